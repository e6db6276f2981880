"""What the grammar code reads from a request (structural types, read-only).

``constrained/`` never imports the scheduler's ``Req`` or ``SamplingParams`` (that would
point the dependency the wrong way); these Protocols name the attributes it reads.  Every
member is a read-only property: the grammar code returns decisions and the scheduler applies
them, so nothing here is ever written through these types.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, Union

if TYPE_CHECKING:  # a type only: the server's start does without fsm_state's numpy
    from radixserve.constrained.runtime.fsm_state import GrammarState


class GrammarSampling(Protocol):
    """The sampling parameters the grammar code reads (``SamplingParams`` satisfies it)."""

    @property
    def regex(self) -> Optional[str]: ...
    @property
    def json_schema(self) -> Union[str, dict, None]: ...
    @property
    def choices(self) -> Optional[list[str]]: ...
    @property
    def ebnf(self) -> Optional[str]: ...
    @property
    def ignore_eos(self) -> bool: ...
    @property
    def min_new_tokens(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def stop_token_ids(self) -> Optional[list[int]]: ...
    @property
    def stop_strs(self) -> list[str]: ...
    @property
    def constraint_budget(self) -> str: ...


class GrammarRequest(Protocol):
    """The request the grammar code reads (the scheduler's ``Req`` satisfies it)."""

    @property
    def rid(self) -> str: ...
    @property
    def sampling(self) -> GrammarSampling: ...
    @property
    def output_ids(self) -> list[int]: ...
    @property
    def return_logprob(self) -> bool: ...
    @property
    def grammar(self) -> Optional[GrammarState]: ...

    def remaining_new_tokens(self) -> int: ...
