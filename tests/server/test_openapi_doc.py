"""The server's OpenAPI document describes every route's body and error answers (what the
fuzzer, benchmarks/fuzz_server.py, generates requests from), and schemathesis loads it."""
from __future__ import annotations

import types

import pytest

from radixserve.config import EngineConfig, ServerConfig
from radixserve.server.app import ServerContext, create_app
from radixserve.server.protocol import GenerateReqInput

BODIES = {"/generate": "GenerateReqInput", "/v1/completions": "CompletionRequest",
          "/v1/chat/completions": "ChatCompletionRequest", "/v1/embeddings": "EmbeddingRequest",
          "/tokenize": "TokenizeReqInput", "/abort_request": "AbortReqInput",
          "/concate_and_append_request": "ConcatAndAppendReqInput",
          "/load_lora_adapter": "LoadLoRAAdapterReqInput", "/unload_lora_adapter": "UnloadLoRAAdapterReqInput"}


@pytest.fixture(scope="module")
def doc() -> dict:
    ctx = ServerContext(tm=types.SimpleNamespace(), engine_cfg=EngineConfig(), server_cfg=ServerConfig(),
                        model_name="m", model_path="p", tokenizer_path="t", pids={})
    return create_app(ctx).openapi()


def test_every_body_and_error_is_described(doc):
    schemas = doc["components"]["schemas"]
    for path, model in BODIES.items():
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}, path
        assert schemas[model]["properties"], model
    gen = schemas["GenerateReqInput"]
    assert gen["additionalProperties"] is False and set(GenerateReqInput.model_fields) == set(gen["properties"])
    assert "max_new_tokens" in schemas["SamplingParamsIn"]["properties"]
    assert "tools" in schemas["ChatCompletionRequest"]["properties"] and "ToolDef" in schemas
    assert schemas["EmbeddingRequest"]["properties"]["input"].get("anyOf"), "input's accepted shapes"
    ops = [op for item in doc["paths"].values() for op in item.values()]
    assert len({op["operationId"] for op in ops}) == len(ops)
    for op in ops:
        assert "422" not in op["responses"] and "400" in op["responses"], op["operationId"]
        assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        assert "text/event-stream" in doc["paths"][path]["post"]["responses"]["200"]["content"]
    refs = {v for v in _strings(doc) if v.startswith("#/")}
    assert all(r.rsplit("/", 1)[1] in schemas for r in refs), "every $ref resolves"


def test_schemathesis_loads_it(doc):
    import schemathesis

    ops = [r.ok() for r in schemathesis.openapi.from_dict(doc).get_all_operations()]
    assert {"POST /generate", "POST /v1/chat/completions", "GET /health"} <= {op.label for op in ops}


def _strings(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj
