"""Multi-key mode against the real server (``--api-keys-file``, ``--usage-db``): budgets (429 +
Retry-After, nothing charged), concurrent admission never overspending, rate limits, routes,
per-tenant cache isolation (``cached_tokens``), /v1/usage and /metrics, SIGHUP reload, a
restart on the same usage database, and a bad keys file at startup."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers.server_harness import ServerHandle

KEYS = """
[[keys]]
key = "sk-admin"
name = "admin"
admin = true

[[keys]]
key = "sk-alice"
name = "alice"

[[keys]]
key = "sk-bob"
name = "bob"
routes = ["/v1/*", "/generate"]

[[keys]]
key = "sk-tight"
name = "tight"
budget_tokens = 100
period = "day"

[[keys]]
key = "sk-conc"
name = "conc"
budget_tokens = 180
period = "month"

[[keys]]
key = "sk-slow"
name = "slow"
requests_per_minute = 2
routes = ["/generate"]
"""
DAVE = '\n[[keys]]\nkey = "sk-dave"\nname = "dave"\n'
ARGS = ("--max-total-tokens", "8192", "--chunked-prefill-size", "256")


class Tracker:
    """What every successful response said it used, per key name (the expected charges)."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # prompt, cached, completion, requests

    def add(self, name: str, prompt: int, cached: int, completion: int) -> None:
        t = self.tokens[name]
        t[0], t[1], t[2], t[3] = t[0] + prompt, t[1] + cached, t[2] + completion, t[3] + 1


def start(tiny_dir: str, keys, db) -> ServerHandle:
    srv = ServerHandle(tiny_dir, *ARGS, "--api-keys-file", str(keys), "--usage-db", str(db))
    srv.headers = {"Authorization": "Bearer sk-admin"}  # for the harness's info / wait_idle
    return srv.wait_ready()


@pytest.fixture(scope="module")
def env(tiny_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    keys, db = d / "keys.toml", d / "usage.db"
    keys.write_text(KEYS)
    state = {"srv": start(tiny_dir, keys, db), "keys": keys, "db": db, "track": Tracker(), "tiny_dir": tiny_dir}
    yield state
    state["srv"].stop()


def post(srv: ServerHandle, key: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def generate(env, key: str, name: str, ids: list[int], n_new: int, **extra) -> httpx.Response:
    r = post(env["srv"], key, "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": n_new, "ignore_eos": True, "temperature": 0}, **extra})
    if r.status_code == 200:
        m = r.json()["meta_info"]
        env["track"].add(name, m["prompt_tokens"], m["cached_tokens"], m["completion_tokens"])
    return r


def complete(env, key: str, name: str, ids: list[int], **extra) -> httpx.Response:
    r = post(env["srv"], key, "/v1/completions", {"prompt": ids, "max_tokens": 2, "temperature": 0, **extra})
    if r.status_code == 200:
        u = r.json()["usage"]
        env["track"].add(name, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], u["completion_tokens"])
    return r


def usage(srv: ServerHandle, period: str = "day") -> dict[str, dict]:
    r = httpx.get(srv.url + "/v1/usage", params={"period": period}, headers={"Authorization": "Bearer sk-admin"})
    assert r.status_code == 200, r.text
    return {row["key"]: row for row in r.json()["data"]}


def ids(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(100, 20000) for _ in range(n)]


def cached(r: httpx.Response) -> int:
    body = r.json()
    return body["usage"]["prompt_tokens_details"]["cached_tokens"] if "usage" in body else body["meta_info"]["cached_tokens"]


def test_tenants_never_hit_each_others_cache(env):
    p = ids(1, 48)
    assert cached(complete(env, "sk-alice", "alice", p)) == 0
    assert cached(complete(env, "sk-alice", "alice", p)) > 0  # the same tenant hits
    assert cached(complete(env, "sk-bob", "bob", p)) == 0  # another tenant never does
    assert cached(generate(env, "sk-bob", "bob", p, 2)) > 0  # ... until it computed the prompt itself
    # a request salt is a namespace within the tenant's, never another tenant's
    assert cached(complete(env, "sk-alice", "alice", p, cache_salt="s1")) == 0
    assert cached(complete(env, "sk-alice", "alice", p, cache_salt="s1")) > 0
    assert cached(complete(env, "sk-bob", "bob", p, cache_salt="alice")) == 0
    assert cached(generate(env, "sk-alice", "alice", p, 2, cache_salt="s1")) > 0
    r = complete(env, "sk-alice", "alice", p, cache_salt=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    r = post(env["srv"], "sk-alice", "/generate", {"input_ids": p, "cache_salt": "a",
                                                    "sampling_params": {"cache_salt": "b"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_budget_refuses_with_retry_after_and_charges_nothing(env):
    srv = env["srv"]
    for i in range(3):  # 10 + 20 tokens each: 90 of 100
        assert generate(env, "sk-tight", "tight", ids(10 + i, 10), 20).status_code == 200
    before = usage(srv)["tight"]
    r = generate(env, "sk-tight", "tight", ids(20, 10), 20)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["param"] == "budget_tokens" and "tokens per day" in r.json()["error"]["message"]
    assert 0 < int(r.headers["Retry-After"]) <= 86400
    assert usage(srv)["tight"] == before  # nothing charged
    assert generate(env, "sk-tight", "tight", ids(21, 5), 5).status_code == 200  # exactly the 10 left
    r = complete(env, "sk-tight", "tight", ids(22, 1))
    assert r.status_code == 429 and "Retry-After" in r.headers
    row = usage(srv)["tight"]
    assert (row["prompt_tokens"], row["completion_tokens"], row["requests"]) == (35, 65, 4)


def test_concurrent_requests_never_overspend(env):
    def one(i: int) -> httpx.Response:
        return generate(env, "sk-conc", "conc", ids(100 + i, 10), 20)  # 30 each, budget 180

    with ThreadPoolExecutor(12) as pool:
        codes = [r.status_code for r in pool.map(one, range(12))]
    ok = codes.count(200)
    assert set(codes) <= {200, 429} and 1 <= ok <= 6 and codes.count(429) >= 6
    row = usage(env["srv"], "month")["conc"]
    assert row["prompt_tokens"] + row["completion_tokens"] == 30 * ok <= 180


def test_rate_limit_routes_and_admin(env):
    srv = env["srv"]
    assert generate(env, "sk-slow", "slow", ids(30, 4), 1).status_code == 200
    assert generate(env, "sk-slow", "slow", ids(31, 4), 1).status_code == 200
    r = generate(env, "sk-slow", "slow", ids(32, 4), 1)
    assert r.status_code == 429 and r.json()["error"]["param"] == "requests_per_minute"
    assert 0 < int(r.headers["Retry-After"]) <= 60
    r = complete(env, "sk-slow", "slow", ids(33, 4))
    assert r.status_code == 403 and "/v1/completions" in r.json()["error"]["message"]
    assert post(srv, "sk-nope", "/generate", {"text": "hi"}).status_code == 401
    for path in ("/v1/usage", "/metrics"):
        assert httpx.get(srv.url + path, headers={"Authorization": "Bearer sk-alice"}).status_code == 403
    m = httpx.get(srv.url + "/metrics", headers={"Authorization": "Bearer sk-admin"}).text
    assert 'radixserve:key_prompt_tokens_total{key="alice"}' in m
    assert 'radixserve:key_rejected_requests_total{key="tight",reason="budget"}' in m
    body = httpx.get(srv.url + "/v1/usage", params={"key": "tight"}, headers={"Authorization": "Bearer sk-admin"}).json()
    assert {r["key"] for r in body["data"]} == {"tight"} and body["budgets"][0]["remaining_tokens"] == 0


def test_sighup_reloads_and_a_bad_file_keeps_the_old_keys(env):
    srv, keys = env["srv"], env["keys"]
    keys.write_text(KEYS + DAVE)
    os.kill(srv.proc.pid, signal.SIGHUP)
    deadline = time.time() + 20
    while generate(env, "sk-dave", "dave", ids(40, 4), 1).status_code != 200:
        assert time.time() < deadline, "the reloaded key never worked"
        time.sleep(0.2)
    keys.write_text(KEYS.replace("budget_tokens = 180", "budget_tokens = -1"))
    os.kill(srv.proc.pid, signal.SIGHUP)
    deadline = time.time() + 20
    while "keys[4].budget_tokens: must be a positive integer" not in srv.log_tail(20000):
        assert time.time() < deadline, "no reload error logged"
        time.sleep(0.2)
    assert srv.proc.poll() is None
    assert generate(env, "sk-dave", "dave", ids(41, 4), 1).status_code == 200  # the old table is kept
    keys.write_text(KEYS + DAVE)


def test_n_copies_and_a_disconnected_stream_are_charged_what_they_used(env):
    srv = env["srv"]
    r = complete(env, "sk-bob", "bob", ids(60, 12), n=3)  # the prompt counts once, as in usage
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 12
    before = usage(srv)["alice"]
    p = ids(61, 8)
    body = {"input_ids": p, "stream": True, "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    with httpx.stream("POST", srv.url + "/generate", json=body, headers={"Authorization": "Bearer sk-alice"},
                      timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                break  # the client goes away after the first chunk
    srv.wait_idle()
    after = usage(srv)["alice"]
    prompt, completion = after["prompt_tokens"] - before["prompt_tokens"], \
        after["completion_tokens"] - before["completion_tokens"]
    assert prompt == len(p) and 1 <= completion <= 900 and after["requests"] == before["requests"] + 1
    env["track"].tokens["alice"][0] += prompt
    env["track"].tokens["alice"][1] += after["cached_tokens"] - before["cached_tokens"]
    env["track"].tokens["alice"][2] += completion
    env["track"].tokens["alice"][3] += 1


def test_restart_finds_every_charge(env):
    before = usage(env["srv"])
    env["srv"].stop()
    env["srv"] = srv = start(env["tiny_dir"], env["keys"], env["db"])
    after = usage(srv)
    assert after == before
    for name, (prompt, cache, completion, requests) in env["track"].tokens.items():
        row = after[name]
        assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["requests"]) == \
            (prompt, cache, completion, requests), name
    # the budget is remembered: tight is still spent
    assert generate(env, "sk-tight", "tight", ids(50, 1), 1).status_code == 429


def test_bad_keys_file_is_a_startup_error(tiny_dir, tmp_path):
    bad = tmp_path / "keys.toml"
    bad.write_text('[[keys]]\nkey = "a"\nname = "a"\n\n[[keys]]\nkey = "b"\nname = "b"\nbudget_tokens = 0\n')
    p = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", "--model", tiny_dir, "--api-keys-file",
                        str(bad)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "keys.toml: keys[1].budget_tokens: must be a positive integer" in p.stdout + p.stderr
