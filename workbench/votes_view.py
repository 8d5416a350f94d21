"""PATE votes of one run, read from the store: consensus of every query and the vote histogram
of any one of them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from workbench.plots import Plot, colour, set_curve

ROLLING = 50  # queries in the consensus running mean


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
        layout = QVBoxLayout(self)
        self.info = QLabel("Select a PATE run to see its teachers' votes.")
        self.info.setWordWrap(True)
        layout.addWidget(self.info)
        grid = QGridLayout()
        layout.addLayout(grid, 1)
        self.consensus_plot = Plot("Consensus of the student's queries", "query", "top vote share",
                                   corner="bottom-left")
        self.answered_curve = self.consensus_plot.curve("answered", 2, width=0, symbol="o")
        self.rejected_curve = self.consensus_plot.curve("rejected", 3, width=0, symbol="o")
        for curve in (self.answered_curve, self.rejected_curve):
            curve.setPen(None)
            curve.setSymbolSize(3)
        self.mean_curve = self.consensus_plot.curve(f"running mean ({ROLLING})", 0, width=2)
        self.marker = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(colour(4), width=1))
        self.consensus_plot.addItem(self.marker, ignoreBounds=True)
        self.eps_plot = Plot("ε after each query (data-dependent: a private diagnostic, not publishable)", "query", "ε", legend=False)
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
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=pg.mkBrush(colour(0)))
        self.hist_plot.addItem(self.bars)
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
        for curve in (self.answered_curve, self.rejected_curve, self.mean_curve, self.eps_curve):
            curve.setData([], [])
        self.bars.setOpts(x=[], height=[])
        self.query_info.setText("")
        self.query.setRange(0, 0)

    def show_query(self, query_index: int) -> None:
        row = next((r for r in self.rows if r["query_index"] == query_index), None)
        if row is None:
            return
        counts = np.asarray(row["histogram"], dtype=float)
        classes = np.arange(counts.size)
        brushes = [pg.mkBrush(colour(2 if (row["answered"] and c == row["label"]) else 0)) for c in classes]
        self.bars.setOpts(x=classes, height=counts, brushes=brushes)
        self.hist_plot.setXRange(-0.6, counts.size - 0.4)
        self.hist_plot.setYRange(0, max(counts.max(), 1) * 1.1)
        self.hist_plot.getPlotItem().getAxis("bottom").setTicks([[(int(c), str(int(c))) for c in classes]])
        self.marker.setValue(query_index)
        answered = "answered" if row["answered"] else "rejected (below the noisy threshold)"
        label = f", released label {row['label']}" if row["answered"] else ""
        cost = row.get("epsilon_cost")
        self.query_info.setText(
            f"Query {query_index}: {answered}{label}; true label {row.get('true_label')}; "
            f"top vote share {counts.max() / max(counts.sum(), 1):.2f}"
            + (f"; data-dependent ε after it {row['epsilon_after']:.4g} (+{cost:.2g}; not publishable)"
               if cost is not None else ""))
