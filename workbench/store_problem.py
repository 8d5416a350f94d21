"""When the store given to `dpw gui --db` cannot be used: say which file, what is wrong and what to
do, in a dialog (never a traceback), and leave the file as it is.

The store refuses another application's SQLite file, a file that is not SQLite and a damaged one
(engine.store, through the store helper process); an empty file it would quietly turn into a new
store, so the window refuses that first. The dialog offers another store, a new one elsewhere, or
quitting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from engine.errors import DPWError
from engine.store import empty_file_problem

STORE_FILTER = "DP Workbench stores (*.sqlite *.db);;All files (*)"
OPEN_ANOTHER, CREATE_NEW, QUIT = "open", "create", "quit"


def as_store_problem(path: Path, exc: BaseException) -> DPWError:
    """Any failure to open the window over `path` as one line for a person."""
    if isinstance(exc, DPWError):
        return exc
    detail = str(exc).removeprefix(f"{getattr(exc, 'kind', '')}: ")  # a RemoteError names its type first
    if "malformed" in detail or "not a database" in detail:
        return DPWError(f"{path} is damaged (SQLite: {detail})",
                        hint=f"copy what can be read into a new store: sqlite3 {path} \".recover\" | sqlite3 "
                             "recovered.sqlite, then open recovered.sqlite")
    return DPWError(f"cannot read {path}: {type(exc).__name__}: {exc}",
                    hint="the file may be damaged; DP Workbench leaves it unchanged")


def read_runs(window: object) -> None:
    """Read the runs list once through the window's store helper: a store whose header opens but
    whose runs table is damaged fails here, before the window is shown."""
    window.store.list_runs()


def ask_what_to_do(path: Path, problem: DPWError) -> str:
    """The dialog: OPEN_ANOTHER, CREATE_NEW or QUIT."""
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Icon.Critical, "Cannot open the store", f"Cannot open the store {path}")
    box.setObjectName("storeProblem")
    hint = problem.hint.rstrip(".") if problem.hint else ""
    box.setInformativeText(f"{problem.message.rstrip('.')}.\n\n"
                           + (f"{hint[:1].upper()}{hint[1:]}.\n\n" if hint else "")
                           + ("" if "left unchanged" in hint or "leaves it unchanged" in hint
                              else "The file was left unchanged. ")
                           + "Open another store, create a new one elsewhere, or quit.")
    open_button = box.addButton("Open another store…", QMessageBox.ButtonRole.AcceptRole)
    create_button = box.addButton("Create a new store…", QMessageBox.ButtonRole.AcceptRole)
    quit_button = box.addButton("Quit", QMessageBox.ButtonRole.RejectRole)
    box.setDefaultButton(open_button)
    box.setEscapeButton(quit_button)
    box.exec()
    clicked = box.clickedButton()
    return OPEN_ANOTHER if clicked is open_button else CREATE_NEW if clicked is create_button else QUIT


def choose_store(path: Path, choice: str) -> Path | None:
    """A file dialog for the choice (None when cancelled); a new store is suggested beside the old."""
    from PySide6.QtWidgets import QFileDialog

    if choice == OPEN_ANOTHER:
        chosen, _ = QFileDialog.getOpenFileName(None, "Open a DP Workbench store", str(path.parent), STORE_FILTER)
    else:
        suggestion = path.parent / "runs.sqlite"
        if suggestion.exists():
            suggestion = path.parent / "new-runs.sqlite"
        chosen, _ = QFileDialog.getSaveFileName(None, "Create a new DP Workbench store", str(suggestion),
                                                STORE_FILTER)
    return Path(chosen) if chosen else None


def open_window_over(path: Path, make_window: Callable[[Path], object], *,
                     ask: Callable[[Path, DPWError], str] = ask_what_to_do,
                     choose: Callable[[Path, str], Path | None] = choose_store,
                     check: Callable[[object], None] = read_runs) -> object | None:
    """`make_window(path)`, asking for another store as long as the one given cannot be used; None
    when the user quits."""
    while True:
        problem = empty_file_problem(path)
        if problem is None:
            window = None
            try:
                window = make_window(path)
                check(window)
                return window
            except Exception as exc:  # the store's refusal (or any failure reading it): a dialog
                problem = as_store_problem(path, exc)
                if window is not None:
                    window.close()
        while True:
            choice = ask(path, problem)
            if choice == QUIT:
                return None
            chosen = choose(path, choice)
            if chosen is not None:
                path = chosen
                break
