"""Workbench tests run offscreen, on a temporary store and temporary QSettings."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def tmp_settings(tmp_path_factory):
    """Every test gets empty settings of its own (never the user's)."""
    from workbench.settings import use_folder

    folder = tmp_path_factory.mktemp("settings")
    use_folder(folder)
    return folder


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "runs.sqlite"


@pytest.fixture
def window(qtbot, db_path, mnist_dir, monkeypatch):
    """A main window on an empty store; runners find MNIST through $DPW_DATA_DIR."""
    monkeypatch.setenv("DPW_DATA_DIR", str(mnist_dir.parent))
    from workbench.app import create_app
    from workbench.main_window import MainWindow

    create_app()
    win = MainWindow(db_path, probe=False)
    qtbot.addWidget(win)
    win.show()
    yield win
    win.client.shutdown(timeout_ms=10000)
