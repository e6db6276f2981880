"""Sampling parameters of the frontend: run-level defaults merged with per-gen overrides.

Every field is optional; ``None`` means "not set", and unset fields are not sent, so the
backend's defaults (SGLang's: max_new_tokens 128, temperature 1.0, ...) apply.  A gen's
set fields override the run's.  ``split`` separates the request-level logprob options from
the ``sampling_params`` dict that /generate takes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

# request-level options of /generate (not sampling_params)
REQUEST_OPTIONS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


@dataclass
class SamplingOverrides:
    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    seed: Optional[int] = None
    regex: Optional[str] = None
    json_schema: Union[str, dict, None] = None
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None

    @classmethod
    def of(cls, **kwargs: Any) -> "SamplingOverrides":
        """Build from keyword arguments, ignoring those that are None."""
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def set_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def merged(self, overrides: "SamplingOverrides") -> "SamplingOverrides":
        """These values, with every set field of ``overrides`` taking precedence."""
        return dataclasses.replace(self, **overrides.set_fields())

    def split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(sampling_params dict, request options dict) of the set fields."""
        values = self.set_fields()
        options = {k: values.pop(k) for k in REQUEST_OPTIONS if k in values}
        return values, options


SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingOverrides))
