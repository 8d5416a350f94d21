"""Window sizes that fit the screen they open on."""

from __future__ import annotations

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

SCREEN_SHARE = 0.92  # the most of the screen's free area a window takes when it first opens


def fit_to_screen(widget: QWidget, width: int, height: int) -> None:
    """Resize `widget` to `width` x `height`, or smaller where the screen is: on a 1366 x 768 laptop
    the report dialog's 900 px ran past the bottom of the screen, its Save and Close buttons out of
    reach, and the main window's first size (1400 x 900) past both edges."""
    anchor = widget.parentWidget() or widget
    screen = anchor.screen() or QGuiApplication.primaryScreen()
    if screen is not None:
        free = screen.availableGeometry()
        width = min(width, int(free.width() * SCREEN_SHARE))
        height = min(height, int(free.height() * SCREEN_SHARE))
    widget.resize(width, height)
