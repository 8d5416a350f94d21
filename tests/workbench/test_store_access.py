"""The window and the store stay one: a real file dialog over the store's folder while runners write.

Qt's file dialog opens the files it lists (to sniff their type). POSIX advisory locks belong to a
process and die when any descriptor of the file in that process is closed (sqlite.org, "How To
Corrupt An SQLite Database File", 2.2), so a window holding its own SQLite connection lost its
locks, the next `dpw` deleted `-wal`/`-shm` under it, and the window split from the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFileDialog

from workbench.main_window import MainWindow

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_MS = 180_000
DIALOG_OPEN_MS = 2000  # long enough for the dialog's file model to list (and sniff) the folder


def dpw(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    if check:
        assert out.returncode == 0, out.stderr[-2000:]
    return out


def digits_config(folder: Path, name: str, epochs: int = 1) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""\
        name = "{name}"
        dataset = "digits"
        model = "auto"
        mechanism = "dpsgd"
        noise_multiplier = 1.0
        clipping_norm = 1.0
        delta = 1e-4
        expected_batch_size = 64
        epochs = {epochs}
        learning_rate = 0.5
        evaluations_per_epoch = 1
        seed = 0
        """), encoding="utf-8")
    return path


def runs_seen_by_another_process(db: Path) -> dict[int, tuple[str, str]]:
    """Id -> (name, status) as a fresh process reads the file (never this process: see the module doc)."""
    code = ("import json, sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "print(json.dumps(c.execute('select id, name, status from runs order by id').fetchall()))")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    return {row[0]: (row[1], row[2]) for row in json.loads(out.stdout)}


def integrity(db: Path) -> str:
    code = "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('pragma integrity_check').fetchone()[0])"
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60)
    return (out.stdout.strip() or out.stderr.strip().splitlines()[-1])


def open_config_over(window: MainWindow, folder: Path) -> list:
    """File > Open config… starting in `folder`; the real dialog lists the folder, then is cancelled."""
    window.settings.set_text("setup/folder", str(folder))
    shown: list = []

    def cancel() -> None:
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, QFileDialog):
            shown.append(Path(dialog.directory().absolutePath()))
        if dialog is not None:
            dialog.reject()

    QTimer.singleShot(DIALOG_OPEN_MS, cancel)
    assert window.open_config() is False
    assert shown == [folder], "the Open config dialog did not list the store's folder"
    return shown


def start_from_window(window: MainWindow, name: str) -> int:
    for field, value in dict(name=name, dataset="digits", model="auto", mechanism="dpsgd", noise_multiplier=1.0,
                             target_epsilon="", expected_batch_size=64, epochs=1, learning_rate=0.5, delta=1e-4,
                             evaluations_per_epoch=1).items():
        window.form.set_value(field, str(value))
    assert window.form.start_button.isEnabled(), window.form.summary.text()
    before = set(window.run_data)
    window.act_start.trigger()
    (run_id,) = set(window.run_data) - before
    return run_id


def window_ids(window: MainWindow) -> dict[int, str]:
    window.refresh_runs()
    return {row["id"]: row["name"] for row in window.runs_model.rows}


def test_a_file_dialog_over_the_store_folder_never_splits_the_window_from_the_store(window, qtbot, db_path, tmp_path):
    folder = db_path.parent
    assert folder == tmp_path
    # A CLI run writes while the dialog lists the folder.
    cli_run = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(digits_config(folder, "cli-1", 3)),
                                "--db", str(db_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        qtbot.waitUntil(lambda: 1 in window_ids(window), timeout=60_000)
        open_config_over(window, folder)
        dpw("list", "--db", str(db_path))  # a process that opens and closes the store

        first = start_from_window(window, "window-1")
        qtbot.waitUntil(lambda: window.run_data[first].finished, timeout=RUN_TIMEOUT_MS)
        assert window.run_data[first].status == "finished", [m.text for m in window.run_data[first].messages]
        assert cli_run.wait(timeout=300) == 0, cli_run.stderr.read().decode()[-2000:]
    finally:
        if cli_run.poll() is None:
            cli_run.kill()
            cli_run.wait()

    # Again, with the window's own run writing while the dialog lists the folder.
    second = start_from_window(window, "window-2")
    open_config_over(window, folder)
    qtbot.waitUntil(lambda: window.run_data[second].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[second].status == "finished", [m.text for m in window.run_data[second].messages]
    dpw("run", str(digits_config(folder, "cli-2")), "--db", str(db_path))

    # The window and any other process see the same runs under the same ids.
    elsewhere = runs_seen_by_another_process(db_path)
    assert window_ids(window) == {run_id: name for run_id, (name, _) in elsewhere.items()}
    assert sorted(name for name, _ in elsewhere.values()) == ["cli-1", "cli-2", "window-1", "window-2"]
    assert {status for _, status in elsewhere.values()} == {"finished"}

    window.close()  # quitting leaves the store intact
    assert integrity(db_path) == "ok"
    assert runs_seen_by_another_process(db_path) == elsewhere


_STORE_CONNECTS: list[str] = []


def _record_sqlite_connects(event: str, args: tuple) -> None:
    if event == "sqlite3.connect":
        _STORE_CONNECTS.append(str(args[0]))


sys.addaudithook(_record_sqlite_connects)  # once per process; it only records


def finished_run(window: MainWindow, name: str) -> int:
    from engine.config import RunConfig

    run_id = window.store.create_run(RunConfig(name=name, dataset="digits", mechanism="dpsgd", noise_multiplier=1.0))
    window.store.update_run(run_id, status="finished", steps_done=0)
    window.refresh_runs()
    return run_id


def store_descriptors(db: Path) -> list[str]:
    """This process's open descriptors on the store's files (Linux /proc)."""
    names = {str(db), f"{db}-wal", f"{db}-shm"}
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.removesuffix(" (deleted)") in names:
            found.append(target)
    return found


def test_the_window_process_never_opens_the_store_file(window, qtbot, db_path):
    before = len(_STORE_CONNECTS)
    run_id = finished_run(window, "looked-at")
    window.select_run(run_id)
    window.tabs.setCurrentWidget(window.votes)
    report = window.report_run()
    qtbot.waitUntil(lambda: report.report is not None or report.browser.toPlainText().startswith("No report"),
                    timeout=60_000)
    export = window.export_run()
    export.export()
    qtbot.waitUntil(lambda: export.outcome is not None, timeout=120_000)
    assert export.outcome == "error"  # nothing saved to export: said, not crashed
    assert "looked-at" in [row["name"] for row in window.runs_model.rows]
    connects = [c for c in _STORE_CONNECTS[before:] if Path(c).name.startswith(db_path.name)]
    assert connects == [], "the window's process opened the store itself"
    assert store_descriptors(db_path) == []


def test_a_killed_store_helper_is_started_again_and_the_status_bar_says_so(window, qtbot, db_path):
    run_id = finished_run(window, "survives")
    first = window.store.helper_pid
    os.kill(first, signal.SIGKILL)
    window.refresh_runs()
    assert window.store.helper_pid != first
    assert run_id in [row["id"] for row in window.runs_model.rows]
    assert "started it again" in window.statusBar().currentMessage()
    window.store.update_run(run_id, name="renamed")  # writes go through the new helper
    window.refresh_runs()
    assert [row["name"] for row in window.runs_model.rows] == ["renamed"]


def test_a_setting_refused_inside_the_store_helper_arrives_as_that_settings_error(window, db_path):
    """A ConfigError from the helper was rebuilt without its field: a TypeError instead of the message."""
    from engine.errors import ConfigError

    run_id = finished_run(window, "named")
    with pytest.raises(ConfigError) as refused:
        window.store.rename_run(run_id, "two\nlines")
    assert refused.value.field == "name" and refused.value.message.startswith("name: 'two\\nlines' holds a line break")
    assert refused.value.hint == "a run's name is one line of text"


def test_a_store_that_is_not_a_store_is_one_message_not_a_traceback(tmp_path, qtbot):
    from engine.errors import DPWError
    from workbench.app import create_app

    create_app()
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 200)
    with pytest.raises(DPWError, match="notes.txt"):
        MainWindow(text, probe=False)
    assert text.read_text() == "hello\n" * 200


def test_a_store_replaced_under_the_window_is_opened_again_and_said(window, qtbot, db_path, tmp_path):
    finished_run(window, "before")
    backup = tmp_path / "backup" / "runs.sqlite"
    backup.parent.mkdir()
    code = ("import sys; from engine.store import Store; from engine.config import RunConfig; s = Store(sys.argv[1]); "
            "[s.create_run(RunConfig(name=n, dataset='digits', mechanism='dpsgd', noise_multiplier=1.0)) "
            "for n in ('restored-1', 'restored-2')]; s.close()")
    subprocess.run([sys.executable, "-c", code, str(backup)], check=True, cwd=REPO, timeout=60)
    os.replace(backup, db_path)  # a backup copied over the store while the window is open
    assert sorted(window_ids(window).values()) == ["restored-1", "restored-2"]
    assert "replaced" in window.statusBar().currentMessage()
    window.close()
    assert integrity(db_path) == "ok"
    assert sorted(name for name, _ in runs_seen_by_another_process(db_path).values()) == ["restored-1", "restored-2"]
