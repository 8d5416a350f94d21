"""PATE votes of one run, read from the store: consensus of every query and the vote histogram
of any one of them.

Click a point of the consensus plot (or type its number) to see that query's histogram, with the
aggregator's threshold and the released label marked. Answered and rejected queries differ in
shape (circles, crosses) as well as colour, and the legend names them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from workbench.plots import Plot, colour, set_curve, set_line_label

ROLLING = 50  # queries in the consensus running mean
CLICK_RADIUS_PX = 12  # a click selects the nearest query within this many pixels
ANSWERED, REJECTED, MEAN, SELECTED, RELEASED, THRESHOLD = 0, 1, 4, 3, 2, 3  # colour indices (tab10)


def consensus(histograms: np.ndarray) -> np.ndarray:
    """Top vote share of each query: the largest count over the number of teachers."""
    totals = histograms.sum(axis=1)
    return histograms.max(axis=1) / np.maximum(totals, 1)


def running_mean(values: np.ndarray, window: int) -> np.ndarray:
    if values.size == 0:
        return values
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    end = np.arange(1, values.size + 1)
    start = np.maximum(end - window, 0)
    return (cumulative[end] - cumulative[start]) / (end - start)


class VotesView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.rows: list[dict[str, Any]] = []
        self.run: dict[str, Any] | None = None
        self.selected: int | None = None  # the query whose histogram is shown
        layout = QVBoxLayout(self)
        self.info = QLabel("Select a PATE run to see its teachers' votes.")
        self.info.setWordWrap(True)
        layout.addWidget(self.info)
        grid = QGridLayout()
        layout.addLayout(grid, 1)
        self.consensus_plot = Plot("Consensus of the student's queries", "query", "top vote share",
                                   corner="bottom-left")
        self.answered_curve = self.consensus_plot.curve("answered (●)", ANSWERED, width=0, symbol="o")
        self.rejected_curve = self.consensus_plot.curve("rejected (✕)", REJECTED, width=0, symbol="x")
        for curve in (self.answered_curve, self.rejected_curve):
            curve.setPen(None)
            curve.setSymbolSize(7)
        self.rejected_curve.setSymbolPen(pg.mkPen(colour(REJECTED), width=1.5))
        self.mean_curve = self.consensus_plot.curve(f"running mean ({ROLLING})", MEAN, width=2)
        self.selected_curve = self.consensus_plot.curve("selected query", SELECTED, width=0, symbol="o")
        self.selected_curve.setPen(None)
        self.selected_curve.setSymbolSize(15)
        self.selected_curve.setSymbolBrush(None)
        self.selected_curve.setSymbolPen(pg.mkPen(colour(SELECTED), width=2))
        self.marker = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(colour(SELECTED), width=1,
                                                                           style=Qt.PenStyle.DotLine))
        self.consensus_plot.addItem(self.marker, ignoreBounds=True)
        self.consensus_plot.setToolTip("Click a point to show that query's teacher votes.")
        self.consensus_plot.scene().sigMouseClicked.connect(self._clicked)
        self.eps_plot = Plot("ε after each query", "query", "ε", legend=False,
                             subtitle="data-dependent: a private diagnostic, not publishable")
        self.eps_curve = self.eps_plot.curve(None, 4)
        grid.addWidget(self.consensus_plot, 0, 0)
        grid.addWidget(self.eps_plot, 1, 0)

        side = QVBoxLayout()
        pick = QHBoxLayout()
        pick.addWidget(QLabel("Query"))
        self.query = QSpinBox()
        self.query.setObjectName("queryIndex")
        self.query.setRange(0, 0)
        self.query.valueChanged.connect(self.show_query)
        pick.addWidget(self.query, 1)
        side.addLayout(pick)
        self.hist_plot = Plot("Teacher votes", "class", "votes", legend=False)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=pg.mkBrush(colour(ANSWERED)))
        self.hist_plot.addItem(self.bars)
        # Confident GNMax answers only when the top count plus noise reaches the threshold T.
        self.threshold_line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(
            colour(THRESHOLD), width=2, style=Qt.PenStyle.DashLine), label="", labelOpts={
            "position": 0.98, "anchors": [(1, 1), (1, 1)], "color": colour(THRESHOLD)})
        self.threshold_line.setZValue(10)  # over the bars
        self.hist_plot.addItem(self.threshold_line)
        self.threshold_line.hide()
        self.released_text = pg.TextItem("", color=colour(RELEASED), anchor=(0.5, 1.0))
        self.hist_plot.addItem(self.released_text, ignoreBounds=True)
        side.addWidget(self.hist_plot, 1)
        self.query_info = QLabel("")
        self.query_info.setWordWrap(True)
        side.addWidget(self.query_info)
        grid.addLayout(side, 0, 1, 2, 1)
        grid.setColumnStretch(0, 3)
        grid.setColumnStretch(1, 2)

    def show_run(self, store: Any, run: dict[str, Any] | None) -> None:
        """Show `run`'s votes; for the run already shown, read only the rows stored since (a live
        PATE run adds a batch at a time)."""
        same_run = self.run is not None and run is not None and self.run["id"] == run["id"] and self.rows
        self.run = run
        if run is None or run.get("mechanism") != "pate":
            self.rows = []
            self.info.setText("Select a PATE run to see its teachers' votes.")
            self._clear()
            return
        if same_run:
            self.rows = self.rows + store.votes(run["id"], start=self.rows[-1]["query_index"] + 1)
        else:
            self.rows = store.votes(run["id"])
        if not self.rows:
            if run["status"] in ("queued", "running"):
                self.info.setText(f"Run {run['id']} ({run['name']}) is {run['status']}: the teachers have not "
                                  "answered yet; their votes appear here batch by batch as they are released.")
            else:
                self.info.setText(f"Run {run['id']} ({run['name']}) has no stored votes "
                                  f"(status {run['status']}: the teachers never answered).")
            self._clear()
            return
        histograms = np.array([r["histogram"] for r in self.rows], dtype=float)
        index = np.array([r["query_index"] for r in self.rows], dtype=float)
        answered = np.array([r["answered"] for r in self.rows], dtype=bool)
        share = consensus(histograms)
        set_curve(self.answered_curve, index[answered], share[answered])
        set_curve(self.rejected_curve, index[~answered], share[~answered])
        set_curve(self.mean_curve, index, running_mean(share, ROLLING))
        eps = np.array([np.nan if r["epsilon_after"] is None else r["epsilon_after"] for r in self.rows])
        set_curve(self.eps_curve, index, eps)
        teachers = int(histograms[0].sum())
        self.info.setText(
            f"Run {run['id']} ({run['name']}): {len(self.rows):,} queries, {int(answered.sum()):,} answered, "
            f"{int((~answered).sum()):,} rejected; {teachers} teachers. These histograms were computed from the "
            "private data: they are shown here, never released.")
        self.query.blockSignals(True)
        self.query.setRange(int(index.min()), int(index.max()))
        self.query.blockSignals(False)
        for plot in (self.consensus_plot, self.eps_plot):
            plot.enableAutoRange()
        self.show_query(self.query.value())

    def _clear(self) -> None:
        for curve in (self.answered_curve, self.rejected_curve, self.mean_curve, self.eps_curve,
                      self.selected_curve):
            curve.setData([], [])
        self.bars.setOpts(x=[], height=[])
        self.threshold_line.hide()
        self.released_text.setText("")
        self.query_info.setText("")
        self.query.setRange(0, 0)
        self.selected = None

    def _clicked(self, event) -> None:
        """Select the query whose consensus point is nearest the click (within CLICK_RADIUS_PX)."""
        if not self.rows or event.button() != Qt.MouseButton.LeftButton:
            return
        index = self.query_at(event.scenePos())
        if index is not None:
            event.accept()
            self.select_query(index)

    def query_at(self, scene_pos: QPointF) -> int | None:
        """The query whose point is drawn nearest `scene_pos`, if within CLICK_RADIUS_PX."""
        view = self.consensus_plot.getPlotItem().getViewBox()
        if not view.sceneBoundingRect().contains(scene_pos):
            return None
        index = np.array([r["query_index"] for r in self.rows], dtype=float)
        share = consensus(np.array([r["histogram"] for r in self.rows], dtype=float))
        points = [view.mapViewToScene(QPointF(float(x), float(y))) for x, y in zip(index, share)]
        distance = np.array([np.hypot(p.x() - scene_pos.x(), p.y() - scene_pos.y()) for p in points])
        nearest = int(np.argmin(distance))
        return int(index[nearest]) if distance[nearest] <= CLICK_RADIUS_PX else None

    def scene_position_of(self, query_index: int) -> QPointF:
        """Where a query's consensus point is drawn (for tests and tooltips)."""
        row = next(r for r in self.rows if r["query_index"] == query_index)
        share = float(consensus(np.array([row["histogram"]], dtype=float))[0])
        return self.consensus_plot.getPlotItem().getViewBox().mapViewToScene(QPointF(float(query_index), share))

    def select_query(self, query_index: int) -> None:
        """Show a query's histogram (as typing its number does)."""
        if self.query.value() == query_index:
            self.show_query(query_index)
        else:
            self.query.setValue(query_index)

    def threshold(self) -> float | None:
        """The vote count Confident GNMax's noisy check compares the top count with (None for the
        other aggregators, which answer every query)."""
        config = (self.run or {}).get("config") or {}
        if config.get("aggregator", "confident") != "confident" or config.get("threshold") is None:
            return None
        return float(config["threshold"])

    def show_query(self, query_index: int) -> None:
        row = next((r for r in self.rows if r["query_index"] == query_index), None)
        if row is None:
            return
        counts = np.asarray(row["histogram"], dtype=float)
        classes = np.arange(counts.size)
        released = row["label"] if row["answered"] else None
        brushes = [pg.mkBrush(colour(RELEASED if c == released else ANSWERED)) for c in classes]
        self.bars.setOpts(x=classes, height=counts, brushes=brushes)
        top = max(counts.max(), 1)
        threshold = self.threshold()
        if threshold is not None:
            self.threshold_line.setValue(threshold)
            set_line_label(self.threshold_line, f"threshold T = {threshold:g} (checked with noise)", backed=True)
            self.threshold_line.show()
            top = max(top, threshold)
        else:
            self.threshold_line.hide()
        if released is not None:
            self.released_text.setText(f"▼ released label {released}")
            self.released_text.setPos(float(released), float(counts[int(released)]) + 0.12 * top)
        else:
            self.released_text.setText("")
        self.hist_plot.setXRange(-0.6, counts.size - 0.4)
        self.hist_plot.setYRange(0, top * 1.25)
        self.hist_plot.getPlotItem().getAxis("bottom").setTicks([[(int(c), str(int(c))) for c in classes]])
        self.marker.setValue(query_index)
        share = counts.max() / max(counts.sum(), 1)
        self.selected_curve.setData([float(query_index)], [share])
        self.selected = query_index
        answered = "answered" if row["answered"] else "rejected (below the noisy threshold)"
        label = f", released label {row['label']}" if row["answered"] else ""
        cost = row.get("epsilon_cost")
        self.query_info.setText(
            f"Query {query_index}: {answered}{label}; true label {row.get('true_label')}; "
            f"top vote share {counts.max() / max(counts.sum(), 1):.2f}"
            + (f"; data-dependent ε after it {row['epsilon_after']:.4g} (+{cost:.2g}; not publishable)"
               if cost is not None else ""))
