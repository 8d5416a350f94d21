"""View ▸ Privacy ledger: what all the runs on each dataset spent together, deleted runs included
(engine.ledger, the same figures as `dpw ledger`). The composition runs off the GUI thread."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import rounding
from workbench.screen import fit_to_screen
from workbench.dialogs import Task, describe_error, start_task

COLUMNS = ["Run", "Name", "Mechanism", "Status", "ε", "δ", "Counted"]
UNBOUNDED_COLOUR = "#d62728"
COUNTED = {"composed": "composed exactly (PLD)", "added": "added (ε, δ)", "unbounded": "no bound",
           "none": "spent nothing"}


def number(value: float | None, fmt: str) -> str:
    """A run's epsilon or delta in the ledger: an upper bound, rounded up (engine.rounding.bound_cell)."""
    return rounding.bound_cell(value, fmt) or "–"


class LedgerDialog(QDialog):
    """One top-level row per dataset with its total, the runs that spent it beneath."""

    def __init__(self, runs: list[dict[str, Any]], deleted: list[dict[str, Any]], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Privacy ledger")
        fit_to_screen(self, 900, 480)
        layout = QVBoxLayout(self)
        intro = QLabel("The privacy spent on each dataset by all its runs, deleted ones included: DP-SGD runs "
                       "composed exactly (PLD, at the largest δ among them), the others by adding their (ε, δ). "
                       "Runs of a study count one by one. A non-private run, or one that states no guarantee (noise "
                       "reproducible from its seed, exact normalization statistics, a PATE stop decided on the "
                       "votes), leaves the data without a bound. Same figures as <tt>dpw ledger</tt>.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.status = QLabel("Composing…")
        layout.addWidget(self.status)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setAlternatingRowColors(True)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.tree.header().setStretchLastSection(True)
        layout.addWidget(self.tree, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.ledgers: list | None = None  # engine.ledger.DatasetLedger, once composed

        def work():
            from engine.ledger import dataset_ledgers

            return dataset_ledgers(runs, deleted)

        self.task: Task = start_task(work, self._show, self._failed)

    def _show(self, ledgers: list) -> None:
        self.ledgers = ledgers
        self.tree.clear()
        bold = QFont(self.font())
        bold.setBold(True)
        for ledger in ledgers:
            top = QTreeWidgetItem([f"{ledger.title} — {ledger.statement()}"])
            top.setToolTip(0, top.text(0))  # whole where the dialog is too narrow for it
            top.setFont(0, bold)
            if ledger.unbounded:
                top.setForeground(0, QColor(UNBOUNDED_COLOUR))
            for entry in ledger.entries:
                status = "deleted" if entry.deleted else (entry.status or "")
                counted = COUNTED[entry.counted] + (f": {entry.why}" if entry.why else "")
                child = QTreeWidgetItem([str(entry.run_id), entry.name or "", entry.mechanism or "", status,
                                         number(entry.epsilon, ".4g"), number(entry.delta, ".3g"), counted])
                child.setToolTip(6, counted)
                if entry.counted == "unbounded":
                    child.setForeground(6, QColor(UNBOUNDED_COLOUR))
                top.addChild(child)
            self.tree.addTopLevelItem(top)
            top.setFirstColumnSpanned(True)  # the statement reads across the columns
            top.setExpanded(True)
        datasets = len(ledgers)
        self.status.setText("No runs yet." if not datasets else
                            f"{datasets} dataset{'s' if datasets != 1 else ''}, the largest spend first.")

    def _failed(self, exc: BaseException) -> None:
        self.status.setText(f"<b style='color:{UNBOUNDED_COLOUR}'>Could not compose:</b> "
                            + describe_error(exc).replace("\n", "<br>"))
