"""Would overlapping the scheduler with the worker pay on this machine?

Part 1 (where a step's time goes): the in-process ``Engine`` runs ``--batch`` requests
(``--prompt-len`` random tokens, ``--output-len`` greedy tokens, ``ignore_eos``) and times every
decode step at the full batch in four parts: planning (``Scheduler.step`` up to the worker
call), the worker step (``ModelRunner.step``), processing the result (the rest of
``Scheduler.step``), and what the server's scheduler process adds per step around it:
pickling the plan and unpickling the result (the ZeroMQ link to the worker) and building and
pickling the token deltas for the detokenizer (``take_output``).  The first, third and fourth
are what an overlap scheduler (prepare step i+1 while the worker computes step i) could hide.

Part 2 (whether hiding it is free): a second run alternates plain decode steps with steps
during which a second process burns as much CPU as the scheduler's share measured in part 1
(the overlap's best case: all of it runs concurrently with the worker); alternating step by
step lets both kinds see the same background load.  Overlap pays when such a step takes
less than the serial worker step + scheduler share; on a machine whose cores the worker's
OpenMP threads already use, the concurrent work slows the worker instead.

    .venv/bin/python -m benchmarks.bench_overlap --batch 1 64
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import statistics
import time
from typing import Any

from benchmarks.report import write_json


def spinner(conn) -> None:
    """Child: for each number of seconds received, burn CPU that long, then answer."""
    x = 0
    while True:
        secs = conn.recv()
        if secs is None:
            return
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            x = (x * 31 + 7) % 1000003  # busy Python work, like planning
        conn.send(True)


class TimedWorker:
    """Wraps the engine's worker: times each step; optionally runs ``burn`` s of CPU in the
    spinner process during it; records the scheduler-side pickling of plan and result."""

    def __init__(self, inner: Any, conn) -> None:
        self.inner, self.conn = inner, conn
        self.burn = 0.0
        self.log: list[dict] = []

    def step(self, plan: Any) -> Any:
        t0 = time.perf_counter()
        wire = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        t1 = time.perf_counter()
        if self.burn:
            self.conn.send(self.burn)
        result = self.inner.step(plan)
        t2 = time.perf_counter()
        if self.burn:
            self.conn.recv()
        t3 = time.perf_counter()
        pickle.loads(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        t4 = time.perf_counter()
        self.log.append({"decode": plan.decode, "n": len(plan.reqs), "start": t0, "worker": t2 - t1,
                         "overlapped": t3 - t1, "ipc": (t1 - t0) + (t4 - t3), "end": t4, "bytes": len(wire)})
        return result


def run(eng: Any, tw: TimedWorker, batch: int, args: argparse.Namespace, burn: float) -> list[dict]:
    import numpy as np

    from radixserve.ipc.server_link import BatchReqOutput
    from radixserve.scheduler.outputs import take_output

    rng = np.random.default_rng(batch)
    prompts = [rng.integers(100, eng.info.vocab_size - 100, args.prompt_len).tolist() for _ in range(batch)]
    params = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)

    def drive(sched) -> list[dict]:
        rows = []
        for r in reqs:
            sched.add_request(r)
        while sched.has_work():
            tw.log.clear()
            tw.burn = burn if len(rows) % 2 else 0.0  # every other full-batch decode step
            t0 = time.perf_counter()
            touched = sched.step()
            t1 = time.perf_counter()
            pickle.dumps(BatchReqOutput([o for o in (take_output(r, t0) for r in touched) if o is not None]))
            t2 = time.perf_counter()
            if len(tw.log) == 1 and tw.log[0]["decode"] and tw.log[0]["n"] == batch:
                w = tw.log[0]
                rows.append({"burnt": tw.burn > 0, "plan": w["start"] - t0, "worker": w["worker"],
                             "overlapped": w["overlapped"],
                             "process": t1 - w["end"], "ipc": w["ipc"], "emit": t2 - t1, "bytes": w["bytes"]})
        tw.burn = 0.0
        return rows

    return eng.run_on_driver(drive)


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    from radixserve import Engine

    eng = Engine(args.model, dtype=args.dtype, max_total_tokens=max(args.batch) * (args.prompt_len + args.output_len)
                 + 1024)
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=spinner, args=(child,), daemon=True)
    proc.start()
    tw = TimedWorker(eng.runner, parent)
    eng.run_on_driver(lambda s: setattr(s, "worker", tw))
    eng.generate("warm up", {"max_new_tokens": 4})
    report = []
    for batch in args.batch:
        serial = run(eng, tw, batch, args, 0.0)
        sched_s = med(serial, "plan") + med(serial, "process") + med(serial, "ipc") + med(serial, "emit")
        mixed = run(eng, tw, batch, args, sched_s)
        plain, over = [r for r in mixed if not r["burnt"]], [r for r in mixed if r["burnt"]]
        worker = med(plain, "worker")
        row = {"batch": batch, "steps": len(serial),
               **{k: med(serial, k) for k in ("plan", "process", "ipc", "emit", "bytes")},
               "worker": worker, "scheduler_share": sched_s, "serial_step": worker + sched_s,
               "overlapped_step": med(over, "overlapped")}
        row["saving"] = row["serial_step"] - row["overlapped_step"]
        report.append(row)
        print(f"batch {batch}: worker {row['worker'] * 1e3:.2f} ms; scheduler share {sched_s * 1e3:.2f} ms "
              f"(plan {row['plan'] * 1e3:.2f}, process {row['process'] * 1e3:.2f}, ipc pickling "
              f"{row['ipc'] * 1e3:.2f}, output {row['emit'] * 1e3:.2f}; plan {row['bytes']} B) = "
              f"{sched_s / row['serial_step']:.1%} of a serial step {row['serial_step'] * 1e3:.2f} ms; "
              f"with the share burnt concurrently: {row['overlapped_step'] * 1e3:.2f} ms "
              f"(saves {row['saving'] * 1e3:+.2f} ms)", flush=True)
    parent.send(None)
    proc.join(5)
    write_json(args.json_out, {"args": vars(args), "rows": report})
    eng.shutdown()


if __name__ == "__main__":
    main()
