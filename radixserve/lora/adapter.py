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
from typing import TYPE_CHECKING, Any, Optional

from radixserve.lora_config import TARGET_MODULES

if TYPE_CHECKING:
    import torch

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
    patterns = cfg.get("alpha_pattern") or {}
    alphas = [cfg.get("lora_alpha", r), *(patterns.values() if isinstance(patterns, dict) else [None])]
    if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in alphas):
        raise ValueError(f"{field}: {path!r}: adapter_config.json 'lora_alpha' and the values of 'alpha_pattern' "
                         "must be finite numbers")


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


def _tensors(path: str, field: str) -> dict[str, "torch.Tensor"]:
    import torch  # here: the server process reads adapters' configs without torch

    file = _weights_file(path, field)
    try:
        if file.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(file)
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{field}: {path!r}: cannot read {os.path.basename(file)} ({type(e).__name__}: {e})") from None


def _shapes(path: str, field: str) -> dict[str, tuple[int, ...]]:
    """The tensors' shapes from a safetensors header (8-byte length, then JSON): no tensor read."""
    file = _weights_file(path, field)
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > os.fstat(f.fileno()).st_size - 8:  # a garbage length: f.read(n) overflows or allocates it
                raise ValueError(f"header length {n} exceeds the file")
            header = json.loads(f.read(n))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{field}: {path!r}: cannot read {os.path.basename(file)} ({type(e).__name__}: {e})") from None


def _pairs(shapes: dict[str, tuple[int, ...]], path: str, field: str, max_rank: Optional[int],
           targets: Optional[frozenset[str]]) -> tuple[dict[tuple[int, str], tuple[str, str]], int, frozenset[str]]:
    """``{(layer, module): (key of A, key of B)}``, the largest rank and the modules, every check
    done on the shapes alone (ValueError naming ``field``)."""
    found: dict[tuple[int, str], dict[str, str]] = {}
    for key in shapes:
        m = _KEY.search(key)
        if m is None:
            if "lora_" in key or "modules_to_save" in key:
                raise ValueError(f"{field}: {path!r}: tensor {key!r} targets a module that is not served "
                                 f"(only {', '.join(TARGET_MODULES)} of the decoder layers)")
            continue
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if module not in TARGET_MODULES:
            raise ValueError(f"{field}: {path!r}: module {module!r} is not served (only {', '.join(TARGET_MODULES)})")
        found.setdefault((layer, module), {})[which] = key
    if not found:
        raise ValueError(f"{field}: {path!r}: no LoRA weights found")
    rank = 0
    for (layer, module), ab in found.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{field}: {path!r}: layer {layer} {module} has lora_A or lora_B missing")
        a, b = shapes[ab["A"]], shapes[ab["B"]]
        if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
            raise ValueError(f"{field}: {path!r}: layer {layer} {module}: lora_A {a} and lora_B {b} do not make a "
                             "rank-r product")
        rank = max(rank, a[0])
    modules = frozenset(m for _, m in found)
    if max_rank is not None and rank > max_rank:
        raise ValueError(f"{field}: {path!r} has rank {rank}, above max_lora_rank {max_rank}")
    if targets is not None and not modules <= targets:
        raise ValueError(f"{field}: {path!r} targets {', '.join(sorted(modules - targets))}, outside "
                         f"lora_target_modules ({', '.join(sorted(targets))})")
    return {lm: (ab["A"], ab["B"]) for lm, ab in found.items()}, rank, modules


def load_weights(name: str, path: str, field: str = "lora_path", max_rank: Optional[int] = None,
                 targets: Optional[frozenset[str]] = None,
                 ) -> tuple[AdapterInfo, dict[tuple[int, str], tuple["torch.Tensor", "torch.Tensor"]]]:
    """The adapter's info and ``{(layer, module): (A [r, in], scale * B [out, r])}`` in fp32 (the
    scale folded into B).  Refuses (ValueError naming ``field``) what ``read_adapter`` refuses."""
    cfg = _config(path, field)
    _check(cfg, path, field)
    tensors = _tensors(path, field)
    pairs, rank, modules = _pairs({k: tuple(t.shape) for k, t in tensors.items()}, path, field, max_rank, targets)
    out: dict[tuple[int, str], tuple[Any, Any]] = {}
    for lm, (ka, kb) in pairs.items():
        a, b = tensors[ka].float(), tensors[kb].float()
        prefix = ka[: _KEY.search(ka).start(3) - len("lora_")].rstrip(".")
        out[lm] = (a.contiguous(), (b * _scale(cfg, prefix, a.shape[0])).contiguous())
    return AdapterInfo(name, path, rank, modules, fingerprint(path, field)), out


def read_adapter(name: str, path: str, field: str = "lora_path", max_rank: Optional[int] = None,
                 targets: Optional[frozenset[str]] = None) -> AdapterInfo:
    """The adapter's info, every check of ``load_weights`` that needs no tensor done: from the
    safetensors header alone (no torch; a ``.bin`` file is read whole)."""
    cfg = _config(path, field)
    _check(cfg, path, field)
    if _weights_file(path, field).endswith(".safetensors"):
        _, rank, modules = _pairs(_shapes(path, field), path, field, max_rank, targets)
        return AdapterInfo(name, path, rank, modules, fingerprint(path, field))
    return load_weights(name, path, field, max_rank, targets)[0]
