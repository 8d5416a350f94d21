"""Which runs a search text picks, in the window's filter box and in `dpw list TEXT`: those whose name,
dataset, mechanism, status, tags or study contain every word of it, in any case."""

from __future__ import annotations

from typing import Any

from engine.study_rows import study_label

FILTERED_KEYS = ("name", "dataset", "mechanism", "status", "tags", "study")


def tags_text(row: dict[str, Any]) -> str:
    """A run's tags as the runs list and the tags box show them: "baseline, lr 0.5"."""
    return ", ".join(row.get("tags") or [])


def searched_text(row: dict[str, Any]) -> str:
    """What a search looks in: the run's FILTERED_KEYS as the runs list shows them, lower case."""
    return " ".join(tags_text(row) if key == "tags" else study_label(row) if key == "study"
                    else str(row.get(key) or "") for key in FILTERED_KEYS).lower()


def matches(row: dict[str, Any], words: list[str]) -> bool:
    """Whether every one of `words` (lower case) is in the run's searched text."""
    text = searched_text(row)
    return all(word in text for word in words)
