"""``PipelineRunner``: one step of a pipeline-parallel worker, on every rank of every stage.

Every rank gets the same step plan (world rank 0 broadcasts it, as under tensor parallelism)
and cuts it into the same micro-batches (``micro.split_plan``).  Each stage runs its
``ModelRunner`` over each micro-batch in order; the model itself takes the previous stage's
hidden states and hands its own on (``DecoderLM.final_hidden`` over ``parallel/p2p.py``), so
with ``M`` micro-batches and ``S`` stages the schedule is GPipe's forward pass::

    stage 0:  F1 F2 F3 F4 .  .  .   (then waits for the results)
    stage 1:  .  F1 F2 F3 F4 .  .
    stage 2:  .  .  F1 F2 F3 F4 .   (samples each micro-batch, sends its result to rank 0)

Sends do not wait for the receiver, so stage ``s`` computes micro-batch ``k + 1`` while stage
``s + 1`` computes ``k``; with equal stage times the idle share of a step is
``(S - 1) / (M + S - 1)``.  The last stage's rank 0 samples (its ``ModelRunner`` holds the
sampling states, seeded per request, so the tokens are those of one process) and sends each
micro-batch's ``StepResult`` to world rank 0, which concatenates them in order and returns the
step's result; the other ranks return an empty one (dropped, like a TP follower's).

Failures: a step that raises on the last stage is reported to rank 0 in place of its result
(rank 0 raises it, so the scheduler fails that step's requests and serving goes on); one that
raises on another stage cannot be finished by the stages after it, so it ends the rank
(``PeerLost``) and the group goes down as for a dead stage.

``RADIXSERVE_PP_STATS=DIR`` (benchmarks): each rank writes its step counters (wall and waiting
seconds, steps, micro-batches) to ``DIR/rank<R>.json`` after every step.
"""
from __future__ import annotations

import json
import os
import time
import traceback
from typing import Any

from radixserve.ipc.worker_link import StepPlan, StepResult
from radixserve.parallel.group import PeerLost
from radixserve.worker.pp.micro import split_plan


class StageStepError(RuntimeError):
    """A micro-batch failed on the last stage (its message, from that stage)."""


class PipelineRunner:
    """Wraps this rank's ``ModelRunner``; the same ``step`` (and attributes) as a ``ModelRunner``."""

    def __init__(self, runner: Any, pipe: Any, micro_batches: int) -> None:
        self.runner = runner
        self.pipe = pipe
        self.micro_batches = micro_batches or pipe.count
        self.stats = {"rank": pipe.world_rank, "stage": pipe.index, "steps": 0, "micro_batches": 0,
                      "step_s": 0.0, "wait_s": 0.0}
        self._stats_dir = os.environ.get("RADIXSERVE_PP_STATS")

    def __getattr__(self, name: str) -> Any:  # numerics, kv_pool, states, ... of the wrapped runner
        return getattr(self.__dict__["runner"], name)

    def step(self, plan: StepPlan) -> StepResult:
        t0, wait0 = time.perf_counter(), self.pipe.wait_s
        parts = split_plan(plan, self.micro_batches)
        for part in parts:
            result = self._run(part)
            if self.pipe.returns_results:
                self.pipe.send_result(result)
        self.pipe.flush()
        merged = self._collect(len(parts)) if self.pipe.world_rank == 0 else StepResult([])
        self._account(t0, wait0, len(parts) if plan.reqs else 0)
        if isinstance(merged, StageStepError):
            raise merged
        return merged

    def _run(self, part: StepPlan) -> Any:
        try:
            return self.runner.step(part)
        except Exception as e:
            if not self.pipe.returns_results:  # the stages after this one would wait forever
                raise PeerLost(f"pipeline stage {self.pipe.index} failed a step:\n{traceback.format_exc()}") from e
            return StageStepError(f"{type(e).__name__}: {e}")

    def _collect(self, n: int) -> Any:
        """Rank 0: the ``n`` micro-batch results, concatenated (the first error instead, once all came)."""
        outputs, error = [], None
        for _ in range(n):
            got = self.pipe.recv_result()
            if isinstance(got, StageStepError):
                error = error or got
            else:
                outputs.extend(got.outputs)
        return error if error is not None else StepResult(outputs)

    def _account(self, t0: float, wait0: float, parts: int) -> None:
        s = self.stats
        s["steps"] += 1
        s["micro_batches"] += parts
        s["step_s"] += time.perf_counter() - t0
        s["wait_s"] += self.pipe.wait_s - wait0
        if self._stats_dir:
            path = os.path.join(self._stats_dir, f"rank{self.pipe.world_rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(s, f)
            os.replace(path + ".tmp", path)
