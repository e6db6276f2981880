"""GET /v1/usage?key=<name>&period=<kind>: the usage recorded per key and period.

Rows: ``{key, period, period_start, prompt_tokens, cached_tokens, completion_tokens,
total_tokens, requests}`` (newest first); ``budgets``: each configured key's live state
(charged, reserved, remaining).  Multi-key mode: admin keys only (403 otherwise; the
middleware checks it too).  404 when the server keeps no accounting.
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter

from radixserve.server.tenancy.accounting import current_key
from radixserve.server.tenancy.keys import PERIODS
from radixserve.server.req_state import RequestError


def usage_router(ctx: Any) -> APIRouter:
    """The usage route over ``ctx`` (the app's ``ServerContext``)."""
    router = APIRouter()

    @router.get("/v1/usage")
    async def usage(key: Optional[str] = None, period: Optional[str] = None):
        acct = ctx.tm.accounting
        if acct is None:
            raise RequestError(404, "usage: not recorded (start the server with --api-keys-file or --usage-db)")
        spec = current_key.get()
        if acct.keys is not None and not (spec is not None and spec.admin):
            raise RequestError(403, "authorization: /v1/usage needs an admin key")
        if period is not None and period not in PERIODS:
            raise RequestError(400, f"period: must be one of {', '.join(PERIODS)}")
        return acct.usage(key, period)

    return router
