"""engine.privacy.tuning against dp-accounting's RepeatAndSelectDpEvent, the pure-DP corollaries of
Papernot & Steinke (2022), independent formulas for the distribution of K, and `dpw privacy tuning`."""

from __future__ import annotations

import itertools
import json
import logging
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from engine import rounding
from engine.cli import cli
from engine.privacy import DEFAULT_ORDERS, compute_rdp, rdp_to_epsilon
from engine.privacy.tuning import (
    SHAPE_POISSON,
    repeat_and_select_rdp,
    sample_num_runs,
    truncated_negative_binomial_gamma,
    truncated_negative_binomial_mean,
    tuning_epsilon,
)

REPO = Path(__file__).resolve().parents[2]
# dp-accounting's exact sum costs O(alpha^2) per order, so its orders 512 and 1024 would take most of the run time
INTEGER_ORDERS = DEFAULT_ORDERS[(DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)) & (DEFAULT_ORDERS <= 256)]
SHAPES = (0.0, 0.5, 1.0, 3.0, SHAPE_POISSON)  # those dp-accounting supports: logarithmic .. Poisson
GRID = list(itertools.product((0.001, 0.01, 0.1), (0.8, 2.0), (1, 1000), (1.5, 8.0, 100.0)))  # q, sigma, steps, mu
DELTA = 1e-5


@pytest.fixture(scope="module")
def dp_accounting_epsilon():
    """epsilon of RepeatAndSelectDpEvent(SelfComposed(PoissonSampled(Gaussian))) by dp-accounting's RdpAccountant."""
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    rdp_accountant = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    logging.getLogger().setLevel(logging.ERROR)

    def epsilon(q, sigma, steps, mu, shape, orders):
        candidate = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        accountant = rdp_accountant.RdpAccountant(orders=[float(a) for a in orders])
        accountant.compose(dp_event.RepeatAndSelectDpEvent(candidate, mu, shape))
        return accountant.get_epsilon(DELTA)

    return epsilon


# ---- against dp-accounting ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_dp_accountings_repeat_and_select_at_integer_orders(shape, dp_accounting_epsilon):
    """At integer orders both libraries compute the same candidate RDP (exact binomial sum), so
    the whole chain (gamma from the mean, Theorem 2 or 6, conversion) must agree; dp-accounting
    rounds gamma down to 1e-9 relative, hence the tolerance."""
    worst = 0.0
    for q, sigma, steps, mu in GRID:
        ours = tuning_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=DELTA, mean_runs=mu,
                              shape=shape, orders=INTEGER_ORDERS).epsilon.value
        ref = dp_accounting_epsilon(q, sigma, steps, mu, shape, INTEGER_ORDERS)
        worst = max(worst, abs(ours - ref) / ref)
    assert worst < 1e-8


@pytest.mark.parametrize("shape", (0.0, 1.0, SHAPE_POISSON))
def test_never_above_dp_accounting_at_the_default_orders(shape, dp_accounting_epsilon):
    """At fractional orders dp-accounting bounds the candidate's RDP more loosely (see test_rdp),
    and the tuning bound grows with the candidate's RDP: ours may only be lower."""
    for q, sigma, steps, mu in ((0.01, 0.8, 1000, 8.0), (0.1, 2.0, 1, 100.0)):
        ours = tuning_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=DELTA, mean_runs=mu,
                              shape=shape).epsilon.value
        ref = dp_accounting_epsilon(q, sigma, steps, mu, shape, DEFAULT_ORDERS)
        assert ours <= ref * (1 + 1e-8)


# ---- pure-DP corollaries --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", (-0.5, 0.0, 0.5, 1.0, 3.0))
@pytest.mark.parametrize("eps", (0.1, 1.0))
@pytest.mark.parametrize("mu", (2.0, 8.0, 100.0))
def test_pure_dp_candidate_gives_two_plus_shape_times_epsilon(shape, eps, mu):
    """[PS22]: an eps-DP candidate with K ~ D_{eta, gamma} gives a (2 + eta) eps-DP study (eta = 1,
    geometric: Liu & Talwar's 3 eps). Pure DP is RDP at order -> infinity; at order 1e9 the
    remaining log(E[K])/(lambda - 1) is below 1e-8. Where log(1/gamma) < eps, Theorem 2 at a finite
    lhat gives less than the corollary; never more."""
    lam = 1e9
    out = repeat_and_select_rdp(orders=[lam], rdp=[eps], mean_runs=mu, shape=shape, pure_epsilon=eps)[0]
    corollary = (2 + shape) * eps + math.log(mu) / (lam - 1)
    assert out <= corollary * (1 + 1e-12)
    log_inv_gamma = -math.log(truncated_negative_binomial_gamma(mean_runs=mu, shape=shape))
    if log_inv_gamma >= eps:
        assert out == pytest.approx(corollary, rel=1e-12)
    assert out > eps  # a search always costs something


@pytest.mark.parametrize("shape", (0.0, 1.0, 3.0))
def test_pure_dp_curve_without_the_flag_approaches_the_corollary_from_above(shape):
    """Given only a flat RDP curve (eps at every order, up to 1e6), Theorem 2 over finite lhat gives
    (2 + eta) eps plus (1 + eta)(log(1/gamma) - eps)/lhat_max: just above the corollary."""
    eps, mu = 0.5, 8.0
    orders = np.concatenate([DEFAULT_ORDERS, [1e4, 1e6]])
    out = repeat_and_select_rdp(orders=orders, rdp=np.full(orders.size, eps), mean_runs=mu, shape=shape)
    log_inv_gamma = -math.log(truncated_negative_binomial_gamma(mean_runs=mu, shape=shape))
    expected = (2 + shape) * eps + (1 + shape) * (log_inv_gamma - eps) / 1e6 + math.log(mu) / (1e6 - 1)
    assert out[-1] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("eps", (0.1, 0.5, 1.0))
@pytest.mark.parametrize("mu", (2.0, 8.0, 100.0))
def test_pure_dp_candidate_with_poisson_runs(eps, mu):
    """[PS22, Thm. 6] with an eps-DP candidate: for e^eps <= 1 + 1/(lambda - 1) it is (eps, 0)-DP at
    eps_hat = log(1 + 1/(lambda - 1)), so the study is (lambda, eps + log(mu)/(lambda - 1))-RDP.
    Above that order delta_hat > 0 (randomized response's profile) adds mu * delta_hat."""
    lam_max = 1 + 1 / math.expm1(eps)
    for lam in (1.01, 1 + (lam_max - 1) / 2, lam_max):
        out = repeat_and_select_rdp(orders=[lam], rdp=[eps], mean_runs=mu, shape=SHAPE_POISSON, pure_epsilon=eps)[0]
        assert out == pytest.approx(eps + math.log(mu) / (lam - 1), rel=1e-12)
    lam = 2 * lam_max
    out = repeat_and_select_rdp(orders=[lam], rdp=[eps], mean_runs=mu, shape=SHAPE_POISSON, pure_epsilon=eps)[0]
    delta_rr = (math.exp(eps) - lam / (lam - 1)) / (1 + math.exp(eps))
    assert eps + math.log(mu) / (lam - 1) < out <= eps + mu * delta_rr + math.log(mu) / (lam - 1) + 1e-12


# ---- sanity of the bound --------------------------------------------------------------------------


def test_study_never_below_one_run_and_grows_with_mean_runs():
    for q, sigma, steps in ((0.001, 0.8, 1000), (0.01, 1.1, 1000), (0.1, 2.0, 1), (0.1, 0.8, 100)):
        rdp = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps)
        single = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=rdp, delta=DELTA).value
        for shape in (-0.5, *SHAPES):
            previous = single
            for mu in (1.0, 1.5, 8.0, 100.0):
                study = repeat_and_select_rdp(orders=DEFAULT_ORDERS, rdp=rdp, mean_runs=mu, shape=shape)
                eps = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=study, delta=DELTA).value
                assert eps >= previous and (eps > single or (mu == 1.0 and not math.isinf(shape)))
                previous = eps


@pytest.mark.parametrize("shape", (-0.5, 0.0, 1.0, 3.0))
def test_one_expected_run_is_one_run(shape):
    """mean_runs = 1 with a truncated negative binomial means K = 1: exactly the candidate's epsilon."""
    result = tuning_epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=1000, delta=DELTA, mean_runs=1.0, shape=shape)
    rdp = compute_rdp(sample_rate=0.01, noise_multiplier=1.1, steps=1000)
    assert result.epsilon == result.single_run == rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=rdp, delta=DELTA)
    assert sample_num_runs(rng=np.random.default_rng(0), mean_runs=1.0, shape=shape, size=5).tolist() == [1] * 5


def test_bound_is_non_decreasing_in_the_order():
    """A Renyi divergence never decreases with the order, so neither may the bound (it takes the best larger order)."""
    rdp = compute_rdp(sample_rate=0.01, noise_multiplier=1.1, steps=1000)
    for shape in SHAPES:
        out = repeat_and_select_rdp(orders=DEFAULT_ORDERS, rdp=rdp, mean_runs=8.0, shape=shape)
        assert np.all(np.diff(out) >= 0)


# ---- the distribution of K ------------------------------------------------------------------------


def reference_pmf(shape: float, gamma: float, kmax: int) -> np.ndarray:
    """P[K = k], k = 0..kmax, from Definition 1 of [PS22] written out here (products, not gammaln), or scipy."""
    if math.isinf(shape):
        raise ValueError("Poisson: use scipy.stats.poisson")
    k = np.arange(kmax + 1)
    if shape == 0.0:
        return np.where(k >= 1, stats.logser.pmf(k, 1 - gamma), 0.0)
    weights = np.zeros(kmax + 1)
    term = 1.0
    for j in range(1, kmax + 1):
        term *= (j - 1 + shape) / j * (1 - gamma)  # prod_{l<j} (l + eta)/(l + 1) * (1-gamma)^j
        weights[j] = term
    return weights / (gamma ** (-shape) - 1)


@pytest.mark.parametrize("shape", (-0.5, 0.0, 0.5, 1.0, 3.0, 10.0))
@pytest.mark.parametrize("mu", (1.2, 8.0, 1000.0))
def test_gamma_gives_the_requested_mean(shape, mu):
    gamma = truncated_negative_binomial_gamma(mean_runs=mu, shape=shape)
    assert truncated_negative_binomial_mean(gamma=gamma, shape=shape) == pytest.approx(mu, rel=1e-12)
    if shape == 1.0:
        assert gamma == pytest.approx(1 / mu, rel=1e-14)  # geometric
    if shape > 0:  # scipy's negative binomial, conditioned on K >= 1
        nb = stats.nbinom(shape, gamma)
        assert nb.mean() / nb.sf(0) == pytest.approx(mu, rel=1e-9)
    if shape == 0.0:
        assert stats.logser(1 - gamma).mean() == pytest.approx(mu, rel=1e-9)
    if mu < 100:  # direct sum over the pmf, as far as (1-gamma)^k < e^-40
        pmf = reference_pmf(shape, gamma, int(40 / gamma) + 100)
        assert pmf.sum() == pytest.approx(1.0, rel=1e-9)
        assert (np.arange(pmf.size) * pmf).sum() == pytest.approx(mu, rel=1e-9)


def goodness_of_fit(draws: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square p-value of the draws against pmf[0..], bins merged so each expects >= 20."""
    n = draws.size
    counts = np.bincount(draws, minlength=pmf.size)[: pmf.size].astype(float)
    counts[-1] += np.sum(draws >= pmf.size)
    expected = pmf * n
    expected[-1] += max(n - expected.sum(), 0.0)
    observed_bins, expected_bins, o, e = [], [], 0.0, 0.0
    for oi, ei in zip(counts, expected):
        o, e = o + oi, e + ei
        if e >= 20:
            observed_bins.append(o)
            expected_bins.append(e)
            o, e = 0.0, 0.0
    observed_bins[-1] += o
    expected_bins[-1] += e
    expected_bins = np.asarray(expected_bins) * n / np.sum(expected_bins)
    return float(stats.chisquare(observed_bins, expected_bins).pvalue)


def pmf_of(shape: float, mu: float, kmax: int) -> np.ndarray:
    if math.isinf(shape):
        return stats.poisson.pmf(np.arange(kmax + 1), mu)
    return reference_pmf(shape, truncated_negative_binomial_gamma(mean_runs=mu, shape=shape), kmax)


@pytest.mark.parametrize("shape", (-0.5, 0.0, 0.5, 1.0, 3.0, SHAPE_POISSON))
@pytest.mark.parametrize("mu", (3.0, 8.0))
def test_sampler_has_the_requested_mean_and_distribution(shape, mu):
    rng = np.random.default_rng(20260501)
    draws = sample_num_runs(rng=rng, mean_runs=mu, shape=shape, size=100_000)
    assert draws.dtype == np.int64 and draws.shape == (100_000,)
    assert draws.min() >= (0 if math.isinf(shape) else 1)
    standard_error = draws.std() / math.sqrt(draws.size)
    assert abs(draws.mean() - mu) < 5 * standard_error
    assert goodness_of_fit(draws, pmf_of(shape, mu, 5000)) > 1e-4


def test_goodness_of_fit_tells_neighbouring_shapes_apart():
    """The distribution test above has power: geometric draws are rejected as eta = 0.5, and
    Poisson draws as geometric, at the same mean."""
    rng = np.random.default_rng(7)
    geometric = sample_num_runs(rng=rng, mean_runs=8.0, shape=1.0, size=100_000)
    assert goodness_of_fit(geometric, pmf_of(0.5, 8.0, 5000)) < 1e-6
    poisson = sample_num_runs(rng=rng, mean_runs=8.0, shape=SHAPE_POISSON, size=100_000)
    assert goodness_of_fit(poisson, pmf_of(1.0, 8.0, 5000)) < 1e-6


def test_sampler_returns_one_int_without_size_and_uses_only_the_given_generator():
    a = sample_num_runs(rng=np.random.default_rng(3), mean_runs=8.0, shape=1.0)
    b = sample_num_runs(rng=np.random.default_rng(3), mean_runs=8.0, shape=1.0)
    assert isinstance(a, int) and a == b and a >= 1
    with pytest.raises(ValueError, match="^rng must be a generator with a random"):
        sample_num_runs(rng=3, mean_runs=8.0, shape=1.0)


class UniformsInHalfOpenAbove:
    """A generator with only random(size), uniforms in (0, 1] (the convention of the hardened
    SecureGenerator in engine.randomness), to check the sampler needs nothing else."""

    def __init__(self, seed: int):
        self._numpy = np.random.default_rng(seed)

    def random(self, size=None):
        return 1.0 - self._numpy.random(size)


@pytest.mark.parametrize("shape", (0.5, SHAPE_POISSON))
def test_sampler_needs_only_uniforms_from_the_generator(shape):
    draws = sample_num_runs(rng=UniformsInHalfOpenAbove(5), mean_runs=8.0, shape=shape, size=50_000)
    assert goodness_of_fit(draws, pmf_of(shape, 8.0, 5000)) > 1e-4
    one = sample_num_runs(rng=UniformsInHalfOpenAbove(5), mean_runs=8.0, shape=shape)
    assert isinstance(one, int)


def test_heavy_tailed_shape_still_samples_its_distribution():
    """eta close to -1: gamma ~ 3e-10 and a tail reaching past a million; P[K = 1] still matches."""
    mu, shape = 8.0, -0.9
    gamma = truncated_negative_binomial_gamma(mean_runs=mu, shape=shape)
    draws = sample_num_runs(rng=np.random.default_rng(11), mean_runs=mu, shape=shape, size=20_000)
    p1 = reference_pmf(shape, gamma, 1)[1]
    assert draws.min() >= 1
    assert abs(np.mean(draws == 1) - p1) < 5 * math.sqrt(p1 * (1 - p1) / draws.size)


# ---- argument errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, start",
    [
        (dict(mean_runs=0.5, shape=1.0), "mean_runs must be in [1,"),
        (dict(mean_runs=math.inf, shape=1.0), "mean_runs must be in [1,"),
        (dict(mean_runs=8.0, shape=-1.0), "shape must be > -1"),
        (dict(mean_runs=8.0, shape=math.nan), "shape must be a number"),
        (dict(mean_runs=8.0, shape="1"), "shape must be a number"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_argument(kwargs, start):
    for call in (
        lambda: repeat_and_select_rdp(orders=[2.0], rdp=[0.1], **kwargs),
        lambda: sample_num_runs(rng=np.random.default_rng(0), **kwargs),
        lambda: tuning_epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=DELTA, **kwargs),
    ):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith(start) and "\n" not in str(info.value)


def test_bad_curves_and_poisson_gamma_are_refused():
    with pytest.raises(ValueError, match="^rdp must have one value per order"):
        repeat_and_select_rdp(orders=[2.0, 3.0], rdp=[0.1], mean_runs=8.0, shape=1.0)
    with pytest.raises(ValueError, match="^rdp values must be >= 0"):
        repeat_and_select_rdp(orders=[2.0], rdp=[-0.1], mean_runs=8.0, shape=1.0)
    with pytest.raises(ValueError, match="^shape must be finite here"):
        truncated_negative_binomial_gamma(mean_runs=8.0, shape=SHAPE_POISSON)
    with pytest.raises(ValueError, match="^gamma must be in"):
        truncated_negative_binomial_mean(gamma=0.0, shape=1.0)


# ---- dpw privacy tuning ---------------------------------------------------------------------------

CLI_ARGS = ["privacy", "tuning", "--sample-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "1000",
            "--delta", "1e-5", "--mean-runs", "8"]


@pytest.mark.parametrize("shape", ("1", "0", "-0.5", "inf"))
def test_cli_json_matches_the_library(shape):
    result = CliRunner().invoke(cli, [*CLI_ARGS, "--shape", shape, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    expected = tuning_epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=1000, delta=1e-5, mean_runs=8.0,
                              shape=float(shape))
    assert out["epsilon"] == expected.epsilon.value and out["delta"] == 1e-5
    assert out["single_run_epsilon"] == expected.single_run.value
    assert out["shape"] == ("inf" if shape == "inf" else float(shape))


def test_cli_readable_form_and_no_torch_import():
    code = (
        "import sys; from engine.cli import main; sys.argv=['dpw', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    out = subprocess.run([sys.executable, "-c", code, *CLI_ARGS, "--shape", "1"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = tuning_epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=1000, delta=1e-5, mean_runs=8.0, shape=1.0)
    assert f"epsilon (study)    = {rounding.up(expected.epsilon.value, '.6g')}" in out.stdout
    assert f"epsilon (one run)  = {rounding.up(expected.single_run.value, '.6g')}" in out.stdout


@pytest.mark.parametrize(
    "extra, words",
    [(["--mean-runs", "0.5", "--shape", "1"], ["--mean-runs", "0.5"]),
     (["--shape", "-1"], ["--shape", "-1"]),
     (["--shape", "nan"], ["--shape", "nan"])],
)
def test_cli_errors_are_one_line(extra, words):
    args = [a for a in CLI_ARGS if a not in ("--mean-runs", "8")] + (["--mean-runs", "8"] if "--mean-runs" not in extra else [])
    result = CliRunner().invoke(cli, [*args, *extra])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    for word in words:
        assert word in result.output


def test_cli_help_ends_with_an_example():
    result = CliRunner().invoke(cli, ["privacy", "tuning", "--help"])
    assert "Example: dpw privacy tuning --sample-rate" in result.output


# ---- what a plan shows of K ---------------------------------------------------------------------
@pytest.mark.parametrize("mean_runs", [1.5, 3.0, 8.0, 40.0])
def test_num_runs_quantiles_match_scipy_for_poisson_and_geometric(mean_runs):
    from engine.privacy.tuning import num_runs_probability, num_runs_quantiles

    p = [0.1, 0.5, 0.9, 0.99]
    assert num_runs_quantiles(mean_runs=mean_runs, shape=math.inf, probabilities=p) == \
        [int(k) for k in stats.poisson(mean_runs).ppf(p)]
    # geometric (shape 1) on 1, 2, ...: success probability gamma = 1 / mean
    assert num_runs_quantiles(mean_runs=mean_runs, shape=1.0, probabilities=p) == \
        [int(k) for k in stats.geom(1.0 / mean_runs).ppf(p)]
    assert num_runs_probability(mean_runs=mean_runs, shape=math.inf, k=0) == pytest.approx(math.exp(-mean_runs))
    assert num_runs_probability(mean_runs=mean_runs, shape=1.0, k=0) == 0.0
    assert num_runs_probability(mean_runs=mean_runs, shape=1.0, k=1) == pytest.approx(1.0 / mean_runs)


@pytest.mark.parametrize("sigma", [1e-160, 1e-200, 1e-300])
@pytest.mark.parametrize("shape", SHAPES + (-0.5,))
def test_noise_too_small_for_any_bound_gives_an_infinite_study_epsilon_not_an_error(sigma, shape):
    """`dpw privacy tuning --noise-multiplier 1e-200` failed as `dpw privacy dpsgd` did (NaN RDP)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = tuning_epsilon(sample_rate=0.01, noise_multiplier=sigma, steps=100, delta=DELTA, mean_runs=8.0,
                                shape=shape)
    assert result.epsilon.value == math.inf and result.single_run.value == math.inf


@pytest.mark.parametrize("shape", SHAPES)
def test_a_study_rdp_past_float_range_is_inf_without_a_warning(shape):
    """Noise 1e-153: one run's RDP is ~1e308, the study's adds to it and overflows: inf, an upper bound."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = tuning_epsilon(sample_rate=0.01, noise_multiplier=1e-153, steps=100, delta=DELTA, mean_runs=8.0,
                                shape=shape)
    assert result.epsilon.value >= result.single_run.value > 1e300
