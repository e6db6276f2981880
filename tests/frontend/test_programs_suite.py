"""The programs suite (benchmarks/programs/) in small: every workload of ``registry.WORKLOADS``,
two runs at a small ``scale`` (the tiny model's context is 1024 tokens), in process through
``frontend_lang.Runtime`` and over HTTP through ``RuntimeEndpoint`` on the session's tiny-model
server.  Greedy, so both must give identical outputs; every select's decision is one of its
choices and is in the outputs; the features a workload declares are exactly those it uses; every
gen has an explicit token budget; no request holds a KV slot afterwards (``kv_invariants``).
No timing is asserted."""
from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.programs.registry import WORKLOADS
from benchmarks.programs.spec import FEATURES, Workload
from frontend_lang import Backend
from frontend_lang.executor import StreamExecutor

pytestmark = pytest.mark.usefixtures("kv_invariants")  # conftest.py

N, SCALE = 2, 0.15


class Recording(Backend):
    """Passes every call to ``inner`` and notes the features the calls use in ``used``."""

    def __init__(self, inner: Backend, used: set[str], budgets: list[Any]) -> None:
        self.inner, self.used, self.budgets = inner, used, budgets

    def generate(self, text, sampling_params, options, on_text=None):
        self.used.add("gen")
        self.used.update(k for k in ("regex", "json_schema", "stop") if sampling_params.get(k))
        self.budgets.append((sampling_params.get("max_new_tokens"), sampling_params.get("temperature")))
        return self.inner.generate(text, sampling_params, options, on_text)

    def cache_prefix(self, text=None, input_ids=None, priority=None, lora_path=None):
        return self.inner.cache_prefix(text=text, input_ids=input_ids, priority=priority)

    def tokenize(self, texts):
        return self.inner.tokenize(texts)

    def prompt_logprobs(self, input_ids, logprob_start_len, priority=None, lora_path=None):
        self.used.add("select")
        return self.inner.prompt_logprobs(input_ids, logprob_start_len, priority)

    def chat_template(self):
        self.used.add("chat")
        return self.inner.chat_template()


@pytest.fixture(scope="module")
def runtime(tiny_dir):
    """The in-process backend, configured like the tiny server (fp32, pinned dense path, the
    same KV pool and prefill chunk) so greedy decoding agrees token for token."""
    from frontend_lang import Runtime
    from tests.helpers.models import pinned_dense_kernel

    rt = Runtime(tiny_dir, dtype="float32", dense_kernel=pinned_dense_kernel(tiny_dir), max_total_tokens=8192,
                 chunked_prefill_size=256)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def suite() -> dict[str, Workload]:
    return {name: make(N, 0, scale=SCALE) for name, make in WORKLOADS.items()}


def select_decisions(state) -> dict[str, Any]:
    """Every select of the run: variable -> its decision (a list for a select made in fork
    branches), after checking that each decision is one of its choices."""
    out = {}
    for name, meta in state._ex.meta_info.items():
        metas = meta if isinstance(meta, list) else [meta]
        if metas and all(isinstance(m, dict) and "decision" in m for m in metas):
            for m in metas:
                assert m["decision"] in m["choices"] and m["choices"][m["decision_index"]] == m["decision"]
            out[name] = [m["decision"] for m in metas] if isinstance(meta, list) else meta["decision"]
    return out


def test_the_registry_lists_the_suite_in_order(suite):
    assert list(WORKLOADS) == ["mmlu", "hellaswag", "tree_of_thought", "branch_solve_merge", "skeleton_of_thought",
                               "react_agent", "json_regex", "json_schema", "multi_turn_short", "multi_turn_long",
                               "rag_pipeline"]
    for name, w in suite.items():
        assert w.name == name and len(w.args) == N and w.features <= FEATURES
        assert w.sampling == {"temperature": 0.0}
        json.dumps(w.args)  # plain data: any runner can log or ship it
        again = WORKLOADS[name](N, 0, scale=SCALE)
        assert again.args == w.args  # deterministic given the seed
        assert WORKLOADS[name](N, 1, scale=SCALE).args != w.args


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_agrees_in_process_and_over_http(name, suite, runtime, http_backend, monkeypatch):
    w = suite[name]
    used: set[str] = set()
    budgets: list[Any] = []
    fork = StreamExecutor.fork

    def recording_fork(self, n):
        used.add("fork")
        return fork(self, n)

    monkeypatch.setattr(StreamExecutor, "fork", recording_fork)
    local = w.function.run_batch(w.args, backend=Recording(runtime, used, budgets), **w.sampling)
    remote = w.function.run_batch(w.args, backend=http_backend, **w.sampling)
    for st in local + remote:
        assert st.error() is None, st.error()
    outs = [w.outputs(st) for st in local]
    assert json.loads(json.dumps(outs)) == outs
    assert [w.outputs(st) for st in remote] == outs  # greedy: the same text on both backends
    for st, out in zip(local + remote, outs + outs):
        for var, decision in select_decisions(st).items():
            assert out[var] == decision, (var, out)
    assert used == w.features, f"{name} declares {sorted(w.features)} but uses {sorted(used)}"
    assert all(m is not None and t == 0.0 for m, t in budgets), budgets  # explicit budgets, greedy
