"""The hierarchical cache through HTTP (tiny model, a server of its own): ``/generate`` answers
the same whether a prefix was computed or loaded from the host or the disk tier, and the
inspector (``/cache/stats``, ``/cache/tree``) and ``/get_server_info`` show the tiers."""
from __future__ import annotations

import random

from tests.helpers.server_harness import ServerHandle

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def _ids(seed: int, n: int = 200) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


def _walk(node: dict):
    yield node
    for c in node["children"]:
        yield from _walk(c)


def test_tiers_over_http(tiny_dir, tmp_path):
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "450", "--enable-hierarchical-cache", "--hicache-ratio", "2",
                       "--hicache-write-policy", "write_back", "--hicache-storage-backend", "file",
                       "--hicache-storage-dir", str(tmp_path)).wait_ready()
    try:
        with srv.client() as c:
            def gen(i: int) -> dict:
                r = c.post("/generate", json={"input_ids": _ids(i), "sampling_params": GREEDY}).raise_for_status()
                return r.json()

            first = {i: gen(i)["output_ids"] for i in range(8)}  # computed; 0-5 leave the pool, 0-1 the host tier
            tiers = c.get("/cache/stats").raise_for_status().json()["tiers"]
            assert tiers["host"]["tokens"] > 0 and tiers["disk"]["blocks"] > 0
            seen = {t for n in _walk(c.get("/cache/tree").raise_for_status().json()["root"]) for t in n["tiers"]}
            assert seen == {"pool", "host", "disk"}
            again = {i: gen(i) for i in (0, 4)}  # from disk, from the host tier
            assert {i: o["output_ids"] for i, o in again.items()} == {i: first[i] for i in again}
            assert all(o["meta_info"]["cached_tokens"] == 199 for o in again.values())
            tiers = c.get("/cache/stats").raise_for_status().json()["tiers"]
            assert tiers["host"]["hit_tokens"] >= 199 and tiers["disk"]["hit_tokens"] >= 199
            info = c.get("/get_server_info", params={"check_invariants": True}).raise_for_status().json()
            s = info["scheduler"]
            assert s["invariants_ok"], s["invariant_error"]
            assert s["disk_budget_bytes"] == 8 * 10**9 and s["disk_bytes"] > 0
            assert s["host_slots"] == info["worker"]["host_tier_slots"] - 1 >= 900  # slot 0 pads, as in the pool
            assert info["enable_hierarchical_cache"] and info["hicache_write_policy"] == "write_back"
    finally:
        srv.stop()


def test_quantized_pool_over_http(tiny_dir, tmp_path):
    """``--kv-cache-dtype`` with the tiers: a prefix back from the host tier answers as computed;
    ``/get_server_info`` names the pool's form and its bytes a token (tiny model: 2 layers x K, V x
    2 KV heads x (16 + 4) bytes)."""
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "450", "--kv-cache-dtype", "fp8_e4m3",
                       "--enable-hierarchical-cache", "--hicache-write-policy", "write_back").wait_ready()
    try:
        with srv.client() as c:
            def gen(i: int) -> dict:
                r = c.post("/generate", json={"input_ids": _ids(i), "sampling_params": GREEDY}).raise_for_status()
                return r.json()

            first = {i: gen(i)["output_ids"] for i in range(4)}  # 0 and 1 leave the pool for the host tier
            again = gen(0)
            assert again["output_ids"] == first[0] and again["meta_info"]["cached_tokens"] == 199
            info = c.get("/get_server_info", params={"check_invariants": True}).raise_for_status().json()
            assert info["scheduler"]["invariants_ok"] and info["scheduler"]["host_hit_tokens"] >= 199
            assert info["kv_cache_dtype"] == "fp8_e4m3" and info["worker"]["kv_bytes_per_slot"] == 2 * 2 * 2 * 20
    finally:
        srv.stop()
