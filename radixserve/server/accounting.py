"""Charging every token-consuming request to its API key, at the one place all routes pass:
the TokenizerManager's ``submit`` (``admit``) and the end of each sequence (``settle``).

The key comes from ``current_key``, a context variable the ``KeyAuthMiddleware`` sets for
the request's task (None: single-key or no-key mode, charged to ``DEFAULT_NAME`` without
limits).  ``admit`` raises ``RequestError(429)`` with ``Retry-After`` before anything is
sent or charged; otherwise it salts the sequences' prefix-cache namespace (multi-key mode)
and reserves their worst case.  ``settle`` charges what a sequence consumed: its completion
tokens, and its prompt (once per prompt: copy 0 of an ``n > 1`` prompt) unless it ended
without computing anything (an error or abort before its first token); a request counts
once, when its first sequence is charged any token.  Event loop only.
"""
from __future__ import annotations

import logging
import sqlite3
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Optional

from radixserve.config import ServerConfig
from radixserve.ipc.server_link import TokenizedRequest
from radixserve.metrics import Metrics
from radixserve.server.budget import Ledger, LimitExceeded
from radixserve.server.keys import KeySpec, KeysFileError, KeyStore, load_keys
from radixserve.server.req_state import ReqState, RequestError
from radixserve.server.usage_db import UsageDB

logger = logging.getLogger(__name__)

current_key: ContextVar[Optional[KeySpec]] = ContextVar("radixserve_api_key", default=None)
DEFAULT_NAME = "default"
_SEP = "\0"  # key salt / request salt; key salts never contain it, so tenants cannot collide


def salted(key_salt: str, request_salt: Optional[str]) -> str:
    return key_salt if request_salt is None else key_salt + _SEP + request_salt


@dataclass
class _Group:
    spec: Optional[KeySpec]
    request_counted: bool = False


@dataclass
class _Seq:
    group: _Group
    reserved: int
    counts_prompt: bool


class Accounting:
    def __init__(self, ledger: Ledger, metrics: Metrics, keys: Optional[KeyStore] = None) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.keys = keys  # None: single-key or no-key mode
        self.pending: dict[str, _Seq] = {}  # rid -> charge of an admitted, unsettled sequence

    def admit(self, reqs: list[TokenizedRequest]) -> None:
        """Check the key's limits for ``reqs`` (one HTTP request) and reserve; RequestError(429)
        naming the limit when refused (nothing reserved).  Mutates the requests' cache salt."""
        spec = current_key.get()
        group = _Group(spec)
        needs = [(len(r.input_ids) if r.copy == 0 else 0) + r.sampling.max_new_tokens for r in reqs]
        if spec is not None:
            try:
                self.ledger.admit(spec, sum(needs), time.time())
            except LimitExceeded as e:
                self.metrics.observe_key_rejected(spec.name, e.reason)
                raise RequestError(429, e.message, {"Retry-After": str(e.retry_after)}) from None
            if self.keys is not None:
                for r in reqs:
                    r.sampling.cache_salt = salted(spec.salt, r.sampling.cache_salt)
        for r, need in zip(reqs, needs):
            self.pending[r.rid] = _Seq(group, need if spec is not None else 0, r.copy == 0)

    def settle(self, st: ReqState) -> None:
        """``st`` is done: charge what it consumed to its key (durable on return)."""
        seq = self.pending.pop(st.rid, None)
        if seq is None:
            return
        completion = len(st.output_ids)
        computed = completion > 0 or (st.error is None and (st.finish_reason or {}).get("type") != "abort")
        prompt = len(st.input_ids) if seq.counts_prompt and computed else 0
        cached = min(st.cached_tokens, prompt)
        requests = 0 if seq.group.request_counted or not (prompt or completion) else 1
        seq.group.request_counted = seq.group.request_counted or requests == 1
        spec = seq.group.spec
        name = spec.name if spec is not None else DEFAULT_NAME
        live = self.keys.table.by_name(name) if self.keys is not None else None
        period = (live or spec).period if spec is not None else "day"
        self.ledger.settle(name, period, seq.reserved, prompt, cached, completion, requests, time.time())
        self.metrics.observe_key(name, prompt, cached, completion, requests)

    def usage(self, name: Optional[str], period: Optional[str]) -> dict:
        """The /v1/usage body: recorded rows plus the live budget of each configured key."""
        now = time.time()
        specs = self.keys.table.specs if self.keys is not None else []
        return {"object": "list", "data": self.ledger.db.rows(name, period),
                "budgets": [self.ledger.snapshot(s, now) for s in specs if name is None or s.name == name]}


class StartupError(ValueError):
    """A bad keys file or usage database: the server does not start; the message names the field."""


def open_accounting(cfg: ServerConfig) -> tuple[Optional[KeyStore], Optional[UsageDB]]:
    """The key store (multi-key mode) and usage database the config asks for, or StartupError."""
    if cfg.api_keys_file and cfg.api_key:
        raise StartupError("api_keys_file: give either --api-key or --api-keys-file, not both")
    keys = None
    if cfg.api_keys_file:
        try:
            keys = KeyStore(cfg.api_keys_file, load_keys(cfg.api_keys_file))
        except KeysFileError as e:
            raise StartupError(str(e)) from None
    if keys is None and not cfg.usage_db:
        return None, None
    if not cfg.usage_db:
        logger.warning("no --usage-db: usage and budgets are kept in memory only (a restart forgets them)")
    try:
        return keys, UsageDB(cfg.usage_db)
    except sqlite3.Error as e:
        raise StartupError(f"usage_db: cannot open {cfg.usage_db!r} ({e})") from None
