"""`dpw gui --db FILE` where FILE is not a usable store: a dialog naming it, what is wrong and what to
do, and the file left as it was (real files, through the store helper process)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.config import RunConfig
from engine.store import Store
from left_behind_wal import backup_restored_beside_a_stale_log
from workbench.store_problem import CREATE_NEW, open_window_over


def _empty(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def _foreign(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("create table contacts (name text, phone text)")
    conn.execute("insert into contacts values ('Ada', '123')")
    conn.commit()
    conn.close()
    return path


def _text(path: Path) -> Path:
    path.write_text("name,phone\nAda,123\n")
    return path


def _damaged(path: Path) -> Path:
    store = Store(path)
    store.create_run(RunConfig(name="kept", dataset="digits", noise_multiplier=1.0))
    store.close()
    data = bytearray(path.read_bytes())
    data[100:] = b"\xab" * (len(data) - 100)  # keep the SQLite header, damage every page
    path.write_bytes(bytes(data))
    return path


def _damaged_runs_table(path: Path) -> Path:
    store = Store(path)
    for i in range(20):
        store.create_run(RunConfig(name=f"run-{i}", dataset="digits", noise_multiplier=1.0))
    store.close()
    conn = sqlite3.connect(path)
    (root,) = conn.execute("select rootpage from sqlite_master where name = 'runs'").fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page_size:root * page_size] = b"\xab" * page_size  # the header opens; the runs do not
    path.write_bytes(bytes(data))
    return path


CASES = {
    "empty": (_empty, "empty file (0 bytes)"),
    "foreign": (_foreign, "another application's SQLite database (tables: contacts)"),
    "not-sqlite": (_text, "not an SQLite database file"),
    "damaged": (_damaged, "is damaged"),
    "damaged-runs-table": (_damaged_runs_table, "is damaged (SQLite: database disk image is malformed)"),
    # Read through the -wal the restored file's predecessor left: the dialog names it, nothing is replayed.
    "stale-wal": (backup_restored_beside_a_stale_log, "reads as damaged through the stale-wal.sqlite-wal left beside it"),
}


def _fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


class DialogAnswerer:
    """Answers each store-problem dialog with the button named, recording what it said."""

    def __init__(self, button: str):
        self.button, self.seen = button, []
        self.timer = QTimer()
        self.timer.setInterval(50)
        self.timer.timeout.connect(self._answer)
        self.timer.start()

    def _answer(self) -> None:
        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox) and box.objectName() == "storeProblem":
            self.seen.append((box.text(), box.informativeText(), [b.text() for b in box.buttons()]))
            next(b for b in box.buttons() if b.text() == self.button).click()


@pytest.mark.parametrize("case", list(CASES))
def test_an_unusable_store_gets_a_dialog_and_stays_unchanged(case, qtbot, tmp_path):
    from workbench.main_window import MainWindow

    make, what = CASES[case]
    path = make(tmp_path / f"{case}.sqlite")
    before = _fingerprint(tmp_path)
    answer = DialogAnswerer("Quit")
    window = open_window_over(path, lambda p: MainWindow(p, probe=False))
    answer.timer.stop()
    assert window is None
    ((text, details, buttons),) = answer.seen
    assert str(path) in text
    assert what in details and "Traceback" not in details
    assert details.count("left unchanged") + details.count("leaves it unchanged") == 1  # said once
    assert buttons == ["Open another store…", "Create a new store…", "Quit"]
    after = _fingerprint(tmp_path)
    if case == "stale-wal":  # its -shm is SQLite's index of the log, rebuilt by the read that found the damage
        before.pop("stale-wal.sqlite-shm"), after.pop("stale-wal.sqlite-shm")
    assert after == before  # same bytes, and no -wal or -shm beside it


def test_a_new_store_elsewhere_opens_the_window_and_leaves_the_bad_file(qtbot, tmp_path):
    from workbench.main_window import MainWindow

    bad = _foreign(tmp_path / "contacts.sqlite")
    before = _fingerprint(tmp_path)
    new = tmp_path / "elsewhere" / "runs.sqlite"
    asked = []
    answer = DialogAnswerer("Create a new store…")
    window = open_window_over(bad, lambda p: MainWindow(p, probe=False),
                              choose=lambda path, choice: asked.append(choice) or new)
    answer.timer.stop()
    assert asked == [CREATE_NEW]
    assert window is not None and window.store.path == new
    qtbot.addWidget(window)
    assert window.runs_model.rows == []
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == before[bad.name]
    window.close()
