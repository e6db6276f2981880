"""One tiny-model server with LoRA adapters per test session, shared by tests/server/test_server_lora.py
and tests/frontend/test_frontend_lora.py (started on first use, stopped at exit).

Adapters (random, std 0.5 so they visibly change the tiny model's output): ``a`` (rank 4) and ``b``
(rank 8) are served from the start; ``c`` (rank 4) is for loading while serving; ``big`` (rank 16)
is over ``--max-lora-rank 8``.  Multi-key mode: ``ADMIN`` may call the adapter admin routes,
``USER`` may not (both may generate with any adapter).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import httpx

from tests.helpers.lora_adapters import greedy, make_adapter, merged_model
from tests.helpers.server_harness import ServerHandle

ADMIN, USER = "sk-lora-admin", "sk-lora-user"
KEYS = f'[[keys]]\nkey = "{ADMIN}"\nname = "ops"\nadmin = true\n\n[[keys]]\nkey = "{USER}"\nname = "user"\n'
RANKS = {"a": 4, "b": 8, "c": 4, "big": 16}
MAX_RANK = 8


@dataclass
class LoRAServer:
    srv: ServerHandle
    tiny_dir: str
    adapters: dict[str, str]  # name -> PEFT directory
    _oracle: dict = field(default_factory=dict)

    def client(self, key: str = ADMIN) -> httpx.Client:
        return httpx.Client(base_url=self.srv.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    def oracle(self, name: Optional[str], ids: list[int], n: int) -> list[int]:
        """PEFT's merged model's greedy tokens for adapter ``name`` (None: the base model)."""
        key = (name, tuple(ids), n)
        if key not in self._oracle:
            if name is None:
                import torch
                from transformers import LlamaForCausalLM

                model = LlamaForCausalLM.from_pretrained(self.tiny_dir, dtype=torch.float32).eval()
            else:
                model = merged_model(self.tiny_dir, self.adapters[name])
            self._oracle[key] = greedy(model, ids, n)[0]
        return self._oracle[key]

    def idle_invariants(self) -> None:
        """No request holds a KV slot and the allocator's invariants hold (checked in full)."""
        self.srv.wait_idle()
        with self.client() as c:
            s = c.get("/get_server_info", params={"check_invariants": "true"}).raise_for_status().json()["scheduler"]
        assert s["invariants_ok"], s["invariant_error"]
        assert s["held_slots"] == 0, s


_shared: Optional[LoRAServer] = None


def lora_server(tiny_dir: str) -> LoRAServer:
    global _shared
    if _shared is None or _shared.srv.proc.poll() is not None:
        root = tempfile.mkdtemp(prefix="radixserve-lora-")
        atexit.register(shutil.rmtree, root, True)
        adapters = {name: make_adapter(tiny_dir, os.path.join(root, name), rank, seed=i + 1, std=0.5)
                    for i, (name, rank) in enumerate(RANKS.items())}
        keys = os.path.join(root, "keys.toml")
        with open(keys, "w") as f:
            f.write(KEYS)
        srv = ServerHandle(tiny_dir, "--max-total-tokens", "4096", "--lora-paths", f"a={adapters['a']}",
                           f"b={adapters['b']}", "--max-lora-rank", str(MAX_RANK), "--api-keys-file", keys)
        srv.headers = {"Authorization": f"Bearer {ADMIN}"}  # for the harness's info / wait_idle
        atexit.register(srv.stop)
        _shared = LoRAServer(srv.wait_ready(), tiny_dir, adapters)
    return _shared
