"""The run store: one SQLite file (WAL mode) through sqlite-utils.

The runner process is the only writer of a run's rows; the GUI and CLI read. Each event is
written in its own transaction, so a killed runner leaves every completed step in the file.
The schema carries a version (`PRAGMA user_version`) and is migrated forward, never dropped.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterable

import sqlite_utils

from engine.errors import DPWError
from engine.store_files import abandon, empty_old_wal, replaced, store_files

SCHEMA_VERSION = 2
STATUSES = ("queued", "running", "finished", "stopped", "failed")


def default_db_path() -> Path:
    """`$DPW_DB`, else runs.sqlite in the per-user data folder."""
    env = os.environ.get("DPW_DB")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("dp-workbench")) / "runs.sqlite"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _migration_1(db: sqlite_utils.Database) -> None:
    db["runs"].create(
        {
            "id": int,
            "name": str,
            "mechanism": str,
            "dataset": str,
            "model": str,
            "config": str,
            "config_hash": str,
            "status": str,
            "created": str,
            "started": str,
            "finished": str,
            "pid": int,
            "host": str,
            "device": str,
            "num_train": int,
            "num_test": int,
            "sample_rate": float,
            "noise_multiplier": float,
            "clipping_norm": float,
            "steps_planned": int,
            "steps_done": int,
            "epochs_done": float,
            "accuracy": float,
            "epsilon": float,
            "delta": float,
            "accountant": str,
            "epsilon_budget": float,
            "stop_reason": str,
            "error": str,
            "error_hint": str,
            "summary": str,
        },
        pk="id",
    )
    db["metrics"].create(
        {"run_id": int, "step": int, "epoch": float, "name": str, "value": float},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["metrics"].create_index(["run_id", "name", "step"])
    db["privacy"].create(
        {"run_id": int, "step": int, "epsilon": float, "delta": float, "accountant": str},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["privacy"].create_index(["run_id", "accountant", "step"])
    db["events"].create(
        {"run_id": int, "seq": int, "type": str, "t": float, "payload": str},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["events"].create_index(["run_id", "seq"])
    db["artifacts"].create(
        {"run_id": int, "kind": str, "path": str, "sha256": str, "created": str},
        foreign_keys=[("run_id", "runs", "id")],
    )
    # PATE: one row per student query. histogram is a JSON list of vote counts per class;
    # label is the released label (NULL when the query was rejected); epsilon_cost is the
    # query's share of the data-dependent privacy cost (NULL when not computed per query).
    db["votes"].create(
        {
            "run_id": int,
            "query_index": int,
            "histogram": str,
            "answered": int,
            "label": int,
            "true_label": int,
            "epsilon_cost": float,
            "epsilon_after": float,
        },
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["votes"].create_index(["run_id", "query_index"], unique=True)


def _migration_2(db: sqlite_utils.Database) -> None:
    # What a deleted run was and when it was deleted: its privacy spend on the data still happened
    # (a reviewer may ask), and its id is never given to a new run.
    db["deleted_runs"].create(
        {
            "id": int,
            "name": str,
            "mechanism": str,
            "dataset": str,
            "status": str,
            "epsilon": float,
            "delta": float,
            "accountant": str,
            "config_hash": str,
            "created": str,
            "finished": str,
            "deleted": str,
        },
        pk="id",
    )


MIGRATIONS = [_migration_1, _migration_2]


def check_deletable(run: dict[str, Any]) -> None:
    """Raise DPWError if `run` (a row of `runs`) may not be deleted: it is running."""
    if run["status"] == "running":
        raise DPWError(f"run {run['id']} ({run['name']}) is running; stop it before deleting it",
                       hint="Ctrl-C in its `dpw run`, or Stop in the window")
RUN_TABLES = ("metrics", "privacy", "events", "artifacts", "votes")  # rows owned by a run


class Store:
    """Read and write runs, their events and the rows derived from them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite_utils.Database(self.path)
        self.db.conn.execute("PRAGMA busy_timeout = 10000")
        self.db.enable_wal()
        self.db.conn.execute("PRAGMA synchronous = NORMAL")
        self.db.conn.execute("PRAGMA foreign_keys = ON")
        self._seq: dict[int, int] = {}
        self.migrate()
        self._files = store_files(self.path)  # what this connection holds (reopen_if_replaced)

    # ---- schema -----------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return self.db.conn.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise DPWError(
                f"{self.path} has store schema {version}, newer than this version of DP Workbench "
                f"reads ({SCHEMA_VERSION})",
                hint="upgrade dp-workbench, or use another --db file",
            )
        for number in range(version + 1, SCHEMA_VERSION + 1):
            with self.db.conn:
                MIGRATIONS[number - 1](self.db)
                self.db.conn.execute(f"PRAGMA user_version = {number}")

    def close(self) -> None:
        self.db.close()

    def reopen_if_replaced(self) -> bool:
        """Open the path again if its file was replaced, or its -wal deleted, under this connection
        (engine.store_files); True if it did. The stale connection is abandoned, never closed."""
        if not replaced(self._files, self.path):
            return False
        if not self.path.exists():
            raise DPWError(f"{self.path} was deleted or moved while in use",
                           hint="put the file back, or open another store with --db")
        if not empty_old_wal(self._files, self.db.conn, self.path):
            raise DPWError(f"{self.path} was replaced while {self.path.name}-wal still holds the old file's "
                           "changes, in use by another process",
                           hint="stop the dpw commands and runs using the old file, then refresh")
        fresh = Store(self.path)
        abandon(self.db.conn)
        self.db, self._files, self._seq = fresh.db, fresh._files, {}
        return True

    # ---- runs -------------------------------------------------------------------------------
    def create_run(self, config: Any) -> int:
        """Store a config as a new queued run; `config` is a RunConfig."""
        with self.db.conn:
            row = {
                "name": config.name,
                "mechanism": config.mechanism,
                "dataset": config.dataset,
                "model": config.model,
                "config": json.dumps(config.to_dict(), sort_keys=True),
                "config_hash": config.config_hash(),
                "status": "queued",
                "created": now_iso(),
                "epsilon_budget": getattr(config, "epsilon_budget", None),
                "steps_done": 0,
                "id": self._next_run_id(),
            }
            return self.db["runs"].insert(row).last_pk

    def _next_run_id(self) -> int:
        """One more than any id ever used here, deleted runs included (ids are never reused)."""
        used = self.db.conn.execute(
            "select max(coalesce((select max(id) from runs), 0), coalesce((select max(id) from deleted_runs), 0))"
        ).fetchone()[0]
        return int(used) + 1

    def delete_run(self, run_id: int) -> dict[str, Any]:
        """Delete a run and every row it owns in one transaction, keeping a line in `deleted_runs`;
        returns the run as it was. A running run is refused: its runner would go on writing."""
        self.reconcile_orphans()
        run = self.get_run(run_id)
        check_deletable(run)
        keep = ("id", "name", "mechanism", "dataset", "status", "epsilon", "delta", "accountant",
                "config_hash", "created", "finished")
        with self.db.conn:
            self.db["deleted_runs"].insert({**{k: run.get(k) for k in keep}, "deleted": now_iso()}, replace=True)
            for table in RUN_TABLES:
                self.db.conn.execute(f"delete from {table} where run_id = ?", [run_id])
            self.db.conn.execute("delete from runs where id = ?", [run_id])
        self._seq.pop(run_id, None)
        return run

    def deleted_runs(self) -> list[dict[str, Any]]:
        return list(self.db["deleted_runs"].rows_where(order_by="id"))

    def update_run(self, run_id: int, **fields: Any) -> None:
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"unknown status {fields['status']!r}")
        if "summary" in fields and not isinstance(fields["summary"], str):
            fields["summary"] = json.dumps(fields["summary"], sort_keys=True)
        with self.db.conn:
            self.db["runs"].update(run_id, fields)

    def mark_running(self, run_id: int, **fields: Any) -> None:
        self.update_run(
            run_id, status="running", started=now_iso(), pid=os.getpid(), host=socket.gethostname(), **fields
        )

    def get_run(self, run_id: int) -> dict[str, Any]:
        try:
            row = self.db["runs"].get(run_id)
        except sqlite_utils.db.NotFoundError:
            raise DPWError(f"no run with id {run_id} in {self.path}", hint="`dpw list` shows the runs") from None
        return _decode_run(row)

    def find_run(self, ref: str | int) -> dict[str, Any]:
        """A run by id, or by name (the newest run of that name)."""
        if isinstance(ref, int) or str(ref).isdigit():
            return self.get_run(int(ref))
        rows = list(self.db["runs"].rows_where("name = ?", [ref], order_by="id desc", limit=1))
        if not rows:
            raise DPWError(f"no run named {ref!r} in {self.path}", hint="`dpw list` shows the runs")
        return _decode_run(rows[0])

    def list_runs(self) -> list[dict[str, Any]]:
        self.reconcile_orphans()
        return [_decode_run(r) for r in self.db["runs"].rows_where(order_by="id")]

    def reconcile_orphans(self) -> list[int]:
        """Mark runs whose runner process on this host is gone as failed. Returns their ids."""
        host = socket.gethostname()
        lost = []
        for row in self.db["runs"].rows_where("status = 'running' and host = ?", [host]):
            if row["pid"] and not _pid_alive(row["pid"]):
                lost.append(row["id"])
        for run_id in lost:
            self.update_run(
                run_id,
                status="failed",
                finished=now_iso(),
                error="the runner process ended without reporting (killed or crashed)",
                error_hint="everything up to its last completed step is kept; start the run again to retry",
            )
        return lost

    # ---- events and derived rows -------------------------------------------------------------
    def record_event(self, event: dict[str, Any]) -> None:
        """Write one event and the metric/privacy/artifact row it carries, in one transaction."""
        run_id = event["run_id"]
        if run_id not in self._seq:
            last = self.db.conn.execute(
                "select coalesce(max(seq), -1) from events where run_id = ?", [run_id]
            ).fetchone()[0]
            self._seq[run_id] = last + 1
        seq = self._seq[run_id]
        self._seq[run_id] += 1
        payload = {k: v for k, v in event.items() if k not in ("v", "type", "run_id", "t")}
        kind = event["type"]
        with self.db.conn:
            self.db["events"].insert(
                {"run_id": run_id, "seq": seq, "type": kind, "t": event["t"], "payload": json.dumps(payload)}
            )
            if kind == "metric":
                self.db["metrics"].insert(
                    {
                        "run_id": run_id,
                        "step": payload["step"],
                        "epoch": payload.get("epoch"),
                        "name": payload["name"],
                        "value": payload["value"],
                    }
                )
            elif kind == "privacy":
                self.db["privacy"].insert(
                    {
                        "run_id": run_id,
                        "step": payload["step"],
                        "epsilon": payload["epsilon"],
                        "delta": payload["delta"],
                        "accountant": payload["accountant"],
                    }
                )
            elif kind == "artifact":
                self.db["artifacts"].insert(
                    {
                        "run_id": run_id,
                        "kind": payload["kind"],
                        "path": payload["path"],
                        "sha256": payload.get("sha256"),
                        "created": now_iso(),
                    }
                )

    def events(self, run_id: int, *, exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The run's events in order; `exclude` leaves out types already in their own tables (e.g.
        metric, privacy), which a replay reads faster from there."""
        exclude = list(exclude)
        sql = "select type, t, payload from events where run_id = ?"
        if exclude:
            sql += " and type not in (" + ",".join("?" * len(exclude)) + ")"
        rows = self.db.conn.execute(sql + " order by seq", [run_id, *exclude]).fetchall()
        return [{"v": 1, "type": t, "run_id": run_id, "t": time, **json.loads(p)} for t, time, p in rows]

    def metrics(self, run_id: int, name: str | None = None) -> list[dict[str, Any]]:
        where, args = "run_id = ?", [run_id]
        if name is not None:
            where, args = where + " and name = ?", args + [name]
        return list(self.db["metrics"].rows_where(where, args, order_by="step, rowid"))

    def privacy(self, run_id: int, accountant: str | None = None) -> list[dict[str, Any]]:
        where, args = "run_id = ?", [run_id]
        if accountant is not None:
            where, args = where + " and accountant = ?", args + [accountant]
        return list(self.db["privacy"].rows_where(where, args, order_by="step, rowid"))

    def votes(self, run_id: int, *, start: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Vote rows of a PATE run in query order, histograms decoded."""
        sql = "select * from votes where run_id = ? and query_index >= ? order by query_index"
        args: list[Any] = [run_id, start]
        if limit is not None:
            sql += " limit ?"
            args.append(limit)
        cursor = self.db.conn.execute(sql, args)
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, r)) for r in cursor.fetchall()]
        for row in rows:
            row["histogram"] = json.loads(row["histogram"])
            row["answered"] = bool(row["answered"])
        return rows

    def artifacts(self, run_id: int) -> list[dict[str, Any]]:
        return list(self.db["artifacts"].rows_where("run_id = ?", [run_id], order_by="rowid"))

    def table_counts(self, run_id: int) -> dict[str, int]:
        return {
            table: self.db.conn.execute(f"select count(*) from {table} where run_id = ?", [run_id]).fetchone()[0]
            for table in RUN_TABLES
        }

    def insert_many(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        with self.db.conn:
            self.db[table].insert_all(rows)


def _decode_run(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    for key in ("config", "summary"):
        if row.get(key):
            row[key] = json.loads(row[key])
    return row


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True
