"""Writing a benchmark's JSON report (shared by the bench_*.py scripts)."""
from __future__ import annotations

import json
import os
from typing import Any, Optional


def write_json(path: Optional[str], report: Any) -> None:
    """Write ``report`` to ``path`` (creating its folder); nothing when ``path`` is None."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {path}")
