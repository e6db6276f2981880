"""The soak's seeded request mix: which route, streamed or not, constrained, n > 1, and what
the client does to it (abort it, disconnect mid-stream, read it slowly, send it oversize).

``make_mix(seed, count)`` is deterministic; ``Spec.body(pool)`` builds the JSON body (an
oversize request's prompt is sized from the running server's KV pool).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

WORDS = ("the cache keeps every shared prefix of a prompt so the next request starts from its longest match "
         "while the scheduler admits what fits and retracts what does not when memory runs short").split()
SYSTEMS = ["You are a terse assistant. " * 4, "Answer in one line and cite nothing. " * 3,
           "System: the soak test is running; reply briefly. " * 2]
REGEX = r"(yes|no|maybe)[0-9]{1,3}"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"]}
CHOICES = ["red", "green", "blue"]

# (kind, weight): the share of each request shape in the mix
KINDS = (("generate", 16), ("generate_stream", 12), ("chat", 10), ("chat_stream", 8), ("completion", 8),
         ("completion_stream", 6), ("regex", 5), ("json_schema", 5), ("choices", 5), ("n_gt_1", 6),
         ("abort", 6), ("disconnect", 5), ("slow_reader", 5), ("oversize", 3))


@dataclass(frozen=True)
class Spec:
    """One request of the mix.  ``route`` is the path, ``action`` what the client does while it
    runs: "" (read it all), "abort" (POST /abort_request for ``rid`` after ``delay`` s),
    "disconnect" (close the stream after ``chunks`` chunks), "slow" (sleep ``delay`` s per
    chunk); ``oversize`` requests must be refused with a 400 naming the KV pool."""

    idx: int
    kind: str
    route: str
    stream: bool
    payload: dict = field(default_factory=dict)
    action: str = ""
    delay: float = 0.0
    chunks: int = 0
    oversize: bool = False
    rid: Optional[str] = None

    def body(self, pool: int) -> dict[str, Any]:
        """The JSON body; an oversize prompt gets ``pool + 8`` tokens (as token ids)."""
        body = dict(self.payload)
        if self.oversize:
            ids = [(7 * i) % 1000 + 100 for i in range(pool + 8)]
            if self.route == "/generate":
                body.pop("text", None)
                body["input_ids"] = ids
            else:
                body["prompt"] = ids
        return body


def _text(rng: random.Random) -> str:
    sys = rng.choice(SYSTEMS) if rng.random() < 0.6 else ""
    return sys + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))


def _native(rng: random.Random, stream: bool, **sp: Any) -> dict[str, Any]:
    params = {"max_new_tokens": rng.randint(4, 40), "temperature": rng.choice([0.0, 0.7, 1.0]), **sp}
    return {"text": _text(rng), "sampling_params": params, "stream": stream}


def _chat(rng: random.Random, stream: bool, n: int = 1) -> dict[str, Any]:
    msgs = [{"role": "user", "content": _text(rng)}]
    if rng.random() < 0.5:
        msgs.insert(0, {"role": "system", "content": rng.choice(SYSTEMS)})
    return {"model": "default", "messages": msgs, "max_tokens": rng.randint(4, 40), "n": n, "stream": stream,
            "temperature": rng.choice([0.0, 0.8])}


def _completion(rng: random.Random, stream: bool, n: int = 1) -> dict[str, Any]:
    return {"model": "default", "prompt": _text(rng), "max_tokens": rng.randint(4, 40), "n": n, "stream": stream,
            "temperature": rng.choice([0.0, 0.8])}


def make_spec(idx: int, kind: str, rng: random.Random) -> Spec:
    """The request of shape ``kind`` (one of ``KINDS``) drawn from ``rng``."""
    stream = kind.endswith("_stream") or rng.random() < 0.3
    if kind.startswith("generate"):
        return Spec(idx, kind, "/generate", stream, _native(rng, stream))
    if kind.startswith("chat"):
        return Spec(idx, kind, "/v1/chat/completions", stream, _chat(rng, stream))
    if kind.startswith("completion"):
        return Spec(idx, kind, "/v1/completions", stream, _completion(rng, stream))
    if kind in ("regex", "json_schema", "choices"):
        spec = {"regex": REGEX, "json_schema": SCHEMA, "choices": CHOICES}[kind]
        return Spec(idx, kind, "/generate", stream, _native(rng, stream, **{kind: spec}, max_new_tokens=32))
    if kind == "n_gt_1":
        n = rng.randint(2, 3)
        route, payload = rng.choice([("/generate", _native(rng, stream, n=n)),
                                     ("/v1/chat/completions", _chat(rng, stream, n)),
                                     ("/v1/completions", _completion(rng, stream, n))])
        return Spec(idx, kind, route, stream, payload)
    if kind == "abort":
        rid = f"soak-{idx}"
        payload = {**_native(rng, stream, max_new_tokens=rng.randint(20, 80)), "rid": rid}
        return Spec(idx, kind, "/generate", stream, payload, action="abort", delay=rng.uniform(0.02, 1.0), rid=rid)
    if kind == "disconnect":
        route, payload = rng.choice([("/generate", _native(rng, True, max_new_tokens=60)),
                                     ("/v1/chat/completions", {**_chat(rng, True), "max_tokens": 60})])
        return Spec(idx, kind, route, True, payload, action="disconnect", chunks=rng.randint(1, 4))
    if kind == "slow_reader":
        route, payload = rng.choice([("/generate", _native(rng, True)), ("/v1/completions", _completion(rng, True))])
        return Spec(idx, kind, route, True, payload, action="slow", delay=rng.uniform(0.02, 0.15))
    if kind == "oversize":
        route = rng.choice(["/generate", "/v1/completions"])
        payload = _native(rng, stream) if route == "/generate" else _completion(rng, stream)
        return Spec(idx, kind, route, stream, payload, oversize=True)
    raise ValueError(f"kind: unknown {kind!r}")


def make_mix(seed: int, count: int) -> list[Spec]:
    """``count`` requests drawn with ``KINDS``' weights from ``random.Random(seed)``."""
    rng = random.Random(seed)
    names, weights = zip(*KINDS)
    return [make_spec(i, rng.choices(names, weights)[0], rng) for i in range(count)]
