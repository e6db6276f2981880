"""The scheduler process's loop (``radixserve.scheduler.process``): a failed worker step
aborts only its own requests, the others finish with the same output."""
from __future__ import annotations

from tests.helpers.models import make_engine
from radixserve.config import EngineConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.build import build_scheduler
from radixserve.scheduler.process import SchedulerLoop
from radixserve.scheduler.req import Req
from radixserve.tokenizer import load_light_tokenizer
from radixserve.worker.build import build_worker
from radixserve.worker.remote import WorkerStepError


def test_failed_step_aborts_only_its_requests(tiny_dir):
    # the scheduler process's wiring (worker/build + scheduler/build), here over a local runner
    cfg = EngineConfig.from_kwargs(tiny_dir, dtype="float32", max_total_tokens=2048)
    real, info = build_worker(cfg, show_progress=False)
    sched = build_scheduler(cfg, real, info, load_light_tokenizer(tiny_dir))

    class Flaky:
        def step(self, plan):
            if any(r.rid == "bad" for r in plan.reqs):
                raise WorkerStepError("boom", plan)
            return real.step(plan)

    sched.worker = Flaky()
    loop = SchedulerLoop.__new__(SchedulerLoop)
    loop.sched = sched
    good = Req("good", list(range(100, 160)), SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True))
    bad = Req("bad", list(range(200, 290)), SamplingParams(max_new_tokens=12, ignore_eos=True))
    sched.add_request(good)
    loop.step()  # prefill of "good" alone
    sched.add_request(bad)
    loop.step()  # prefill of "bad" alone: fails
    assert bad.finish_reason["type"] == "abort" and "boom" in bad.finish_reason["message"]
    while not good.finished:
        loop.step()
    assert good.finish_reason == {"type": "length", "length": 12}
    ref = make_engine(tiny_dir).generate(input_ids=good.input_ids, sampling_params={"max_new_tokens": 12,
                                                                                   "temperature": 0})
    assert good.output_ids == ref["output_ids"]
    sched.check_invariants()
    s = sched.stats()
    assert s["num_slots"] - s["free_slots"] - s["cache_size"] == 0 and not sched.running
