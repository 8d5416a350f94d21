"""engine.privacy.accountants: the functions the trainer, CLI and window call."""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

from engine.privacy import (
    ACCOUNTANTS,
    DEFAULT_ORDERS,
    NOISE_MULTIPLIER_RANGE,
    Epsilon,
    LiveAccountant,
    calibrate_noise_multiplier,
    compute_rdp,
    dpsgd_epsilon,
    epsilon_curve,
    max_steps_within_budget,
)

MNIST_Q = 256 / 60000


def _eps(accountant, q=MNIST_Q, sigma=1.1, steps=1000, delta=1e-5) -> float:
    return dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=delta, accountant=accountant).value


def test_accountant_registry_lists_pld_first_as_the_default():
    assert ACCOUNTANTS == ("pld", "rdp")
    assert dpsgd_epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5).accountant == "pld"


def test_unknown_accountant_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="pld, rdp"):
        dpsgd_epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5, accountant="moments")


def test_epsilon_is_a_frozen_dataclass():
    result = dpsgd_epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5, accountant="rdp")
    assert isinstance(result, Epsilon) and result.order in DEFAULT_ORDERS
    with pytest.raises(AttributeError):
        result.value = 0.0  # type: ignore[misc]


# --- monotonicity -------------------------------------------------------------------------


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_epsilon_increases_with_steps(accountant):
    values = [_eps(accountant, steps=t) for t in (1, 10, 100, 1000, 5000)]
    assert all(a < b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_epsilon_increases_with_sample_rate(accountant):
    values = [_eps(accountant, q=q, steps=200) for q in (0.001, 0.004, 0.02, 0.1)]
    assert all(a < b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_epsilon_decreases_with_noise_multiplier(accountant):
    values = [_eps(accountant, sigma=s, steps=500) for s in (0.7, 1.0, 1.5, 3.0)]
    assert all(a > b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_epsilon_decreases_with_delta(accountant):
    values = [_eps(accountant, delta=d) for d in (1e-8, 1e-6, 1e-5, 1e-3)]
    assert all(a > b for a, b in zip(values, values[1:]))


# --- published figures --------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma,epochs,published",
    [(1.1, 60, 3.01), (1.3, 15, 1.19), (0.7, 45, 7.10)],
)
def test_tf_privacy_mnist_tutorial_figures(sigma, epochs, published, opacus_rdp, classic_conversion):
    """TF Privacy's tutorials/README.md table (N = 60000, batch 256, delta = 1e-5) used RDP with the
    original conversion (Mironov 2017, Prop. 3). Reproduce it from Opacus' RDP and from ours,
    then check that both our accountants report no more than the published figure."""
    steps = math.ceil(epochs * 60000 / 256)
    orders = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))  # TF Privacy's grid then
    reference = classic_conversion(
        orders, np.asarray(opacus_rdp.compute_rdp(q=MNIST_Q, noise_multiplier=sigma, steps=steps, orders=list(orders))),
        1e-5,
    )
    ours_classic = classic_conversion(
        orders, compute_rdp(sample_rate=MNIST_Q, noise_multiplier=sigma, steps=steps, orders=orders), 1e-5
    )
    assert round(reference, 2) == published
    assert round(ours_classic, 2) == published
    rdp = _eps("rdp", sigma=sigma, steps=steps)
    pld = _eps("pld", sigma=sigma, steps=steps)
    assert pld < rdp < published


def test_abadi_et_al_moments_accountant_figure(opacus_rdp, classic_conversion):
    """Abadi et al. 2016, Sec. 3.1: q = 0.01, sigma = 4, delta = 1e-5, 10,000 steps gives
    eps ~ 1.26 with the moments accountant (integer orders up to 32, original conversion)."""
    orders = np.arange(2, 33, dtype=float)
    reference = classic_conversion(
        orders, np.asarray(opacus_rdp.compute_rdp(q=0.01, noise_multiplier=4.0, steps=10000, orders=list(orders))), 1e-5
    )
    assert round(reference, 2) == 1.26
    assert _eps("pld", q=0.01, sigma=4.0, steps=10000) < _eps("rdp", q=0.01, sigma=4.0, steps=10000) < 1.26


# --- epsilon_curve and LiveAccountant -------------------------------------------------------


def test_epsilon_curve_equals_rdp_epsilon_at_sampled_steps():
    curve = epsilon_curve(sample_rate=MNIST_Q, noise_multiplier=1.1, steps=10_000, delta=1e-5)
    assert curve.shape == (10_000,)
    for t in (1, 2, 17, 234, 1000, 5555, 10_000):
        assert curve[t - 1] == pytest.approx(_eps("rdp", steps=t), rel=1e-12)
    assert np.all(np.diff(curve) >= 0)


def test_epsilon_curve_edge_cases():
    assert epsilon_curve(sample_rate=0.1, noise_multiplier=1.0, steps=0, delta=1e-5).shape == (0,)
    assert np.all(epsilon_curve(sample_rate=0.0, noise_multiplier=1.0, steps=5, delta=1e-5) == 0)
    assert np.all(np.isinf(epsilon_curve(sample_rate=0.1, noise_multiplier=0.0, steps=5, delta=1e-5)))


def test_live_accountant_agrees_with_the_pure_functions():
    acc = LiveAccountant(sample_rate=MNIST_Q, noise_multiplier=1.1, delta=1e-5)
    assert acc.steps == 0 and acc.epsilon().value == 0.0
    acc.step()
    acc.step(233)
    assert acc.steps == 234
    assert acc.epsilon() == dpsgd_epsilon(sample_rate=MNIST_Q, noise_multiplier=1.1, steps=234, delta=1e-5,
                                          accountant="rdp")
    reported = acc.epsilon_reported()
    assert reported == dpsgd_epsilon(sample_rate=MNIST_Q, noise_multiplier=1.1, steps=234, delta=1e-5)
    assert acc.epsilon_reported() is reported  # cached until the next step
    assert acc.epsilon_reported("rdp") == acc.epsilon()
    acc.step(0)
    assert acc.steps == 234


def test_live_accountant_rejects_bad_input():
    with pytest.raises(ValueError, match="delta"):
        LiveAccountant(sample_rate=0.1, noise_multiplier=1.0, delta=0.0)
    acc = LiveAccountant(sample_rate=0.1, noise_multiplier=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="steps"):
        acc.step(-1)
    with pytest.raises(ValueError, match="accountant"):
        acc.epsilon_reported("gdp")


# --- budgets: max steps and noise calibration ------------------------------------------------


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
@pytest.mark.parametrize("budget", [1.0, 3.0])
def test_max_steps_is_the_last_step_within_budget(accountant, budget):
    t = max_steps_within_budget(sample_rate=MNIST_Q, noise_multiplier=1.1, delta=1e-5, budget=budget,
                                accountant=accountant)
    assert t > 0
    assert _eps(accountant, steps=t) <= budget < _eps(accountant, steps=t + 1)


def test_max_steps_pld_allows_more_steps_than_rdp():
    kwargs = dict(sample_rate=MNIST_Q, noise_multiplier=1.1, delta=1e-5, budget=2.0)
    assert max_steps_within_budget(**kwargs, accountant="pld") > max_steps_within_budget(**kwargs, accountant="rdp")


def test_max_steps_is_zero_when_one_step_exceeds_the_budget():
    assert max_steps_within_budget(sample_rate=0.1, noise_multiplier=0.8, delta=1e-5, budget=0.01) == 0
    assert max_steps_within_budget(sample_rate=0.1, noise_multiplier=0.8, delta=1e-5, budget=0.01,
                                   accountant="rdp") == 0


def test_max_steps_respects_upper_and_reports_unbounded_budgets():
    assert max_steps_within_budget(sample_rate=MNIST_Q, noise_multiplier=1.1, delta=1e-5, budget=3.0, upper=500) == 500
    assert max_steps_within_budget(sample_rate=0.0, noise_multiplier=1.1, delta=1e-5, budget=1.0, upper=77) == 77
    with pytest.raises(ValueError, match="upper"):
        max_steps_within_budget(sample_rate=0.0, noise_multiplier=1.1, delta=1e-5, budget=1.0)


@pytest.mark.parametrize("accountant,target", [("rdp", 1.0), ("rdp", 8.0), ("pld", 3.0), ("pld", 0.5)])
def test_calibrated_noise_meets_the_target_and_is_minimal(accountant, target):
    steps, tol = 5000, 1e-3
    sigma = calibrate_noise_multiplier(sample_rate=MNIST_Q, steps=steps, target_epsilon=target, delta=1e-5,
                                       accountant=accountant, tolerance=tol)
    assert NOISE_MULTIPLIER_RANGE[0] <= sigma <= NOISE_MULTIPLIER_RANGE[1]
    assert _eps(accountant, sigma=sigma, steps=steps) <= target
    assert _eps(accountant, sigma=sigma - tol, steps=steps) > target
    assert sigma == round(sigma, 3)  # on the grid of multiples of the tolerance


def test_calibration_with_pld_needs_less_noise_than_with_rdp():
    kwargs = dict(sample_rate=MNIST_Q, steps=14063, target_epsilon=3.0, delta=1e-5)
    assert calibrate_noise_multiplier(**kwargs) < calibrate_noise_multiplier(**kwargs, accountant="rdp")


def test_calibration_reports_unreachable_and_trivial_targets():
    with pytest.raises(ValueError, match="cannot be reached"):
        calibrate_noise_multiplier(sample_rate=0.5, steps=10**5, target_epsilon=0.1, delta=1e-5, accountant="rdp")
    with pytest.raises(ValueError, match="already met"):
        calibrate_noise_multiplier(sample_rate=1e-4, steps=1, target_epsilon=100.0, delta=1e-5)
    with pytest.raises(ValueError, match="nothing to calibrate"):
        calibrate_noise_multiplier(sample_rate=0.0, steps=100, target_epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate_noise_multiplier(sample_rate=0.01, steps=100, target_epsilon=1.0, delta=1e-5, tolerance=0.0)
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise_multiplier(sample_rate=0.01, steps=100, target_epsilon=-1.0, delta=1e-5)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(sample_rate=1.01, noise_multiplier=1.0, steps=1, delta=1e-5), "sample_rate"),
        (dict(sample_rate=0.1, noise_multiplier=-0.5, steps=1, delta=1e-5), "noise_multiplier"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=-1, delta=1e-5), "steps"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=1, delta=1.0), "delta"),
        (dict(sample_rate="0.1", noise_multiplier=1.0, steps=1, delta=1e-5), "sample_rate"),
    ],
)
@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_dpsgd_epsilon_rejects_bad_input_naming_argument_value_and_range(kwargs, name, accountant):
    with pytest.raises(ValueError, match=name) as info:
        dpsgd_epsilon(**kwargs, accountant=accountant)
    assert str(kwargs[name]) in str(info.value)


def test_max_steps_rejects_negative_budget():
    with pytest.raises(ValueError, match="budget"):
        max_steps_within_budget(sample_rate=0.1, noise_multiplier=1.0, delta=1e-5, budget=-1.0)


def test_privacy_package_imports_only_numpy_and_scipy():
    """engine.privacy is pure math: importing it must not pull in torch or the reference libraries."""
    code = (
        "import sys, engine.privacy; "
        "bad = [m for m in ('torch', 'opacus', 'dp_accounting', 'PySide6', 'sqlite3') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    repo = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("sigma", [1e-200, 1e-300])
def test_noise_too_small_for_any_bound_gives_inf_everywhere_and_zero_before_any_step(sigma):
    """Noise multiplier 1e-200: the RDP accountant gave NaN (and rdp_to_epsilon raised). Now inf from
    every accountant and function, without a warning; and the live accountant before its first step
    states 0 (0 * inf was NaN there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for accountant in ACCOUNTANTS:
            assert _eps(accountant, q=0.01, sigma=sigma, steps=100) == math.inf
        assert np.all(epsilon_curve(sample_rate=0.01, noise_multiplier=sigma, steps=5, delta=1e-5) == math.inf)
        live = LiveAccountant(sample_rate=0.01, noise_multiplier=sigma, delta=1e-5)
        assert live.epsilon().value == 0.0 and live.epsilon_reported().value == 0.0
        live.step()
        assert live.epsilon().value == math.inf and live.epsilon_reported().value == math.inf
        assert max_steps_within_budget(sample_rate=0.01, noise_multiplier=sigma, delta=1e-5, budget=1.0,
                                       accountant="rdp") == 0
        assert dpsgd_epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=0, delta=1e-5, accountant="rdp",
                             statistics_noise_multiplier=sigma).value == math.inf


def test_epsilon_past_float_range_is_inf_without_a_warning():
    """Noise 1e-150 (RDP ~1e300 per step) over many steps: steps * RDP overflows to inf, the right bound."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        live = LiveAccountant(sample_rate=0.01, noise_multiplier=1e-150, delta=1e-5)
        live.step(10**12)
        assert live.epsilon().value == math.inf
        curve = epsilon_curve(sample_rate=0.01, noise_multiplier=1e-153, steps=300, delta=1e-5)
    assert np.all(curve[1:] >= curve[:-1]) and curve[-1] == math.inf and np.isfinite(curve[0])
