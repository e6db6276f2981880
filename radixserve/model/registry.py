"""Which class serves a Hugging Face ``model_type``: the one table of architectures.

An architecture file registers its class with ``@register("model_type", ...)``; ``FAMILIES``
lists the modules imported (lazily, on the first lookup) so that their decorators run.
``model_class(config)`` returns the class or raises ValueError naming the architecture or the
config feature that is not built, so a load never runs a model silently wrong.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

FAMILIES = ("llama", "qwen3", "phi3", "gemma", "moe_families", "deepseek_v2")
_ARCHITECTURES: dict[str, type] = {}
_imported = False


def register(*model_types: str) -> Callable[[type], type]:
    """Class decorator: serve these ``model_type`` values with the class."""
    def deco(cls: type) -> type:
        for t in model_types:
            _ARCHITECTURES[t] = cls
        return cls
    return deco


def architectures() -> dict[str, type]:
    """Every registered ``model_type`` and its class."""
    global _imported
    if not _imported:
        for fam in FAMILIES:
            try:
                importlib.import_module(f"radixserve.model.{fam}")
            except ModuleNotFoundError as e:
                if e.name != f"radixserve.model.{fam}":
                    raise
        _imported = True
    return dict(_ARCHITECTURES)


def model_class(config: Any) -> type:
    """The class for ``config``; ValueError naming what is not supported otherwise."""
    table = architectures()
    cls = table.get(config.model_type)
    if cls is None:
        raise ValueError(f"model: architecture {config.model_type!r} is not supported "
                         f"(supported: {', '.join(sorted(table))})")
    missing = cls.unsupported(config)
    if missing:
        raise ValueError(f"model: {config.model_type} with {', '.join(missing)} is not supported")
    return cls
