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


def test_the_local_worker_keeps_the_worker_process_contract(tiny_dir):
    """With one rank the scheduler process runs the model itself (``worker/local.py``): a step
    that raises fails only that step (``WorkerStepError`` with the plan), and a warm-restart,
    LoRA or tier request that raises gets the refusal a worker process would send."""
    import numpy as np

    from radixserve.ipc.lora_link import LoRAReq
    from radixserve.ipc.persist_link import KVRestoreReq, KVSaveReq
    from radixserve.ipc.tier_link import KVTierReq
    from radixserve.worker.local import LocalWorker

    cfg = EngineConfig.from_kwargs(tiny_dir, dtype="float32", max_total_tokens=2048)
    real, info = build_worker(cfg, show_progress=False)

    class Flaky:  # the runner raises as a real one would (a bad request, a kernel error)
        def step(self, plan):
            if any(r.rid == "bad" for r in plan.reqs):
                raise RuntimeError("boom")
            return real.step(plan)

        def lora_request(self, req):
            raise OSError("adapter folder gone")

    local = LocalWorker(Flaky(), info)
    assert local.wait_ready() is info
    sched = build_scheduler(cfg, local, info, load_light_tokenizer(tiny_dir))
    loop = SchedulerLoop.__new__(SchedulerLoop)
    loop.sched = sched
    good = Req("good", list(range(100, 160)), SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True))
    bad = Req("bad", list(range(200, 290)), SamplingParams(max_new_tokens=12, ignore_eos=True))
    sched.add_request(good)
    loop.step()
    sched.add_request(bad)
    loop.step()
    assert bad.finish_reason["type"] == "abort" and "RuntimeError: boom" in bad.finish_reason["message"]
    while not good.finished:
        loop.step()
    ref = make_engine(tiny_dir).generate(input_ids=good.input_ids, sampling_params={"max_new_tokens": 12,
                                                                                   "temperature": 0})
    assert good.output_ids == ref["output_ids"] and local.num_steps >= 3
    sched.check_invariants()
    s = sched.stats()
    assert s["num_slots"] - s["free_slots"] - s["cache_size"] == 0 and not sched.running
    # no warm-restart store, no tiers: the requests are refused, never raised
    saved = local.save_prefixes(KVSaveReq([], np.zeros(0, dtype=np.int64)))
    assert saved.ok is False and saved.message
    assert local.restore_prefixes(KVRestoreReq(np.zeros(0, dtype=np.int64))).message.startswith("worker error")
    assert local.lora_request(LoRAReq("load", "a", "/nowhere")).error.startswith("lora_path: worker error: OSError")
    tiers = local.apply_tiers(KVTierReq([object(), object()]))
    assert tiers.failed == [0, 1] and tiers.message
