"""Windows open no larger than the screen they open on (a 1366 x 768 laptop); a background task whose
window closed while it ran ends without a traceback."""

from __future__ import annotations

import threading

from PySide6.QtCore import QThreadPool

from workbench.screen import SCREEN_SHARE


def test_the_main_window_and_the_report_dialog_fit_a_small_screen(window, qapp):
    """The offscreen screen is 800 x 800: smaller than the report dialog (820 x 900) and the main
    window's first size (1400 x 900), whose buttons ran off a laptop's screen."""
    from engine.config import RunConfig
    from engine.store import Store
    from workbench.dialogs import ReportDialog
    from workbench.ledger_dialog import LedgerDialog

    free = qapp.primaryScreen().availableGeometry()
    most = (int(free.width() * SCREEN_SHARE), int(free.height() * SCREEN_SHARE))
    assert window.width() <= most[0] and window.height() <= most[1]
    store = Store(window.store.path)
    run_id = store.create_run(RunConfig(name="r", dataset="digits", noise_multiplier=1.0))
    report = ReportDialog(window.store.path, store.get_run(run_id), window)
    ledger = LedgerDialog(store.list_runs(), [], window)
    for dialog in (report, ledger):
        assert dialog.width() <= most[0] and dialog.height() <= most[1]
    assert report.height() == most[1]  # as tall as the screen allows: the report is a long page
    report.close()
    ledger.close()


def test_a_task_whose_window_closed_ends_without_a_traceback(qapp, capfd):
    """Closing the report dialog (or quitting) while its report was built printed "Error calling Python
    override of QRunnable::run()" with a traceback: the task's signals were gone when it finished."""
    import shiboken6

    from workbench.dialogs import start_task

    release = threading.Event()
    told: list[object] = []
    task = start_task(lambda: release.wait(10), told.append, told.append)
    shiboken6.delete(task.signals)  # what closing the asking window leaves the running task
    release.set()
    assert QThreadPool.globalInstance().waitForDone(10_000)
    qapp.processEvents()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "RuntimeError" not in err and told == []
