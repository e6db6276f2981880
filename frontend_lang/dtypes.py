"""``gen(dtype=...)``: SGLang's typed generation, as a regex constraint plus stop strings.

``int`` and ``float`` end at the first space or newline (added to the gen's stop strings);
``str`` is a double-quoted string of word characters and spaces; ``bool`` is True/False.
The dtype replaces any ``regex`` the gen also has (as in SGLang).  The generated text is
stored as text; the program converts it (``int(s["x"])``).
"""
from __future__ import annotations

from typing import Any, Optional, Union

REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

# dtype -> (regex, stop strings to add)
_DTYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "int": (REGEX_INT, (" ", "\n")),
    "float": (REGEX_FLOAT, (" ", "\n")),
    "str": (REGEX_STR, ()),
    "bool": (REGEX_BOOL, ()),
}

DType = Union[type, str, None]


def check_dtype(dtype: DType) -> Optional[str]:
    """The dtype's name ("int", "float", "str", "bool") or None; ValueError otherwise."""
    if dtype is None:
        return None
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if name not in _DTYPES:
        raise ValueError(f"gen: dtype must be one of int, float, str, bool (got {dtype!r})")
    return name


def apply_dtype(params: dict[str, Any], dtype: Optional[str]) -> dict[str, Any]:
    """``params`` (a sampling_params dict) with the dtype's regex and stop strings."""
    if dtype is None:
        return params
    regex, extra_stops = _DTYPES[dtype]
    stop = params.get("stop") or []
    stops = [stop] if isinstance(stop, str) else list(stop)
    out = {k: v for k, v in params.items() if k not in ("json_schema", "choices")}
    out["regex"] = regex
    if extra_stops:
        out["stop"] = stops + [s for s in extra_stops if s not in stops]
    return out
