"""The run store: one SQLite file (WAL mode) through sqlite-utils, kept as a privacy ledger.

The runner process is the only writer of a run's rows; the GUI and CLI read. Each event is
written in its own transaction, and a `privacy` event updates the run row (epsilon, delta,
accountant, steps so far) in that same transaction, so whatever ends a run (kill -9, full disk,
a failed save) the row states the privacy spent up to the last completed step. Every write is an
explicit `BEGIN IMMEDIATE ... COMMIT` (the write lock is taken first, so concurrent writers wait
on the busy timeout instead of failing), schema creation and each migration included: Python's
sqlite3 would otherwise run DDL outside any transaction. The schema carries a version
(`PRAGMA user_version`) and is migrated forward, never dropped.

A file that is not ours is never changed: not an SQLite file, another application's database,
a damaged store (checked with `PRAGMA quick_check` before a connection's first write, and before
any open that would replay a -wal no connection holds) each give one `StoreError`. A read-only
store (or one in a read-only folder) opens for reading.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import socket
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator

import sqlite_utils

from engine.errors import DPWError, StoreError, explain, recover_hint
from engine.events import loads, to_json_safe
from engine.publication import no_guarantee_reason, run_epsilon
from engine.store_files import abandon, empty_old_wal, hold, release, replaced, store_files, wal_left_behind

SCHEMA_VERSION = 7
STATUSES = ("queued", "running", "finished", "stopped", "failed")
BUSY_TIMEOUT_S = 120  # a writer waits this long for another's write lock (a backup, an sqlite3 shell)
SQLITE_HEADER = b"SQLite format 3\x00"
# A privacy row of this accountant is a function of the private data (PATE's data-dependent bound):
# it is kept in the privacy table but never becomes the run's stated epsilon (engine.publication).
NOT_STATED_ACCOUNTANTS = ("pate-dd",)


def default_db_path() -> Path:
    """`$DPW_DB`, else runs.sqlite in the per-user data folder."""
    env = os.environ.get("DPW_DB")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("dp-workbench")) / "runs.sqlite"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


COUNTED_BACK = re.compile(r"-[1-9][0-9]*")  # a run reference counted back from the newest: -1, -2, ...

# ---- schema: plain DDL, run inside the migration's transaction ----------------------------------
_RUNS_COLUMNS = (
    "[id] INTEGER PRIMARY KEY, [name] TEXT, [mechanism] TEXT, [dataset] TEXT, [model] TEXT, [config] TEXT, "
    "[config_hash] TEXT, [status] TEXT, [created] TEXT, [started] TEXT, [finished] TEXT, [pid] INTEGER, "
    "[host] TEXT, [device] TEXT, [num_train] INTEGER, [num_test] INTEGER, [sample_rate] FLOAT, "
    "[noise_multiplier] FLOAT, [clipping_norm] FLOAT, [steps_planned] INTEGER, [steps_done] INTEGER, "
    "[epochs_done] FLOAT, [accuracy] FLOAT, [epsilon] FLOAT, [delta] FLOAT, [accountant] TEXT, "
    "[epsilon_budget] FLOAT, [stop_reason] TEXT, [error] TEXT, [error_hint] TEXT, [summary] TEXT"
)
_RUN_REF = "[run_id] INTEGER REFERENCES [runs]([id])"


def _migration_1(db: sqlite_utils.Database) -> None:
    """The run tables. IF NOT EXISTS: a store whose creation an older version left half done
    (tables made, version never set) is completed, not refused."""
    statements = [
        f"CREATE TABLE IF NOT EXISTS [runs] ({_RUNS_COLUMNS})",
        f"CREATE TABLE IF NOT EXISTS [metrics] ({_RUN_REF}, [step] INTEGER, [epoch] FLOAT, [name] TEXT, [value] FLOAT)",
        "CREATE INDEX IF NOT EXISTS [idx_metrics_run_id_name_step] ON [metrics] ([run_id], [name], [step])",
        f"CREATE TABLE IF NOT EXISTS [privacy] ({_RUN_REF}, [step] INTEGER, [epsilon] FLOAT, [delta] FLOAT, "
        "[accountant] TEXT)",
        "CREATE INDEX IF NOT EXISTS [idx_privacy_run_id_accountant_step] ON [privacy] ([run_id], [accountant], [step])",
        f"CREATE TABLE IF NOT EXISTS [events] ({_RUN_REF}, [seq] INTEGER, [type] TEXT, [t] FLOAT, [payload] TEXT)",
        "CREATE INDEX IF NOT EXISTS [idx_events_run_id_seq] ON [events] ([run_id], [seq])",
        f"CREATE TABLE IF NOT EXISTS [artifacts] ({_RUN_REF}, [kind] TEXT, [path] TEXT, [sha256] TEXT, [created] TEXT)",
        # PATE: one row per student query. histogram is a JSON list of vote counts per class; label is
        # the released label (NULL when the query was rejected); epsilon_cost is the query's share of
        # the data-dependent privacy cost (NULL when not computed per query).
        f"CREATE TABLE IF NOT EXISTS [votes] ({_RUN_REF}, [query_index] INTEGER, [histogram] TEXT, "
        "[answered] INTEGER, [label] INTEGER, [true_label] INTEGER, [epsilon_cost] FLOAT, [epsilon_after] FLOAT)",
        "CREATE UNIQUE INDEX IF NOT EXISTS [idx_votes_run_id_query_index] ON [votes] ([run_id], [query_index])",
    ]
    for sql in statements:
        db.conn.execute(sql)


def _migration_2(db: sqlite_utils.Database) -> None:
    # What a deleted run was and when it was deleted: its privacy spend on the data still happened
    # (a reviewer may ask), and its id is never given to a new run.
    db.conn.execute(
        "CREATE TABLE IF NOT EXISTS [deleted_runs] ([id] INTEGER PRIMARY KEY, [name] TEXT, [mechanism] TEXT, "
        "[dataset] TEXT, [status] TEXT, [epsilon] FLOAT, [delta] FLOAT, [accountant] TEXT, [config_hash] TEXT, "
        "[created] TEXT, [finished] TEXT, [deleted] TEXT)"
    )


def _add_column(db: sqlite_utils.Database, table: str, column: str, kind: str = "TEXT") -> None:
    """ALTER TABLE ... ADD COLUMN unless the column is there (a migration that an older version left
    half done is completed, not refused)."""
    if column not in {r[1] for r in db.conn.execute(f"PRAGMA table_info({table})")}:
        db.conn.execute(f"ALTER TABLE [{table}] ADD COLUMN [{column}] {kind}")


def _migration_3(db: sqlite_utils.Database) -> None:
    # Tuning studies (engine.study): a group of runs on the same data with one privacy statement for
    # the group; `released_run_id` is the run a private study released (its other runs never leave).
    db.conn.execute(
        "CREATE TABLE IF NOT EXISTS [studies] ([id] INTEGER PRIMARY KEY, [name] TEXT, [mode] TEXT, [config] TEXT, "
        "[status] TEXT, [created] TEXT, [finished] TEXT, [epsilon] FLOAT, [delta] FLOAT, [accountant] TEXT, "
        "[released_run_id] INTEGER, [num_candidates] INTEGER, [error] TEXT)"
    )
    _add_column(db, "runs", "study_id", "INTEGER REFERENCES [studies]([id])")


def _migration_4(db: sqlite_utils.Database) -> None:
    # User tags and notes. Tags get a table of their own, one row per (run, tag): a run has any number
    # of them, each matched exactly (`dpw list`, the window's filter) without parsing a column, the
    # unique index keeps a tag once per run, and delete_run removes them with the run's other rows.
    # A note is one text per run: a column of `runs`. A deleted run's record keeps both (why it was
    # made and why it was dropped are part of its record).
    db.conn.execute(f"CREATE TABLE IF NOT EXISTS [run_tags] ({_RUN_REF}, [tag] TEXT NOT NULL)")
    db.conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS [idx_run_tags_run_id_tag] ON [run_tags] ([run_id], [tag])")
    for table, column in (("runs", "notes"), ("deleted_runs", "notes"), ("deleted_runs", "tags")):
        _add_column(db, table, column)
    # A study's own process (pid, host), so a study whose `dpw study` was killed is marked interrupted
    # the way a run whose runner died is marked failed (Store.reconcile_studies).
    for column, kind in (("pid", "INTEGER"), ("host", "TEXT")):
        _add_column(db, "studies", column, kind)


def _migration_5(db: sqlite_utils.Database) -> None:
    # The dataset's fingerprint (a hash of its contents, from the run's plan event) on the run row and
    # on a deleted run's record: the privacy ledger counts the same data under two names together.
    # Runs planned before this version get it from their plan event; deleted ones have none.
    for table in ("runs", "deleted_runs"):
        _add_column(db, table, "dataset_fingerprint")
    db.conn.execute(
        "UPDATE runs SET dataset_fingerprint = (SELECT json_extract(payload, '$.dataset_fingerprint') FROM events "
        "WHERE events.run_id = runs.id AND events.type = 'plan' ORDER BY seq DESC LIMIT 1) "
        "WHERE dataset_fingerprint IS NULL"
    )


def _migration_6(db: sqlite_utils.Database) -> None:
    # A run continued from another's checkpoint (engine.checkpoint): which run, and how many of its
    # steps_done were that run's (the ledger counts them there, not twice).
    _add_column(db, "runs", "resumed_from", "INTEGER")
    _add_column(db, "runs", "steps_resumed", "INTEGER")


def _migration_7(db: sqlite_utils.Database) -> None:
    # Why a deleted run carried no guarantee (publication.no_guarantee_reason), if it carried none:
    # the ledger keeps saying that nothing bounds the data's spend once the run is gone. Runs
    # deleted before this version have none recorded.
    _add_column(db, "deleted_runs", "no_guarantee")


MIGRATIONS = [_migration_1, _migration_2, _migration_3, _migration_4, _migration_5, _migration_6, _migration_7]
RUN_COLUMNS_NEEDED = {"id", "name", "status", "config"}  # a `runs` table without these is not ours


def check_deletable(run: dict[str, Any]) -> None:
    """Raise DPWError if `run` (a row of `runs`) may not be deleted: it is running."""
    if run["status"] == "running":
        runner = f", or `kill {run['pid']}` (its runner process)" if run.get("pid") else ""
        raise DPWError(f"run {run['id']} ({run['name']}) is running; stop it before deleting it",
                       hint=f"Ctrl-C in its `dpw run`, Stop in the window{runner}")
RECORD_TABLES = ("metrics", "privacy", "events", "artifacts", "votes")  # what a run recorded (table_counts)
RUN_TABLES = RECORD_TABLES + ("run_tags",)  # every row a run owns (deleted with it)
MAX_TAG_LENGTH = 64


# ---- opening a file ----------------------------------------------------------------------------
def check_store_path(path: Path) -> bool:
    """Refuse, in one line and without touching anything, a path that cannot be a store: a folder,
    a path under a file, a file that is not SQLite. True when a non-empty file is there."""
    if path.is_dir():
        raise StoreError(f"{path} is a folder, not a store file", hint=f"give a file, e.g. --db {path / 'runs.sqlite'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise StoreError(f"cannot use {path}: {parent} is a file, not a folder",
                                 hint="choose a --db path whose folders are folders")
            break
    if not path.exists():
        return False
    if not path.is_file():  # opening a FIFO to read its header would wait for a writer for ever
        raise StoreError(f"{path} is not a regular file, so it cannot be a store",
                         hint="check the --db path (it was left unchanged)")
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}", hint="check the file's permissions") from None
    if not header:
        return False
    if header != SQLITE_HEADER:
        raise StoreError(f"{path} is not a DP Workbench store: it is not an SQLite database file",
                         hint="check the --db path (the file was left unchanged)")
    return True


def empty_file_problem(path: Path) -> StoreError | None:
    """An existing file of 0 bytes is not a store: a command that reads, or a window that opens it,
    says so (SQLite would quietly make a new store of it; only `dpw run` may create one)."""
    try:
        empty = path.is_file() and path.stat().st_size == 0
    except OSError:
        return None  # the store says what is wrong with a path it cannot read
    if not empty:
        return None
    return StoreError(f"{path} is an empty file (0 bytes), not a DP Workbench store",
                      hint="check the path; a new store is created only where no file is yet")


def _may_write(path: Path) -> bool:
    """Whether this process may write the store and create its -wal/-shm files beside it (False on
    a read-only file, folder or file system)."""
    folder = next((p for p in path.parents if p.exists()), Path("."))
    if path.exists():
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    return os.access(folder, os.W_OK)


def check_creatable(path: Path) -> None:
    """Refuse, without creating anything, a path where no new store can be made (a read-only folder),
    so that a command can check its other input before it creates the store file."""
    if not _may_write(path):
        raise StoreError(f"cannot create a store at {path.absolute()}: its folder is read-only",
                         hint="check the --db path")


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection. In a read-only folder SQLite cannot create the -shm file a WAL store
    needs; with no -wal content left (every writer closed cleanly) the file is then complete on its
    own and is opened as immutable."""
    uri = path.resolve().as_uri()
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("PRAGMA user_version").fetchone()
        conn.execute("select count(*) from sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(f"cannot read {path}: its folder is read-only and {wal.name} holds changes not yet "
                         f"written to it", hint="open it once where its folder is writable, or copy the store "
                         "with its -wal file to a writable folder")
    return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)


def _check_left_behind_wal(path: Path) -> None:
    """Before a store whose -wal no connection holds (store_files.wal_left_behind) is opened: read it
    through that log on a read-only connection, which changes neither file, and refuse it if it reads
    as damaged. Any other open would replay the log into the store and write the damage into it when
    it closes: the log of the file a restored backup replaced is taken for the backup's own (SQLite
    cannot tell them apart)."""
    conn = _connect_read_only(path)
    try:
        problems = [r[0] for r in conn.execute("PRAGMA quick_check(1)")]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    finally:
        conn.close()
    if problems != ["ok"]:
        first = " ".join(problems[0].replace("*** in database main ***", "").split())
        raise StoreError(
            f"{path} reads as damaged through the {path.name}-wal left beside it ({first}); neither file was "
            "changed",
            hint=f"if {path.name} was copied back from a backup, that log belongs to the file it replaced: move "
            f"{path.name}-wal and {path.name}-shm out of the folder and run the command again; otherwise "
            + recover_hint(path))


class Store:
    """Read and write runs, their events and the rows derived from them.

    `readonly=True` never writes (nor migrates); a store the process may not write (read-only file
    or folder) opens that way by itself, and its writes raise StoreError."""

    def __init__(self, path: str | Path, *, readonly: bool = False):
        # Absolute from the start: the runner, the window's helpers and the saved models' paths must
        # name this file whatever folder each process was started in (a relative --db named two).
        self.path = Path(path).absolute()
        self._seq: dict[int, int] = {}
        self._stated: dict[int, str | None] = {}  # run id -> accountant its plan reports
        self._checked = False  # quick_check done before this connection's first write
        exists = check_store_path(self.path)
        self.writable = not readonly and _may_write(self.path)
        if not exists and readonly:
            raise StoreError(f"no store at {self.path}", hint="check the --db path")
        if not exists:
            check_creatable(self.path)
        elif wal_left_behind(self.path):
            _check_left_behind_wal(self.path)
        try:
            if self.writable:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(str(self.path), check_same_thread=False)
            else:
                conn = _connect_read_only(self.path)
        except (OSError, sqlite3.Error) as exc:
            message, hint, _ = explain(exc, store_path=self.path)
            raise StoreError(message, hint=hint) from None
        self.db = sqlite_utils.Database(conn)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
            self._check_ours()
            if self.writable:
                if self.db.journal_mode != "wal":
                    self.db.enable_wal()
                conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            if self.writable:
                self.migrate()
        except sqlite3.Error as exc:
            conn.close()
            message, hint, _ = explain(exc, store_path=self.path)
            raise StoreError(message, hint=hint) from None
        except BaseException:
            conn.close()
            raise
        self._files = store_files(self.path)  # what this connection holds (reopen_if_replaced)
        hold(self.path, self)  # another Store of this process on the file never looks at its -shm

    # ---- schema -----------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return self.db.conn.execute("PRAGMA user_version").fetchone()[0]

    def _check_ours(self) -> None:
        """Refuse a newer schema, and any non-empty SQLite file without our `runs` table."""
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has store schema {version}, newer than this version of DP Workbench "
                f"reads ({SCHEMA_VERSION})",
                hint="upgrade dp-workbench, or use another --db file",
            )
        tables = [r[0] for r in self.db.conn.execute(
            "select name from sqlite_master where type = 'table' and name not like 'sqlite_%' order by name")]
        if not tables and version == 0:
            return  # a new, empty store
        columns = {r[1] for r in self.db.conn.execute("PRAGMA table_info(runs)")}
        if not RUN_COLUMNS_NEEDED <= columns:
            shown = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
            raise StoreError(f"{self.path} is not a DP Workbench store: it is another application's SQLite "
                             f"database (tables: {shown or 'none'})",
                             hint="DP Workbench leaves it unchanged; use another --db file")

    def migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION, each migration and its version number in one
        transaction (all or nothing: a store interrupted mid-migration opens again once the cause
        is gone)."""
        self._check_ours()
        for number in range(self.schema_version + 1, SCHEMA_VERSION + 1):
            with self._write() as conn:
                if conn.execute("PRAGMA user_version").fetchone()[0] >= number:
                    continue  # another process migrated it while this one waited for the lock
                MIGRATIONS[number - 1](self.db)
                conn.execute(f"PRAGMA user_version = {number}")

    def close(self) -> None:
        self.db.close()
        release(self.path, self)

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
        self._stated, self._checked, self.writable = {}, fresh._checked, fresh.writable
        return True

    # ---- writing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE (wait for the write lock up to the busy timeout),
        COMMIT, or ROLLBACK on any exception."""
        self.check_writable()
        conn = self.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def check_writable(self) -> None:
        """Refuse writes to a read-only store, and to a damaged one (never insert into a corrupt
        file): `PRAGMA quick_check` once, before this connection's first write."""
        if not self.writable:
            raise StoreError(f"{self.path} is read-only: this process may not write the file or its folder",
                             hint="reading works; to add or change runs make the file and its folder writable")
        if self._checked:
            return
        try:
            problems = [r[0] for r in self.db.conn.execute("PRAGMA quick_check(1)")]
        except sqlite3.DatabaseError as exc:
            problems = [str(exc)]
        if problems != ["ok"]:
            first = " ".join(problems[0].replace("*** in database main ***", "").split())
            raise StoreError(f"{self.path} is damaged ({first}); nothing was written to it",
                             hint=recover_hint(self.path))
        self._checked = True

    # ---- runs -------------------------------------------------------------------------------
    def create_run(self, config: Any, *, resumed_from: int | None = None) -> int:
        """Store a config as a new queued run; `config` is a RunConfig. The id is allocated inside the
        write transaction, so concurrent creators get distinct ids. The run records this process as
        its owner until a runner takes it over (`assign_runner`, `mark_running`). `resumed_from`: the
        run whose checkpoint it continues (engine.checkpoint)."""
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
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        if resumed_from is not None:
            row["resumed_from"] = int(resumed_from)
        with self._write():
            row["id"] = self._next_run_id()
            return self.db["runs"].insert(row).last_pk

    def continued_by(self, run_id: int) -> list[int]:
        """The runs that continue `run_id` from its checkpoint (engine.checkpoint); none in a read-only
        store older than continuing (schema 6), which is read as it is."""
        if "resumed_from" not in self.db["runs"].columns_dict:
            return []
        return [row[0] for row in self.db.conn.execute("select id from runs where resumed_from = ? order by id",
                                                        [run_id])]

    def _next_run_id(self) -> int:
        """One more than any id ever used here, deleted runs included (ids are never reused)."""
        used = self.db.conn.execute(
            "select max(coalesce((select max(id) from runs), 0), coalesce((select max(id) from deleted_runs), 0))"
        ).fetchone()[0]
        return int(used) + 1

    def assign_runner(self, run_id: int, pid: int) -> None:
        """Record the runner process started for a queued run (its owner from now on)."""
        with self._write() as conn:
            conn.execute("update runs set pid = ?, host = ? where id = ? and status = 'queued'",
                         [pid, socket.gethostname(), run_id])

    def delete_run(self, run_id: int) -> dict[str, Any]:
        """Delete a run and every row it owns in one transaction, keeping a line in `deleted_runs`;
        returns the run as it was. A running run is refused: its runner would go on writing."""
        self.reconcile_orphans()
        run = self.get_run(run_id)
        check_deletable(run)
        keep = ("id", "name", "mechanism", "dataset", "dataset_fingerprint", "status", "config_hash", "created",
                "finished", "notes")
        spent = run_epsilon(run)  # the run's own privacy spent (PATE: its publishable epsilon, not the dd one)
        record = {**{k: run.get(k) for k in keep}, "epsilon": spent.value, "delta": spent.delta,
                  "accountant": spent.accountant, "tags": ", ".join(run.get("tags") or []) or None,
                  "no_guarantee": no_guarantee_reason(run), "deleted": now_iso()}
        with self._write() as conn:
            self.db["deleted_runs"].insert(record, replace=True)
            for table in RUN_TABLES:
                conn.execute(f"delete from {table} where run_id = ?", [run_id])
            conn.execute("delete from runs where id = ?", [run_id])
        self._seq.pop(run_id, None)
        return run

    def deleted_runs(self) -> list[dict[str, Any]]:
        """What the store keeps of each deleted run (its privacy spent, name, data, dates, tags, notes),
        oldest first; `tags` as a list."""
        rows = [dict(r) for r in self.db["deleted_runs"].rows_where(order_by="id")]
        for row in rows:
            row["tags"] = [t.strip() for t in (row.get("tags") or "").split(",") if t.strip()]
        return rows

    # ---- tags and notes (the user's, not the engine's) ---------------------------------------------
    def add_tags(self, run_id: int, tags: Iterable[str]) -> list[str]:
        """Tag a run (a tag it already has is kept once); returns its tags."""
        wanted = clean_tags(tags)
        with self._write() as conn:
            self._check_run(conn, run_id)
            conn.executemany("insert or ignore into run_tags (run_id, tag) values (?, ?)",
                             [(run_id, tag) for tag in wanted])
        return self.tags(run_id)

    def remove_tags(self, run_id: int, tags: Iterable[str]) -> list[str]:
        """Take tags off a run (one it does not have is ignored); returns its tags."""
        unwanted = clean_tags(tags)
        with self._write() as conn:
            self._check_run(conn, run_id)
            conn.executemany("delete from run_tags where run_id = ? and tag = ?", [(run_id, t) for t in unwanted])
        return self.tags(run_id)

    def set_tags(self, run_id: int, tags: Iterable[str]) -> list[str]:
        """Replace a run's tags with `tags` (the window's tags box); returns them."""
        wanted = clean_tags(tags)
        with self._write() as conn:
            self._check_run(conn, run_id)
            conn.execute("delete from run_tags where run_id = ?", [run_id])
            conn.executemany("insert or ignore into run_tags (run_id, tag) values (?, ?)",
                             [(run_id, tag) for tag in wanted])
        return self.tags(run_id)

    def tags(self, run_id: int) -> list[str]:
        return self._tags_of([run_id]).get(run_id, [])

    def set_notes(self, run_id: int, notes: str | None) -> None:
        """The run's notes (free text; empty clears them)."""
        text = (notes or "").strip() or None
        with self._write() as conn:
            self._check_run(conn, run_id)
            conn.execute("update runs set notes = ? where id = ?", [text, run_id])

    def rename_run(self, run_id: int, name: str) -> str:
        """Give a run another name (the user's label: not in its config hash, so nothing it states
        changes); its config says the same name, so a run set up again from it or continued keeps it.
        Returns the name, stripped; one the config would refuse is refused."""
        from engine.config import check_field

        name = str(name).strip()
        if error := check_field("name", name):
            raise error
        with self._write() as conn:
            self._check_run(conn, run_id)
            (config,) = conn.execute("select config from runs where id = ?", [run_id]).fetchone()
            config = {**(json.loads(config) if config else {}), "name": name}
            conn.execute("update runs set name = ?, config = ? where id = ?",
                         [name, json.dumps(config, sort_keys=True), run_id])
        return name

    def _check_run(self, conn: sqlite3.Connection, run_id: int) -> None:
        if conn.execute("select 1 from runs where id = ?", [run_id]).fetchone() is None:
            raise DPWError(f"no run with id {run_id} in {self.path}", hint="`dpw list` shows the runs")

    def _tags_of(self, run_ids: list[int] | None = None) -> dict[int, list[str]]:
        """run id -> its tags in the order given; every run's when `run_ids` is None. A read-only store
        of an older schema has none."""
        if not self.db["run_tags"].exists():
            return {}
        sql, args = "select run_id, tag from run_tags", []
        if run_ids is not None:
            sql += " where run_id in (" + ",".join("?" * len(run_ids)) + ")"
            args = list(run_ids)
        tags: dict[int, list[str]] = {}
        for run_id, tag in self.db.conn.execute(sql + " order by run_id, rowid", args):
            tags.setdefault(run_id, []).append(tag)
        return tags

    def update_run(self, run_id: int, **fields: Any) -> None:
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"unknown status {fields['status']!r}")
        if "summary" in fields and not isinstance(fields["summary"], str):
            fields["summary"] = json.dumps(to_json_safe(fields["summary"]), sort_keys=True, allow_nan=False)
        with self._write():
            self.db["runs"].update(run_id, fields)

    def set_summary_key(self, run_id: int, key: str, value: Any) -> None:
        """Set one key of a run's summary (e.g. a result computed after training), keeping the others:
        read, merge and write in one transaction, so a concurrent writer's keys are never lost."""
        with self._write() as conn:
            row = conn.execute("select summary from runs where id = ?", [run_id]).fetchone()
            if row is None:
                raise DPWError(f"no run with id {run_id} in {self.path}", hint="`dpw list` shows the runs")
            summary = json.loads(row[0]) if row[0] else {}
            summary[key] = value
            conn.execute("update runs set summary = ? where id = ?",
                         [json.dumps(to_json_safe(summary), sort_keys=True, allow_nan=False), run_id])

    def mark_running(self, run_id: int, **fields: Any) -> None:
        """Take a queued run over for this process (the runner); refused when it is no longer queued
        (deleted, or reconciled as failed because its creator ended)."""
        values = {"status": "running", "started": now_iso(), "pid": os.getpid(), "host": socket.gethostname(),
                  **fields}
        with self._write() as conn:
            status = conn.execute("select status from runs where id = ?", [run_id]).fetchone()
            if status is None or status[0] != "queued":
                raise DPWError(f"run {run_id} is {status[0] if status else 'gone'}, not queued; only a queued run "
                               f"can be started", hint="create a new run from its config (`dpw run`)")
            self.db["runs"].update(run_id, values)

    def get_run(self, run_id: int) -> dict[str, Any]:
        try:
            if not -(2**63) <= run_id < 2**63:  # beyond SQLite's integers: no run has it
                raise sqlite_utils.db.NotFoundError
            row = self.db["runs"].get(run_id)
        except sqlite_utils.db.NotFoundError:
            raise DPWError(f"no run with id {run_id} in {self.path}", hint="`dpw list` shows the runs") from None
        return self._with_stated(self._with_tags(self._with_study(_decode_run(row))))

    def _with_stated(self, run: dict[str, Any]) -> dict[str, Any]:
        """A running DP-SGD run whose row holds the live bound of its latest step (the ledger's safe
        value) also gets `run["stated_privacy"]`: the latest row of the accountant its config states
        (e.g. pld, computed at evaluations), so views show the tight value instead of flipping between
        the two (engine.publication.run_epsilon)."""
        stated = (run.get("config") or {}).get("accountant")
        if run.get("status") != "running" or run.get("mechanism") != "dpsgd" or not stated \
                or run.get("accountant") in (None, stated):
            return run
        row = self.db.conn.execute("select step, epsilon, delta, accountant from privacy where run_id = ? and "
                                   "accountant = ? order by step desc limit 1", [run["id"], stated]).fetchone()
        if row is not None:
            run["stated_privacy"] = dict(zip(("step", "epsilon", "delta", "accountant"), row))
        return run

    def find_run(self, ref: str | int) -> dict[str, Any]:
        """A run by id, by name (the newest run of that name) or counted back from the newest run: -1 is
        the newest, -2 the one before. A reference of that form that points at no run and no name (an
        all-digit one too, a run named "42") is looked up as a name."""
        if isinstance(ref, str) and COUNTED_BACK.fullmatch(ref):
            back = int(ref[1:])
            row = self.db.conn.execute("select id from runs order by id desc limit 1 offset ?",
                                       [min(back - 1, 2**62)]).fetchone()
            if row:
                return self.get_run(row[0])
            if not self.db.conn.execute("select 1 from runs where name = ?", [ref]).fetchone():
                held = self.db.conn.execute("select count(*) from runs").fetchone()[0]
                raise DPWError(f"no run {ref} in {self.path}: it holds {held} run{'s' * (held != 1)} "
                               "(-1 is the newest)", hint="`dpw list` shows the runs")
        if isinstance(ref, int) or str(ref).isdigit():
            try:
                return self.get_run(int(ref))
            except DPWError:
                if isinstance(ref, int) or not self.db.conn.execute(
                        "select 1 from runs where name = ?", [str(ref)]).fetchone():
                    raise
        rows = list(self.db["runs"].rows_where("name = ?", [str(ref)], order_by="id desc", limit=1))
        if not rows:
            raise DPWError(f"no run named {ref!r} in {self.path}", hint="`dpw list` shows the runs")
        return self._with_tags(self._with_study(_decode_run(rows[0])))

    def find_runs(self, refs: Iterable[str | int]) -> list[dict[str, Any]]:
        """The runs `refs` name (find_run), each once, in the order first named: "3 3" or "3 tiny"
        naming one run twice is that run."""
        found = [self.find_run(ref) for ref in refs]  # every reference resolved before any is used
        return list({run["id"]: run for run in found}.values())

    def checked_fingerprints(self, dataset: str) -> frozenset[str]:
        """Fingerprints of the data runs on `dataset` (a config's name or path) trained on. A run records
        its data's fingerprint only once the data passed the load's check, so the same bytes need no
        check again (engine.datasets.load_dataset's `checked_before`)."""
        rows = self.db.conn.execute("select distinct dataset_fingerprint from runs where dataset = ? and "
                                    "dataset_fingerprint is not null", [dataset]).fetchall()
        return frozenset(row[0] for row in rows)

    def list_runs(self) -> list[dict[str, Any]]:
        self.reconcile_orphans()
        studies = {s["id"]: s for s in self.list_studies()}
        tags = self._tags_of()
        return [self._with_stated(self._with_tags(self._with_study(_decode_run(r), studies), tags))
                for r in self.db["runs"].rows_where(order_by="id")]

    def _with_tags(self, run: dict[str, Any], tags: dict[int, list[str]] | None = None) -> dict[str, Any]:
        """The run with its tags as `run["tags"]` (a list) and `run["notes"]` (None when it has none)."""
        run["tags"] = (tags if tags is not None else self._tags_of([run["id"]])).get(run["id"], [])
        run.setdefault("notes", None)
        return run

    # ---- studies (engine.study) -----------------------------------------------------------------
    def create_study(self, **fields: Any) -> int:
        with self._write():
            return self.db["studies"].insert({"status": "running", "created": now_iso(), "pid": os.getpid(),
                                              "host": socket.gethostname(), **fields}).last_pk

    def update_study(self, study_id: int, **fields: Any) -> None:
        with self._write():
            self.db["studies"].update(study_id, fields)

    def get_study(self, study_id: int) -> dict[str, Any]:
        try:
            return _decode_run(self.db["studies"].get(study_id))
        except sqlite_utils.db.NotFoundError:
            raise DPWError(f"no study with id {study_id} in {self.path}") from None

    def list_studies(self) -> list[dict[str, Any]]:
        if not self.db["studies"].exists():  # a read-only store of schema 2 is read as it is
            return []
        return [_decode_run(r) for r in self.db["studies"].rows_where(order_by="id")]

    def _with_study(self, run: dict[str, Any], studies: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The run with its study's row as `run["study"]` (engine.publication states the study's epsilon)."""
        if run.get("study_id") is not None:
            run["study"] = studies.get(run["study_id"]) if studies is not None else self.get_study(run["study_id"])
        return run

    def reconcile_orphans(self) -> list[int]:
        """Mark `queued`/`running` runs whose owner process on this host is gone as failed, with the
        reason (the runner's own, when it could only note it beside the run's files; their privacy
        spent stays as the ledger recorded it). Returns their ids. A read-only
        store is left as it is, and so is one that cannot be written now (full disk): reading it must
        still work, and the next reader with room reconciles."""
        self.reconcile_studies()
        host = socket.gethostname()
        lost = []
        rows = self.db.conn.execute(
            "select id, status, pid, host, started from runs where status in ('queued', 'running')")
        for run_id, status, pid, run_host, started in rows.fetchall():
            if run_host not in (None, host):
                continue  # another machine's run: its process cannot be seen from here
            if _owner_gone(pid, started if status == "running" else None):
                lost.append((run_id, status, pid))
        if not lost or not self.writable:
            return []
        reasons = {
            "queued": ("the run never started: the process that queued it ended before its runner began",
                       "start the run again"),
            "running": ("the runner process ended without reporting (killed or crashed)",
                        "everything up to its last completed step is kept, with the privacy it spent; a DP-SGD "
                        "run goes on from its last checkpoint with dpw resume (Run ▸ Continue run), or start it "
                        "again"),
        }
        return self._update_each(
            (run_id, "update runs set status = 'failed', finished = ?, error = ?, error_hint = ? "
             "where id = ? and status = ? and pid is ?",
             [now_iso(), *self._lost_reason(run_id, *reasons[status]), run_id, status, pid])
            for run_id, status, pid in lost)

    def _lost_reason(self, run_id: int, error: str, hint: str) -> tuple[str, str]:
        """Why a lost run failed: the error its runner noted beside its files when this store could not
        take it (engine.artifacts.note_unrecorded_failure: a lock held past the busy timeout, a full
        disk), with what is kept; else `error`, the owner process having gone without a word."""
        from engine.artifacts import unrecorded_failure

        noted = unrecorded_failure(self, run_id)
        if noted is None:
            return error, hint
        noted_error, noted_hint = noted
        return noted_error, (f"{noted_hint}; " if noted_hint else "") + hint

    def reconcile_studies(self) -> list[int]:
        """Mark `running` studies whose own process on this host is gone (killed, crashed) as
        interrupted; returns their ids. Nothing is computed here: before starting each candidate the
        study records on its row the privacy of every candidate started so far (engine.study), which
        is what an interrupted study has spent. Read-only or full stores are left as they are."""
        if not self.writable or not self.db["studies"].exists():
            return []
        host = socket.gethostname()
        rows = self.db.conn.execute("select id, pid, host, created from studies where status = 'running'").fetchall()
        lost = [(study_id, pid) for study_id, pid, study_host, created in rows
                if study_host in (None, host) and _owner_gone(pid, created)]
        return self._update_each(
            (study_id, "update studies set status = 'interrupted', finished = ?, error = ? "
             "where id = ? and status = 'running' and pid is ?",
             [now_iso(), "the study's process ended before the study finished (killed or crashed)", study_id, pid])
            for study_id, pid in lost)

    def _update_each(self, updates: Iterable[tuple[int, str, list[Any]]]) -> list[int]:
        """Run each (id, sql, parameters) in a write transaction of its own; the ids whose row changed
        (a row another reader already reconciled is left alone). A full disk stops here quietly: the
        store stays readable, and the next reader with room does the rest."""
        done = []
        for row_id, sql, parameters in updates:
            try:
                with self._write() as conn:
                    changed = conn.execute(sql, parameters).rowcount
            except sqlite3.OperationalError as exc:
                if "full" not in str(exc):
                    raise
                break
            if changed:
                done.append(row_id)
        return done

    # ---- events and derived rows -------------------------------------------------------------
    def record_event(self, event: dict[str, Any]) -> None:
        """Write one event and what it carries in one transaction: its metric/privacy/artifact row,
        and the privacy spent so far (privacy), the plan's figures (plan) or the PATE queries asked
        and answered (vote_batch) on the run row."""
        run_id = event["run_id"]
        payload = {k: v for k, v in event.items() if k not in ("v", "type", "run_id", "t")}
        kind = event["type"]
        if kind == "privacy" and run_id not in self._stated:
            self._stated[run_id] = self._stated_accountant(run_id)
        with self._write() as conn:
            if run_id not in self._seq:
                last = conn.execute("select coalesce(max(seq), -1) from events where run_id = ?", [run_id]).fetchone()[0]
                self._seq[run_id] = last + 1
            seq = self._seq[run_id]
            self.db["events"].insert({"run_id": run_id, "seq": seq, "type": kind, "t": event["t"],
                                      "payload": json.dumps(to_json_safe(payload), allow_nan=False)})
            if kind == "metric":
                self.db["metrics"].insert({"run_id": run_id, "step": payload["step"], "epoch": payload.get("epoch"),
                                           "name": payload["name"], "value": payload["value"]})
            elif kind == "privacy":
                self.db["privacy"].insert({"run_id": run_id, "step": payload["step"], "epsilon": payload["epsilon"],
                                           "delta": payload["delta"], "accountant": payload["accountant"]})
                self._record_spent(conn, run_id, payload)
            elif kind == "artifact":
                self.db["artifacts"].insert({"run_id": run_id, "kind": payload["kind"], "path": payload["path"],
                                             "sha256": payload.get("sha256"), "created": now_iso()})
            elif kind == "plan":
                self._record_plan(conn, run_id, payload)
            elif kind == "vote_batch":
                self._record_queries(conn, run_id, payload)
        self._seq[run_id] = seq + 1

    def _stated_accountant(self, run_id: int) -> str | None:
        """The accountant the run's plan reports (the tight one, e.g. pld), from its plan event."""
        row = self.db.conn.execute("select payload from events where run_id = ? and type = 'plan' "
                                   "order by seq desc limit 1", [run_id]).fetchone()
        return json.loads(row[0]).get("accountant") if row else None

    def _record_spent(self, conn: sqlite3.Connection, run_id: int, payload: dict[str, Any]) -> None:
        """The ledger rule: the run row carries the privacy row of the latest step; at that step the
        plan's reported accountant replaces the live bound once it is computed."""
        accountant = payload["accountant"]
        if accountant in NOT_STATED_ACCOUNTANTS:
            return
        conn.execute(
            "update runs set epsilon = :epsilon, delta = :delta, accountant = :accountant, steps_done = :step "
            "where id = :id and (coalesce(steps_done, 0) < :step or "
            "(steps_done = :step and (epsilon is null or accountant is null or :accountant = :stated)))",
            {"epsilon": payload["epsilon"], "delta": payload["delta"], "accountant": accountant,
             "step": payload["step"], "id": run_id, "stated": self._stated.get(run_id)},
        )

    def _record_plan(self, conn: sqlite3.Connection, run_id: int, payload: dict[str, Any]) -> None:
        self._stated[run_id] = payload.get("accountant")
        columns = {"model": "model", "device": "device", "num_train": "num_train", "num_test": "num_test",
                   "sample_rate": "sample_rate", "noise_multiplier": "noise_multiplier", "steps": "steps_planned",
                   "delta": "delta", "dataset_fingerprint": "dataset_fingerprint"}
        values = {column: payload[key] for key, column in columns.items() if payload.get(key) is not None}
        if values:
            conn.execute(f"update runs set {', '.join(f'{c} = ?' for c in values)} where id = ?",
                         [*values.values(), run_id])

    def _record_queries(self, conn: sqlite3.Connection, run_id: int, payload: dict[str, Any]) -> None:
        """PATE: queries asked and answered so far, in the run's summary until its final summary."""
        row = conn.execute("select summary from runs where id = ?", [run_id]).fetchone()
        summary = json.loads(row[0]) if row and row[0] else {}
        summary["queries"] = payload["first_query"] + payload["count"]
        summary["answered"] = int(summary.get("answered") or 0) + payload["answered"]
        conn.execute("update runs set summary = ? where id = ?",
                     [json.dumps(to_json_safe(summary), sort_keys=True, allow_nan=False), run_id])

    def events(self, run_id: int, *, exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The run's events in order; `exclude` leaves out types already in their own tables (e.g.
        metric, privacy), which a replay reads faster from there."""
        exclude = list(exclude)
        sql = "select type, t, payload from events where run_id = ?"
        if exclude:
            sql += " and type not in (" + ",".join("?" * len(exclude)) + ")"
        rows = self.db.conn.execute(sql + " order by seq", [run_id, *exclude]).fetchall()
        return [{"v": 1, "type": t, "run_id": run_id, "t": time, **loads(p)} for t, time, p in rows]

    def plan_event(self, run_id: int) -> dict[str, Any]:
        """The run's `plan` event (what it fixed before training: data, split, privacy plan), or {}
        for a run that never got that far."""
        row = self.db.conn.execute("select t, payload from events where run_id = ? and type = 'plan' "
                                   "order by seq limit 1", [run_id]).fetchone()
        return {} if row is None else {"v": 1, "type": "plan", "run_id": run_id, "t": row[0], **loads(row[1])}

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
            for table in RECORD_TABLES
        }

    def insert_many(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        with self._write():
            self.db[table].insert_all(rows)


def clean_tags(tags: Iterable[str]) -> list[str]:
    """Tags as stored: each stripped, inner spaces collapsed, split at commas (the window's box and
    `dpw tag a,b` alike), empty ones dropped, each once in the order given; DPWError for a tag longer
    than MAX_TAG_LENGTH."""
    if isinstance(tags, str):
        tags = [tags]
    out: list[str] = []
    for text in tags:
        for part in str(text).split(","):
            tag = " ".join(part.split())
            if len(tag) > MAX_TAG_LENGTH:
                raise DPWError(f"tag {tag[:20]!r}… is {len(tag)} characters long; a tag has at most "
                               f"{MAX_TAG_LENGTH}", hint="use a shorter tag, and the run's notes for longer text")
            if tag and tag not in out:
                out.append(tag)
    return out


def _decode_run(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    for key in ("config", "summary"):
        if row.get(key):
            row[key] = loads(row[key])
    return row


def _owner_gone(pid: int | None, since: str | None) -> bool:
    """The process that owns a run or a study on this host is gone: none recorded, dead, or its pid
    now held by a process that began after `since` (see _pid_reused)."""
    return pid is None or not pid_alive(pid) or _pid_reused(pid, since)


def _pid_reused(pid: int, started: str | None) -> bool:
    """True when the process now holding `pid` began after the run started: the runner is gone and the
    system gave its pid to another process (a run would otherwise look `running` for ever). A runner
    marks its run running from inside itself, so its own process always began before `started`."""
    if not started:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            ticks = int(f.read().split(") ", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        began = boot + ticks / os.sysconf("SC_CLK_TCK")
        run_started = _dt.datetime.fromisoformat(started).timestamp()
    except (OSError, ValueError, IndexError, StopIteration):
        return False  # no /proc (not Linux) or an unreadable time: fall back to liveness alone
    return began > run_started + 2.0  # btime is whole seconds; allow for it and clock ticks


def pid_alive(pid: int) -> bool:
    """Whether process `pid` is running (a zombie is not)."""
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
