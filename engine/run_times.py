"""How long a run took, from its stored start and end, in words: the runs list, the results panel,
the dashboard and comparisons say it alike."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any


def _when(value: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def duration_seconds(row: dict[str, Any], now: dt.datetime | None = None) -> float | None:
    """Seconds from start to finish (to now while it runs); None for a run that never started."""
    start = _when(row.get("started"))
    if start is None:
        return None
    end = _when(row.get("finished"))
    if end is None:
        if row.get("status") != "running":
            return None
        end = now or dt.datetime.now(start.tzinfo)
    return max((end - start).total_seconds(), 0.0)


def format_duration(seconds: float | None) -> str:
    """Seconds in words ("4 min 05 s"); empty when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
