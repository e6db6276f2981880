"""Charging every token-consuming request to its API key, at the one place all routes pass:
the TokenizerManager's ``submit`` (``admit``) and the end of each sequence (``settle``).

The key comes from ``current_key``, a context variable the ``KeyAuthMiddleware`` sets for
the request's task (None: single-key or no-key mode, charged to ``DEFAULT_NAME`` without
limits).  ``admit`` raises ``RequestError(429)`` with ``Retry-After`` before anything is
sent or charged; otherwise it salts the sequences' prefix-cache namespace (multi-key mode)
and reserves their worst case.  ``settle`` charges what a sequence consumed: its completion
tokens, and with the last copy of its prompt (``n > 1``) the prompt, once, unless no copy
computed it (each ended by an error or abort before its first token); a request counts
once, with the first charge that has any token.  Event loop only.
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
from radixserve.server.tenancy.budget import Ledger, LimitExceeded
from radixserve.server.tenancy.keys import KeySpec, KeysFileError, KeyStore, load_keys
from radixserve.server.req_state import ReqState, RequestError
from radixserve.server.tenancy.usage_db import UsageDB

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
class _Prompt:
    """One prompt of a request and its ``n`` copies: the prompt is reserved and charged once,
    when its last copy ends, if any copy computed it."""

    tokens: int
    reserved: int
    copies: int = 0
    computed: bool = False
    cached: int = 0


@dataclass
class _Seq:
    group: _Group
    prompt: _Prompt
    reserved: int  # its max_new_tokens (0 without a key)


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
        need = sum((len(r.input_ids) if r.copy == 0 else 0) + r.sampling.max_new_tokens for r in reqs)
        if spec is not None:
            try:
                self.ledger.admit(spec, need, time.time())
            except LimitExceeded as e:
                self.metrics.observe_key_rejected(spec.name, e.reason)
                raise RequestError(429, e.message, {"Retry-After": str(e.retry_after)}) from None
            if self.keys is not None:
                for sp in {id(r.sampling): r.sampling for r in reqs}.values():  # each object once
                    sp.cache_salt = salted(spec.salt, sp.cache_salt)
        group, keyed = _Group(spec), spec is not None
        prompt = _Prompt(0, 0)
        for r in reqs:
            if r.copy == 0:
                prompt = _Prompt(len(r.input_ids), len(r.input_ids) if keyed else 0)
            prompt.copies += 1
            self.pending[r.rid] = _Seq(group, prompt, r.sampling.max_new_tokens if keyed else 0)

    def settle(self, st: ReqState) -> None:
        """``st`` is done: charge what it consumed to its key (durable on return)."""
        seq = self.pending.pop(st.rid, None)
        if seq is None:
            return
        completion, p = len(st.output_ids), seq.prompt
        if completion > 0 or (st.error is None and (st.finish_reason or {}).get("type") != "abort"):
            if not p.computed:
                p.computed, p.cached = True, st.cached_tokens
        p.copies -= 1
        reserved, prompt, cached = seq.reserved, 0, 0
        if p.copies == 0:  # the prompt's last copy: release its reservation, charge it if computed
            reserved += p.reserved
            prompt, cached = (p.tokens, min(p.cached, p.tokens)) if p.computed else (0, 0)
        g = seq.group
        requests = 0 if g.request_counted or not (prompt or completion) else 1
        g.request_counted = g.request_counted or requests == 1
        name = g.spec.name if g.spec is not None else DEFAULT_NAME
        live = self.keys.table.by_name(name) if self.keys is not None else None
        period = (live or g.spec).period if g.spec is not None else "day"
        self.ledger.settle(name, period, reserved, prompt, cached, completion, requests, time.time())
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
