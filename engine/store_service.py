"""The store behind a pipe: `python -m engine.store_service DB` answers JSON-line requests on stdin.

The window never opens the SQLite file itself. POSIX advisory locks belong to a process and die
when any descriptor of the file in that process is closed (sqlite.org, "How To Corrupt An SQLite
Database File", section 2.2); Qt's file dialogs open the files they list, so a window holding a
connection lost its locks, and the next `dpw` deleted `-wal`/`-shm` under it. This process opens
nothing but the store, so its locks hold.

Protocol (one JSON object per line, UTF-8):
  first line out:  {"ready": true, "path": ..., "pid": ...}  or  {"ready": false, "error": {...}}
  request in:      {"id": 7, "method": "get_run", "args": [3], "kwargs": {}}
  reply out:       {"id": 7, "result": ...}  or  {"id": 7, "error": {"type", "message", "hint"}}
A reply carries "reopened": true when the store file was replaced (or its -wal deleted) since the
previous request and was opened again. End of input ends the process.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from engine.errors import explain
from engine.store import Store


def replay(store: Store, run_id: int) -> dict[str, Any]:
    """What a window needs to redraw a stored run, in one read: its row, its metric and privacy
    curves as {name: [steps, values]} (columns: a tenth of the JSON of one object per row), and
    its other events, progress thinned to what a replay shows (engine.store_service.thin_progress)."""
    run = store.get_run(run_id)
    conn = store.db.conn
    metrics = conn.execute("select name, step, value from metrics where run_id = ? order by name, step, rowid",
                           [run_id]).fetchall()
    privacy = conn.execute("select accountant, step, epsilon from privacy where run_id = ? "
                           "order by accountant, step, rowid", [run_id]).fetchall()
    events = thin_progress(store.events(run_id, exclude=("metric", "privacy", "started")))
    return {"run": run, "metrics": _columns(metrics), "privacy": _columns(privacy), "events": events}


def _columns(rows: list[tuple]) -> dict[str, list[list[Any]]]:
    curves: dict[str, list[list[Any]]] = {}
    for name, step, value in rows:
        curve = curves.get(name)
        if curve is None:
            curve = curves[name] = [[], []]
        curve[0].append(step)
        curve[1].append(value)
    return curves


def thin_progress(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop progress events between the first and the last of a phase: a replay shows only where
    a phase started and where it got to (a run emits one per step)."""
    kept = []
    for i, event in enumerate(events):
        if event["type"] == "progress" and kept:
            following = events[i + 1] if i + 1 < len(events) else None
            phase = event.get("phase")
            if (kept[-1]["type"] == "progress" and kept[-1].get("phase") == phase and following is not None
                    and following["type"] == "progress" and following.get("phase") == phase):
                continue
        kept.append(event)
    return kept


def _create_run(store: Store, config: dict[str, Any]) -> int:
    from engine.config import RunConfig

    return store.create_run(RunConfig.from_dict(config))


def _continue_run(store: Store, run_id: int) -> int:
    """A queued run that continues `run_id` from its checkpoint (engine.checkpoint; `dpw resume`)."""
    from engine.config import RunConfig
    from engine.runner import resumable

    parent = resumable(store, run_id)  # (the runner reads the checkpoint: torch is not loaded here)
    return store.create_run(RunConfig.from_dict(parent["config"]), resumed_from=run_id)


def _remove_run(store: Store, run_id: int) -> dict[str, Any]:
    from engine.runner import remove_run

    return remove_run(store, run_id)


def _export_run(store: Store, run_ref: Any, out_dir: str, kind: str = "model", force: bool = False) -> dict[str, str]:
    from engine.export import export_run

    return export_run(store, run_ref, out_dir, kind=kind, force=force)


def _build_report(store: Store, run_ref: Any, **options: Any) -> dict[str, Any]:
    from engine.report import build_report, render_html

    report = build_report(store, run_ref, **options)
    return {"report": report, "html": render_html(report)}


# What a client may ask for: the store's own reads and the few writes a window does ...
STORE_METHODS = frozenset({"list_runs", "get_run", "find_run", "events", "metrics", "privacy", "votes",
                           "artifacts", "deleted_runs", "table_counts", "update_run", "reconcile_orphans",
                           "tags", "set_tags", "add_tags", "remove_tags", "set_notes", "rename_run"})
# ... and what needs more than one Store call.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "replay": replay, "create_run": _create_run, "continue_run": _continue_run, "remove_run": _remove_run, "export_run": _export_run,
    "build_report": _build_report, "ping": lambda store: os.getpid(),
}


def error_reply(exc: BaseException, *, store_path: Path | None = None) -> dict[str, Any]:
    """A failure as the caller gets it. One that is the user's situation (a path through a file, a
    full disk, a locked store: engine.errors.explain) is a user error in the words `dpw` uses, not
    an exception's repr; anything else keeps its type and text."""
    message, hint, is_bug = explain(exc, store_path=store_path)
    if is_bug:
        return {"type": type(exc).__name__, "message": str(exc), "hint": None, "user_error": False}
    reply = {"type": type(exc).__name__, "message": message, "hint": hint, "user_error": True}
    if isinstance(getattr(exc, "field", None), str):  # a ConfigError: which setting it is about
        reply["field"] = exc.field
    return reply


def answer(store: Store, request: dict[str, Any]) -> dict[str, Any]:
    """One request's reply; the store is checked for replacement first."""
    reply: dict[str, Any] = {"id": request.get("id")}
    try:
        if store.reopen_if_replaced():
            reply["reopened"] = True
        name = request.get("method", "")
        if name in STORE_METHODS:
            method = getattr(store, name)
        elif name in FUNCTIONS:
            method = functools.partial(FUNCTIONS[name], store)
        else:
            raise ValueError(f"unknown store method {name!r}")
        reply["result"] = method(*request.get("args", []), **request.get("kwargs", {}))
    except Exception as exc:  # every failure goes back to the caller, the service keeps serving
        reply["error"] = error_reply(exc, store_path=store.path)
    return reply


def serve(path: Path, stdin, stdout) -> int:
    def send(obj: dict[str, Any]) -> None:
        stdout.write(json.dumps(obj, default=str) + "\n")
        stdout.flush()

    try:
        store = Store(path)
    except Exception as exc:
        send({"ready": False, "error": error_reply(exc)})
        return 1
    send({"ready": True, "path": str(path), "pid": os.getpid()})
    try:
        for line in stdin:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError as exc:
                send({"id": None, "error": error_reply(exc)})
                continue
            send(answer(store, request))
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engine.store_service DB", file=sys.stderr)
        return 2
    # The protocol owns stdout: anything else printed (a library's warning) goes to stderr.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr
    return serve(Path(args[0]), sys.stdin, protocol)


if __name__ == "__main__":
    sys.exit(main())
