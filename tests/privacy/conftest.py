"""Independent reference values for the privacy tests.

Everything here is computed either by the reference libraries (Opacus, Google's dp-accounting)
or from closed forms written out in the test code itself, never by engine.privacy.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings

import numpy as np
import pytest
from scipy import optimize, stats


@pytest.fixture(scope="session")
def opacus_rdp():
    """Opacus' RDP of the sampled Gaussian and its RDP -> epsilon conversion."""
    analysis = pytest.importorskip("opacus.accountants.analysis.rdp")
    return analysis


@pytest.fixture(scope="session")
def dpacct_rdp():
    """dp-accounting's RDP module (integer orders there use the same exact sum; fractional
    orders are summed in absolute value, a looser bound, so only integer orders are compared)."""
    return pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")


@pytest.fixture(scope="session")
def dpacct_pld_epsilon():
    """eps(q, sigma, steps, delta, pessimistic) from dp-accounting's PLD (h = 1e-4).

    pessimistic=True: connect-the-dots, an upper bound; False: privacy buckets rounded down,
    a lower bound on the true epsilon. Constructions are cached per (q, sigma, kind).
    """
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    logging.getLogger().setLevel(logging.ERROR)

    @functools.lru_cache(maxsize=None)
    def build(q: float, sigma: float, pessimistic: bool):
        return pld.from_gaussian_mechanism(
            sigma,
            sampling_prob=q,
            pessimistic_estimate=pessimistic,
            use_connect_dots=pessimistic,
            value_discretization_interval=1e-4,
        )

    @functools.lru_cache(maxsize=None)
    def composed(q: float, sigma: float, steps: int, pessimistic: bool):
        return build(q, sigma, pessimistic).self_compose(steps)

    def epsilon(q: float, sigma: float, steps: int, delta: float, pessimistic: bool) -> float:
        return float(composed(q, sigma, steps, pessimistic).get_epsilon_for_delta(delta))

    return epsilon


@pytest.fixture(scope="session")
def opacus_prv_bounds():
    """(eps_lower, eps_estimate, eps_upper) from Opacus' PRV accountant (Gopi et al. 2021)."""
    prv = pytest.importorskip("opacus.accountants.prv")

    def bounds(q: float, sigma: float, steps: int, delta: float) -> tuple[float, float, float]:
        acc = prv.PRVAccountant()
        acc.history = [(sigma, q, steps)]  # (noise_multiplier, sample_rate, steps), as step() records
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dprv = acc._get_dprv(eps_error=0.01, delta_error=delta / 1000)
            return tuple(float(x) for x in dprv.compute_epsilon(delta, delta / 1000, 0.01))

    return bounds


def gaussian_delta(epsilon: float, sigma: float) -> float:
    """Exact delta(eps) of the Gaussian mechanism, sensitivity 1, noise std sigma.

    Balle & Wang 2018, "Improving the Gaussian Mechanism for DP", Theorem 8:
    delta = Phi(-eps sigma + 1/(2 sigma)) - e^eps Phi(-eps sigma - 1/(2 sigma)).
    """
    return float(
        stats.norm.cdf(-epsilon * sigma + 0.5 / sigma) - math.exp(epsilon) * stats.norm.cdf(-epsilon * sigma - 0.5 / sigma)
    )


def gaussian_epsilon(delta: float, sigma: float) -> float:
    """Exact epsilon of the Gaussian mechanism at delta (inverting gaussian_delta)."""
    return float(optimize.brentq(lambda e: gaussian_delta(e, sigma) - delta, 0.0, 200.0, xtol=1e-14, rtol=1e-14))


def subsampled_gaussian_delta(epsilon: float, q: float, sigma: float, direction: str = "both") -> float:
    """Exact delta(eps) of ONE Poisson-subsampled Gaussian step, worse of add and remove.

    With M = (1-q) N(0, s^2) + q N(1, s^2) and N0 = N(0, s^2), the likelihood ratio
    M/N0 = 1 - q + q exp((2y-1)/(2 s^2)) is increasing in y, so each hockey-stick divergence
    is attained on a half line {y > t} (remove) or {y < t} (add):
      remove: H(M || N0) = M(y > t) - e^eps N0(y > t), with M/N0 = e^eps at t;
      add:    H(N0 || M) = N0(y < t) - e^eps M(y < t), with N0/M = e^eps at t.
    `direction` picks one of them ("remove", "add") or the worse ("both").
    """
    s2 = sigma * sigma
    norm = stats.norm

    def threshold(ratio: float) -> float:  # y with M/N0 = ratio
        return s2 * math.log((ratio - (1.0 - q)) / q) + 0.5

    # remove
    if math.exp(epsilon) <= 1.0 - q:
        remove = 1.0 - math.exp(epsilon)
    else:
        t = threshold(math.exp(epsilon))
        m_sf = (1 - q) * norm.sf(t / sigma) + q * norm.sf((t - 1) / sigma)
        remove = m_sf - math.exp(epsilon) * norm.sf(t / sigma)
    # add: N0/M = e^eps  <=>  M/N0 = e^-eps, possible only if e^-eps > 1 - q
    if math.exp(-epsilon) <= 1.0 - q:
        add = 0.0
    else:
        t = threshold(math.exp(-epsilon))
        m_cdf = (1 - q) * norm.cdf(t / sigma) + q * norm.cdf((t - 1) / sigma)
        add = norm.cdf(t / sigma) - math.exp(epsilon) * m_cdf
    if direction == "remove":
        return max(remove, 0.0)
    if direction == "add":
        return max(add, 0.0)
    return max(remove, add, 0.0)


@pytest.fixture(scope="session")
def closed_forms():
    """The closed-form references above, as a namespace."""

    class ClosedForms:
        gaussian_delta = staticmethod(gaussian_delta)
        gaussian_epsilon = staticmethod(gaussian_epsilon)
        subsampled_gaussian_delta = staticmethod(subsampled_gaussian_delta)

    return ClosedForms


def sampled_gaussian_log_a_by_quadrature(q: float, sigma: float, alpha: float) -> float:
    """log A_alpha = log E_{z~N(0,s^2)}[(1 - q + q exp((2z-1)/(2 s^2)))^alpha] by adaptive
    quadrature at 50 digits (mpmath), independent of any series expansion."""
    mpmath = pytest.importorskip("mpmath")
    mp = mpmath.mp
    with mpmath.workdps(50):
        q_, s_, a_ = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)

        def integrand(z):
            ratio = 1 - q_ + q_ * mp.exp((2 * z - 1) / (2 * s_**2))
            return mp.npdf(z, 0, s_) * ratio**a_

        z0 = s_**2 * mp.log(1 / q_ - 1) + mp.mpf(1) / 2
        points = sorted({mp.mpf(0), z0, mp.mpf(1), a_})
        return float(mp.log(mp.quad(integrand, [-mp.inf, *points, mp.inf])))


@pytest.fixture(scope="session")
def quadrature_log_a():
    return sampled_gaussian_log_a_by_quadrature


def classic_rdp_conversion(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """The original RDP -> (eps, delta) conversion, Mironov 2017 Prop. 3: min rdp - log(delta)/(alpha-1).

    This is what TF Privacy's tutorials and Abadi et al.'s moments accountant reported.
    """
    return float(np.min(rdp - math.log(delta) / (orders - 1.0)))


@pytest.fixture(scope="session")
def classic_conversion():
    return classic_rdp_conversion
