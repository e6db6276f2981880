"""Issue 47, item 1's end, on the real server through the official ``openai`` client: names that mean
something.  ``--served-model-name alpha beta``: /v1/models lists both, a response echoes the name asked
for, any other name is a 404 naming it; ``--chat-template FILE`` renders the chats; with LoRA on (the
session's LoRA server, tests/helpers/lora_server.py), an adapter that is not loaded is a 404, never
the base model's answer."""
from __future__ import annotations

import openai
import pytest

from tests.helpers.lora_server import USER, lora_server
from tests.helpers.server_harness import ServerHandle

TEMPLATE = ("{% for m in messages %}<<{{ m.role }}>>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<<assistant>>{% endif %}")
MSGS = [{"role": "user", "content": "Name a prime number."}]
GREEDY = {"max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def named(tiny_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "2048", "--served-model-name", "alpha", "beta",
                       "--chat-template", str(path)).wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(named):
    return openai.OpenAI(base_url=named.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _not_found(call, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        call()
    assert e.value.status_code == 404 and e.value.param == "model", e.value.body
    assert f"`{model}`" in e.value.message and "does not exist" in e.value.message


def test_the_served_names_are_listed_and_echoed(client, named):
    assert [m.id for m in client.models.list().data] == ["alpha", "beta"]
    assert client.chat.completions.create(model="beta", messages=MSGS, **GREEDY).model == "beta"
    assert client.completions.create(model="alpha", prompt="hi", **GREEDY).model == "alpha"
    assert client.embeddings.create(model="beta", input="hi").model == "beta"
    with named.client() as http:  # no model: the first served name
        body = http.post("/v1/chat/completions", json={"messages": MSGS, **GREEDY}).raise_for_status().json()
        assert body["model"] == "alpha"
        assert http.get("/get_server_info").json()["served_model_name"] == "alpha"


def test_any_other_name_is_a_404_naming_it(client):
    for model in ("tiny_llama", "gpt-3.5-turbo", "alpha:adapter"):
        _not_found(lambda: client.chat.completions.create(model=model, messages=MSGS, **GREEDY), model)
    _not_found(lambda: client.chat.completions.create(model="ALPHA", messages=MSGS, stream=True, **GREEDY), "ALPHA")
    _not_found(lambda: client.completions.create(model="gamma", prompt="hi", **GREEDY), "gamma")
    _not_found(lambda: client.embeddings.create(model="gamma", input="hi"), "gamma")


def test_the_chat_template_replaces_the_tokenizers(client, named, tok):
    with named.client() as http:
        assert http.get("/get_model_info").json()["chat_template"] == TEMPLATE
    r = client.chat.completions.create(model="alpha", messages=MSGS, **GREEDY)
    want = tok.apply_chat_template(MSGS, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert want == "<<user>>Name a prime number.\n<<assistant>>"
    assert r.usage.prompt_tokens == len(tok(want, add_special_tokens=False).input_ids)
    turn = [*MSGS, {"role": "assistant", "content": "Seven is"}]
    r = client.chat.completions.create(model="alpha", messages=turn, **GREEDY,
                                       extra_body={"continue_final_message": True})
    want = "<<user>>Name a prime number.\n<<assistant>>Seven is"
    assert r.usage.prompt_tokens == len(tok(want, add_special_tokens=False).input_ids)


def test_an_adapter_that_is_not_loaded_is_a_404_not_the_base_model(tiny_dir):
    lora = lora_server(tiny_dir)
    oai = openai.OpenAI(base_url=lora.srv.url + "/v1", api_key=USER, max_retries=0, timeout=60)
    base = oai.models.list().data[0].id
    msgs = [{"role": "user", "content": "Hello"}]
    for model in ("no-such-adapter", f"{base}:no-such-adapter", "some-other-model"):
        _not_found(lambda: oai.chat.completions.create(model=model, messages=msgs, **GREEDY), model)
    _not_found(lambda: oai.completions.create(model="no-such-adapter", prompt="hi", **GREEDY), "no-such-adapter")
    with_a = oai.chat.completions.create(model="a", messages=msgs, **GREEDY)
    assert with_a.model == "a"
    assert oai.chat.completions.create(model=f"{base}:a", messages=msgs, **GREEDY).choices[0].message.content == \
        with_a.choices[0].message.content
    assert oai.chat.completions.create(model=base, messages=msgs, **GREEDY).model == base
    with pytest.raises(openai.BadRequestError) as e:  # an adapter's name on the embeddings route
        oai.embeddings.create(model="a", input="hi")
    assert e.value.param == "model"
    with lora.client() as admin:  # an adapter cannot take a name of the base model
        r = admin.post("/load_lora_adapter", json={"lora_name": base, "lora_path": lora.adapters["c"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name", r.text
    lora.idle_invariants()
