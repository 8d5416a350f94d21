"""Bounds as text never state a stronger guarantee than the number proven: an epsilon is rounded up
wherever it is shown, an audit's lower bound down."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine import rounding
from engine.cli_shell import epsilon_text
from engine.publication import epsilon_label

SPECS = (".3g", ".4g", ".4f", ".3f")


def _quantum(value: float, spec: str) -> float:
    digits = int(spec[1:-1])
    if spec.endswith("f"):
        return 10.0 ** -digits
    return 10.0 ** (math.floor(math.log10(value)) - digits + 1)


@pytest.mark.parametrize("spec", SPECS)
def test_up_is_never_below_the_value_and_at_most_one_shown_digit_above(spec):
    rng = np.random.default_rng(0)
    values = np.concatenate([np.exp(rng.uniform(math.log(1e-6), math.log(1e7), 4000)),
                             10.0 ** rng.uniform(7, 307, 200)])  # a PATE bound can be astronomically large
    for value in map(float, values):
        shown = float(rounding.up(value, spec))
        assert shown >= value, (value, spec, shown)
        assert shown - value <= _quantum(value, spec) * (1 + 1e-9), (value, spec, shown)
        low = float(rounding.down(value, spec))
        assert low <= value and value - low <= _quantum(value, spec) * (1 + 1e-9), (value, spec, low)


@pytest.mark.parametrize("value, spec, up, down", [
    (2.3114, ".3g", "2.32", "2.31"),  # to nearest: "2.31", a stronger guarantee than the one proven
    (1.91025, ".4f", "1.9103", "1.9102"),
    (2.0, ".3g", "2", "2"),
    (0.1, ".3g", "0.1", "0.1"),  # read as its repr: not 0.1000000000000000055... rounded up
    (9.9951, ".3g", "10", "9.99"),
    (1.23456e-5, ".3g", "1.24e-05", "1.23e-05"),
    (math.inf, ".4g", "inf", "inf"),
    (1.5e300, ".3f", format(1.5e300, ".3f"), format(1.5e300, ".3f")),  # beyond decimal's 28 digits: it raised
    (348.21, ".3f", "348.210", "348.210"),
    (0.0, ".3g", "0", "0"),
])
def test_a_bound_as_text(value, spec, up, down):
    assert rounding.up(value, spec) == up and rounding.down(value, spec) == down


@pytest.mark.parametrize("x, up, down", [
    (0.0412, "4.2%", "4.1%"),
    (0.041, "4.1%", "4.1%"),  # scaled in decimal: 100 * 0.041 in floats is 4.1000000000000005
    (0.0410000001, "4.2%", "4.1%"),  # just above a shown value: up, not to nearest
    (0.05, "5.0%", "5.0%"),
    (0.9991, "100%", "99%"),
    (1.0, "100%", "100%"),
    (0.0, "0%", "0%"),
])
def test_a_probability_bound_as_a_percentage(x, up, down):
    assert rounding.percent_up(x) == up and rounding.percent_down(x) == down


def test_a_probability_bound_in_percent_is_never_on_the_unsafe_side():
    rng = np.random.default_rng(1)
    for x in map(float, 10.0 ** rng.uniform(-7, 0, 3000)):
        for digits in (2, 3):
            assert float(rounding.percent_up(x, digits)[:-1]) >= 100 * x * (1 - 1e-12)
            assert float(rounding.percent_down(x, digits)[:-1]) <= 100 * x * (1 + 1e-12)
    assert rounding.significant_up(0.0002911) == "0.00030" and rounding.significant_up(412) == "420"


def test_every_epsilon_a_view_states_is_rounded_up(tmp_path):
    from engine.config import RunConfig
    from engine.report import privacy_statement
    from engine.store import Store

    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(name="r", noise_multiplier=1.0))
    store.update_run(run_id, status="finished", epsilon=2.3114, delta=1e-5, accountant="pld")
    run = store.get_run(run_id)
    assert epsilon_label(run) == "2.32"  # the runs list: ".3g"; to nearest it read "2.31"
    assert "satisfies (2.312, 1e-05)-differential privacy" in privacy_statement(run)["statement"]
    assert epsilon_text(2.31141) == "2.3115" and epsilon_text(4e301) == "4e+301"  # every dpw command
    from engine.cli import bound_cell

    assert [bound_cell(e) for e in (2.3114, math.inf, None)] == ["2.312", "∞", None]  # dpw list, ledger tables


def test_the_reports_tables_round_a_bound_up_and_other_numbers_to_nearest():
    from engine.report import _table

    html = _table({"epsilon_data_independent": 24.349631, "epsilon_released": 11.600349, "accuracy": 0.9519996})
    assert "<td>24.3497</td>" in html  # to nearest: 24.3496, below the bound
    assert "<td>11.6003</td>" in html and "<td>0.952</td>" in html  # an estimate, a figure: to nearest
    assert "<td>2.31141</td>" in _table({"epsilon": 2.311401}) and "<td>2.3114</td>" in _table({"x": 2.311401})


def test_a_bound_in_a_table_is_rounded_up_infinite_or_absent():
    assert rounding.bound_cell(2.31141, ".4g") == "2.312" and rounding.bound_cell(1e-5, ".3g") == "1e-05"
    assert rounding.bound_cell(math.inf, ".4g") == "∞" and rounding.bound_cell(None, ".4g") is None
    assert rounding.percent(0.01) == "1%" and rounding.percent(0.001) == "0.1%"
