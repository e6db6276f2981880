"""In-process units of the serving runtime: stop-string-safe detokenization, output deltas,
error messages, and a failed worker step aborting only its own requests."""
from __future__ import annotations

from conftest import make_engine
from radixserve.tokenizer import load_light_tokenizer
from radixserve.detokenizer.process import DetokState, safe_text_len
from radixserve.ipc.server_link import ReqOutput
from radixserve.sampling_params import SamplingParams
from radixserve.config import EngineConfig
from radixserve.scheduler.build import build_scheduler
from radixserve.scheduler.outputs import take_output
from radixserve.scheduler.process import SchedulerLoop
from radixserve.scheduler.req import Req
from radixserve.server.protocol import validation_message
from radixserve.worker.build import build_worker
from radixserve.worker.remote import WorkerStepError


def test_safe_text_len_holds_back_stop_prefixes():
    assert safe_text_len("hello wor", ("world",)) == len("hello ")
    assert safe_text_len("hello world!", ("world",)) == len("hello ")
    assert safe_text_len("hello", ("xyz",)) == 5
    assert safe_text_len("abcab", ("abd", "x")) == 3
    assert safe_text_len("xxabc", ("abc", "b")) == 2


def test_detok_stream_never_shows_stop_string(tiny_dir):
    tok = load_light_tokenizer(tiny_dir)
    ids = tok.encode("The cat sat on the mat. The end.")
    state, shown = DetokState(tok, True, ("on the",)), ""
    for i, t in enumerate(ids):
        done = i == len(ids) - 1
        out = ReqOutput("r", [t], {"type": "stop", "matched": "on the"} if done else None)
        state.update(out)
        shown = out.final_text if done else shown + out.text
        assert "The cat sat ".startswith(shown), shown  # always a prefix of the final, trimmed text
    assert shown == "The cat sat "


def test_take_output_deltas():
    req = Req("r", [1, 2, 3], SamplingParams(max_new_tokens=4))
    req.arrival = 0.0
    req.output_ids += [7, 8]
    a = take_output(req, 1.5)
    assert a.new_ids == [7, 8] and a.queue_time == 1.5 and not a.finished
    assert take_output(req, 2.0) is None
    req.output_ids.append(9)
    req.finish_reason = {"type": "length", "length": 3}
    b = take_output(req, 2.0)
    assert b.new_ids == [9] and b.finished and b.queue_time is None and b.completion_tokens == 3


def test_validation_message_names_the_field():
    errs = [{"loc": ("body", "sampling_params", "SamplingParamsIn", "top_p"), "msg": "bad", "type": "x"}]
    assert validation_message(errs) == "sampling_params.top_p: bad"
    errs = [{"loc": ("body", "input_ids", "list[int]", 1), "msg": "bad", "type": "x"}]
    assert validation_message(errs) == "input_ids.1: bad"


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
