"""Multi-turn chat over the OpenAI route: how much of each turn the prefix cache serves.

Each turn sends the whole conversation so far (the previous answers as assistant messages)
to ``/v1/chat/completions`` (greedy) and reads ``usage.prompt_tokens_details.cached_tokens``.
What turn k can hit at most is the common prefix of its rendered prompt and the tokens
turn k-1 computed KV for: its prompt plus its output tokens but the last one (a sampled
token has no KV until it is fed back).  The output tokens are recovered by re-tokenizing
the answer (checked token by token against the chat logprobs' token texts; only the
agreeing part counts), so ``expected`` counts exactly the tokens the chat template renders
identically.

    .venv/bin/python -m benchmarks.bench_multiturn --url http://127.0.0.1:30000 [--model-dir DIR]
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any, Optional

QUESTIONS = ["What is a prefix cache in an LLM server? Answer in two sentences.",
             "Why does it help multi-turn chats?",
             "Give one case where it does not help.",
             "Summarise our conversation in one sentence."]


@dataclass
class Turn:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    expected: int  # the part of the previous turn that the template renders identically (0 for turn 1)
    content: str


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def output_ids(tok: Any, content: str, finish: str, lp_texts: list[str]) -> list[int]:
    """The answer's output token ids as far as they are known for sure: the re-tokenized
    answer (+ EOS when it stopped on EOS), cut where a token's text differs from the
    logprobs' token text of the same position."""
    ids = tok.encode(content, add_special_tokens=False)
    if finish == "stop":
        ids.append(tok.eos_token_id)
    known = 0
    for i, t in zip(ids, lp_texts):
        if tok.decode([i]) != t and not (i == tok.eos_token_id and t in ("", tok.eos_token)):
            break
        known += 1
    return ids[:known]


def run_chat(client: Any, tok: Any, questions: list[str], max_tokens: int = 48) -> list[Turn]:
    messages: list[dict] = []
    turns: list[Turn] = []
    kv_ids: Optional[list[int]] = None  # tokens the previous turn computed KV for
    for q in questions:
        messages.append({"role": "user", "content": q})
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        r = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                           temperature=0, logprobs=True)
        choice = r.choices[0]
        content = choice.message.content
        lp_texts = [e.token for e in choice.logprobs.content]
        assert r.usage.prompt_tokens == len(prompt_ids), (r.usage.prompt_tokens, len(prompt_ids))
        cached = r.usage.prompt_tokens_details.cached_tokens
        expected = 0 if kv_ids is None else common_prefix(prompt_ids, kv_ids)
        turns.append(Turn(len(prompt_ids), cached, r.usage.completion_tokens, expected, content))
        out = output_ids(tok, content, choice.finish_reason, lp_texts)
        kv_ids = (prompt_ids + out)[: len(prompt_ids) + r.usage.completion_tokens - 1]
        messages.append({"role": "assistant", "content": content})
    return turns


def hit_rate(turns: list[Turn]) -> float:
    return sum(t.cached_tokens for t in turns) / sum(t.prompt_tokens for t in turns)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--model-dir", default=None, help="tokenizer directory (default: SmolLM2's)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    import openai
    from transformers import AutoTokenizer

    from radixserve.model.loader import resolve_hf_dir

    tok = AutoTokenizer.from_pretrained(args.model_dir or resolve_hf_dir(None))
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="none", max_retries=0, timeout=600)
    turns = run_chat(client, tok, QUESTIONS, args.max_tokens)
    for k, t in enumerate(turns, 1):
        print(f"turn {k}: prompt {t.prompt_tokens}, cached {t.cached_tokens} (renders identically: "
              f"{t.expected}), completion {t.completion_tokens}")
    print(f"hit rate over {len(turns)} turns: {hit_rate(turns):.1%}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"turns": [asdict(t) for t in turns], "hit_rate": hit_rate(turns)}, f, indent=1)


if __name__ == "__main__":
    main()
