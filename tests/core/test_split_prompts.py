"""``split_prompts``: the one splitter of a raw request (text or input_ids, single or batched,
one or per-prompt sampling parameters) that the Engine and the server's /generate both call."""
from __future__ import annotations

import pytest

from radixserve.request_builder import split_prompts
from radixserve.sampling_params import SamplingParams


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_single_text_and_single_ids():
    p = split_prompts("ab", None, {"n": 2}, encode)
    assert (p.ids, p.params, p.names, p.rids, p.batched) == ([[97, 98]], [{"n": 2}], ["text"], None, False)
    p = split_prompts(None, [1, 2], None, encode, rid="r")
    assert (p.ids, p.params, p.names, p.rids, p.batched) == ([[1, 2]], [{}], ["input_ids"], ["r"], False)


def test_batches_name_each_prompt_and_share_or_split_params():
    p = split_prompts(["a", "bc"], None, {"top_k": 3}, encode, rid="r")
    assert p.ids == [[97], [98, 99]] and p.batched
    assert p.names == ["text.0", "text.1"] and p.rids == ["r-0", "r-1"]
    assert p.params == [{"top_k": 3}, {"top_k": 3}]
    sp = SamplingParams(seed=1)
    p = split_prompts(None, [[1], [2, 3]], [sp, None], encode, rid=["x", "y"])
    assert p.names == ["input_ids.0", "input_ids.1"] and p.params == [sp, {}] and p.rids == ["x", "y"]
    assert split_prompts(None, ([1], [2]), None, encode).ids == [[1], [2]]  # a tuple of lists is a batch too


def test_top_level_priority_and_cache_salt_go_into_every_prompt():
    p = split_prompts(["a", "b"], None, [{"priority": 2}, {}], encode, priority=2, cache_salt="s")
    assert p.params == [{"priority": 2, "cache_salt": "s"}, {"priority": 2, "cache_salt": "s"}]


def test_empty_batch_is_an_error_unless_allowed():
    with pytest.raises(ValueError, match="^text: the batch is empty"):
        split_prompts([], None, None, encode)
    p = split_prompts(None, [], None, encode)  # one empty prompt (RequestBuilder refuses it), not a batch
    assert p.ids == [[]] and not p.batched
    p = split_prompts([], None, None, encode, allow_empty=True)
    assert p.ids == [] and p.batched


@pytest.mark.parametrize("kw,needle", [
    (dict(text=None, input_ids=None), "text: give exactly one of prompt text or input_ids"),
    (dict(text="a", input_ids=[1]), "text: give exactly one"),
    (dict(text=["a", 5], input_ids=None), "text: must be a string or a list of strings"),
    (dict(text=None, input_ids=[1, "x"]), "input_ids: must be a list of ints"),
    (dict(text=None, input_ids=[[1], 2]), "input_ids: must be a list of ints"),
    (dict(text=None, input_ids=7), "input_ids: must be a list of ints"),
    (dict(text=["a", "b"], input_ids=None, sampling_params=[{}]), "sampling_params: a list must have one entry"),
    (dict(text="a", input_ids=None, sampling_params={"priority": 1}, priority=2),
     "priority: differs from sampling_params.priority; give it once"),
    (dict(text="a", input_ids=None, sampling_params=SamplingParams(), priority=2), "priority: give it inside"),
    (dict(text="a", input_ids=None, cache_salt=""), "cache_salt: must be a non-empty string of at most 256"),
    (dict(text="a", input_ids=None, cache_salt="s" * 257), "cache_salt: must be a non-empty string"),
    (dict(text="a", input_ids=None, sampling_params={"cache_salt": "t"}, cache_salt="s"),
     "cache_salt: differs from sampling_params.cache_salt; give it once"),
])
def test_errors_name_the_field(kw, needle):
    kw = {"sampling_params": None, **kw}
    with pytest.raises(ValueError, match="^" + needle):
        split_prompts(kw.pop("text"), kw.pop("input_ids"), kw.pop("sampling_params"), encode, **kw)
