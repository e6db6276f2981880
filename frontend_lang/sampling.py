"""Sampling parameters of the frontend: run-level defaults merged with per-gen overrides.

The field names are those of ``radixserve.SamplingParams`` (derived from the dataclass, so
a field added there is accepted here too) plus the request-level options of /generate
(``REQUEST_OPTIONS``: the logprob options and ``lora_path``, the LoRA adapter's name, which
/generate takes at the top level, SGLang's place for it; ``lora`` is its short alias).
Every value is optional; an unset one is not sent, so the backend's defaults (SGLang's:
max_new_tokens 128, temperature 1.0, ...) apply.  A gen's set values override the run's.
``split`` separates the request-level options from the ``sampling_params`` dict that
/generate takes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from radixserve.sampling_params import SamplingParams

# request-level options of /generate (not sampling_params)
REQUEST_OPTIONS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "lora_path")
SAMPLING_PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.name not in REQUEST_OPTIONS)
ALIASES = {"lora": "lora_path"}  # the frontend's short names
SAMPLING_FIELDS = SAMPLING_PARAM_FIELDS + REQUEST_OPTIONS + tuple(ALIASES)


@dataclass(frozen=True)
class SamplingOverrides:
    """The set values (never None), keyed by the names in ``SAMPLING_FIELDS``."""

    values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **kwargs: Any) -> "SamplingOverrides":
        """Build from keyword arguments, ignoring those that are None, aliases under their
        field's name; TypeError names an unknown one (or an alias that contradicts its field)."""
        unknown = sorted(set(kwargs) - set(SAMPLING_FIELDS))
        if unknown:
            raise TypeError(f"{unknown[0]}: not a sampling parameter (known: {', '.join(SAMPLING_FIELDS)})")
        values = {k: v for k, v in kwargs.items() if v is not None and k not in ALIASES}
        for alias, name in ALIASES.items():
            v = kwargs.get(alias)
            if v is not None:
                if values.get(name, v) != v:
                    raise TypeError(f"{alias}: {v!r} contradicts {name}={values[name]!r} (give one of them)")
                values[name] = v
        return cls(values)

    def __getattr__(self, name: str) -> Any:
        """``overrides.temperature``: the set value or None."""
        if name in SAMPLING_FIELDS:
            return self.values.get(ALIASES.get(name, name))
        raise AttributeError(name)

    def set_fields(self) -> dict[str, Any]:
        return dict(self.values)

    def merged(self, overrides: "SamplingOverrides") -> "SamplingOverrides":
        """These values, with every set value of ``overrides`` taking precedence."""
        return SamplingOverrides({**self.values, **overrides.values})

    def split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(sampling_params dict, request options dict) of the set values."""
        values = self.set_fields()
        options = {k: values.pop(k) for k in REQUEST_OPTIONS if k in values}
        return values, options
