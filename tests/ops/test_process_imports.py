"""Which serving processes import transformers and torch (docs/ARCHITECTURE.md, "Serving processes").

Importing transformers costs seconds of CPU in each process that does, most of a tiny-model
server's start, and torch one to two more.  The detokenizer and the scheduler tokenize with the
Rust ``tokenizers`` library, and a model worker (every TP and PP rank) reads a config it has
read before from ``loader.load_config``'s snapshot; only the server process imports
transformers, for chat templates.  Only the model workers (every rank) import torch: the
scheduler's KV bookkeeping and grammar masks are numpy.  The detokenizer's and the scheduler's
paths (decoding, a grammar's vocabulary) run in a fresh interpreter each, a whole two-rank
server under an import watch; and the snapshot reads like the config for every family.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radixserve.model.config_snapshot import ConfigSnapshot
from tests.helpers.families import FAMILIES
from tests.helpers.server_harness import ServerHandle, process_names

REPO = Path(__file__).resolve().parents[2]


def run_fresh(code: str, **values: str) -> dict:
    """Run ``code`` (``values`` bound as globals) in a new interpreter; the JSON it prints last."""
    prelude = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_detokenizer_never_imports_transformers(tiny_dir):
    out = run_fresh("""
        import json, sys
        from radixserve.detokenizer.process import Detokenizer, run_detokenizer  # noqa: F401 (the entry module)
        from radixserve.ipc.server_link import BatchReqOutput, ReqOutput
        from radixserve.tokenizer import load_light_tokenizer

        tok = load_light_tokenizer(TINY)
        ids = tok.encode("Grüße, 世界! 🙂") + [tok.eos_token_id]
        detok = Detokenizer(tok)
        text = "".join(detok.process(BatchReqOutput([ReqOutput("r", [i])])).outputs[0].text for i in ids[:-1])
        last = detok.process(BatchReqOutput([ReqOutput("r", ids[-1:], finish_reason={"type": "stop"})])).outputs[0]
        print(json.dumps({"transformers": "transformers" in sys.modules, "text": text + last.text}))
    """, TINY=tiny_dir)
    assert out == {"transformers": False, "text": "Grüße, 世界! 🙂"}


def test_the_scheduler_never_imports_transformers_or_torch(tiny_dir):
    # the process's module, the scheduler over the worker's report, a plain request's step
    # plan (its KV slots and row), and a JSON-schema request's grammar: the vocabulary comes
    # from the light tokenizer, the mask is numpy
    out = run_fresh("""
        import json, sys, time
        from radixserve.config import EngineConfig
        from radixserve.ipc.worker_link import WorkerInfo
        from radixserve.sampling_params import SamplingParams
        from radixserve.scheduler.build import build_scheduler
        from radixserve.scheduler.process import run_scheduler  # noqa: F401 (the entry module)
        from radixserve.scheduler.req import Req
        from radixserve.tokenizer import load_light_tokenizer

        tok = load_light_tokenizer(TINY)
        cfg = EngineConfig.from_kwargs(TINY, dtype="float32", max_total_tokens=2048)
        info = WorkerInfo(num_slots=2048, max_rows=8, context_len=1024, vocab_size=len(tok), dtype="float32",
                          device="cpu", hf_dir=TINY)
        sched = build_scheduler(cfg, None, info, tok)
        plain = Req("p", tok.encode("Hello there"), SamplingParams(max_new_tokens=4))
        sched.add_request(plain)
        plan = sched._prefill_plan()[0]
        planned = len(plan.reqs) == 1 and plan.reqs[0].slots.tolist() == list(range(1, len(plain.input_ids) + 1))
        torch_before_grammar = "torch" in sys.modules
        req = Req("r", tok.encode("JSON:"), SamplingParams(max_new_tokens=8, json_schema={"type": "object"}))
        sched.grammars.add(req)
        deadline = time.monotonic() + 120
        ready = []
        while not ready and time.monotonic() < deadline:
            sched.grammars.wait(0.1)
            ready, failed = sched.grammars.ready()
            assert not failed, failed
        req.grammar = ready[0][1]
        allowed = int(sched.grammars.mask(req).sum())
        print(json.dumps({"transformers": "transformers" in sys.modules, "some_allowed": allowed > 0,
                          "planned": planned, "torch": [torch_before_grammar, "torch" in sys.modules]}))
    """, TINY=tiny_dir)
    assert out == {"transformers": False, "some_allowed": True, "planned": True, "torch": [False, False]}


WATCH = """
import os, sys


class _Watch:
    \"\"\"Leaves a file NAME-PID the first time anything in this process imports NAME.\"\"\"

    done = set()

    def find_spec(self, name, path=None, target=None):
        if name in ("transformers", "torch") and name not in self.done:
            self.done.add(name)
            open(os.path.join(os.environ["RS_TEST_MARKS"], f"{name}-{os.getpid()}"), "w").close()
        return None


sys.meta_path.insert(0, _Watch())
"""


def test_only_the_server_imports_transformers_and_only_the_ranks_torch(tiny_dir, tmp_path, monkeypatch):
    # the real processes of a two-rank server on a config read before (the model worker is
    # rank 0): a sitecustomize in every interpreter reports who imports transformers and torch
    from radixserve.model.loader import load_config

    load_config(tiny_dir)  # the first read (this process has transformers): keeps the snapshot
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(WATCH)
    (tmp_path / "marks").mkdir()
    path = [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    monkeypatch.setenv("RS_TEST_MARKS", str(tmp_path / "marks"))
    srv = ServerHandle(tiny_dir, "--tp-size", "2", "--max-total-tokens", "2048")
    try:
        srv.wait_ready()
        with srv.client() as c:  # one request through every process
            out = c.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
        assert out.status_code == 200, out.text
        names = process_names(srv.proc.pid)
        marks = [p.name.split("-") for p in (tmp_path / "marks").iterdir()]
        imported = {mod: sorted(names.get(int(pid), pid) for mod_, pid in marks if mod_ == mod and int(pid) != srv.proc.pid)
                    for mod in ("transformers", "torch")}
    finally:
        srv.stop()
    assert {"rs-scheduler", "rs-detokenizer", "rs-worker"} <= set(names.values()), names
    assert imported["transformers"] == [], f"these processes imported transformers: {imported['transformers']}"
    ranks = {n for n in names.values() if n not in ("server", "rs-scheduler", "rs-detokenizer")}
    assert "rs-worker" in imported["torch"] and set(imported["torch"]) <= ranks, imported["torch"]


def _reads(config, name: str):
    try:
        return "value", getattr(config, name)
    except AttributeError:
        return "AttributeError", None
    except Exception:
        return "raises", None


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_config_snapshot_reads_like_the_config(family, tmp_path, monkeypatch):
    from transformers import AutoConfig

    from radixserve.model import loader
    from radixserve.model.layers.rotary import rope_parameters

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / "cache"))
    cls, kw = FAMILIES[family]()
    folder = str(tmp_path / family)
    cls(**kw).save_pretrained(folder)
    first, again, real = loader.load_config(folder), loader.load_config(folder), AutoConfig.from_pretrained(folder)
    assert not isinstance(first, ConfigSnapshot)
    if isinstance(again, type(real)):  # a RoPE variant: its reference functions take the real config
        layer_types = {None, *(getattr(real, "layer_types", None) or ())}
        assert {rope_parameters(real, t)["rope_type"] for t in layer_types} != {"default"}
        return
    assert isinstance(again, ConfigSnapshot)
    names = {n for n in dir(real) if not n.startswith("__")} | set(getattr(real, "attribute_map", {}))
    for name in names:
        if name in again._snapshot_left_out:  # a method, or a value that is not plain data: never a default
            assert name == "to_dict" or _reads(again, name) == ("raises", None), name
        else:
            assert _reads(again, name) == _reads(real, name), name
    assert {n for n in vars(again) if not n.startswith("_snapshot_")} <= names
    assert again.to_dict() == real.to_dict()
    assert _reads(again, "no_such_attribute") == ("AttributeError", None)
