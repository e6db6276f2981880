"""Stored responses of /v1/responses, for ``previous_response_id``, ``GET`` and ``DELETE``, in SQLite.

With ``--usage-db FILE`` the responses are kept in that file (the server's database; a table of
their own, ``responses``), so they survive a restart; without it in an in-memory SQLite database
holding the newest ``MEMORY_LIMIT`` responses (older ones are dropped, and a restart forgets all).
A row is the response object as returned (JSON), the conversation it continues from (every input
item of the earlier turns and this one's, resolved: a continuation re-renders them in order, so its
prompt starts with the earlier prompt and the radix cache serves that prefix) and its output items.
``owner``: the API key's name in multi-key mode (``--api-keys-file``): another key's response is
unknown to a key, as if it did not exist.  One connection, used from the event loop only (a write
commits in tens of microseconds).
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional

from radixserve.server.tenancy.usage_db import connect_sqlite

MEMORY_LIMIT = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    response TEXT NOT NULL,
    conversation TEXT NOT NULL
)
"""


class ResponseStore:
    def __init__(self, path: Optional[str]) -> None:
        """Open (creating the table in) the SQLite file ``path``; None: in memory, bounded.
        Raises ``sqlite3.Error`` when the file cannot be opened."""
        self.path = path or ":memory:"
        self.bounded = not path
        self.conn = connect_sqlite(path)
        self.conn.execute(_SCHEMA)

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]], owner: str = "") -> None:
        """Store ``response`` (by its ``id``) and the items of its turn's conversation (its input items,
        earlier turns' included, then its output items)."""
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                              (response["id"], owner, time.time(), json.dumps(response), json.dumps(conversation)))
            if self.bounded:
                self.conn.execute("DELETE FROM responses WHERE id NOT IN "
                                  "(SELECT id FROM responses ORDER BY created_at DESC LIMIT ?)", (MEMORY_LIMIT,))

    def get(self, rid: str, owner: str = "") -> Optional[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """(the response, its conversation items) or None when ``owner`` has no response ``rid``."""
        row = self.conn.execute("SELECT response, conversation FROM responses WHERE id=? AND owner=?",
                                (rid, owner)).fetchone()
        return None if row is None else (json.loads(row[0]), json.loads(row[1]))

    def delete(self, rid: str, owner: str = "") -> bool:
        """Whether a response ``rid`` of ``owner`` was there (and is gone now)."""
        return self.conn.execute("DELETE FROM responses WHERE id=? AND owner=?", (rid, owner)).rowcount > 0

    def close(self) -> None:
        self.conn.close()
