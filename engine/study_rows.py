"""How a run's tuning study is named (the window's runs list and its filter, `dpw list`) and when
Compare warns that choosing among the runs it shows is a selection nobody accounted for."""

from __future__ import annotations

from typing import Any

from engine.publication import exploratory_note

ACCOUNTED_MODES = ("private", "composition")


def study_label(row: dict[str, Any]) -> str:
    """The Study column: "3 study-digits (private, released)"; empty for a run outside any study.
    A private study's other candidates read "not released"; an unfinished study says how it stands."""
    study = row.get("study")
    if not study:
        return ""
    words = [study.get("mode") or "?"]
    if study.get("mode") == "private" and study.get("status") == "finished":
        words.append("released" if study.get("released_run_id") == row.get("id") else "not released")
    elif study.get("mode") == "exploratory" and study.get("released_run_id") == row.get("id"):
        words.append("selected")
    if study.get("status") != "finished":
        words.append(str(study.get("status")))
    return f"{study.get('id')} {study.get('name')} ({', '.join(words)})"


def study_sort_key(row: dict[str, Any]) -> str:
    """Sorting by the Study column groups each study's runs together, studies in the order they were made."""
    study = row.get("study")
    return "" if not study else f"{int(study.get('id') or 0):08d} {study.get('name')}"


def exploratory_banner(rows: list[dict[str, Any]]) -> str | None:
    """What Compare says when the runs it shows on the same data could be chosen among: the exploratory
    note for their number, unless the choice is already covered (all of them runs of one composition
    study, every one releasable, so keeping the best is post-processing). None for fewer than two runs."""
    if len(rows) < 2:
        return None
    studies = {(r.get("study") or {}).get("id") for r in rows}
    study = rows[0].get("study") or {}
    if len(studies) == 1 and study.get("mode") == "composition" and study.get("status") == "finished":
        return None
    return (f"Choosing the best of these {len(rows)} runs: {exploratory_note(len(rows))}. "
            "A tuning study (Run ▸ Study…) accounts for the choice.")
