"""The JSON files under ``$RADIXSERVE_CACHE`` that remember measurements between starts.

Contract: ``load`` returns {} for a missing, unreadable or corrupt file; ``save`` replaces the
file atomically and only logs a warning when it cannot (a read-only home measures again next
time).  Neither ever fails the caller.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

logger = logging.getLogger(__name__)


def load(path: Optional[str]) -> dict:
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save(path: Optional[str], data: dict) -> None:
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("could not write the measurement cache %s: %s", path, e)
