"""LoRA adapters over one base model (docs/LORA.md).

``adapter``: a PEFT directory read and checked, its weights per layer and module.
``registry``: the adapters a server or Engine serves, by name (what requests resolve against).
The worker's slots and the per-step segmented products live in ``radixserve/worker/lora/``.
"""
