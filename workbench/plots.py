"""pyqtgraph plots that follow the system palette and stay smooth with long curves, with a hover
read-out of exact values, an optional log axis, and export of the picture (PNG/SVG) and data (CSV)."""

from __future__ import annotations

import csv
import html
import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters  # noqa: F401  (registers pg.exporters)
from PySide6.QtCore import QEvent, QPointF, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPalette
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication, QFileDialog, QMenu

pg.setConfigOptions(antialias=False, useNumba=False)

# Mid-tone colours that read on light and dark backgrounds alike (the "tab10" cycle).
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")



# One colour per accountant in every view (dashboard, compare, votes), whatever order curves arrive in.
ACCOUNTANT_COLOURS = {"pld": 4, "rdp": 5, "prv": 9, "gdp": 8, "pate-di": 4, "pate-released": 9, "pate-dd": 7,
                      "publishable": 4}
MIN_RANGE = 1e-3  # the smallest span an axis shows
HOVER_RADIUS_PX = 20  # the read-out names the nearest point within this many pixels
TITLE_MARGIN_PX = 24  # room kept beside a plot's title: a longer one goes on to a second line
SUBTITLE_PT = 9.0  # a subtitle's size (the title's is pyqtgraph's 11pt)
LEGEND_SAMPLE_PX = 40  # a legend entry's line sample and the gap before its text
LABEL_BACKGROUND_ALPHA = 200  # of a reference line's label background (255: opaque)
TICK_GAP_PX = 10  # the least room between two tick labels side by side
TICK_GAP_UP_PX = 2  # and between two one above the other (a line's height already has some)


def colour(index: int) -> QColor:
    return QColor(SERIES_COLOURS[index % len(SERIES_COLOURS)])


def accountant_colour(name: str) -> int:
    """The colour index of an accountant's curve (the same in every view)."""
    return ACCOUNTANT_COLOURS.get(name, 6)


def format_value(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value):,}"
    return f"{value:.4g}"


def palette_colours() -> tuple[QColor, QColor]:
    """(background, foreground) of the current palette's base and text roles."""
    palette = QApplication.palette()
    return palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)


def wrapped(text: str, metrics: QFontMetrics, width: int) -> list[str]:
    """`text` in lines of whole words no wider than `width` pixels (a word wider than that alone on its line)."""
    lines: list[str] = []
    for word in text.split():
        if lines and metrics.horizontalAdvance(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines or [text]


def as_html_lines(lines: list[str]) -> str:
    """Plain-text lines as one label's HTML: escaped (never read as markup), joined by line breaks."""
    return "<br>".join(html.escape(line) for line in lines)


def shown_font(label: pg.LabelItem) -> QFont:
    """The font a pyqtgraph label draws its text in: its HTML sets the size (a title 11pt, a legend
    entry 9pt), not the item's font."""
    font = QFont(label.item.font())
    size = str(label.opts.get("size") or "")
    if size.endswith("pt"):
        font.setPointSizeF(float(size[:-2]))
    return font


class SpacedAxis(pg.AxisItem):
    """An axis whose tick labels never run into one another. pyqtgraph spaces ticks by the axis's
    length alone: in a narrow plot (Compare's scatter in a window 950 px wide) the labels read
    "185185.4", and in a short one (Compare's membership tests) "0.8" sat on "0.6". The major
    spacing goes up the 1-2-5 steps until the labels fit."""

    def tickSpacing(self, minVal: float, maxVal: float, size: float):  # noqa: N802, N803 (pyqtgraph's names)
        levels = super().tickSpacing(minVal, maxVal, size)
        if not levels or self.logMode or self._tickSpacing:
            return levels
        across = self.orientation in ("bottom", "top")
        spacing, offset = levels[0]
        metrics = QFontMetrics(self.style.get("tickFont") or self.font())
        low, high = min(minVal, maxVal), max(minVal, maxVal)
        for _ in range(8):
            values = np.arange(math.ceil(low / spacing) * spacing, high + spacing * 1e-9, spacing)
            if len(values) <= 2:
                break
            strings = self.tickStrings(list(values), self.autoSIPrefixScale * self.scale, spacing)
            extents = [metrics.horizontalAdvance(text) if across else metrics.height() for text in strings]
            if sum(extents) + (TICK_GAP_PX if across else TICK_GAP_UP_PX) * len(values) <= size:
                break
            mantissa = spacing / 10 ** math.floor(math.log10(spacing) + 1e-9)
            spacing *= 2.5 if round(mantissa) == 2 else 2.0  # 1 -> 2 -> 5 -> 10
        return [(spacing, offset)] + [level for level in levels[1:] if level[0] < spacing]


class Plot(pg.PlotWidget):
    """A plot with palette colours, axis labels, a legend and a grid; re-coloured on palette change."""

    def __init__(self, title: str = "", x_label: str = "", y_label: str = "", parent=None, legend: bool = True,
                 corner: str = "", log_axis: bool = False,
                 y_bounds: tuple[float | None, float | None] | None = None, subtitle: str = ""):
        """`log_axis`: offer a log value axis in the context menu; `y_bounds`: the value axis never
        leaves them (accuracy: (0, 1)); `subtitle`: a smaller line under the title (plain text, as the
        title). `corner` is accepted for older callers: legends sit under the plot."""
        super().__init__(parent=parent, axisItems={"bottom": SpacedAxis("bottom"), "left": SpacedAxis("left")})
        del self.clear  # PlotWidget binds PlotItem.clear to each instance; Plot.clear keeps the read-out
        self._title = title
        self._subtitle = subtitle
        self.title_lines: list[str] = []  # the title as shown, line by line
        self.log_axis_offered = log_axis
        self.y_bounds = y_bounds
        self.log_y = False
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
        self.legend = self._legend_below() if legend else None
        self._apply_bounds()
        # A single point (one finished run, one evaluation) auto-ranges to a zero-height view whose ticks
        # read 0.9347000000000002: never show less than this span.
        item.getViewBox().setLimits(minXRange=MIN_RANGE, minYRange=MIN_RANGE)
        self.log_y = False
        self.smoothing = 0.0  # weight of the moving average drawn over SmoothedCurves (0: off)
        self.smoothed: list[SmoothedCurve] = []
        self._lines: list[tuple[pg.InfiniteLine, float | None]] = []
        self.hover = pg.TextItem(anchor=(0, 1))
        self.hover.setZValue(1000)
        self.hover.hide()
        item.addItem(self.hover, ignoreBounds=True)
        self.scene().sigMouseMoved.connect(self._mouse_moved)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._context_menu)
        self._title_never_widens()
        self.apply_palette()

    def _legend_below(self) -> pg.LegendItem:
        """The legend as a row under the x axis, never over the curves or the budget line."""
        item = self.getPlotItem()
        legend = pg.LegendItem(colCount=2, horSpacing=12, verSpacing=-6)
        legend.setParentItem(None)
        item.layout.addItem(legend, 4, 1)
        item.legend = legend  # named curves added to the plot join it
        # Labels are laid out (and widen) after they are added: refit the columns whenever the legend's
        # size changes, so a legend wider than the plot never pushes the plot under its neighbour.
        legend.geometryChanged.connect(lambda: QTimer.singleShot(0, self, self._fit_legend))
        return legend

    def apply_palette(self) -> None:
        background, foreground = palette_colours()
        self.setBackground(background)
        item = self.getPlotItem()
        for name in ("left", "bottom"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(foreground))
            axis.setTextPen(pg.mkPen(foreground))
        self._show_title(recolour=True)
        if self.legend is not None:
            self.legend.setLabelTextColor(foreground)
            self.legend.setBrush(pg.mkBrush(background))
        self.hover.setColor(foreground)
        self.hover.fill = pg.mkBrush(QColor(background))
        self.hover.border = pg.mkPen(foreground)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if not self.closed:  # close() deletes the scene's items, then resizes the view
            self._fit_legend()
            self._show_title()

    def _fit_legend(self) -> None:
        """As many legend entries side by side as the width takes (a wider legend would widen the
        plot past its place in the layout, under its neighbour)."""
        legend = getattr(self, "legend", None)
        if legend is None or self.closed:
            return
        self._wrap_legend_labels(legend, max(40, self.width() - 60 - LEGEND_SAMPLE_PX))
        # the text's own width: a label's bounding rect stretches to its column once laid out
        widest = max((label.item.boundingRect().width() + 50 for _, label in legend.items), default=200.0)
        columns = int(max(1, min(4, (self.width() - 60) // widest)))
        if columns != legend.columnCount:
            legend.setColumnCount(columns)
        if self.getPlotItem().geometry().width() > self.width() + 1:
            # The plot kept the width a wider legend forced on it at the last resize: fit it to the view again.
            QTimer.singleShot(0, self, self._fit_to_view)

    @staticmethod
    def _wrap_legend_labels(legend: pg.LegendItem, room: int) -> None:
        """A label wider than the plot goes on over more lines: cut, it lost its end (the "not
        publishable" of the PATE data-dependent epsilon at 950 px) and widened the plot under its
        neighbour. Each label keeps its full text to wrap anew at every width."""
        for _, label in legend.items:
            full = getattr(label, "full_text", None)
            if full is None:
                full = label.full_text = label.text
            lines = wrapped(full, QFontMetrics(shown_font(label)), room)
            text = full if len(lines) == 1 else as_html_lines(lines)
            if text != label.text:
                label.setText(text)

    def _fit_to_view(self) -> None:
        if not self.closed:
            pg.GraphicsView.resizeEvent(self, None)  # sets the plot's geometry to the view's rectangle

    def showEvent(self, event) -> None:  # noqa: N802
        # Curves set while hidden were downsampled for a zero-size view; redo them at the real size.
        super().showEvent(event)
        QTimer.singleShot(0, self, self._refit)  # with `self` as context: dropped if the plot is deleted first

    def _refit(self) -> None:
        if self.closed:  # pyqtgraph's close() ran before this deferred call: its items are gone
            return
        for item in self.getPlotItem().listDataItems():
            if isinstance(item, pg.PlotDataItem):
                item.updateItems(styleUpdate=False)
        view = self.getPlotItem().getViewBox()
        if any(view.autoRangeEnabled()):
            view.updateAutoRange()

    def clear(self) -> None:
        """Remove every curve and line; the hover read-out stays."""
        self.getPlotItem().clear()
        self._lines = []
        self.smoothed = []
        self.hover.hide()
        self.getPlotItem().addItem(self.hover, ignoreBounds=True)

    def fit_to_data(self) -> None:
        """Show all the data, then follow it. Curves clipped to the view report only what the old view
        showed, so the auto range alone could keep a previous run's axes: the full extent is set first."""
        xs, ys = [], []
        for item in self.getPlotItem().listDataItems():
            if isinstance(item, pg.PlotDataItem) and item.xData is not None and len(item.xData):
                x, y = np.asarray(item.xData, dtype=float), np.asarray(item.yData, dtype=float)
                if self.log_y:
                    y = np.log10(np.where(y > 0, y, np.nan))
                keep = np.isfinite(x) & np.isfinite(y)
                if keep.any():
                    xs += [x[keep].min(), x[keep].max()]
                    ys += [y[keep].min(), y[keep].max()]
        view = self.getPlotItem().getViewBox()
        if xs:
            x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
            if self.y_bounds is not None and not self.log_y:
                low, high = self.y_bounds
                y0 = y0 if low is None else max(y0, low)
                y1 = y1 if high is None else min(y1, high)
            view.setRange(xRange=(x0, x1 if x1 > x0 else x0 + 1), yRange=(y0, y1 if y1 > y0 else y0 + 1e-3))
        view.enableAutoRange()

    def set_title(self, title: str) -> None:
        self._title = title
        self._show_title()

    def _show_title(self, *, recolour: bool = False) -> None:
        """The title (and subtitle, smaller), wrapped onto more lines where the plot is too narrow for
        it in one (a cut title lost its end, e.g. the "not in ε" of the PATE teachers' accuracies at
        1,100 px). Both are plain text: escaped, never read as markup."""
        if not getattr(self, "_title", ""):  # (also while pyqtgraph's constructor resizes the view)
            return
        label = self.getPlotItem().titleLabel
        font = shown_font(label)
        small = QFont(font)
        small.setPointSizeF(SUBTITLE_PT)
        # pyqtgraph puts the title over the view box alone: the room is the plot's width less its value axis
        room = max(40, int(self.width() - self.getPlotItem().getAxis("left").width() - TITLE_MARGIN_PX))
        lines = wrapped(self._title, QFontMetrics(font), room)
        sublines = wrapped(self._subtitle, QFontMetrics(small), room) if self._subtitle else []
        if recolour or lines + sublines != self.title_lines:
            self.title_lines = lines + sublines
            text = as_html_lines(lines)
            if sublines:
                text += f"<br><span style='font-size:{SUBTITLE_PT:g}pt'>{as_html_lines(sublines)}</span>"
            self.getPlotItem().setTitle(text, color=palette_colours()[1].name())
            height = (QFontMetrics(font).lineSpacing() * (len(lines) - 1)
                      + QFontMetrics(small).lineSpacing() * len(sublines))
            label.setMaximumHeight(30 + height)  # (setTitle: 30 px)

    def _title_never_widens(self) -> None:
        """pyqtgraph makes a title's text width the plot's minimum width (LabelItem.updateMin, on every
        text change and resize): a long title in a narrow place pushed the plot under its neighbour
        (the Audit tab's side panel covered its right part). The title is clipped instead."""
        label = self.getPlotItem().titleLabel
        measure = label.updateMin

        def update_min() -> None:
            measure()
            label.setMinimumWidth(0)
            hints = label._sizeHint
            for which in (Qt.SizeHint.MinimumSize, Qt.SizeHint.PreferredSize):
                hints[which] = (0, hints[which][1])

        label.updateMin = update_min  # called by LabelItem's own setText and resizeEvent
        update_min()
        label.updateGeometry()

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
        if name:
            self._fit_legend()
        return item

    def smoothed_curve(self, name: str, index: int) -> SmoothedCurve:
        """A noisy curve (train loss) that `set_smoothing` can draw smoothed over its faint raw self."""
        return SmoothedCurve(self, name, index)

    def set_smoothing(self, weight: float) -> None:
        """Draw the SmoothedCurves as moving averages of `weight` in [0, 1) (0: raw only)."""
        self.smoothing = min(max(float(weight), 0.0), 0.999)
        for curve in self.smoothed:
            curve.draw()

    def anchor(self) -> pg.PlotDataItem:
        """An invisible point that keeps a value (a budget, a reference) inside the auto range."""
        item = pg.PlotDataItem(pen=pg.mkPen((0, 0, 0, 0)))  # transparent, but counted in the bounds
        self.addItem(item)
        return item

    # ---- hover read-out ------------------------------------------------------------------------
    def named_curves(self) -> list[pg.PlotDataItem]:
        return [c for c in self.getPlotItem().listDataItems()
                if isinstance(c, pg.PlotDataItem) and c.name() and c.xData is not None and len(c.xData)]

    def nearest(self, scene_pos: QPointF) -> tuple[str, float, float] | None:
        """(curve name, x, y) of the data point nearest `scene_pos` within HOVER_RADIUS_PX, exact values.
        Distances in pixels, vectorised over each curve (cheap enough for every mouse move)."""
        view = self.getPlotItem().getViewBox()
        if not view.sceneBoundingRect().contains(scene_pos):
            return None
        mouse = view.mapSceneToView(scene_pos)
        pixel_x, pixel_y = view.viewPixelSize()
        if not pixel_x or not pixel_y:
            return None
        best = None
        for curve in self.named_curves():
            x, y = np.asarray(curve.xData, dtype=float), np.asarray(curve.yData, dtype=float)
            if x.size > 1000 and x[0] <= x[-1]:  # steps ascend: only points within reach in x
                reach = HOVER_RADIUS_PX * abs(pixel_x)
                lo, hi = np.searchsorted(x, [mouse.x() - reach, mouse.x() + reach])
                if lo < hi and np.all(x[lo + 1:hi] >= x[lo:hi - 1]):
                    x, y = x[lo:hi], y[lo:hi]
            if not x.size:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                shown_y = np.log10(y) if self.log_y else y
                distance = np.hypot((x - mouse.x()) / pixel_x, (shown_y - mouse.y()) / pixel_y)
            distance[~np.isfinite(distance)] = np.inf
            i = int(np.argmin(distance))
            if distance[i] <= HOVER_RADIUS_PX and (best is None or distance[i] < best[0]):
                best = (float(distance[i]), curve.name(), float(x[i]), float(y[i]))
        return None if best is None else best[1:]

    def readout(self, scene_pos: QPointF) -> str:
        """The hover text at `scene_pos`: the nearest point's curve and exact x, y, or ""."""
        found = self.nearest(scene_pos)
        if found is None:
            return ""
        name, x, y = found
        item = self.getPlotItem()
        x_label = item.getAxis("bottom").labelText or "x"
        y_label = item.getAxis("left").labelText or "y"
        return f"{name}\n{x_label} {format_value(x)}, {y_label} {format_value(y)}"

    def _mouse_moved(self, scene_pos: QPointF) -> None:
        text = self.readout(scene_pos)
        if not text:
            self.hover.hide()
            return
        view = self.getPlotItem().getViewBox()
        right_half = scene_pos.x() > view.sceneBoundingRect().center().x()
        self.hover.setAnchor((1.05, 1.05) if right_half else (-0.05, 1.05))  # towards the middle, off the cursor
        self.hover.setText(text)
        self.hover.setPos(view.mapSceneToView(scene_pos))
        self.hover.show()

    def leaveEvent(self, event) -> None:  # noqa: N802
        if not self.closed:
            self.hover.hide()
        super().leaveEvent(event)

    # ---- log axis, export -------------------------------------------------------------------------
    def _apply_bounds(self) -> None:
        """Keep the value axis within `y_bounds` (in a log scale the bounds no longer apply)."""
        low, high = self.y_bounds if self.y_bounds is not None and not self.log_y else (None, None)
        self.getPlotItem().getViewBox().setLimits(yMin=-1e307 if low is None else low,
                                                  yMax=1e307 if high is None else high)  # pyqtgraph's "none"

    def set_log_y(self, on: bool) -> None:
        """Log scale on the value axis; reference lines (the budget) move with it."""
        self.log_y = on
        self.getPlotItem().setLogMode(y=on)
        self._apply_bounds()
        for line, value in self._lines:
            self._place(line, value)
        self.fit_to_data()

    def _place(self, line: pg.InfiniteLine, value: float | None) -> None:
        if value is not None:
            line.setValue(math.log10(value) if self.log_y and value > 0 else value)

    def set_line(self, line: pg.InfiniteLine, value: float | None) -> None:
        """Move a reference line made by `hline` to `value` (hidden for None), in linear or log scale."""
        self._lines = [(l, value if l is line else v) for l, v in self._lines]
        line.setVisible(value is not None)
        self._place(line, value)

    def export_image(self, path: str | Path) -> Path:
        """Save the plot as it looks: PNG, or SVG by the file's suffix."""
        path = Path(path)
        if path.suffix.lower() != ".svg":
            pg.exporters.ImageExporter(self.getPlotItem()).export(str(path))
            return path
        # Qt's own SVG painter: pyqtgraph's SVGExporter cannot parse the paths recent Qt versions write.
        generator = QSvgGenerator()
        generator.setFileName(str(path))
        generator.setSize(QSize(self.width(), self.height()))
        generator.setViewBox(QRect(0, 0, self.width(), self.height()))
        generator.setTitle(self._title or "plot")
        painter = QPainter(generator)
        try:
            self.render(painter)
        finally:
            painter.end()
        return path

    def export_csv(self, path: str | Path) -> Path:
        """Save the plotted data, one row per point: curve, x, y (exact values, not downsampled)."""
        path = Path(path)
        item = self.getPlotItem()
        x_label = item.getAxis("bottom").labelText or "x"
        y_label = item.getAxis("left").labelText or "y"
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["curve", x_label, y_label])
            for curve in self.named_curves():
                for x, y in zip(curve.xData, curve.yData):
                    writer.writerow([curve.name(), repr(float(x)), repr(float(y))])
        return path

    def _context_menu(self, pos) -> None:
        menu = QMenu(self)
        if self.log_axis_offered:
            log = menu.addAction("Log scale")
            log.setCheckable(True)
            log.setChecked(self.log_y)
            log.toggled.connect(self.set_log_y)
        menu.addAction("Fit to data", self.fit_to_data)
        menu.addSeparator()
        menu.addAction("Save plot as PNG or SVG…", self._save_image)
        menu.addAction("Save data as CSV…", self._save_csv)
        menu.popup(self.mapToGlobal(pos))

    def _file_name(self, suffix: str) -> str:
        return "".join(c if c.isalnum() else "-" for c in (self._title or "plot").lower()).strip("-") + suffix

    def _save_image(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save plot", self._file_name(".png"),
                                              "PNG image (*.png);;SVG drawing (*.svg)")
        if path:
            self.export_image(path)

    def _save_csv(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save plot data", self._file_name(".csv"), "CSV (*.csv)")
        if path:
            self.export_csv(path)

    def hline(self, value: float | None, label: str = "", *, label_flips: bool = False) -> pg.InfiniteLine:
        """A dashed reference line at `value`, its label at the right end above it; `label_flips`: below
        it while the line is in the upper half of the view (a line at the top keeps its label in view)."""
        _, foreground = palette_colours()
        anchors = [(1, 0), (1, 1)] if label_flips else [(1, 1), (1, 1)]
        line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(QColor("#d62728"), width=1.5,
                                                                    style=Qt.PenStyle.DashLine),
                               label=label, labelOpts={"position": 0.97, "color": foreground, "anchors": anchors})
        self._lines.append((line, value))
        self.set_line(line, value)
        self.addItem(line, ignoreBounds=True)
        return line


def set_line_label(line: pg.InfiniteLine, text: str, *, backed: bool = False) -> None:
    """Label a reference line now. pyqtgraph's `label.setFormat` redraws only a visible label, so a
    line labelled while hidden (the view not yet shown, the line just about to be) kept its old text:
    the PATE votes' threshold line showed no label for the first query drawn."""
    line.label.format = text
    line.label.setText(text)
    if backed:  # on a background of the palette's: readable over a bar (the votes' threshold crosses the
        background = QColor(palette_colours()[0])  # winning one), the plot still seen through it
        background.setAlpha(LABEL_BACKGROUND_ALPHA)
        line.label.fill = pg.mkBrush(background)
        line.label.update()


def ema(y: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average, TensorBoard's scalar smoothing: s_i = w s_(i-1) + (1 - w) y_i
    from s_(-1) = 0, divided by 1 - w^(i+1) so the first points are not pulled towards 0 (the bias
    correction of Kingma & Ba, "Adam", 2015, section 3). `weight` 0 returns `y` unchanged."""
    y = np.asarray(y, dtype=float)
    if weight <= 0 or y.size == 0:
        return y
    from scipy.signal import lfilter

    smoothed = lfilter([1.0 - weight], [1.0, -weight], y)
    return smoothed / (1.0 - weight ** np.arange(1, y.size + 1))


class SmoothedCurve:
    """A noisy curve with optional smoothing (`Plot.set_smoothing`): the raw curve keeps its name and
    exact data (hover, CSV) and is drawn faint behind its moving average while smoothing is on. Only
    what is drawn changes, never the run's data."""

    RAW_ALPHA = 60  # of 255: the raw curve behind the smoothed one

    def __init__(self, plot: "Plot", name: str, index: int):
        self.plot, self.name, self.index = plot, name, index
        self.raw = plot.curve(name, index)
        self.smooth = plot.curve(None, index, width=1.5)
        self.smooth.opts["name"] = f"{name} (smoothed)"  # named after adding: in the legend only while on
        self.x, self.y = np.empty(0), np.empty(0)
        self._faint = False
        plot.smoothed.append(self)

    def set_data(self, x: np.ndarray, y: np.ndarray) -> None:
        if y.size and not np.isfinite(y).all():
            keep = np.isfinite(y)
            x, y = x[keep], y[keep]
        self.x, self.y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        self.draw()

    def clear(self) -> None:
        self.set_data(np.empty(0), np.empty(0))

    def draw(self) -> None:
        weight = self.plot.smoothing
        if self._faint != (weight > 0):  # a new pen only when smoothing is switched, not every frame
            self._faint = weight > 0
            pen = colour(self.index)
            if self._faint:
                pen.setAlpha(self.RAW_ALPHA)
            self.raw.setPen(pg.mkPen(pen, width=1))
        self.raw.setData(self.x, self.y, skipFiniteCheck=True)
        legend = self.plot.legend
        if weight > 0:
            self.smooth.setData(self.x, ema(self.y, weight), skipFiniteCheck=True)
            if legend is not None and legend.getLabel(self.smooth) is None:
                legend.addItem(self.smooth, self.smooth.opts["name"])
        else:
            self.smooth.setData([], [])
            if legend is not None and legend.getLabel(self.smooth) is not None:
                legend.removeItem(self.smooth)


def set_curve(item: pg.PlotDataItem, x: np.ndarray, y: np.ndarray) -> None:
    """setData for finite data without pyqtgraph's per-call finite check (NaNs are dropped first).
    A line through one point draws nothing: a curve without markers gets one while it has a single
    point (a short PATE run's one privacy row), and loses it with the second."""
    if y.size and not np.isfinite(y).all():
        keep = np.isfinite(y)
        x, y = x[keep], y[keep]
    lone = len(x) == 1
    marked = getattr(item, "_lone_point_marker", False)
    if lone and not marked and item.opts.get("symbol") is None:
        colour = pg.mkPen(item.opts.get("pen")).color()
        item.setSymbol("o")
        item.setSymbolSize(7)
        item.setSymbolPen(colour)
        item.setSymbolBrush(colour)
        item._lone_point_marker = True
    elif marked and not lone:
        item.setSymbol(None)
        item._lone_point_marker = False
    item.setData(x, y, skipFiniteCheck=True)
