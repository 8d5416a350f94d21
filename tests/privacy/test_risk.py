"""engine.privacy.risk against closed forms (Gaussian DP, one subsampled Gaussian step), dp-accounting's
PLD, riskcal, and the `dpw privacy risk` / `dpw privacy calibrate --attack-tpr` commands.

References are computed here or by the reference libraries, never by engine.privacy.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from engine.cli import cli
from engine.privacy import compute_rdp, pld_epsilon
from engine.privacy.rdp import DEFAULT_ORDERS
from engine.privacy.risk import (
    DEFAULT_FPR,
    PrivacyProfile,
    attack_risk,
    calibrate_noise_multiplier_for_attack,
    dpsgd_attack_risk,
    dpsgd_privacy_profile,
    highest_tpr,
    loss_bound,
    max_advantage,
    posterior_bound,
    rdp_privacy_profile,
)

norm = stats.norm
ALPHAS = np.concatenate([np.logspace(-6, -1, 11), [0.2, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0]])


def gdp_tpr(alpha, mu):
    """mu-GDP: the exact trade-off of N(0,1) vs N(mu,1), TPR = Phi(Phi^-1(alpha) + mu) [DRS19, eq. (4)]."""
    return norm.cdf(norm.ppf(alpha) + mu)


def gaussian_profile(mu: float) -> PrivacyProfile:
    """The Gaussian mechanism's own profile from its closed form (Balle & Wang 2018, Thm. 8), fine grid."""
    eps = np.linspace(0.0, 40.0, 40001)
    delta = norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    return PrivacyProfile(epsilons=eps, deltas=np.clip(delta, 0.0, 1.0))


def tpr_by_brute_force(eps: np.ndarray, delta: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """1 - f(alpha), f = sup_eps max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)), over all points."""
    g, d, a = np.exp(eps)[:, None], delta[:, None], alpha[None, :]
    f = np.max(np.maximum(np.maximum(0.0, 1 - d - g * a), (1 - d - a) / g), axis=0)
    return 1.0 - f


@functools.lru_cache(maxsize=None)
def dp_accounting_pld(q: float, sigma: float, steps: int):
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    logging.getLogger().setLevel(logging.ERROR)
    return pld.from_gaussian_mechanism(
        sigma, sampling_prob=q, use_connect_dots=True, value_discretization_interval=1e-4
    ).self_compose(steps)


def _ours(q, sigma, steps, alpha=ALPHAS):
    return highest_tpr(profile=dpsgd_privacy_profile(sample_rate=q, noise_multiplier=sigma, steps=steps), fpr=alpha)


# ---- Gaussian mechanism: exact closed forms ---------------------------------------------------------


@pytest.mark.parametrize("mu,steps", [(0.5, 1), (1.0, 1), (2.0, 1), (1.0, 10)])
def test_gaussian_mechanism_curve_is_never_below_mu_gdp_and_within_1e6(mu, steps):
    """q = 1: T Gaussian steps with noise sigma are exactly mu-GDP, mu = sqrt(T)/sigma [DRS19, Cor. 3.3]."""
    sigma = math.sqrt(steps) / mu
    ours = _ours(1.0, sigma, steps)
    exact = gdp_tpr(ALPHAS, mu)
    assert np.all(ours >= exact)
    assert np.all(ours <= exact * (1 + 1e-6) + 1e-12)


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0])
def test_gaussian_max_advantage_is_2_phi_mu_half_minus_1(mu):
    profile = dpsgd_privacy_profile(sample_rate=1.0, noise_multiplier=1.0 / mu, steps=1)
    exact = 2 * norm.cdf(mu / 2) - 1
    assert exact <= max_advantage(profile=profile) <= exact + 1e-9
    # the curve's own maximum of TPR - FPR agrees (found at alpha = Phi(-mu/2))
    alpha = np.linspace(0, 1, 20001)
    gap = highest_tpr(profile=profile, fpr=alpha) - alpha
    assert gap.max() == pytest.approx(exact, abs=1e-6)


def test_profile_formula_on_the_exact_gaussian_profile_gives_mu_gdp():
    """The conversion alone: the closed-form profile of N(0,1) vs N(1,1) gives back Phi(Phi^-1(alpha) + 1)."""
    ours = highest_tpr(profile=gaussian_profile(1.0), fpr=ALPHAS)
    assert np.allclose(ours, gdp_tpr(ALPHAS, 1.0), rtol=1e-6, atol=1e-12)


def test_envelope_search_equals_the_brute_force_minimum_over_every_profile_point():
    profile = dpsgd_privacy_profile(sample_rate=0.01, noise_multiplier=1.0, steps=300)
    alpha = np.unique(np.concatenate([DEFAULT_FPR, ALPHAS]))
    brute = tpr_by_brute_force(profile.epsilons, profile.deltas, alpha)
    ours = highest_tpr(profile=profile, fpr=alpha)
    assert np.allclose(ours, np.maximum(brute, alpha), rtol=1e-9, atol=1e-14)


# ---- one subsampled Gaussian step: the Neyman-Pearson test in closed form --------------------------


@pytest.mark.parametrize("q,sigma", [(0.1, 1.0), (0.01, 0.8), (0.5, 2.0)])
def test_one_subsampled_step_matches_the_neyman_pearson_test(q, sigma):
    """One step: out = N(0, s^2), in = (1-q) N(0, s^2) + q N(1, s^2); the likelihood ratio grows with y,
    so the best test rejects 'out' for y > t: FPR = Phi(-t/s), TPR = (1-q) FPR + q Phi((1-t)/s).
    The symmetric guarantee (both orders of the neighbours) may only be above it, and for small
    FPR it is this test."""
    alpha = np.logspace(-6, -1, 11)
    t = -sigma * norm.ppf(alpha)
    exact = (1 - q) * alpha + q * norm.sf((t - 1) / sigma)
    ours = _ours(q, sigma, 1, alpha)
    assert np.all(ours >= exact)
    assert np.all(ours <= exact * (1 + 1e-5) + 1e-12)


# ---- composed DP-SGD: dp-accounting and riskcal ------------------------------------------------------


@pytest.mark.parametrize("q,sigma,steps", [(0.01, 1.0, 1000), (256 / 60000, 1.1, 14063)])
def test_dpsgd_curve_matches_dp_accountings_pld(q, sigma, steps):
    """dp-accounting's connect-the-dots PLD (h = 1e-4): its delta(eps) on a grid of 0.001, turned into a
    curve by brute force. Both are upper bounds; they agree to 1e-4 relative, and our advantage
    matches its delta(0)."""
    pld = dp_accounting_pld(q, sigma, steps)
    eps = np.linspace(0.0, 15.0, 15001)
    ref = tpr_by_brute_force(eps, np.asarray(pld.get_delta_for_epsilon(eps), dtype=float), ALPHAS)
    ref = np.maximum(ref, ALPHAS)
    profile = dpsgd_privacy_profile(sample_rate=q, noise_multiplier=sigma, steps=steps)
    ours = highest_tpr(profile=profile, fpr=ALPHAS)
    assert np.allclose(ours, ref, rtol=1e-4, atol=1e-9)
    assert max_advantage(profile=profile) == pytest.approx(pld.get_delta_for_epsilon(0.0), rel=1e-4)


@pytest.mark.parametrize("q,sigma,steps", [(0.1, 1.0, 1), (0.1, 2.0, 100), (0.01, 1.0, 100), (1.0, 2.0, 10)])
def test_dpsgd_curve_is_never_below_riskcal(q, sigma, steps):
    """riskcal (Kulynych et al.'s own implementation, Algorithm 1 on dp-accounting's PLD): ours is never
    below it (beyond its 1e-5 discretisation noise) and agrees within 1% at FPR >= 0.1%. riskcal 1.5.1
    reports lower TPRs at small FPR after many steps (down to TPR < FPR); not compared there."""
    conversions = pytest.importorskip("riskcal.analysis")
    alpha = np.array([1e-3, 1e-2, 0.1, 0.3, 0.5, 0.9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = 1.0 - np.asarray(conversions.get_beta_from_pld(dp_accounting_pld(q, sigma, steps), alpha=alpha))
    ours = _ours(q, sigma, steps, alpha)
    assert np.all(ours >= ref * (1 - 1e-5))
    assert np.all(ours <= ref * 1.01)


# ---- properties ------------------------------------------------------------------------------------


@pytest.mark.parametrize("q,sigma,steps", [(0.01, 1.0, 1000), (0.2, 0.7, 50), (1.0, 5.0, 3)])
def test_curve_is_monotone_concave_above_the_diagonal_and_ends_at_1(q, sigma, steps):
    fpr = np.linspace(0.0, 1.0, 2001)
    tpr = _ours(q, sigma, steps, fpr)
    assert np.all(tpr >= fpr) and np.all(tpr <= 1.0)
    assert np.all(np.diff(tpr) >= -1e-12)
    assert np.all(np.diff(tpr, 2) <= 1e-9)  # concave: a trade-off function is convex
    assert tpr[-1] == 1.0


def test_more_noise_or_fewer_steps_never_raise_the_tpr():
    base = _ours(0.01, 1.0, 500)
    assert np.all(_ours(0.01, 1.2, 500) <= base)
    assert np.all(_ours(0.01, 1.0, 250) <= base)


def test_no_training_allows_only_guessing_and_no_noise_allows_everything():
    for steps, q in ((0, 0.01), (10, 0.0)):
        risk = dpsgd_attack_risk(sample_rate=q, noise_multiplier=1.0, steps=steps, delta=1e-5)
        assert risk.max_advantage == 0.0
        assert risk.tpr_at_fpr[0.01] == pytest.approx(0.01, rel=1e-12)
        assert risk.posterior[0.5] == pytest.approx(0.5, rel=1e-12)
    reckless = dpsgd_attack_risk(sample_rate=0.01, noise_multiplier=0.0, steps=10, delta=1e-5)
    assert reckless.max_advantage == 1.0 and reckless.tpr_at_fpr[0.001] == 1.0 and reckless.posterior[0.01] == 1.0


# ---- posterior -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu,delta", [(0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-6)])
def test_posterior_bound_holds_with_probability_1_minus_delta(mu, delta):
    """Gaussian mechanism: for a record that is in, the privacy loss is L ~ N(mu^2/2, mu^2) exactly.
    P(L > loss_bound) must be <= delta, and the bound is not loose by more than 1 nat."""
    profile = dpsgd_privacy_profile(sample_rate=1.0, noise_multiplier=1.0 / mu, steps=1)
    bound = loss_bound(profile=profile, delta=delta)
    assert norm.sf(bound, loc=mu**2 / 2, scale=mu) <= delta
    assert bound <= norm.isf(delta, loc=mu**2 / 2, scale=mu) + 1.0
    for prior in (0.01, 0.5):
        post = posterior_bound(profile=profile, prior=prior, delta=delta)
        assert post == pytest.approx(prior * math.exp(bound) / (prior * math.exp(bound) + 1 - prior), rel=1e-12)
        assert prior < post <= 1.0


def test_posterior_at_a_prior_of_one_half_follows_the_loss_bound_of_the_mnist_setting():
    risk = dpsgd_attack_risk(sample_rate=256 / 60000, noise_multiplier=1.1, steps=14063, delta=1e-5)
    eps = pld_epsilon(sample_rate=256 / 60000, noise_multiplier=1.1, steps=14063, delta=1e-5).value
    assert risk.epsilon == pytest.approx(eps, rel=1e-3) and risk.epsilon >= eps * (1 - 1e-9)
    assert risk.loss_bound > eps  # P(L > eps) is not bounded by delta itself
    assert risk.posterior[0.5] == pytest.approx(1 / (1 + math.exp(-risk.loss_bound)), rel=1e-12)
    assert risk.posterior[0.01] < risk.posterior[0.5]


# ---- PATE-style profiles from an RDP curve -----------------------------------------------------------


def test_rdp_profile_is_an_upper_bound_on_the_gaussian_profile_and_gives_a_valid_curve():
    """RDP of the Gaussian mechanism is alpha mu^2 / 2 at every order: the converted profile must be
    above the exact delta(eps), so its curve is above mu-GDP (and not absurdly far)."""
    mu = 1.0
    orders = DEFAULT_ORDERS
    profile = rdp_privacy_profile(orders=orders, rdp=orders * mu**2 / 2)
    exact = gaussian_profile(mu)
    exact_at = np.interp(profile.epsilons, exact.epsilons, exact.deltas)
    assert np.all(profile.deltas >= exact_at - 1e-15)
    tpr = highest_tpr(profile=profile, fpr=ALPHAS)
    assert np.all(tpr >= gdp_tpr(ALPHAS, mu))
    assert tpr[ALPHAS == 0.01][0] <= 2.5 * gdp_tpr(0.01, mu)


def test_rdp_profile_of_dpsgd_is_looser_than_the_pld_profile():
    q, sigma, steps = 0.01, 1.0, 1000
    rdp = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps)
    from_rdp = highest_tpr(profile=rdp_privacy_profile(orders=DEFAULT_ORDERS, rdp=rdp), fpr=ALPHAS)
    assert np.all(from_rdp >= _ours(q, sigma, steps) * (1 - 1e-9))


def test_pate_gnmax_profile_from_its_rdp_is_never_below_the_gaussian_it_post_processes():
    """n data-independent GNMax answers: each is the arg max of a Gaussian mechanism whose histogram moves
    by sqrt(2), so the n answers are post-processing of sqrt(2n)/sigma-GDP. The curve from the RDP
    curve (engine.privacy.pate) may not be below that GDP curve."""
    from engine.privacy import pate

    sigma, queries = 40.0, 1000
    rdp = queries * pate.gnmax_rdp_data_independent(sigma=sigma, orders=pate.PATE_ORDERS)
    profile = rdp_privacy_profile(orders=pate.PATE_ORDERS, rdp=rdp)
    mu = math.sqrt(2 * queries) / sigma
    tpr = highest_tpr(profile=profile, fpr=ALPHAS)
    assert np.all(tpr >= gdp_tpr(ALPHAS, mu))
    assert max_advantage(profile=profile) >= 2 * norm.cdf(mu / 2) - 1


def test_attack_risk_reports_every_figure_from_one_profile():
    profile = gaussian_profile(1.0)
    risk = attack_risk(profile=profile, delta=1e-5)
    assert risk.tpr_at_fpr[0.01] == pytest.approx(gdp_tpr(0.01, 1.0), rel=1e-6)
    assert risk.max_advantage == pytest.approx(2 * norm.cdf(0.5) - 1, rel=1e-9)
    assert set(risk.posterior) == {0.01, 0.5}
    assert risk.tradeoff_tpr.shape == risk.tradeoff_fpr.shape == DEFAULT_FPR.shape


@pytest.mark.parametrize("bad", [{"fpr": [1.5]}, {"fpr": [float("nan")]}])
def test_bad_fpr_is_refused(bad):
    with pytest.raises(ValueError, match="fpr"):
        highest_tpr(profile=gaussian_profile(1.0), **bad)


# ---- calibration -----------------------------------------------------------------------------------


def test_calibrated_noise_meets_the_attack_target_and_is_minimal():
    q, steps, target, fpr, tol = 0.01, 300, 0.05, 0.01, 0.01
    sigma = calibrate_noise_multiplier_for_attack(sample_rate=q, steps=steps, target_tpr=target, fpr=fpr,
                                                  tolerance=tol)
    assert sigma == pytest.approx(round(sigma / tol) * tol, abs=1e-9)
    assert _ours(q, sigma, steps, np.array([fpr]))[0] <= target
    assert _ours(q, round(sigma - tol, 6), steps, np.array([fpr]))[0] > target


def test_calibration_refuses_targets_at_or_below_guessing_and_out_of_reach():
    with pytest.raises(ValueError, match="target_tpr"):
        calibrate_noise_multiplier_for_attack(sample_rate=0.01, steps=100, target_tpr=0.01, fpr=0.01)
    with pytest.raises(ValueError, match="already met"):
        calibrate_noise_multiplier_for_attack(sample_rate=0.0001, steps=1, target_tpr=0.9, fpr=0.01)


# ---- CLI -------------------------------------------------------------------------------------------


def test_privacy_risk_json_matches_the_library_and_does_not_import_torch():
    code = (
        "import sys, time; t = time.perf_counter(); from engine.cli import main; sys.argv = ['dpw', 'privacy', "
        "'risk', '--sample-rate', '0.004267', '--noise-multiplier', '1.1', '--steps', '9375', '--delta', '1e-5', "
        "'--json']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, time.perf_counter() - t, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    torch_loaded, _seconds = done.stderr.split()
    assert torch_loaded == "False"
    out = json.loads(done.stdout)
    expected = dpsgd_attack_risk(sample_rate=0.004267, noise_multiplier=1.1, steps=9375, delta=1e-5)
    assert out["max_advantage"] == expected.max_advantage
    assert out["tpr_at_fpr"] == {"0.01": expected.tpr_at_fpr[0.01], "0.001": expected.tpr_at_fpr[0.001]}
    assert out["posterior"] == {"0.01": expected.posterior[0.01], "0.5": expected.posterior[0.5]}
    assert out["tradeoff"]["fpr"] == DEFAULT_FPR.tolist()
    assert out["tradeoff"]["tpr"] == expected.tradeoff_tpr.tolist()


def test_privacy_risk_table_rounds_every_figure_up():
    result = CliRunner().invoke(cli, ["privacy", "risk", "--sample-rate", "0.004267", "--noise-multiplier", "1.1",
                                      "--steps", "9375", "--delta", "1e-5"])
    assert result.exit_code == 0, result.output
    expected = dpsgd_attack_risk(sample_rate=0.004267, noise_multiplier=1.1, steps=9375, delta=1e-5)
    line = next(row for row in result.output.splitlines() if "TPR at FPR 1%" in row)
    shown = float(line.split()[-1].rstrip("%")) / 100
    assert expected.tpr_at_fpr[0.01] <= shown <= expected.tpr_at_fpr[0.01] + 1e-4
    assert "posterior, prior 50%" in result.output and "except with probability 1e-05" in result.output


def test_privacy_risk_prints_the_accountants_epsilon_as_every_command_does():
    """The figures' own epsilon is read off a grid (1.9103); the accountant's is 1.91025: one number, printed
    as `dpw show` prints an epsilon (rounded up)."""
    from engine.cli_shell import epsilon_text
    from engine.privacy import dpsgd_epsilon

    args = ["--sample-rate", "0.004267", "--noise-multiplier", "1.1", "--steps", "9375", "--delta", "1e-5"]
    result = CliRunner().invoke(cli, ["privacy", "risk", *args])
    eps = dpsgd_epsilon(sample_rate=0.004267, noise_multiplier=1.1, steps=9375, delta=1e-5, accountant="pld")
    row = next(line for line in result.output.splitlines() if line.strip().startswith("epsilon"))
    assert row.split() == ["epsilon", epsilon_text(eps.value), "at", "delta", "1e-05", "(pld)"]
    assert epsilon_text(eps.value) == "1.9103"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sample-rate", "1.5", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--sample-rate"),
        (["--sample-rate", "0", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"],
         "--sample-rate: 0 is out of range; allowed (0, 1]"),  # as dpw privacy dpsgd says it
        (["--sample-rate", "0.1", "--noise-multiplier", "-1", "--steps", "10", "--delta", "1e-5"],
         "--noise-multiplier"),
        (["--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1"], "--delta"),
    ],
)
def test_privacy_risk_bad_numbers_are_one_line_errors(args, message):
    result = CliRunner().invoke(cli, ["privacy", "risk", *args])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]


def test_privacy_calibrate_to_an_attack_tpr_round_trips():
    result = CliRunner().invoke(cli, ["privacy", "calibrate", "--sample-rate", "0.01", "--steps", "300",
                                      "--attack-tpr", "0.05", "--at-fpr", "0.01", "--json"])
    assert result.exit_code == 0, result.output
    sigma = json.loads(result.output)["noise_multiplier"]
    assert _ours(0.01, sigma, 300, np.array([0.01]))[0] <= 0.05
    assert _ours(0.01, sigma - 0.001, 300, np.array([0.01]))[0] > 0.05


def test_privacy_calibrate_needs_exactly_one_target():
    both = CliRunner().invoke(cli, ["privacy", "calibrate", "--sample-rate", "0.01", "--steps", "300",
                                    "--attack-tpr", "0.05", "--epsilon", "3", "--delta", "1e-5"])
    neither = CliRunner().invoke(cli, ["privacy", "calibrate", "--sample-rate", "0.01", "--steps", "300"])
    for result in (both, neither):
        assert result.exit_code != 0 and result.output.startswith("error: give either --epsilon")


@pytest.mark.parametrize("sigma", [1e-101, 1e-200, 1e-300])
def test_noise_too_small_for_the_pld_gives_the_no_bound_profile_not_an_error(sigma):
    """`dpw privacy risk --noise-multiplier 1e-200` printed RuntimeWarnings, then "The function value at
    x=-1.0 is NaN; solver cannot continue" (sigma^2 underflows in the loss range search). Below the PLD's
    floor (1e-100, where pld_epsilon is already inf) the profile is delta = 1: nothing bounded, quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        risk = dpsgd_attack_risk(sample_rate=0.01, noise_multiplier=sigma, steps=100, delta=1e-5)
        result = CliRunner().invoke(cli, ["privacy", "risk", "--sample-rate", "0.01", "--noise-multiplier",
                                          f"{sigma:g}", "--steps", "100", "--delta", "1e-5", "--json"])
    assert risk.epsilon == math.inf and risk.max_advantage == 1.0 and risk.loss_bound == math.inf
    assert all(v == 1.0 for v in risk.tpr_at_fpr.values()) and all(v == 1.0 for v in risk.posterior.values())
    assert result.exit_code == 0 and "Warning" not in result.output
    assert json.loads(result.output)["max_advantage"] == 1.0


def test_vanishing_noise_above_the_pld_floor_states_at_least_the_chance_of_being_sampled():
    """Noise 1e-100 (still computed by the PLD): with almost no noise every step that samples the record
    reveals it, so the advantage is at least the chance of being sampled, 1 - (1 - q)^T."""
    q, steps = 0.01, 100
    risk = dpsgd_attack_risk(sample_rate=q, noise_multiplier=1e-100, steps=steps, delta=1e-5)
    assert risk.max_advantage >= -math.expm1(steps * math.log1p(-q)) and risk.epsilon == math.inf
