"""``document(text)`` in frontend_lang (radixserve's issue 46): text appended as a document, sent
to /generate (or the Engine) as ``segments`` when a gen's prompt holds documents, as ``text``
otherwise."""
from __future__ import annotations

import json

import httpx
import pytest

import frontend_lang as fl
from frontend_lang.backend.base import Backend, segments_of
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.transcript import Transcript


def test_segments_of_cuts_the_text_at_the_documents():
    assert segments_of("Q: AB?", [(3, 4), (4, 5)]) == [
        {"text": "Q: "}, {"text": "A", "document": True}, {"text": "B", "document": True}, {"text": "?"}]
    assert segments_of("AB", [(0, 2)]) == [{"text": "AB", "document": True}]


def test_the_transcript_keeps_the_document_ranges():
    t = Transcript()
    t.append("Q: ")
    t.append_document("doc one")
    t.append_document("")  # marks nothing
    t.append(" then ")
    t.append_document("doc two")
    assert t.text == "Q: doc one then doc two" and t.documents == [(3, 10), (16, 23)]
    assert t.copy().documents == t.documents and t.copy().documents is not t.documents


def test_document_wants_a_string():
    with pytest.raises(TypeError, match="^document: text must be a str"):
        fl.document(5)


class Recording(Backend):
    """A backend with the old ``generate`` signature (no ``documents``), recording its calls."""

    def __init__(self, accepts_documents: bool) -> None:
        self.calls: list[tuple[str, object]] = []
        if accepts_documents:
            self.generate = self._generate_docs  # type: ignore[method-assign]

    def generate(self, text, sampling_params, options, on_text=None):
        self.calls.append((text, None))
        return "!", {}

    def _generate_docs(self, text, sampling_params, options, on_text=None, documents=None):
        self.calls.append((text, documents))
        return "!", {}

    def cache_prefix(self, text=None, input_ids=None, priority=None, lora_path=None):
        pass

    def tokenize(self, texts):
        return [[ord(c) for c in t] for t in texts]

    def prompt_logprobs(self, input_ids, logprob_start_len, priority=None, lora_path=None):
        raise NotImplementedError

    def chat_template(self):
        return ChatTemplate(None, {})


@fl.function
def rag(s, docs, question):
    s += "Context:"
    for d in docs:
        s += fl.document(d)
    s += question + fl.gen("answer", max_tokens=2)


@fl.function
def plain(s, question):
    s += "Context:" + question + fl.gen("answer", max_tokens=2)


def test_a_gen_after_documents_sends_their_ranges_and_plain_programs_do_not():
    be = Recording(accepts_documents=True)
    rag.run(docs=[" A.", " B."], question=" Q?", backend=be)
    assert be.calls == [("Context: A. B. Q?", [(8, 11), (11, 14)])]
    old = Recording(accepts_documents=False)  # a backend written before documents still runs plain programs
    plain.run(question=" Q?", backend=old)
    assert old.calls == [("Context: Q?", None)]


def test_the_runtime_endpoint_sends_segments_only_with_documents():
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"text": "x", "output_ids": [1], "meta_info": {"finish_reason": None}})

    be = fl.RuntimeEndpoint("http://test")
    be._client = httpx.Client(base_url="http://test", transport=httpx.MockTransport(handler))
    be.generate("Q: AB", {"max_new_tokens": 1}, {}, documents=[(3, 4)])
    be.generate("Q: AB", {"max_new_tokens": 1}, {})
    assert bodies[0] == {"segments": [{"text": "Q: "}, {"text": "A", "document": True}, {"text": "B"}],
                         "sampling_params": {"max_new_tokens": 1}}
    assert bodies[1] == {"text": "Q: AB", "sampling_params": {"max_new_tokens": 1}}
    be.shutdown()


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def generate(self, *args, **kw):
        self.calls.append((args, kw))
        return {"text": "x", "output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}}


def test_the_engine_backend_passes_segments_only_with_documents():
    eng = FakeEngine()
    be = fl.EngineBackend(eng)
    be.generate("Q: AB", {"max_new_tokens": 1}, {}, documents=[(3, 5)])
    be.generate("Q: AB", {"max_new_tokens": 1}, {})
    (args, kw), (args2, kw2) = eng.calls
    assert args[0] is None and kw == {"segments": [{"text": "Q: "}, {"text": "AB", "document": True}]}
    assert args2[0] == "Q: AB" and kw2 == {}


def test_documents_run_on_both_backends(backend, tok):
    state = rag.run(docs=[" Cats sit on mats.", " Dogs sit on logs."], question=" Who sits on logs?",
                    temperature=0, document_recompute=1.0, backend=backend)
    meta = state.get_meta_info("answer")
    assert meta["document_reused_tokens"] >= 0 and meta["document_recomputed_tokens"] >= 0
    want = sum(len(tok.encode(t, add_special_tokens=False))
               for t in ("Context:", " Cats sit on mats.", " Dogs sit on logs.", " Who sits on logs?"))
    assert meta["prompt_tokens"] == want
    assert state.text().startswith("Context: Cats sit on mats. Dogs sit on logs. Who sits on logs?")
