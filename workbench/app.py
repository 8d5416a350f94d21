"""`dpw gui`: the workbench window over a store file."""

from __future__ import annotations

import sys
import time
from pathlib import Path

APP_STARTED = time.monotonic()


def qt_binding_problem() -> str | None:
    """PySide6 6.12.0 miscounts references to None/True/False on Python < 3.12 (where they are not
    immortal), which crashes any long-running window; say so instead of crashing later."""
    import PySide6

    if PySide6.__version__.startswith("6.12.0") and sys.version_info < (3, 12):
        return (f"PySide6 {PySide6.__version__} on Python {sys.version.split()[0]} is known to crash "
                "(reference-count bug); install PySide6 6.11 (pip install 'PySide6<6.12') or use Python 3.12+")
    return None


def display_problem(environ=None) -> str | None:
    """On Linux, Qt aborts with a long plugin message when there is no screen to open a window
    on; say what to do instead."""
    import os

    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux") or env.get("QT_QPA_PLATFORM"):
        return None
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("no display to open the window on (neither DISPLAY nor WAYLAND_DISPLAY is set); "
            "on a server use `xvfb-run dpw gui`, or the CLI (`dpw run`, `dpw list`, `dpw report`)")


# Libraries Qt's xcb platform plugin loads from the system (the wheel does not carry them): the
# library's name as the linker knows it, and the Debian package that installs it.
XCB_LIBRARIES = {
    "xcb-cursor": "libxcb-cursor0", "xkbcommon-x11": "libxkbcommon-x11-0", "xcb-icccm": "libxcb-icccm4",
    "xcb-image": "libxcb-image0", "xcb-keysyms": "libxcb-keysyms1", "xcb-randr": "libxcb-randr0",
    "xcb-render-util": "libxcb-render-util0", "xcb-shape": "libxcb-shape0", "xcb-xkb": "libxcb-xkb1",
    "EGL": "libegl1", "fontconfig": "libfontconfig1",
}


def missing_xcb_libraries(environ=None, find=None) -> list[str]:
    """The Debian packages of the X11 libraries Qt will look for and not find (Qt then aborts with a
    plugin message that names one at most); [] off Linux, for another platform, or when all are there.
    `find` is ctypes.util.find_library (a finder may miss libraries in unusual places: a warning only)."""
    import ctypes.util
    import os

    env = os.environ if environ is None else environ
    platform = env.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (platform and not platform.startswith("xcb")):
        return []
    if not platform and env.get("WAYLAND_DISPLAY"):
        return []  # Qt opens a Wayland window, not an X11 one
    find = find or ctypes.util.find_library
    return [package for library, package in XCB_LIBRARIES.items() if not find(library)]


def create_app(argv: list[str] | None = None):
    """The QApplication (created once), named so QSettings and the desktop file find it."""
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from workbench.main_window import ICON_PATH
    from workbench.settings import APPLICATION, ORGANIZATION

    app = QApplication.instance()
    if app is None:
        app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("DP Workbench")
    app.setDesktopFileName("dp-workbench")
    if ICON_PATH.is_file():
        app.setWindowIcon(QIcon(str(ICON_PATH)))
    return app


def main(db_path: str | Path | None = None, argv: list[str] | None = None) -> int:
    """Open the window over `db_path` (None: the default store); returns the exit code."""
    from engine.store import default_db_path

    problem = qt_binding_problem()
    if problem:
        print(f"warning: {problem}", file=sys.stderr)
    no_display = display_problem()
    if no_display:
        print(f"error: {no_display}", file=sys.stderr)
        return 2
    missing = missing_xcb_libraries()
    if missing:
        print(f"warning: libraries Qt needs for the window were not found ({', '.join(missing)}); if the window "
              f"does not open, install them: sudo apt-get install {' '.join(missing)}", file=sys.stderr)
    app = create_app(argv)
    from workbench.main_window import MainWindow
    from workbench.store_problem import open_window_over

    path = Path(db_path) if db_path is not None else default_db_path()
    # A store that cannot be used (empty, another application's, not SQLite, damaged) gets a dialog
    # naming the file and offering another store, a new one elsewhere, or quitting.
    window = open_window_over(path, MainWindow)
    if window is None:
        return 1
    window.show()
    # Ctrl-C in the terminal (or SIGTERM) closes the window as the user would: runs are stopped
    # after their current step and the layout is saved. Python sees the signal at the next timer tick.
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: window.close())
    return app.exec()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
