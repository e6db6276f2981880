"""The worker's LoRA adapters: host pool and slots (``slots``), a step's deltas (``step``), the
manager the ModelRunner drives (``manager``)."""
