"""The least-noise search shared by the calibrations: exact answers, few evaluations."""

import math

import pytest

from engine.privacy import calibrate_noise_multiplier
from engine.privacy import accountants
from engine.privacy._search import find_boundary, log_of


def _brute_force(score, goal, bad, good):
    return min(m for m in range(bad + 1, good + 1) if score(m) <= goal)


@pytest.mark.parametrize("score", [
    lambda m: log_of(5e4 / m**1.5),                      # a power law: what epsilon nearly is
    lambda m: log_of(math.exp(3e3 / m) - 1.0),            # steep at small noise, flat at large
    lambda m: log_of(max(0.0, 2.0 - m / 400.0)),          # reaches 0 (log -inf) inside the range
    lambda m: log_of(10.0 if m < 637 else 0.5),           # a single jump
    lambda m: math.inf if m < 150 else log_of(900.0 / m),  # infinite at the bottom
], ids=["power", "steep", "zero", "jump", "infinite"])
@pytest.mark.parametrize("goal", [math.log(0.9), math.log(3.0), 0.0])
def test_find_boundary_finds_the_smallest_passing_m(score, goal):
    bad, good = 99, 1_000_000
    if score(good) > goal:
        pytest.skip("the goal is not met at the top of the range")
    seen = []

    def counted(m):
        seen.append(m)
        return score(m)

    expected = _brute_force(score, goal, bad, 5000) if score(5000) <= goal else None
    found = find_boundary(counted, goal, good, score(good), bad, math.inf, log_scale=True)
    if expected is not None:
        assert found == expected
    assert score(found) <= goal and (found == bad + 1 or score(found - 1) > goal)
    assert found in seen or found == good  # what it returns was evaluated
    assert len(seen) <= 60


def test_find_boundary_uses_a_known_bracket_and_rejects_a_bad_one():
    calls = []
    score = lambda m: calls.append(m) or log_of(1e3 / m)  # noqa: E731
    assert find_boundary(score, 0.0, 1010, log_of(1e3 / 1010), 990, log_of(1e3 / 990), log_scale=True) == 1000
    assert all(990 < m < 1010 for m in calls)
    with pytest.raises(ValueError, match="must differ"):
        find_boundary(score, 0.0, 10, 0.0, 10, 1.0)
    with pytest.raises(ValueError, match="x >= 0"):
        find_boundary(score, 0.0, 10, 0.0, -1, 1.0, log_scale=True)


@pytest.mark.parametrize("budget", [0.5, 2.0, 7.5])
def test_find_boundary_finds_the_last_passing_x_of_an_increasing_score(budget):
    score = lambda t: 0.01 * math.sqrt(t)  # noqa: E731  (epsilon grows roughly like this with steps)
    found = find_boundary(score, budget, 0, 0.0, 10**6, score(10**6))
    assert score(found) <= budget < score(found + 1)


def test_log_of_keeps_zero_below_every_goal():
    assert log_of(0.0) == -math.inf and log_of(math.e) == pytest.approx(1.0)


def test_calibration_needs_few_accountant_evaluations(monkeypatch):
    """Interpolating log epsilon against log sigma: RDP took 21-32 evaluations with linear interpolation."""
    counts = {"rdp": 0, "pld": 0}
    rdp, pld = accountants.compute_rdp, accountants.pld_epsilon

    def counted_rdp(**kwargs):
        counts["rdp"] += 1
        return rdp(**kwargs)

    def counted_pld(**kwargs):
        counts["pld"] += 1
        return pld(**kwargs)

    monkeypatch.setattr(accountants, "compute_rdp", counted_rdp)
    monkeypatch.setattr(accountants, "pld_epsilon", counted_pld)
    sigma = calibrate_noise_multiplier(sample_rate=256 / 60000, steps=2344, target_epsilon=3.0, delta=1e-5)
    assert sigma == 0.694
    assert counts["pld"] <= 6 and counts["rdp"] <= 14, counts  # linear interpolation: 8 and 26
    counts.update(rdp=0, pld=0)
    assert calibrate_noise_multiplier(sample_rate=0.5, steps=100, target_epsilon=10.0, delta=1e-5,
                                      accountant="rdp") == 2.776
    assert counts["rdp"] <= 12 and counts["pld"] == 0, counts  # linear interpolation: 21
