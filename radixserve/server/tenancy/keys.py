"""The API keys file (``--api-keys-file keys.toml``): parsed strictly, reloadable.

    [[keys]]
    key = "sk-alice-..."            # the bearer secret (required, unique)
    name = "alice"                  # the name usage and metrics are recorded under (required, unique)
    budget_tokens = 100000          # prompt + completion tokens per period (absent: unlimited)
    period = "day"                  # minute | hour | day | month (UTC calendar periods; default day)
    requests_per_minute = 60        # token-consuming requests in any 60 s (absent: unlimited)
    routes = ["/v1/*", "/generate"] # path globs this key may call (default ["*"])
    admin = false                   # admin routes (/v1/usage, /metrics, /flush_cache, /abort_request, /cache/*,
                                    #   /load_lora_adapter, /unload_lora_adapter)
    cache_salt = "team-a"           # prefix-cache namespace (default: the name); keys sharing it share hits

Every error names the file, the entry and the field: ``keys.toml: keys[2].budget_tokens:
must be a positive integer``.  ``KeyStore.reload`` (SIGHUP) swaps the whole table at once,
or keeps the old one when the new file is bad.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import re
import tomllib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

logger = logging.getLogger(__name__)

PERIODS = ("minute", "hour", "day", "month")
ADMIN_PATHS = ("/v1/usage", "/metrics", "/flush_cache", "/abort_request", "/cache/tree", "/cache/stats",
               "/load_lora_adapter", "/unload_lora_adapter")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_FIELDS = ("key", "name", "budget_tokens", "period", "requests_per_minute", "routes", "admin", "cache_salt")


class KeysFileError(ValueError):
    """A bad keys file; the message names the file, entry and field."""


@dataclass(frozen=True)
class KeySpec:
    key: str
    name: str
    budget_tokens: Optional[int] = None
    period: str = "day"
    requests_per_minute: Optional[int] = None
    routes: tuple[str, ...] = ("*",)
    admin: bool = False
    cache_salt: Optional[str] = None

    @property
    def salt(self) -> str:
        """The key's prefix-cache namespace."""
        return self.cache_salt or self.name

    def may_call(self, path: str) -> bool:
        """Admin keys call everything; others any path a glob allows, never an admin path."""
        if self.admin:
            return True
        if path in ADMIN_PATHS:
            return False
        return any(fnmatch.fnmatchcase(path, g) for g in self.routes)


@dataclass(frozen=True)
class KeyTable:
    by_secret: Mapping[str, KeySpec]

    @property
    def specs(self) -> list[KeySpec]:
        return list(self.by_secret.values())

    def by_name(self, name: str) -> Optional[KeySpec]:
        return next((s for s in self.by_secret.values() if s.name == name), None)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry(i: int, raw: Any) -> KeySpec:
    where = f"keys[{i}]"
    if not isinstance(raw, dict):
        raise KeysFileError(f"{where}: must be a table ([[keys]])")

    def bad(name: str, why: str) -> KeysFileError:
        return KeysFileError(f"{where}.{name}: {why}")

    for name in raw:
        if name not in _FIELDS:
            raise bad(name, f"unknown field (known: {', '.join(_FIELDS)})")
    for name in ("key", "name"):
        if name not in raw:
            raise bad(name, "required")
    key = raw["key"]
    if not isinstance(key, str) or not key or any(c.isspace() for c in key):
        raise bad("key", "must be a non-empty string without whitespace")
    name = raw["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad("name", "must be 1-64 characters of letters, digits, '_', '.', '-'")
    for field in ("budget_tokens", "requests_per_minute"):
        v = raw.get(field)
        if v is not None and not (_is_int(v) and v > 0):
            raise bad(field, "must be a positive integer")
    period = raw.get("period", "day")
    if period not in PERIODS:
        raise bad("period", f"must be one of {', '.join(PERIODS)} (got {period!r})")
    routes = raw.get("routes", ["*"])
    if not isinstance(routes, list) or not routes or not all(
            isinstance(r, str) and r[:1] in ("/", "*") for r in routes):
        raise bad("routes", "must be a non-empty list of path globs starting with '/' or '*'")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise bad("admin", "must be true or false")
    salt = raw.get("cache_salt")
    if salt is not None and not (isinstance(salt, str) and 0 < len(salt) <= 256 and "\0" not in salt):
        raise bad("cache_salt", "must be a non-empty string of at most 256 characters")
    return KeySpec(key, name, raw.get("budget_tokens"), period, raw.get("requests_per_minute"), tuple(routes),
                   admin, salt)


def parse_keys(data: Mapping[str, Any]) -> KeyTable:
    """Validate parsed TOML; KeysFileError names the entry and field (without the file)."""
    extra = sorted(set(data) - {"keys"})
    if extra:
        raise KeysFileError(f"{extra[0]}: unknown top-level field (only [[keys]] entries)")
    entries = data.get("keys")
    if not isinstance(entries, list) or not entries:
        raise KeysFileError("keys: at least one [[keys]] entry is required")
    by_secret: dict[str, KeySpec] = {}
    first_of: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(entries):
        spec = _entry(i, raw)
        for field in ("key", "name"):
            seen = first_of.setdefault((field, getattr(spec, field)), i)
            if seen != i:
                raise KeysFileError(f"keys[{i}].{field}: duplicate of keys[{seen}].{field}")
        by_secret[spec.key] = spec
    return KeyTable(MappingProxyType(by_secret))


def load_keys(path: str) -> KeyTable:
    """Read and validate ``path``; KeysFileError("<file>: <entry>.<field>: <why>")."""
    label = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise KeysFileError(f"{label}: cannot read ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise KeysFileError(f"{label}: invalid TOML ({e})") from None
    try:
        return parse_keys(data)
    except KeysFileError as e:
        raise KeysFileError(f"{label}: {e}") from None


class KeyStore:
    """The live key table.  ``table`` is replaced whole (never mutated), so readers on the
    event loop see either the old or the new table; ``reload`` runs on the event loop."""

    def __init__(self, path: str, table: KeyTable) -> None:
        self.path = path
        self.table = table

    def lookup(self, secret: Optional[str]) -> Optional[KeySpec]:
        return self.table.by_secret.get(secret) if secret else None

    def reload(self) -> Optional[str]:
        """Re-read the file; on error keep the old keys and return the message (logged)."""
        try:
            table = load_keys(self.path)
        except KeysFileError as e:
            logger.error("keys file reload failed, keeping the old keys: %s", e)
            return str(e)
        self.table = table
        logger.warning("keys file reloaded: %d key(s)", len(table.by_secret))
        return None
