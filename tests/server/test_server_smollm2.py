"""The real SmolLM2 behind the HTTP server: greedy output through /generate and through the
OpenAI chat route equals HF transformers' greedy continuation of the same tokens."""
from __future__ import annotations

import pytest

from tests.helpers.models import hf_greedy

pytestmark = pytest.mark.slow


def test_generate_and_chat_match_hf(smol_server, smol_dir, smol_hf):
    from openai import OpenAI
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_dir)
    hf = smol_hf
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    ref = hf_greedy(hf, ids, 24)
    with smol_server.client() as c:
        r = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    assert r.status_code == 200, r.text
    out = r.json()
    n = len(out["output_ids"])
    assert out["output_ids"] == ref[:n] and (n == 24 or out["meta_info"]["finish_reason"]["type"] == "stop")
    assert "Paris" in out["text"]
    client = OpenAI(base_url=smol_server.url + "/v1", api_key="none")
    chat = client.chat.completions.create(model="default", messages=messages, max_tokens=24, temperature=0)
    assert chat.choices[0].message.content == tok.decode(ref[:n], skip_special_tokens=True).strip() or \
        chat.choices[0].message.content == out["text"]
    assert chat.usage.prompt_tokens == len(ids)
