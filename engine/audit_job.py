"""The membership audit of a stored run, computed in a process of its own and kept with the run.

`python -m engine.audit_job RUN --db DB [--data-dir DIR] [--background]` runs `engine.audit_run.audit_run` (the
window starts it, so the window never waits on torch or the data) and stores the result in the run's
summary under `membership_audit`, so it is computed once per run. A finished run's runner does the
same right after training (`audit_after_training`), so every finished run carries its audit. Output: JSON lines,
    {"type": "progress", "phase": "auditing"}
    {"type": "result", "audit": {...}}            the stored object (stored_audit)
    {"type": "error", "kind": ..., "message": ..., "hint": ...}  a one-line user error; kind "DataError":
                                                   the run's data files are gone or changed
The result is computed from private data: it stays in the local store and is shown locally; a
report carries it only when asked (`dpw report --include-audit`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import DPWError

MEMBERSHIP_AUDIT_KEY = "membership_audit"
"""The key of the stored audit in a run's summary."""

_ROC_GRID = np.unique(np.concatenate([np.logspace(-5, 0, 201), np.linspace(0.0, 1.0, 201)]))


def thin_roc(fpr, tpr, grid=_ROC_GRID) -> tuple[np.ndarray, np.ndarray]:
    """A subset of a ROC's own points for display and storage: at each grid FPR, the point with the
    highest TPR at an FPR at most that (the ROC ascends), plus both ends. The curve keeps its shape on
    linear and log FPR axes in a few hundred points instead of one per example."""
    f, t = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
    if f.size <= grid.size:
        return f, t
    picks = np.searchsorted(f, grid, side="right") - 1
    keep = np.unique(np.concatenate([[0, f.size - 1], picks[picks >= 0]]))
    return f[keep], t[keep]


def stored_audit(audit_json: dict[str, Any]) -> dict[str, Any]:
    """The `dpw audit --json` object as kept with the run: its ROC thinned (thin_roc), and when."""
    body = json.loads(json.dumps(audit_json))  # a deep copy of plain JSON
    roc = body["mia"]["roc"]
    fpr, tpr = thin_roc(roc["fpr"], roc["tpr"])
    body["mia"]["roc"] = {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "points": len(roc["fpr"]),
                          "thinned": len(fpr) < len(roc["fpr"])}
    body["computed"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return body


def audit_and_store(store, run_ref: str | int, *, data_dir: str | None = None) -> dict[str, Any]:
    """Audit the run (engine.audit_run defaults), keep the result in its summary, return it."""
    from engine.audit_run import audit_run

    result = audit_run(store, run_ref, data_dir=data_dir)
    body = stored_audit(result.to_json())
    body.pop("canaries", None)  # the canary audit is the training run's own result, kept where it put it
    store.set_summary_key(result.run_id, MEMBERSHIP_AUDIT_KEY, body)
    return body


def audit_after_training(store, run_id: int) -> dict[str, Any] | None:
    """The membership audit every finished run gets from its own runner, at no training cost (unless
    its config sets `membership_audit = false`): kept in its summary as `audit_and_store` keeps it.
    The run is already finished when this starts, so nothing here can fail it: a run that cannot be
    audited says why in one line on stderr, and the Audit tab or `dpw audit` can try again."""
    from engine.config import RunConfig
    from engine.publication import publishable_epsilon

    run = store.get_run(run_id)
    if run.get("status") != "finished" or not RunConfig.from_dict(run["config"]).membership_audit:
        return None
    if publishable_epsilon(run).withheld:
        return None  # a private study's candidate, not released (yet): the study audits the one it releases
    try:
        return audit_and_store(store, run_id)
    except DPWError as exc:
        print(f"note: run {run_id} was not audited: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
              file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.audit_job",
                                     description="Membership audit of a stored run, kept in its summary.")
    parser.add_argument("run")
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--background", action="store_true",
                        help="run at a lower CPU priority (the window's audits: the window and runs come first)")
    args = parser.parse_args(argv)
    if args.background and hasattr(os, "nice"):
        os.nice(10)

    def say(obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    say({"type": "progress", "phase": "auditing"})
    try:
        from engine.store import Store

        body = audit_and_store(Store(args.db), args.run, data_dir=args.data_dir)
    except DPWError as exc:
        say({"type": "error", "kind": type(exc).__name__, "message": exc.message, "hint": exc.hint})
        return 1
    say({"type": "result", "audit": body})
    return 0


if __name__ == "__main__":
    sys.exit(main())
