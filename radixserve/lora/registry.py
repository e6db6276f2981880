"""``LoRARegistry``: the adapters being served, by name, on the request side (server, Engine).

Contract: ``resolve(name)`` gives the adapter's ``uid`` (name and content fingerprint) that
requests carry to the scheduler and worker, or ValueError("lora_path: ...") naming the known
adapters.  ``add``/``remove`` only change the table: the caller loads the weights on the worker
first and removes the name before the worker drops them, so a request never names weights the
worker lacks.  Not locked: one event loop (the server) or the Engine's caller thread owns it.
"""
from __future__ import annotations

from typing import Any, Optional

from radixserve.lora.adapter import AdapterInfo, read_adapter
from radixserve.lora_config import LoRAConfig

LORA_NAME_MAX = 128


def check_name(name: object, field: str = "lora_name") -> str:
    if not isinstance(name, str) or not 0 < len(name) <= LORA_NAME_MAX or "@" in name or "\0" in name:
        raise ValueError(f"{field}: must be a non-empty string of at most {LORA_NAME_MAX} characters without '@'")
    return name


class LoRARegistry:
    def __init__(self, cfg: LoRAConfig, max_rank: Optional[int] = None,
                 targets: Optional[frozenset[str]] = None) -> None:
        """``max_rank``/``targets``: what the worker's slots hold (its ``LoRASlots``), which
        adapters loaded later must fit."""
        self.cfg = cfg
        self.max_rank = max_rank
        self.targets = targets
        self.adapters: dict[str, AdapterInfo] = {}

    @property
    def enabled(self) -> bool:
        return self.cfg.enable_lora

    def check(self, name: str, path: str) -> AdapterInfo:
        """The adapter at ``path`` as ``name`` would be loaded, checked (nothing changes)."""
        if not self.enabled:
            raise ValueError("lora_path: LoRA adapters are not enabled on this server (start it with --enable-lora "
                             "or --lora-paths)")
        check_name(name)
        if name in self.adapters:
            raise ValueError(f"lora_name: an adapter named {name!r} is already loaded (unload it first)")
        if self.cfg.max_loaded_loras is not None and len(self.adapters) >= self.cfg.max_loaded_loras:
            raise ValueError(f"lora_name: {len(self.adapters)} adapters are loaded, the most --max-loaded-loras "
                             "allows; unload one first")
        if not isinstance(path, str) or not path:
            raise ValueError("lora_path: must be a non-empty path")
        return read_adapter(name, path, "lora_path", self.max_rank, self.targets)

    def add(self, info: AdapterInfo) -> None:
        self.adapters[info.name] = info

    def remove(self, name: str) -> AdapterInfo:
        if name not in self.adapters:
            raise ValueError(f"lora_name: no adapter named {name!r} is loaded ({self.known()})")
        return self.adapters.pop(name)

    def known(self) -> str:
        return "loaded: " + (", ".join(sorted(self.adapters)) or "none")

    def resolve(self, name: Optional[str], field: str = "lora_path") -> Optional[str]:
        """The uid of adapter ``name`` (None: the base model)."""
        if name is None:
            return None
        if not self.enabled:
            raise ValueError(f"{field}: LoRA adapters are not enabled on this server (start it with --enable-lora "
                             "or --lora-paths)")
        info = self.adapters.get(name) if isinstance(name, str) else None
        if info is None:
            raise ValueError(f"{field}: unknown adapter {name!r} ({self.known()})")
        return info.uid


def registry_for(cfg: LoRAConfig, worker_lora: Any) -> LoRARegistry:
    """The registry of a worker's adapters (``WorkerInfo.lora``: its slots and start adapters)."""
    if worker_lora is None:
        return LoRARegistry(cfg)
    reg = LoRARegistry(cfg, worker_lora.rank, worker_lora.targets)
    for info in worker_lora.adapters:
        reg.add(info)
    return reg


def lora_summary(info: AdapterInfo) -> dict:
    """An adapter as the admin routes and ``/v1/models`` describe it."""
    return {"lora_name": info.name, "lora_path": info.path, "rank": info.rank, "target_modules": sorted(info.targets),
            "fingerprint": info.fingerprint}
