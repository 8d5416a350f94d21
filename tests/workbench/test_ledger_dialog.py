"""View ▸ Privacy ledger (Ctrl+L): each dataset's total spend in the window, the same figures as
`dpw ledger`, a dataset left without a bound in red, deleted runs still counted."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QMenu

from engine.config import RunConfig
from engine.ledger import dataset_ledgers
from engine.privacy.pld import pld_epsilon
from engine.store import Store
from workbench.ledger_dialog import UNBOUNDED_COLOUR


def finished_run(store: Store, name: str, dataset: str, **values) -> int:
    """A finished run's row as the runner leaves it (plan and privacy columns filled)."""
    mechanism = values.pop("mechanism", "dpsgd")
    config = RunConfig(name=name, dataset=dataset, mechanism=mechanism, noise_multiplier=1.0, delta=1e-5)
    run_id = store.create_run(config)
    fields = dict(status="finished", started="2026-11-24T10:00:00+00:00", steps_done=100)
    if mechanism == "dpsgd":
        epsilon = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5).value
        fields.update(sample_rate=0.05, noise_multiplier=1.0, epsilon=epsilon, delta=1e-5, accountant="pld")
    store.update_run(run_id, **fields)
    return run_id


@pytest.fixture
def ledger_store(db_path):
    store = Store(db_path)
    finished_run(store, "a", "digits")
    gone = finished_run(store, "b", "digits")
    finished_run(store, "c", "breast-cancer")
    finished_run(store, "baseline", "breast-cancer", mechanism="none")
    store.delete_run(gone)
    expected = {ledger.dataset: ledger for ledger in dataset_ledgers(store.list_runs(), store.deleted_runs())}
    store.close()
    return expected


def test_the_ledger_opens_from_the_view_menu_and_states_each_dataset(window, qtbot, ledger_store):
    assert window.act_ledger.shortcut().toString() == "Ctrl+L"
    view_menu = next(m for m in window.menuBar().findChildren(QMenu) if m.title() == "&View")
    assert window.act_ledger in view_menu.actions()
    window.refresh_runs()
    window.act_ledger.trigger()
    dialog = window.ledger_dialog
    qtbot.waitUntil(lambda: dialog.ledgers is not None, timeout=30000)
    tops = {dialog.tree.topLevelItem(i).text(0).split(" — ")[0]: dialog.tree.topLevelItem(i)
            for i in range(dialog.tree.topLevelItemCount())}
    assert set(tops) == {"digits", "breast-cancer"}
    digits, cancer = tops["digits"], tops["breast-cancer"]
    assert digits.text(0) == f"digits — {ledger_store['digits'].statement()}"
    assert "2 runs (1 deleted): together (ε = " in digits.text(0)
    assert [digits.child(i).text(3) for i in range(digits.childCount())] == ["finished", "deleted"]
    assert digits.foreground(0).color().name() != UNBOUNDED_COLOUR
    assert "no bound on the privacy spent" in cancer.text(0)
    assert cancer.foreground(0).color().name() == UNBOUNDED_COLOUR
    assert cancer.child(1).text(4) == "∞" and cancer.child(1).text(6).startswith("no bound")
    # a long reason is elided in a narrow dialog: each row's tooltip holds it whole
    assert cancer.toolTip(0) == cancer.text(0) and cancer.child(1).toolTip(6) == cancer.child(1).text(6)
    dialog.close()


def test_an_empty_store_says_so(window, qtbot):
    window.act_ledger.trigger()
    qtbot.waitUntil(lambda: window.ledger_dialog.ledgers is not None, timeout=30000)
    assert window.ledger_dialog.status.text() == "No runs yet." and window.ledger_dialog.tree.topLevelItemCount() == 0
