"""The cache inspector's JSON routes against real servers (tiny model):

* the session's shared server (``--api-key``, previews off): shapes, limits, 400s naming the
  query parameter, 401 without the key, hit counts rising on shared-prefix requests, no text
  or token ids anywhere, the allocator's invariants after;
* a server of this module with ``--cache-inspector-text`` (no key): previews present, never
  for a ``cache_salt`` namespace;
* a multi-key server with ``--disable-radix-cache``: 403 for a non-admin key, the empty tree,
  the static page open without a key.
"""
from __future__ import annotations

import random

import httpx
import pytest

from radixserve.server.inspector.models import CacheStatsReply, CacheTree
from tests.helpers.models import walk
from tests.helpers.server_harness import ServerHandle

SYSTEM = ("You are a meticulous assistant for the Riverside public library. Answer questions about "
          "opening hours, loans and events briefly and politely, and never invent a policy.")


def check_idle_invariants(srv: ServerHandle) -> None:
    s = srv.wait_idle()
    with srv.client() as c:
        s = c.get("/get_server_info", params={"check_invariants": True}).raise_for_status().json()["scheduler"]
    assert s["invariants_ok"], s["invariant_error"]
    assert s["held_slots"] == 0, s


def generate(c: httpx.Client, body: dict) -> dict:
    body = {"sampling_params": {"max_new_tokens": 2, "temperature": 0}, **body}
    r = c.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


# ------------------------------------------------------------------ the shared server
@pytest.mark.usefixtures("kv_invariants")
def test_routes_shape_limits_and_hits_without_text(server):
    rnd = random.Random(1515)
    prefix = [rnd.randrange(20000, 40000) for _ in range(80)]
    with server.client() as c:
        before = c.get("/cache/tree", params={"max_depth": 1, "max_nodes": 1}).raise_for_status().json()
        metas = [generate(c, {"input_ids": prefix + [rnd.randrange(20000, 40000) for _ in range(6)]})
                 for _ in range(4)]
        assert metas[0]["cached_tokens"] == 0 and all(m["cached_tokens"] >= 80 for m in metas[1:])
        tree = c.get("/cache/tree", params={"max_depth": 16, "max_nodes": 2000}).raise_for_status().json()
        stats = c.get("/cache/stats").raise_for_status().json()
        small = c.get("/cache/tree", params={"max_depth": 1, "max_nodes": 3}).raise_for_status().json()
    CacheTree.model_validate(tree), CacheStatsReply.model_validate(stats)
    assert tree["cache"] == "radix" and tree["text_preview"] is False
    nodes = walk(tree["root"])
    assert all("text" not in n and "token_ids" not in n and "text_truncated" not in n for n in nodes)
    assert tree["root"]["hit_count"] >= before["root"]["hit_count"] + 4  # every admission passes the root
    # the 80-token prefix is one node (or ends one) that three admissions ran through
    ends = [n for n in nodes[1:] if n["prefix_tokens"] + n["tokens"] == 80 and n["subtree_nodes"] >= 4]
    assert ends and max(n["hit_count"] for n in ends) >= 3
    assert tree["returned_nodes"] == len(nodes) - 1 <= 2000
    assert len(walk(small["root"])) - 1 == small["returned_nodes"] <= 3
    assert all(n["depth"] <= 1 for n in walk(small["root"]))
    kids = small["root"]["children"]
    assert [k["subtree_tokens"] for k in kids] == sorted((k["subtree_tokens"] for k in kids), reverse=True)
    assert small["root"]["omitted_children"] == len(tree["root"]["children"]) - len(kids)
    w = stats["windows"]
    assert w["since_start"]["cached_tokens"] >= 240 and 0 < w["last_1m"]["hit_rate"] <= 1
    assert w["last_1m"]["requests"] >= 4 and stats["cache"] == "radix"
    kv = stats["kv"]
    assert kv["num_slots"] == kv["free_slots"] + kv["cached_slots"] + kv["held_slots"]
    assert stats["tree"]["tokens"] == kv["cached_slots"] == tree["tree_tokens"]


def test_bad_query_parameters_are_400s_naming_them(server):
    with server.client() as c:
        for params, name in [({"max_nodes": 0}, "max_nodes"), ({"max_nodes": 2001}, "max_nodes"),
                             ({"max_depth": 0}, "max_depth"), ({"max_depth": 65}, "max_depth"),
                             ({"max_depth": "deep"}, "max_depth"), ({"max_nodes": 10**30}, "max_nodes")]:
            r = c.get("/cache/tree", params=params)
            assert r.status_code == 400, (params, r.text)
            assert name in r.json()["error"]["message"], r.text
    for path in ("/cache/tree", "/cache/stats"):
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_openapi_declares_the_routes_with_bounds(server):
    with server.client() as c:
        doc = c.get("/openapi.json").raise_for_status().json()
    tree = doc["paths"]["/cache/tree"]["get"]
    params = {p["name"]: p["schema"] for p in tree["parameters"]}
    for name, bounds in (("max_depth", (1, 64, 8)), ("max_nodes", (1, 2000, 200))):
        p = params[name]
        assert (p["type"], p["minimum"], p["maximum"], p["default"]) == ("integer", *bounds), p
    for path in ("/cache/tree", "/cache/stats"):
        responses = doc["paths"][path]["get"]["responses"]
        assert {"200", "400", "401", "403"} <= set(responses)
        assert "$ref" in responses["200"]["content"]["application/json"]["schema"]
    assert "text/html" in doc["paths"]["/dashboard"]["get"]["responses"]["200"]["content"]


# ------------------------------------------------------------------ text previews on
@pytest.fixture(scope="module")
def text_server(tiny_dir):
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "4096", "--cache-inspector-text").wait_ready()
    yield srv
    srv.stop()


def test_text_preview_when_enabled_and_never_for_salted_nodes(text_server):
    questions = ["When do you open on Sundays?", "How many books can I borrow?", "Is there a chess club?"]
    with text_server.client() as c:
        for q in questions:
            generate(c, {"text": SYSTEM + "\nQuestion: " + q})
        secret = "TENANT SECRET: the vault code is 4417, do not reveal it to anyone at all."
        for q in questions[:2]:
            generate(c, {"text": secret + " " + q, "cache_salt": "tenant-x"})
        tree = c.get("/cache/tree").raise_for_status().json()
        stats = c.get("/cache/stats").raise_for_status().json()
    CacheTree.model_validate(tree)
    assert tree["text_preview"] is True
    nodes = walk(tree["root"])[1:]
    shared = [n for n in nodes if n["namespace"] is None]
    salted = [n for n in nodes if n["namespace"] is not None]
    assert shared and salted and len({n["namespace"] for n in salted}) == 1
    assert all(isinstance(n["text"], str) and isinstance(n["text_truncated"], bool) for n in shared)
    assert all("text" not in n and "token_ids" not in n for n in salted)
    assert "vault" not in str(tree) and "4417" not in str(tree) and "tenant-x" not in str(tree)
    system_node = max(shared, key=lambda n: n["hit_count"])
    assert system_node["depth"] == 1 and system_node["hit_count"] == 2  # questions 2 and 3 hit it
    assert system_node["text"] == SYSTEM + "\nQuestion:" and system_node["text_truncated"] is False
    assert max(salted, key=lambda n: n["tokens"])["hit_count"] == 1
    assert stats["windows"]["since_start"]["requests"] == 5
    check_idle_invariants(text_server)


# ------------------------------------------------------------------ multi-key, no radix cache
KEYS = '[[keys]]\nkey = "sk-root"\nname = "root"\nadmin = true\n\n[[keys]]\nkey = "sk-user"\nname = "user"\n'


@pytest.fixture(scope="module")
def keyed_server(tiny_dir, tmp_path_factory):
    keys = tmp_path_factory.mktemp("inspector_keys") / "keys.toml"
    keys.write_text(KEYS)
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "2048", "--disable-radix-cache", "--cache-inspector-text",
                       "--api-keys-file", str(keys))
    srv.headers = {"Authorization": "Bearer sk-root"}
    yield srv.wait_ready()
    srv.stop()


def test_admin_only_and_an_empty_tree_without_radix_cache(keyed_server):
    url, user = keyed_server.url, {"Authorization": "Bearer sk-user"}
    with httpx.Client(base_url=url, headers=user, timeout=60) as c:
        for _ in range(2):
            generate(c, {"text": SYSTEM + " Hello?"})
        for path in ("/cache/tree", "/cache/stats"):
            r = c.get(path)
            assert r.status_code == 403 and path in r.json()["error"]["message"], r.text
            assert httpx.get(url + path).status_code == 401
    page = httpx.get(url + "/dashboard")  # static and data-free: served without a key
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "cache inspector" in page.text and "Riverside" not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name in ("dashboard.js", "charts.js", "icicle.js", "tree_view.js", "dashboard.css"):
        assert httpx.get(f"{url}/dashboard/{name}").status_code == 200
    assert httpx.get(url + "/dashboard/other.js").status_code == 401  # only the page's own files are open
    with keyed_server.client() as c:
        tree = c.get("/cache/tree").raise_for_status().json()
        stats = c.get("/cache/stats").raise_for_status().json()
    CacheTree.model_validate(tree), CacheStatsReply.model_validate(stats)
    assert tree["cache"] == "none" and tree["root"]["children"] == [] and tree["tree_tokens"] == 0
    assert tree["root"]["hit_count"] == 2
    w = stats["windows"]["since_start"]
    assert stats["cache"] == "none" and w["requests"] == 2 and w["cached_tokens"] == 0 and w["hit_rate"] == 0
    check_idle_invariants(keyed_server)
