"""Does it matter which thread calls the in-process Engine?

One Engine on the default model; ``generate`` of ``--tokens`` greedy tokens (``ignore_eos``),
timed (median of ``--reps``) when the main thread calls it, when a new thread calls it each
time (as ``frontend_lang``'s programs do: a thread each), and from the main thread again.
With every step on the driver's own thread (``radixserve/engine/driver.py``) the three agree;
when the calling thread stepped the model itself, each calling thread got an OpenMP thread
team of its own and the teams slowed each other down.

    .venv/bin/python -m benchmarks.bench_engine_threads --dtype float32 --quantization int4
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Callable

from benchmarks.peers_report import machine

PROMPT = "The capital of France is a city that many people"


def median_ms(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    from radixserve import Engine

    kw = {"dtype": args.dtype, **({"quantization": args.quantization} if args.quantization else {})}
    with Engine(args.model, **kw) as eng:
        params = {"max_new_tokens": args.tokens, "temperature": 0, "ignore_eos": True}
        call = lambda: eng.generate(PROMPT, params)  # noqa: E731

        def on_a_new_thread() -> None:
            t = threading.Thread(target=call)
            t.start()
            t.join()

        call()  # warm-up
        main_ms = median_ms(call, args.reps)
        thread_ms = median_ms(on_a_new_thread, args.reps)
        again_ms = median_ms(call, args.reps)
    print("machine:", machine())
    print(f"generate {args.tokens} tokens, median of {args.reps}: main thread {main_ms:.1f} ms, "
          f"a new thread each call {thread_ms:.1f} ms, main thread again {again_ms:.1f} ms")


if __name__ == "__main__":
    main()
