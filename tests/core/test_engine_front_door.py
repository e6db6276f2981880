"""The one front door (``radixserve.request_builder``): the Engine and the server's
TokenizerManager validate, clamp and expand requests through the same builder, verifying
the sampling parameters exactly once per prompt and giving copy i of an n > 1 prompt
``seed + i``; the scheduler does not validate again."""
from __future__ import annotations

import pytest

from radixserve.ipc.worker_link import WorkerInfo
from radixserve.request_builder import Limits, RequestBuilder
from radixserve.sampling_params import SamplingParams

INFO = WorkerInfo(num_slots=101, max_rows=8, context_len=64, vocab_size=1000, dtype="float32", device="cpu",
                  hf_dir="")


def test_n_expansion_seeds_and_rids():
    b = RequestBuilder(Limits.of(INFO))
    msgs = b.build([[1, 2, 3], [4, 5]], [{"n": 3, "seed": 10}, {"n": 2}], ["input_ids.0", "input_ids.1"],
                   rids=["a", "b"])
    assert [m.rid for m in msgs] == ["a-0", "a-1", "a-2", "b-0", "b-1"]
    assert [m.seed for m in msgs] == [10, 11, 12, None, None]
    assert all(m.sampling.n == 1 for m in msgs)
    assert len({id(m.sampling) for m in msgs}) == len(msgs)  # copies, not one shared object
    assert [m.input_ids for m in msgs] == [[1, 2, 3]] * 3 + [[4, 5]] * 2
    one = b.build([[1]], [{"seed": 4}], ["input_ids"], rids=["x"])
    assert [(m.rid, m.seed) for m in one] == [("x", 4)]
    with pytest.raises(ValueError, match="rid: 'x' is already in use"):
        b.build([[1]], [{}], ["input_ids"], rids=["x"], in_use={"x"}.__contains__)


def test_clamping_against_the_worker_limits():
    lim = Limits.of(INFO)
    assert lim.max_seq_len == 64  # min(context 64, KV pool 100)
    b = RequestBuilder(lim)
    sp = SamplingParams(max_new_tokens=10**6, min_new_tokens=100)
    (m,) = b.build([list(range(60))], [sp], ["input_ids"], return_logprob=True, logprob_start_len=500)
    assert m.sampling.max_new_tokens == 4 and m.sampling.min_new_tokens == 4 and m.logprob_start_len == 59
    assert sp.max_new_tokens == 10**6  # the caller's object is not mutated
    small_pool = RequestBuilder(Limits(vocab_size=1000, context_len=4096, num_slots=33, max_rows=8))
    (m,) = small_pool.build([[1] * 10], [{}], ["input_ids"])
    assert m.sampling.max_new_tokens == 32 - 10


@pytest.mark.parametrize("ids,needle", [
    ([], "input_ids: the prompt is empty"), ([5, 1000], r"input_ids: token ids must be in \[0, 1000\)"),
    ([-1], r"input_ids: token ids must be in"),
    (list(range(64)), "input_ids: the prompt has 64 tokens; at most 63 fit, longer than the context length"),
])
def test_prompt_errors_name_the_field(ids, needle):
    with pytest.raises(ValueError, match=needle):
        RequestBuilder(Limits.of(INFO)).build([ids], [{}], ["input_ids"])


def test_prompt_larger_than_the_pool_says_so():
    small_pool = RequestBuilder(Limits(vocab_size=1000, context_len=4096, num_slots=33, max_rows=8))
    needle = "input_ids: the prompt has 40 tokens; at most 31 fit, larger than the KV pool"
    with pytest.raises(ValueError, match=needle):
        small_pool.build([[1] * 40], [{"n": 2}], ["input_ids"])


def test_request_level_errors():
    b = RequestBuilder(Limits.of(INFO))
    for kw, needle in ((dict(logprob_start_len=-2), "logprob_start_len"), (dict(top_logprobs_num=65), "top_logprobs_num"),
                       (dict(rids=["a", "b"]), "rid")):
        with pytest.raises(ValueError, match=needle):
            b.build([[1]], [{}], ["input_ids"], **kw)
    with pytest.raises(ValueError, match="sampling_params.regex"):
        b.build([[1]], [{"regex": "(a"}], ["input_ids"])
    with pytest.raises(ValueError, match="n: at most 1024"):
        b.build([[1]], [{"n": 1025}], ["input_ids"])


def test_engine_verifies_each_prompt_once(tiny_engine, monkeypatch):
    import radixserve.request_builder as rb

    calls = {"verify": 0, "constraint": 0}
    verify, constraint_of = SamplingParams.verify, rb.constraint_of

    def counted_verify(self, vocab_size):
        calls["verify"] += 1
        return verify(self, vocab_size)

    def counted_constraint(sp, *a, **k):
        calls["constraint"] += 1
        return constraint_of(sp, *a, **k)

    monkeypatch.setattr(SamplingParams, "verify", counted_verify)
    monkeypatch.setattr(rb, "constraint_of", counted_constraint)
    outs = tiny_engine.generate(input_ids=[[1, 2, 3], [4, 5]],
                                sampling_params=[{"n": 3, "max_new_tokens": 2, "temperature": 0},
                                                 {"regex": "[ab]{2}", "n": 2, "temperature": 0}])
    assert len(outs) == 5 and all(o["text"] in ("aa", "ab", "ba", "bb") for o in outs[3:])
    assert calls == {"verify": 2, "constraint": 2}  # per prompt, not per copy, never again downstream
    tiny_engine.check_invariants()


def test_engine_copies_use_seed_plus_i(tiny_engine):
    sp = {"max_new_tokens": 8, "temperature": 30.0, "top_k": 500}
    copies = tiny_engine.generate(input_ids=[11, 12, 13], sampling_params={**sp, "n": 3, "seed": 40})
    alone = [tiny_engine.generate(input_ids=[11, 12, 13], sampling_params={**sp, "seed": 40 + i}) for i in range(3)]
    assert [c["output_ids"] for c in copies] == [a["output_ids"] for a in alone]
    tiny_engine.check_invariants()


def test_tokenizer_manager_uses_the_same_builder(tiny_engine, tmp_path):
    from radixserve.ipc.zmq_utils import IPCAddrs
    from radixserve.server.req_state import RequestError
    from radixserve.server.tokenizer_manager import TokenizerManager

    tm = TokenizerManager(tiny_engine.tokenizer, tiny_engine.info, IPCAddrs.in_dir(str(tmp_path)))
    assert tm.builder.limits == tiny_engine.builder.limits
    msgs = tm.build([[1, 2, 3]], [{"n": 2, "seed": 5, "max_new_tokens": 10**6}], ["text"], ["r"])
    assert [(m.rid, m.seed) for m in msgs] == [("r-0", 5), ("r-1", 6)]
    (ref,) = tiny_engine.builder.build([[1, 2, 3]], [{"max_new_tokens": 10**6}], ["text"])
    assert msgs[0].sampling.max_new_tokens == ref.sampling.max_new_tokens
    with pytest.raises(RequestError, match="text: the prompt is empty") as e:
        tm.build([[]], [{}], ["text"], None)
    assert e.value.status == 400
    with pytest.raises(RequestError, match="sampling_params.top_p"):
        tm.build([[1]], [{"top_p": 0}], ["text"], None)


def test_text_prompts_and_long_outputs_are_clamped(tiny_engine):
    o = tiny_engine.generate("Hello there", {"max_new_tokens": 10**6, "temperature": 0, "ignore_eos": True,
                                             "stop_token_ids": [0]})
    assert o["meta_info"]["prompt_tokens"] == len(tiny_engine.tokenizer.encode("Hello there"))
    assert o["meta_info"]["completion_tokens"] <= 1024
