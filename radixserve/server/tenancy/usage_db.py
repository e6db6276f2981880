"""Usage records in an embedded SQLite database (``--usage-db``; WAL mode).

One row per (key name, period kind, period start) with the summed prompt, cached and
completion tokens and the request count.  ``add`` commits before it returns: with WAL and
``synchronous=NORMAL`` a committed charge survives a crash or kill of the process (a power
loss may drop the last transactions).  A commit costs tens of microseconds, so it runs on
the event loop.  One connection, used by the event-loop thread only.
"""
from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from typing import Any, Iterable, Optional

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    key_name TEXT NOT NULL,
    period TEXT NOT NULL,
    period_start TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_name, period, period_start)
) WITHOUT ROWID
"""
_UPSERT = """
INSERT INTO usage (key_name, period, period_start, prompt_tokens, cached_tokens, completion_tokens, requests)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key_name, period, period_start) DO UPDATE SET
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    requests = requests + excluded.requests
"""
_COLUMNS = ("key", "period", "period_start", "prompt_tokens", "cached_tokens", "completion_tokens", "requests")


def iso(ts: float) -> str:
    """A period start as an ISO-8601 UTC string (the database's and the API's form)."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")



def connect_sqlite(path: Optional[str]) -> sqlite3.Connection:
    """A connection to the SQLite file ``path`` (None: in memory) in autocommit mode, usable from
    any thread, with write-ahead logging for a file; raises ``sqlite3.Error``."""
    conn = sqlite3.connect(path or ":memory:", isolation_level=None, check_same_thread=False)
    if path:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=2000")
    return conn

class UsageDB:
    def __init__(self, path: Optional[str]) -> None:
        """Open (creating) ``path``; None keeps the records in memory only.
        Raises ``sqlite3.Error`` when the file cannot be opened."""
        self.path = path or ":memory:"
        self.conn = connect_sqlite(path)
        self.conn.execute(_SCHEMA)

    def add(self, name: str, periods: Iterable[tuple[str, float]], prompt: int, cached: int, completion: int,
            requests: int) -> None:
        """Add one charge to the row of each (period kind, period start); committed on return."""
        rows = [(name, kind, iso(start), prompt, cached, completion, requests) for kind, start in periods]
        with self.conn:  # one transaction
            self.conn.execute("BEGIN")
            self.conn.executemany(_UPSERT, rows)

    def total_tokens(self, name: str, period: str, start: float) -> int:
        """Prompt + completion tokens charged to ``name`` in that period."""
        row = self.conn.execute(
            "SELECT prompt_tokens + completion_tokens FROM usage WHERE key_name=? AND period=? AND period_start=?",
            (name, period, iso(start))).fetchone()
        return int(row[0]) if row else 0

    def rows(self, name: Optional[str] = None, period: Optional[str] = None, limit: int = 1000) -> list[dict[str, Any]]:
        """Usage rows (newest period first), optionally of one key name and/or period kind."""
        sql, args = "SELECT " + ", ".join(("key_name",) + _COLUMNS[1:]) + " FROM usage WHERE 1=1", []
        if name is not None:
            sql, args = sql + " AND key_name=?", args + [name]
        if period is not None:
            sql, args = sql + " AND period=?", args + [period]
        sql += " ORDER BY period_start DESC, key_name, period LIMIT ?"
        out = []
        for r in self.conn.execute(sql, (*args, limit)):
            d = dict(zip(_COLUMNS, r))
            d["total_tokens"] = d["prompt_tokens"] + d["completion_tokens"]
            out.append(d)
        return out

    def close(self) -> None:
        self.conn.close()
