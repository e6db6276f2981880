"""Multi-turn sessions keep their cache: through the OpenAI chat route with SmolLM2's real
chat template, turn k's ``cached_tokens`` covers every token of turn k-1 (prompt and
output) that the template renders identically and that has KV (all but the last sampled
token).  The conversation logic is benchmarks/bench_multiturn.py's."""
from __future__ import annotations


import pytest

from benchmarks.bench_multiturn import QUESTIONS, hit_rate, run_chat

from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.req import Req


def test_a_finished_request_leaves_prompt_and_output_in_the_tree(tiny_engine):
    prompt = list(range(3000, 3040))
    out = tiny_engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                  "ignore_eos": True})["output_ids"]
    probe = Req("probe", prompt + out + [5], SamplingParams())  # may match all of prompt + output
    cached = tiny_engine.run_on_driver(lambda s: s.kv.match_len(probe))
    # everything but the final sampled token, which was never fed back (no KV)
    assert cached == len(prompt) + len(out) - 1


@pytest.mark.slow
def test_each_turn_hits_everything_the_previous_turn_computed(smol_server, smol_dir):
    import openai
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_dir)
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="none", max_retries=0, timeout=600)
    turns = run_chat(client, tok, QUESTIONS)
    for k, t in enumerate(turns[1:], 2):
        prev = turns[k - 2]
        # SmolLM2's template re-renders the previous answer token for token (a token or two
        # at the junction may tokenize differently): nearly all of the previous prompt and
        # output is expected, all but the final sampled token (it has no KV)
        assert t.expected >= prev.prompt_tokens + prev.completion_tokens - 1 - 2, (k, t, prev)
        assert t.cached_tokens >= t.expected, (k, t)
    print(f"4-turn chat hit rate: {hit_rate(turns):.1%}", [(t.prompt_tokens, t.cached_tokens) for t in turns])
    with smol_server.client() as http:
        s = http.get("/get_server_info").json()["scheduler"]
    assert s["invariants_ok"], s
