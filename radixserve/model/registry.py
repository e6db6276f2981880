"""Which class serves a Hugging Face ``model_type``: the one table of architectures.

A family is one module of ``radixserve.model.arch``; it registers its class once, with
``@register("model_type", ...)``.  The first lookup imports every module of that package (as
SGLang's ``models/registry.py`` walks its ``models`` folder), so a new file is found without
being listed anywhere else.
``model_class(config)`` returns the class or raises ValueError naming the architecture or the
config feature that is not built, so a load never runs a model silently wrong.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

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
        from radixserve.model import arch

        for info in pkgutil.iter_modules(arch.__path__):
            importlib.import_module(f"{arch.__name__}.{info.name}")
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
