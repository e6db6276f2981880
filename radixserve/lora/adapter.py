"""A PEFT LoRA adapter on disk: its config read and checked (``read_adapter``), its weights loaded
per layer and module (``load_weights``).

A directory holds ``adapter_config.json`` (PEFT's ``LoraConfig``) and ``adapter_model.safetensors``
(or ``adapter_model.bin``) with ``...layers.<i>.<self_attn|mlp>.<module>.lora_A.weight [r, in]`` and
``lora_B.weight [out, r]``.  The delta a module adds is ``scale * x @ A.T @ B.T`` with ``scale =
alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``; ``rank_pattern``/``alpha_pattern`` per module).
What cannot be served exactly is refused with the field named: DoRA, trained biases,
``modules_to_save`` (a replaced embedding or head), a target outside the decoder's seven linear
layers, a rank above ``max_lora_rank``.

Errors are ``ValueError("<field>: ...")`` with the caller's field (``lora_paths`` at start,
``lora_path`` when loading while serving).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Optional

import torch

from radixserve.lora_config import TARGET_MODULES

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass(frozen=True)
class AdapterInfo:
    """What the scheduler and the server know of an adapter (no weights)."""

    name: str
    path: str
    rank: int  # the largest rank over its modules
    targets: frozenset[str]  # Hugging Face module names it changes
    fingerprint: str  # of its files: a reloaded adapter with the same files shares its cache

    @property
    def uid(self) -> str:
        """The adapter's identity in the radix key and on the worker: name and content."""
        return f"{self.name}@{self.fingerprint}"


def _weights_file(path: str, field: str) -> str:
    for f in WEIGHT_FILES:
        if os.path.isfile(os.path.join(path, f)):
            return os.path.join(path, f)
    raise ValueError(f"{field}: {path!r} has no {' or '.join(WEIGHT_FILES)}")


def _config(path: str, field: str) -> dict:
    if not os.path.isdir(path):
        raise ValueError(f"{field}: {path!r} is not a directory (a PEFT adapter: adapter_config.json + weights)")
    try:
        with open(os.path.join(path, "adapter_config.json")) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{field}: {path!r} has no adapter_config.json") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{field}: {path!r}: adapter_config.json is not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{field}: {path!r}: adapter_config.json is not an object")
    return cfg


def _check(cfg: dict, path: str, field: str) -> None:
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{field}: {path!r} is a {cfg.get('peft_type')} adapter; only LoRA is served")
    if cfg.get("use_dora"):
        raise ValueError(f"{field}: {path!r} is a DoRA adapter (use_dora); only plain LoRA is served")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"{field}: {path!r} trains biases (bias={cfg.get('bias')!r}); only bias='none' is served")
    if cfg.get("modules_to_save"):
        raise ValueError(f"{field}: {path!r} replaces whole modules (modules_to_save={cfg['modules_to_save']}); "
                         "not served")
    if cfg.get("fan_in_fan_out"):
        raise ValueError(f"{field}: {path!r} has fan_in_fan_out (Conv1D layers); not served")
    r = cfg.get("r")
    if not isinstance(r, int) or r < 1:
        raise ValueError(f"{field}: {path!r}: adapter_config.json 'r' must be a positive integer")


def _scale(cfg: dict, module_key: str, r: int) -> float:
    """PEFT's scaling of one module (its own rank ``r``; alpha_pattern matched as PEFT does: by
    the key's suffix)."""
    alpha = cfg.get("lora_alpha", cfg["r"])
    for pattern, a in (cfg.get("alpha_pattern") or {}).items():
        if re.search(rf"(^|\.){pattern}$", module_key):
            alpha = a
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def fingerprint(path: str, field: str = "lora_path") -> str:
    h = hashlib.sha256()
    with open(os.path.join(path, "adapter_config.json"), "rb") as f:
        h.update(f.read())
    with open(_weights_file(path, field), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _tensors(path: str, field: str) -> dict[str, torch.Tensor]:
    file = _weights_file(path, field)
    try:
        if file.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(file)
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{field}: {path!r}: cannot read {os.path.basename(file)} ({type(e).__name__}: {e})") from None


def load_weights(name: str, path: str, field: str = "lora_path", max_rank: Optional[int] = None,
                 targets: Optional[frozenset[str]] = None,
                 ) -> tuple[AdapterInfo, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]]:
    """The adapter's info and ``{(layer, module): (A [r, in], scale * B [out, r])}`` in fp32 (the
    scale folded into B).  Refuses (ValueError naming ``field``) what ``read_adapter`` refuses."""
    cfg = _config(path, field)
    _check(cfg, path, field)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    keys: dict[tuple[int, str], str] = {}
    for key, t in _tensors(path, field).items():
        m = _KEY.search(key)
        if m is None:
            if "lora_" in key or "modules_to_save" in key:
                raise ValueError(f"{field}: {path!r}: tensor {key!r} targets a module that is not served "
                                 f"(only {', '.join(TARGET_MODULES)} of the decoder layers)")
            continue
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if module not in TARGET_MODULES:
            raise ValueError(f"{field}: {path!r}: module {module!r} is not served (only {', '.join(TARGET_MODULES)})")
        found.setdefault((layer, module), {})[which] = t.float()
        keys[(layer, module)] = key[: m.start(3) - len("lora_")].rstrip(".")
    if not found:
        raise ValueError(f"{field}: {path!r}: no LoRA weights found")
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    rank = 0
    for lm, ab in found.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{field}: {path!r}: layer {lm[0]} {lm[1]} has lora_A or lora_B missing")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"{field}: {path!r}: layer {lm[0]} {lm[1]}: lora_A {tuple(a.shape)} and lora_B "
                             f"{tuple(b.shape)} do not make a rank-r product")
        r = a.shape[0]
        rank = max(rank, r)
        out[lm] = (a.contiguous(), (b * _scale(cfg, keys[lm], r)).contiguous())
    modules = frozenset(m for _, m in out)
    if max_rank is not None and rank > max_rank:
        raise ValueError(f"{field}: {path!r} has rank {rank}, above max_lora_rank {max_rank}")
    if targets is not None and not modules <= targets:
        raise ValueError(f"{field}: {path!r} targets {', '.join(sorted(modules - targets))}, outside "
                         f"lora_target_modules ({', '.join(sorted(targets))})")
    return AdapterInfo(name, path, rank, modules, fingerprint(path, field)), out


def read_adapter(name: str, path: str, field: str = "lora_path", max_rank: Optional[int] = None,
                 targets: Optional[frozenset[str]] = None) -> AdapterInfo:
    """The adapter's info, every check of ``load_weights`` done (its tensors read once, then dropped)."""
    return load_weights(name, path, field, max_rank, targets)[0]
