"""Render a report's HTML to PDF offline with Qt's text engine (no browser)."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

_DATA_URL = re.compile(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'")


def html_to_pdf(html: str, out: str | Path) -> Path:
    """Write `html` (with inline PNG data URLs) as an A4 PDF at `out`."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QByteArray, QMarginsF, QUrl
    from PySide6.QtGui import QImage, QPageLayout, QPageSize, QPdfWriter, QTextDocument
    from PySide6.QtWidgets import QApplication

    # Fonts need an application; a QApplication (not just QGuiApplication) so widgets can follow.
    app = QApplication.instance() or QApplication([])  # noqa: F841
    images: list[QImage] = []

    def to_resource(match: re.Match) -> str:
        image = QImage()
        image.loadFromData(QByteArray(base64.b64decode(match.group(1))), "PNG")
        images.append(image)
        return f"src='figure{len(images) - 1}.png'"

    html = _DATA_URL.sub(to_resource, html)
    document = QTextDocument()
    for index, image in enumerate(images):
        document.addResource(QTextDocument.ResourceType.ImageResource, QUrl(f"figure{index}.png"), image)
    document.setHtml(html)
    out = Path(out)
    writer = QPdfWriter(str(out))
    writer.setPageLayout(QPageLayout(QPageSize(QPageSize.PageSizeId.A4), QPageLayout.Orientation.Portrait,
                                     QMarginsF(15, 15, 15, 15), QPageLayout.Unit.Millimeter))
    writer.setResolution(120)
    writer.setTitle("DP Workbench privacy report")
    document.setPageSize(writer.pageLayout().paintRectPixels(writer.resolution()).size().toSizeF())
    document.print_(writer)
    del writer
    return out
