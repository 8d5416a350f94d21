"""The setup preview states the guarantee in an attacker's terms as the user types."""

from __future__ import annotations

import pytest

from engine.attack_risk import dpsgd_profile, preview_statement
from engine.rounding import percent_up
from engine.config import RunConfig
from engine.privacy.risk import calibrate_noise_multiplier_for_attack, highest_tpr
from workbench.form_state import DataSize
from workbench.preview import estimate
from workbench.setup_form import SetupForm

SIZE = DataSize(num_train=1438, num_test=359, exact=True)


def _tpr(config: RunConfig, sigma: float) -> float:
    q, steps = config.sample_rate_for(SIZE.num_train), config.steps_for(SIZE.num_train)
    profile, _ = dpsgd_profile(sample_rate=q, noise_multiplier=sigma, steps=steps)
    return float(highest_tpr(profile=profile, fpr=[0.01])[0])


def test_a_fixed_noise_multiplier_shows_the_tpr_bound_of_the_pure_functions():
    config = RunConfig(name="p", dataset="digits", noise_multiplier=1.3, epochs=2)
    text = estimate(config, SIZE)
    assert preview_statement(_tpr(config, 1.3)) in text
    assert "detects it with TPR at most" in text and "at 1% FPR" in text


def test_a_target_attack_tpr_is_met_by_the_stated_bound():
    config = RunConfig(name="p", dataset="digits", target_attack_tpr=0.05, epochs=2)
    q, steps = config.sample_rate_for(SIZE.num_train), config.steps_for(SIZE.num_train)
    sigma = calibrate_noise_multiplier_for_attack(sample_rate=q, steps=steps, target_tpr=0.05, fpr=0.01)
    text = estimate(config, SIZE)
    tpr = _tpr(config, sigma)
    assert tpr <= 0.05 and f"TPR at most {percent_up(tpr)} at 1% FPR" in text


def test_reproducible_noise_states_no_bound():
    text = estimate(RunConfig(name="p", dataset="digits", noise_multiplier=1.3, reproducible_noise=True), SIZE)
    assert "No bound on any attack" in text and "detects it with TPR" not in text


def test_every_setting_that_voids_the_guarantee_states_no_bound_and_why():
    """Exact normalization statistics and a PATE budget on the votes were previewed with a TPR bound."""
    from engine.publication import EXACT_STATISTICS, STOPPED_ON_VOTES

    exact = estimate(RunConfig(name="p", dataset="breast-cancer", noise_multiplier=1.3, normalization="exact"), SIZE)
    assert f"No bound on any attack: {EXACT_STATISTICS}." in exact and "detects it with TPR" not in exact
    on_votes = estimate(RunConfig(name="p", dataset="digits", mechanism="pate", num_teachers=10, aggregator="gnmax",
                                  gnmax_sigma=40.0, num_queries=20, epsilon_budget=5.0,
                                  pate_budget_on="data-dependent"), SIZE)
    assert on_votes.endswith(f"No bound on any attack: {STOPPED_ON_VOTES}.")


def test_a_noise_multiplier_too_small_for_any_bound_says_what_to_do():
    """1e-9 gave "ε = inf" and nothing else (and the run's accounting failed at its end before)."""
    text = estimate(RunConfig(name="p", dataset="digits", noise_multiplier=1e-9, epochs=1), SIZE)
    assert text.startswith("ε = inf") and "bounds nothing" in text and "raise the noise multiplier" in text
    assert "bounds nothing" not in estimate(RunConfig(name="p", dataset="digits", noise_multiplier=1.0), SIZE)


def test_pate_states_the_bound_if_every_query_were_answered():
    config = RunConfig(name="p", dataset="digits", mechanism="pate", num_teachers=10, aggregator="gnmax",
                       gnmax_sigma=40.0, num_queries=20)
    text = estimate(config, SIZE)
    assert "detects it with TPR at most" in text and "(if every query were answered)" in text
    assert text.startswith("Guarantee if all 20 queries were answered: ε ≤ ")
    assert "shown after the run as an estimate, not a bound" in text  # it said the released ε was usually much smaller


@pytest.fixture
def form(qtbot):
    widget = SetupForm()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def test_the_form_states_the_attack_bound_as_the_user_types(form, qtbot):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("epochs", "1")
    qtbot.waitUntil(lambda: "detects it with TPR at most" in form.preview_label.text(), timeout=20000)
    first = form.preview_label.text()
    form.set_value("noise_multiplier", "4")
    qtbot.waitUntil(lambda: "detects it with TPR at most" in form.preview_label.text()
                    and form.preview_label.text() != first, timeout=20000)
