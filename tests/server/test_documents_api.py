"""The front door of order-free document reuse (issue 46): ``segments`` on /generate and the
Engine, ``"document": true`` on a chat text part, ``document_recompute`` (request and server),
the spans carried to the scheduler's ``Req`` and the ``document_*`` counters of ``meta_info``.

The scheduler's reuse itself is tested elsewhere; here: ids, spans, validation, response keys.
"""
from __future__ import annotations

import asyncio

import pytest

from radixserve.config import SchedulerConfig
from radixserve.ipc.server_link import TokenizedRequest
from radixserve.output_state import OutputState
from radixserve.request_builder import Limits, RequestBuilder, split_prompts
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.build import new_req
from radixserve.scheduler.outputs import take_output
from radixserve.scheduler.req import Req
from radixserve.tokenizer import check_spans, encode_segments, parse_prompt, special_tokens, split_segments
from tests.helpers.server_harness import shared_server

BOS, EOS = 1, 2


def plain(text: str) -> list[int]:
    return [ord(c) for c in text]


def with_bos(text: str) -> list[int]:
    return [BOS, *plain(text)]


def segs(*items) -> list:
    return [dict(text=x) if isinstance(x, str) else x for x in items]


def doc(text: str) -> dict:
    return {"text": text, "document": True}


# ---------------------------------------------------------------- ids and spans


def test_documents_are_their_own_tokens_and_the_bos_comes_once_outside_them():
    ids, spans = encode_segments(parse_prompt(segs("Q", doc("ab"), doc("cd"), {"text": ""}, doc(""),
                                                   {"input_ids": [7, 8], "document": True}, "?"), "segments"),
                                 with_bos, plain)
    assert ids == [BOS, ord("Q"), 97, 98, 99, 100, 7, 8, ord("?")]
    assert spans == [(2, 4), (4, 6), (6, 8)]  # adjacent documents stay separate; empty ones are skipped
    ids, spans = encode_segments(parse_prompt([doc("ab")], "segments"), with_bos, plain)
    assert ids == [BOS, 97, 98] and spans == [(1, 3)]  # a leading document starts after the BOS


def test_consecutive_plain_text_is_encoded_as_one_piece():
    pairs: list[str] = []

    def encode_plain(text: str) -> list[int]:
        pairs.append(text)
        return plain(text)

    encode_segments(parse_prompt(segs("a", "b", doc("D"), "c", {"input_ids": [5]}, "d"), "s"), with_bos, encode_plain)
    assert pairs == [special_tokens_probe(), "ab", "D", "c", "d"]


def special_tokens_probe() -> str:
    from radixserve.tokenizer import _PROBE

    return _PROBE


def test_special_tokens_found_around_the_text():
    assert special_tokens(with_bos, plain) == ([BOS], [])
    assert special_tokens(lambda t: [BOS, *plain(t), EOS], plain) == ([BOS], [EOS])
    assert special_tokens(plain, plain) == ([], [])
    ids, spans = encode_segments(parse_prompt(segs("x", doc("y")), "s"), lambda t: [BOS, *plain(t), EOS], plain)
    assert ids == [BOS, ord("x"), ord("y"), EOS] and spans == [(2, 3)]  # a suffix never inside a document


def test_without_documents_the_ids_are_those_of_text_or_input_ids():
    assert encode_segments(parse_prompt(segs("ab", "c"), "s"), with_bos, plain) == (with_bos("abc"), None)
    only_ids = [{"input_ids": [5, 6]}, {"input_ids": [7], "document": False}]
    assert encode_segments(parse_prompt(only_ids, "s"), with_bos, plain) == ([5, 6, 7], None)  # no BOS, as input_ids
    assert encode_segments(parse_prompt([{"input_ids": [5]}, doc("a")], "s"), with_bos, plain) == ([BOS, 5, 97],
                                                                                                  [(2, 3)])


@pytest.mark.parametrize("value,field", [
    ([], "segments"),
    ([{}], "segments.0"),
    ([{"text": "a", "input_ids": [1]}], "segments.0"),
    ([{"text": "a"}, {"text": "b", "bogus": 1}], "segments.1.bogus"),
    ([{"text": "a", "document": "yes"}], "segments.0.document"),
    ([{"text": "a", "document": 1}], "segments.0.document"),
    ([{"text": 5}], "segments.0.text"),
    ([{"input_ids": [1, True]}], "segments.0.input_ids"),
    ([[{"text": "a"}], []], "segments.1"),
    ([[{"text": "a"}], [{"text": "b", "document": None}]], "segments.1.0.document"),
    ("text", "segments"),
])
def test_bad_segments_name_the_field(value, field):
    with pytest.raises(ValueError) as e:
        split_segments(value, with_bos, plain)
    assert str(e.value).split(":")[0] == field, str(e.value)


def test_split_prompts_takes_segments_alone_and_batches_them():
    with pytest.raises(ValueError, match="^segments: give exactly one of text, input_ids and segments"):
        split_prompts("a", None, None, with_bos, segments=[doc("b")], encode_plain=plain)
    with pytest.raises(ValueError, match="^segments: give exactly one"):
        split_prompts(None, [1], None, with_bos, segments=[doc("b")], encode_plain=plain)
    p = split_prompts(None, None, {"n": 2}, with_bos, rid="r", segments=[segs(doc("ab"), "?"), segs("plain")],
                      encode_plain=plain)
    assert p.batched and p.names == ["segments.0", "segments.1"] and p.rids == ["r-0", "r-1"]
    assert p.ids == [[BOS, 97, 98, ord("?")], with_bos("plain")] and p.spans == [[(1, 3)], None]
    p = split_prompts(None, None, None, with_bos, segments=segs("a", "b"), encode_plain=plain)
    assert p.ids == [with_bos("ab")] and p.spans is None and not p.batched
    assert split_prompts("ab", None, None, with_bos).spans is None  # text / input_ids: as before


def builder() -> RequestBuilder:
    return RequestBuilder(Limits(vocab_size=1000, context_len=512, num_slots=1024, max_rows=8))


def test_every_copy_and_prompt_carries_its_spans_into_the_req():
    msgs = builder().build([[1, 5, 6, 7], [9, 9]], [{"n": 2}, {}], ["segments.0", "segments.1"],
                           doc_spans=[[(1, 3)], None])
    assert [m.doc_spans for m in msgs] == [[(1, 3)], [(1, 3)], None]
    assert msgs[0].doc_spans is not msgs[1].doc_spans  # each sequence owns its list
    reqs = [new_req(m) for m in msgs]
    assert [r.doc_spans for r in reqs] == [[(1, 3)], [(1, 3)], None]
    assert new_req(TokenizedRequest("x", [1, 2], SamplingParams())).doc_spans is None


@pytest.mark.parametrize("spans", [[(0, 0)], [(2, 1)], [(1, 3), (2, 4)], [(0, 9)], [(-1, 2)], [(3, 4), (0, 1)]])
def test_bad_spans_are_refused(spans):
    with pytest.raises(ValueError, match="^segments: document spans"):
        check_spans(spans, 5, "segments")
    with pytest.raises(ValueError, match="^segments.0: document spans"):
        builder().build([[1, 2, 3, 4, 5]], [{}], ["segments.0"], doc_spans=[spans])


# ---------------------------------------------------------------- document_recompute


@pytest.mark.parametrize("value", [-0.1, 1.5, True, "0.5", float("nan")])
def test_document_recompute_out_of_range_is_named(value):
    with pytest.raises(ValueError, match="^sampling_params.document_recompute:"):
        SamplingParams(document_recompute=value).verify(1000)
    with pytest.raises(ValueError, match="^document_recompute:"):
        SchedulerConfig(document_recompute=value)


def test_document_recompute_defaults():
    assert SamplingParams().document_recompute is None and SchedulerConfig().document_recompute == 0.15
    for v in (0, 0.0, 0.5, 1, 1.0):
        SamplingParams(document_recompute=v).verify(1000)
        SchedulerConfig(document_recompute=v)


def test_the_document_recompute_flag_is_checked_at_parse_time(capsys):
    from radixserve.cli import engine_config_from_args, parse_args

    assert engine_config_from_args(parse_args(["serve", "--document-recompute", "0.3"])).scheduler.document_recompute \
        == 0.3
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", "--document-recompute", "1.5"])
    assert e.value.code == 2 and "argument --document-recompute: must be in [0, 1]" in capsys.readouterr().err


# ---------------------------------------------------------------- meta_info counters


def test_document_counters_travel_to_meta_info():
    req = Req("r", [1, 2, 3], SamplingParams(), doc_spans=[(0, 2)])
    req.output_ids, req.finish_reason = [4], {"type": "length", "length": 1}
    fallback = "exact prefill: int8 KV"
    req.doc_reused, req.doc_recomputed, req.doc_fallback = 7, 2, fallback
    out = take_output(req, None)
    assert (out.document_reused_tokens, out.document_recomputed_tokens, out.document_fallback) == (7, 2, fallback)
    st = OutputState("r", 0, [1, 2, 3])
    st.apply(out, 0.0)
    meta = st.meta_info()
    assert (meta["document_reused_tokens"], meta["document_recomputed_tokens"], meta["document_fallback"]) == (
        7, 2, fallback)


def test_a_plain_request_reports_zeros_and_no_fallback():
    req = Req("r", [1, 2, 3], SamplingParams())
    req.output_ids, req.finish_reason = [4], {"type": "length", "length": 1}
    st = OutputState("r", 0, [1, 2, 3])
    st.apply(take_output(req, None), 0.0)
    meta = st.meta_info()
    assert meta["document_reused_tokens"] == 0 and meta["document_recomputed_tokens"] == 0
    assert "document_fallback" not in meta


# ---------------------------------------------------------------- chat: document parts


def chat_encoder(tok):
    from radixserve.server.openai.chat_encoder import ChatEncoder

    return ChatEncoder(tok, "")


def test_chat_documents_are_the_document_texts_own_tokens(tok):
    from radixserve.server.openai.chat import message_dicts
    from radixserve.server.protocol import ChatCompletionRequest
    from radixserve.server.openai.chat_encoder import DocumentMarks

    docs = [" Paris is the capital of France.", "Bern is the capital of Switzerland."]
    body = {"messages": [{"role": "system", "content": "Answer from the documents."},
                         {"role": "user", "content": [{"type": "text", "text": "Docs:", "document": False},
                                                      {"type": "text", "text": docs[0], "document": True},
                                                      {"type": "text", "text": docs[1], "document": True},
                                                      {"type": "text", "text": "\nWhat is the capital of France?"}]}]}
    req = ChatCompletionRequest.model_validate(body)
    enc = chat_encoder(tok)
    marks = DocumentMarks()
    ids, spans = asyncio.run(enc.encode_documents(message_dicts(req, marks), None, marks))
    assert [ids[a:b] for a, b in spans] == [tok.encode(d, add_special_tokens=False) for d in docs]
    rendered = tok.apply_chat_template(message_dicts(req), tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == rendered  # the same prompt text, only cut at the documents
    plain_ids = asyncio.run(enc.encode(message_dicts(req), None))  # the path of a chat without documents
    assert plain_ids == tok.encode(rendered, add_special_tokens=False)


# ---------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def server(tiny_dir):
    return shared_server(tiny_dir)


GREEDY = {"max_new_tokens": 4, "temperature": 0}


def test_generate_with_segments(server, tok):
    with server.client() as c:
        plain_out = c.post("/generate", json={"text": "The cat sat on", "sampling_params": GREEDY}).json()
        meta = plain_out["meta_info"]
        assert meta["document_reused_tokens"] == 0 and meta["document_recomputed_tokens"] == 0
        assert "document_fallback" not in meta
        same = c.post("/generate", json={"segments": [{"text": "The cat "}, {"text": "sat on"}],
                                         "sampling_params": GREEDY}).json()
        assert same["output_ids"] == plain_out["output_ids"]
        assert same["meta_info"]["prompt_tokens"] == plain_out["meta_info"]["prompt_tokens"]
        body = {"segments": [{"text": "Context:"}, {"text": " cats sit on mats.", "document": True},
                             {"input_ids": tok.encode(" dogs", add_special_tokens=False), "document": True},
                             {"text": " Question: where?"}],
                "sampling_params": {**GREEDY, "document_recompute": 0.5}}
        out = c.post("/generate", json=body)
        assert out.status_code == 200, out.text
        want = [t for piece in ("Context:", " cats sit on mats.", " dogs", " Question: where?")
                for t in tok.encode(piece, add_special_tokens=False)]
        meta = out.json()["meta_info"]
        assert meta["prompt_tokens"] == len(want)
        assert {"document_reused_tokens", "document_recomputed_tokens"} <= set(meta)
        batch = c.post("/generate", json={"segments": [body["segments"], [{"text": "x", "document": True}]],
                                          "sampling_params": {**GREEDY, "n": 2}})
        assert batch.status_code == 200, batch.text
        assert len(batch.json()) == 4
    info = server.wait_idle()
    assert info["scheduler"]["invariants_ok"] and info["scheduler"]["held_slots"] == 0


@pytest.mark.parametrize("body,field", [
    ({"segments": []}, "segments"),
    ({"segments": [{"text": "a", "input_ids": [1]}]}, "segments.0"),
    ({"segments": [{"text": "a", "document": "true"}]}, "segments.0.document"),
    ({"segments": [{"text": "a", "color": "red"}]}, "segments.0.color"),
    ({"segments": [{"text": "a"}], "text": "b"}, "segments"),
    ({"segments": [{"text": "a"}], "input_ids": [1]}, "segments"),
    ({"segments": [[{"text": "a"}], []]}, "segments.1"),
    ({"segments": [{"input_ids": [10 ** 9], "document": True}]}, "segments"),
    ({"segments": [{"text": ""}]}, "segments"),
    ({"segments": [{"text": "a", "document": True}], "sampling_params": {"document_recompute": 2}},
     "sampling_params.document_recompute"),
    ({"text": "a", "sampling_params": {"document_recompute": -1}}, "sampling_params.document_recompute"),
])
def test_bad_segments_over_http_are_400s_naming_the_field(server, body, field):
    with server.client() as c:
        r = c.post("/generate", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].split(":")[0] == field, r.text


def test_chat_document_parts(server):
    msg = [{"role": "user", "content": [{"type": "text", "text": "Doc: the sky is green.", "document": True},
                                        {"type": "text", "text": " What colour is the sky?"}]}]
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200, r.text
        r = c.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 3, "document_recompute": 1.5})
        assert r.status_code == 400 and "document_recompute" in r.json()["error"]["message"], r.text
        bad = [{"role": "user", "content": [{"type": "text", "text": "x", "document": "yes"}]}]
        r = c.post("/v1/chat/completions", json={"messages": bad, "max_tokens": 3})
        assert r.status_code == 400 and "messages.0.content" in r.json()["error"]["message"], r.text
        bad = [{"role": "user", "content": [{"type": "image_url", "document": True}]}]
        r = c.post("/v1/chat/completions", json={"messages": bad, "max_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.0.content.0.document"), r.text


# ---------------------------------------------------------------- the Engine


def test_engine_takes_segments(tiny_engine, tok):
    reqs, batched = tiny_engine.make_requests(segments=[{"text": "Q:"}, {"text": " a doc", "document": True}],
                                              sampling_params=GREEDY)
    n = len(tok.encode("Q:", add_special_tokens=False))
    assert not batched and reqs[0].doc_spans == [(n, n + len(tok.encode(" a doc", add_special_tokens=False)))]
    reqs, batched = tiny_engine.make_requests(segments=[[{"text": "a"}], [{"text": "b", "document": True}]],
                                              sampling_params={"n": 2})
    assert batched and [r.doc_spans for r in reqs] == [None, None, [(0, 1)], [(0, 1)]]
    with pytest.raises(ValueError, match="^segments.0.document:"):
        tiny_engine.generate(segments=[{"text": "a", "document": 1}])
    out = tiny_engine.generate(segments=[{"text": "The cat "}, {"text": "sat on"}], sampling_params=GREEDY)
    assert out["output_ids"] == tiny_engine.generate("The cat sat on", GREEDY)["output_ids"]
    assert out["meta_info"]["document_reused_tokens"] == 0 and out["meta_info"]["document_recomputed_tokens"] == 0
    chunks = list(tiny_engine.generate_stream(segments=[{"text": "The cat "}, {"text": "sat on"}],
                                              sampling_params=GREEDY))
    assert chunks[-1]["output_ids"] == out["output_ids"]
