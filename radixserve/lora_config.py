"""``LoRAConfig``: serving many LoRA adapters over one base model (docs/LORA.md), SGLang's flags."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# the Hugging Face names of the linear layers an adapter may target (q/k/v run as one fused
# projection, gate/up as another)
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_lora_path(spec: str) -> tuple[str, str]:
    """``name=path`` (or a bare ``path``, named after its last folder) -> ``(name, path)``."""
    name, sep, path = spec.partition("=")
    if not sep:
        path = spec
        name = path.rstrip("/").rsplit("/", 1)[-1]
    name, path = name.strip(), path.strip()
    if not name or not path:
        raise ValueError(f"lora_paths: expected NAME=PATH or PATH, got {spec!r}")
    return name, path


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA over one base model.

    ``lora_paths`` (``NAME=PATH``: a PEFT directory with ``adapter_config.json`` and its weights)
    are loaded at start; more can be loaded and unloaded while serving.  A request names its
    adapter (``lora_path`` on ``/generate``, ``model`` on the OpenAI routes); a batch mixes
    adapters, at most ``max_loras_per_batch`` distinct ones per step (their weights are held in
    that many slots, least recently used first out).  ``max_lora_rank`` and
    ``lora_target_modules`` size the slots: by default the largest rank and the union of the
    targets of ``lora_paths`` (both required when none is given at start).  ``max_loaded_loras``
    bounds the adapters held in host memory (None: no bound).
    """

    enable_lora: bool = False
    lora_paths: tuple[str, ...] = field(default=(), metadata={"help": (
        "adapters to load at start, NAME=PATH (a PEFT directory) or PATH; implies --enable-lora")})
    max_loras_per_batch: int = 8
    max_lora_rank: Optional[int] = None
    lora_target_modules: tuple[str, ...] = field(default=(), metadata={"help": (
        "linear layers the slots hold (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or all); "
        "default: those of --lora-paths")})
    max_loaded_loras: Optional[int] = None

    def __post_init__(self) -> None:
        if self.lora_paths and not self.enable_lora:
            object.__setattr__(self, "enable_lora", True)
        names = [parse_lora_path(p)[0] for p in self.lora_paths]
        if len(set(names)) != len(names):
            raise ValueError("lora_paths: adapter names must be distinct")
        if self.max_loras_per_batch < 1:
            raise ValueError("max_loras_per_batch: must be >= 1")
        if self.max_lora_rank is not None and self.max_lora_rank < 1:
            raise ValueError("max_lora_rank: must be >= 1")
        if self.max_loaded_loras is not None and self.max_loaded_loras < 1:
            raise ValueError("max_loaded_loras: must be >= 1 (unset: no bound)")
        if self.max_loaded_loras is not None and self.max_loaded_loras < len(self.lora_paths):
            raise ValueError("max_loaded_loras: must be at least the number of --lora-paths")
        bad = [m for m in self.lora_target_modules if m not in TARGET_MODULES and m not in ("all", "all-linear")]
        if bad:
            raise ValueError(f"lora_target_modules: unknown module(s) {', '.join(bad)} "
                             f"(known: {', '.join(TARGET_MODULES)}, all)")
        if self.enable_lora and not self.lora_paths and (self.max_lora_rank is None):
            raise ValueError("max_lora_rank: required with --enable-lora and no --lora-paths (it sizes the slots)")

    @property
    def adapters(self) -> list[tuple[str, str]]:
        """``(name, path)`` of each adapter of ``lora_paths``."""
        return [parse_lora_path(p) for p in self.lora_paths]

    @property
    def targets(self) -> Optional[frozenset[str]]:
        """The modules the slots hold as configured (None: from the start adapters)."""
        if not self.lora_target_modules:
            return None
        if any(m in ("all", "all-linear") for m in self.lora_target_modules):
            return frozenset(TARGET_MODULES)
        return frozenset(self.lora_target_modules)
