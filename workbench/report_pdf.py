"""Render a report's HTML to PDF offline with Qt's text engine (no browser).

Qt's HTML has no `page-break-after: avoid`, so headings are kept with what follows them by hand:
after layout, a heading whose next block starts on a later page gets a page break before it.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

_DATA_URL = re.compile(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'")


PAGE_LAYOUT = {"margins_mm": 15, "resolution": 120}  # A4 portrait


def _application():
    """Fonts need an application; a QApplication (not just QGuiApplication) so widgets can follow."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication([])


def _page_layout():
    from PySide6.QtCore import QMarginsF
    from PySide6.QtGui import QPageLayout, QPageSize

    margin = PAGE_LAYOUT["margins_mm"]
    return QPageLayout(QPageSize(QPageSize.PageSizeId.A4), QPageLayout.Orientation.Portrait,
                       QMarginsF(margin, margin, margin, margin), QPageLayout.Unit.Millimeter)


def paged_document(html: str):
    """The report as the PDF prints it: a QTextDocument with its images, cut into A4 pages, every
    heading kept with the block after it."""
    from PySide6.QtCore import QByteArray, QUrl
    from PySide6.QtGui import QImage, QTextDocument

    _application()
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
    resolution = PAGE_LAYOUT["resolution"]
    document.setPageSize(_page_layout().paintRectPixels(resolution).size().toSizeF())
    keep_headings_with_next(document)
    return document


def html_to_pdf(html: str, out: str | Path) -> Path:
    """Write `html` (with inline PNG data URLs) as an A4 PDF at `out`."""
    from PySide6.QtGui import QPdfWriter

    document = paged_document(html)
    out = Path(out)
    writer = QPdfWriter(str(out))
    writer.setPageLayout(_page_layout())
    writer.setResolution(PAGE_LAYOUT["resolution"])
    writer.setTitle("DP Workbench privacy report")
    document.print_(writer)
    del writer
    return out


def _page(document, y: float) -> int:
    return int(y // document.pageSize().height())


def _orphaned_blocks(document):
    """Heading blocks (h1-h6) whose next block starts on a later page, from the top."""
    layout = document.documentLayout()
    layout.documentSize()  # lays the whole document out (it is laid out lazily, a part at a time)
    block = document.begin()
    while block.isValid():
        following = block.next()
        if block.blockFormat().headingLevel() > 0 and following.isValid():
            if _page(document, _first_line_top(layout, following)) > _page(document, _first_line_top(layout, block)):
                yield block
        block = following


def _first_line_top(layout, block) -> float:
    """Where a block's first line starts on the paged document (a line that does not fit at a page's
    foot, such as an image, is moved down while its block keeps its place)."""
    lines = block.layout()
    if lines is None or lines.lineCount() == 0:
        return layout.blockBoundingRect(block).top()
    return layout.blockBoundingRect(block).top() + lines.lineAt(0).y() + 1


def orphaned_headings(document) -> list[str]:
    """The text of every heading left at the foot of a page (a laid-out, paged QTextDocument)."""
    return [block.text() for block in _orphaned_blocks(document)]


def keep_headings_with_next(document) -> None:
    """Move every heading left at the foot of a page to the top of the next (keep-with-next), one
    at a time from the top, since each move shifts what follows."""
    from PySide6.QtGui import QTextBlockFormat, QTextCursor, QTextFormat

    moved: set[int] = set()
    for _ in range(document.blockCount()):
        target = next((b for b in _orphaned_blocks(document) if b.position() not in moved), None)
        if target is None:
            return
        moved.add(target.position())
        page_break = QTextBlockFormat()
        page_break.setPageBreakPolicy(QTextFormat.PageBreakFlag.PageBreak_AlwaysBefore)
        QTextCursor(target).mergeBlockFormat(page_break)
