"""pyqtgraph plots that follow the system palette and stay smooth with long curves."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

pg.setConfigOptions(antialias=False, useNumba=False)

# Mid-tone colours that read on light and dark backgrounds alike (the "tab10" cycle).
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")


# pyqtgraph legend offsets: positive from the left/top, negative from the right/bottom.
LEGEND_OFFSETS = {"top-right": (-10, 10), "top-left": (10, 10), "bottom-right": (-10, -10), "bottom-left": (10, -10)}


def colour(index: int) -> QColor:
    return QColor(SERIES_COLOURS[index % len(SERIES_COLOURS)])


def palette_colours() -> tuple[QColor, QColor]:
    """(background, foreground) of the current palette's base and text roles."""
    palette = QApplication.palette()
    return palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)


class Plot(pg.PlotWidget):
    """A plot with palette colours, axis labels, a legend and a grid; re-coloured on palette change."""

    def __init__(self, title: str = "", x_label: str = "", y_label: str = "", parent=None, legend: bool = True,
                 corner: str = "top-right"):
        super().__init__(parent=parent)
        self._title = title
        item = self.getPlotItem()
        item.setLabel("bottom", x_label)
        item.setLabel("left", y_label)
        for name in ("left", "bottom"):
            axis = item.getAxis(name)
            axis.enableAutoSIPrefix(False)  # accuracy stays 0.9, not 900 (x0.001)
            # Grid at the labelled ticks only: the finer levels' translucent lines cost most of a frame.
            axis.setStyle(maxTickLevel=0)
        item.showGrid(x=True, y=True, alpha=0.2)
        item.setMenuEnabled(False)
        self.legend = item.addLegend(offset=LEGEND_OFFSETS[corner]) if legend else None
        self.apply_palette()

    def apply_palette(self) -> None:
        background, foreground = palette_colours()
        self.setBackground(background)
        item = self.getPlotItem()
        for name in ("left", "bottom"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(foreground))
            axis.setTextPen(pg.mkPen(foreground))
        if self._title:
            item.setTitle(self._title, color=foreground.name())
        if self.legend is not None:
            self.legend.setLabelTextColor(foreground)
            fill = QColor(background)
            fill.setAlpha(200)
            self.legend.setBrush(pg.mkBrush(fill))

    def showEvent(self, event) -> None:  # noqa: N802
        # Curves set while hidden were downsampled for a zero-size view; redo them at the real size.
        super().showEvent(event)
        QTimer.singleShot(0, self._refit)

    def _refit(self) -> None:
        for item in self.getPlotItem().listDataItems():
            if isinstance(item, pg.PlotDataItem):
                item.updateItems(styleUpdate=False)
        view = self.getPlotItem().getViewBox()
        if any(view.autoRangeEnabled()):
            view.updateAutoRange()

    def set_title(self, title: str) -> None:
        self._title = title
        self.getPlotItem().setTitle(title, color=palette_colours()[1].name())

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange) \
                and getattr(self, "legend", False) is not False:
            self.apply_palette()
        super().changeEvent(event)

    def curve(self, name: str | None, index: int, *, width: float = 1.0, style=Qt.PenStyle.SolidLine,
              symbol: str | None = None) -> pg.PlotDataItem:
        """A curve ready for long data: peak downsampling, clipped to the view, no finite check.

        Width 1 (a cosmetic hairline) draws about ten times faster than wider pens with the raster
        engine: a 100,000-point curve pans at ~4 ms a frame instead of ~35 ms."""
        pen = pg.mkPen(colour(index), width=width, style=style)
        item = pg.PlotDataItem(name=name, pen=pen, symbol=symbol, symbolSize=6, symbolBrush=colour(index),
                               symbolPen=None, skipFiniteCheck=True)
        item.setDownsampling(auto=True, method="peak")
        item.setClipToView(True)
        self.addItem(item)
        return item

    def anchor(self) -> pg.PlotDataItem:
        """An invisible point that keeps a value (a budget, a reference) inside the auto range."""
        item = pg.PlotDataItem(pen=pg.mkPen((0, 0, 0, 0)))  # transparent, but counted in the bounds
        self.addItem(item)
        return item

    def hline(self, value: float | None, label: str = "") -> pg.InfiniteLine:
        _, foreground = palette_colours()
        line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(QColor("#d62728"), width=1.5,
                                                                    style=Qt.PenStyle.DashLine),
                               label=label, labelOpts={"position": 0.97, "color": foreground, "anchors": [(1, 1), (1, 1)]})
        if value is not None:
            line.setValue(value)
        line.setVisible(value is not None)
        self.addItem(line, ignoreBounds=True)
        return line


def set_curve(item: pg.PlotDataItem, x: np.ndarray, y: np.ndarray) -> None:
    """setData for finite data without pyqtgraph's per-call finite check (NaNs are dropped first)."""
    if y.size and not np.isfinite(y).all():
        keep = np.isfinite(y)
        x, y = x[keep], y[keep]
    item.setData(x, y, skipFiniteCheck=True)
