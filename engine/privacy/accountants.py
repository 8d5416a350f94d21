"""DP-SGD privacy accounting: the functions the trainer, CLI and window call.

Two accountants for the Poisson-subsampled Gaussian mechanism (add/remove-one neighbours):
  "pld": privacy loss distribution (engine.privacy.pld), tight; the one reported.
  "rdp": Renyi DP (engine.privacy.rdp), a looser upper bound but microseconds to update,
         used for live progress after every training step.
Both return upper bounds on epsilon. All functions are pure; LiveAccountant only keeps the
step count (and caches) on top of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from engine.privacy import _validate
from engine.privacy._search import find_boundary, log_of
from engine.privacy.feature_stats import gaussian_rdp
from engine.privacy.pld import pld_epsilon
from engine.privacy.rdp import DEFAULT_ORDERS, _conversion_offset, _epsilon_per_order, compute_rdp, rdp_to_epsilon
from engine.privacy.types import Epsilon

__all__ = [
    "ACCOUNTANTS",
    "NOISE_MULTIPLIER_RANGE",
    "LiveAccountant",
    "calibrate_noise_multiplier",
    "dpsgd_epsilon",
    "epsilon_curve",
    "max_steps_within_budget",
]

ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
"""Accountant names; the first ("pld") is the default for reported numbers."""

NOISE_MULTIPLIER_RANGE: tuple[float, float] = (0.1, 1000.0)
"""Range searched by calibrate_noise_multiplier."""

_MAX_STEPS_SEARCH = 1 << 40  # max_steps_within_budget without `upper`: beyond this is "unbounded"
_CURVE_CHUNK = 1 << 15  # rows of the (steps x orders) table converted at once by epsilon_curve


def dpsgd_epsilon(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    accountant: str = "pld",
    statistics_noise_multiplier: float | None = None,
) -> Epsilon:
    """Upper bound on epsilon at `delta` after `steps` DP-SGD steps (Poisson rate q, multiplier sigma).

    With `statistics_noise_multiplier`, one release of the Gaussian mechanism with that noise
    multiplier (the DP feature statistics, engine.privacy.feature_stats) is composed with the
    training by adding RDP [Mironov 2017, Prop. 1]; the result is then an "rdp" bound whatever
    `accountant` asks for (the PLD accountant composes only the training steps).
    """
    name = _accountant(accountant)
    if statistics_noise_multiplier is None and name == "pld":
        return pld_epsilon(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, delta=delta)
    rdp = compute_rdp(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps)
    return rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=rdp + _statistics_rdp(statistics_noise_multiplier), delta=delta)


def _composed(steps: int, per_step: np.ndarray) -> np.ndarray:
    """RDP of `steps` steps from one step's [Mironov 2017, Prop. 1]: 0 for no steps (also where one
    step's RDP is inf, as for noise too small to bound anything), inf where the product passes float range."""
    if steps == 0:
        return np.zeros_like(per_step)
    with np.errstate(over="ignore"):
        return steps * per_step


def _statistics_rdp(statistics_noise_multiplier: float | None) -> np.ndarray:
    """RDP at DEFAULT_ORDERS of the feature statistics' release (0 when there is none)."""
    if statistics_noise_multiplier is None:
        return np.zeros(DEFAULT_ORDERS.size)
    return gaussian_rdp(noise_multiplier=statistics_noise_multiplier, orders=DEFAULT_ORDERS)


def epsilon_curve(*, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> np.ndarray:
    """RDP epsilon after each step 1..steps (array of length `steps`), for progress plots.

    RDP composes linearly [Mironov 2017, Prop. 1], so the per-step RDP vector is computed
    once, scaled by t for every t, and all rows are converted to epsilon at once (the same
    values as dpsgd_epsilon(accountant="rdp")). The (0, delta) shortcut of the conversion holds
    at some order exactly when it holds at the smallest RDP of the row, so it is applied per row
    after the minimum (a third of the work of converting every entry).
    """
    per_step = compute_rdp(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=1)
    t = _validate.steps(steps)
    d = _validate.delta(delta)
    offset = _conversion_offset(DEFAULT_ORDERS, d)
    smallest = float(per_step.min())
    out = np.empty(t)
    for start in range(0, t, _CURVE_CHUNK):
        ts = np.arange(start + 1, min(start + _CURVE_CHUNK, t) + 1, dtype=float)
        with np.errstate(over="ignore"):  # t * RDP past float range is inf, an upper bound
            eps = (ts[:, None] * per_step[None, :] + offset[None, :]).min(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            zero = d * d + np.expm1(-ts * smallest) >= 0.0
        out[start : start + ts.size] = np.where(zero, 0.0, np.maximum(eps, 0.0))
    return out


class LiveAccountant:
    """Step counter for the training loop: cheap RDP epsilon every step, tight PLD on demand.

    Example:
        acc = LiveAccountant(sample_rate=256/60000, noise_multiplier=1.1, delta=1e-5)
        acc.step()                    # after each optimizer step
        acc.epsilon().value           # RDP bound, microseconds
        acc.epsilon_reported().value  # PLD bound, at epoch ends and at the end
    """

    def __init__(self, *, sample_rate: float, noise_multiplier: float, delta: float,
                 statistics_noise_multiplier: float | None = None):
        self._q = _validate.sample_rate(sample_rate)
        self._sigma = _validate.noise_multiplier(noise_multiplier)
        self._delta = _validate.delta(delta)
        self._per_step = compute_rdp(sample_rate=self._q, noise_multiplier=self._sigma, steps=1)
        # Released before the first step (DP feature statistics): counted from step 0 on, RDP only.
        self._statistics_noise_multiplier = statistics_noise_multiplier
        self._fixed = _statistics_rdp(statistics_noise_multiplier)
        self._offset = _conversion_offset(DEFAULT_ORDERS, self._delta)
        self._steps = 0
        self._reported: dict[str, tuple[int, Epsilon]] = {}

    @property
    def sample_rate(self) -> float:
        return self._q

    @property
    def noise_multiplier(self) -> float:
        return self._sigma

    @property
    def delta(self) -> float:
        return self._delta

    @property
    def steps(self) -> int:
        """Steps taken so far."""
        return self._steps

    def step(self, n: int = 1) -> None:
        """Record `n` more steps (n >= 0)."""
        self._steps += _validate.steps(n)

    def epsilon(self) -> Epsilon:
        """RDP upper bound after the steps so far (equal to dpsgd_epsilon(accountant="rdp"))."""
        rdp = _composed(self._steps, self._per_step) + self._fixed
        eps = _epsilon_per_order(DEFAULT_ORDERS, rdp, self._delta, self._offset)
        best = int(np.argmin(eps))
        value = float(eps[best])
        if math.isinf(value):
            return Epsilon(value=math.inf, delta=self._delta, accountant="rdp", order=None)
        return Epsilon(value=max(value, 0.0), delta=self._delta, accountant="rdp", order=float(DEFAULT_ORDERS[best]))

    def epsilon_reported(self, accountant: str = "pld") -> Epsilon:
        """Bound for reports (default: PLD, tight); cached until the next step."""
        name = _accountant(accountant)
        cached = self._reported.get(name)
        if cached is not None and cached[0] == self._steps:
            return cached[1]
        result = dpsgd_epsilon(
            sample_rate=self._q, noise_multiplier=self._sigma, steps=self._steps, delta=self._delta, accountant=name,
            statistics_noise_multiplier=self._statistics_noise_multiplier,
        )
        self._reported[name] = (self._steps, result)
        return result

    def __repr__(self) -> str:
        return (
            f"LiveAccountant(sample_rate={self._q!r}, noise_multiplier={self._sigma!r}, "
            f"delta={self._delta!r}, steps={self._steps})"
        )


def max_steps_within_budget(
    *,
    sample_rate: float,
    noise_multiplier: float,
    delta: float,
    budget: float,
    accountant: str = "pld",
    upper: int | None = None,
    statistics_noise_multiplier: float | None = None,
) -> int:
    """Largest T with dpsgd_epsilon(T) <= budget (0 if one step already exceeds it).

    Epsilon grows with T, so the boundary is bracketed (doubling) and then found by regula
    falsi with bisection safeguards: the result satisfies eps(T) <= budget < eps(T + 1). For
    "pld" the RDP answer (cheap, and RDP epsilon >= PLD epsilon) starts the bracket. With
    `upper`, at most `upper` is returned; without it, a budget that is never exhausted within
    2^40 steps (e.g. sample_rate 0) is a ValueError. `statistics_noise_multiplier`: as dpsgd_epsilon
    (RDP composition; 0 steps when the statistics alone exceed the budget).
    """
    q = _validate.sample_rate(sample_rate)
    sigma = _validate.noise_multiplier(noise_multiplier)
    d = _validate.delta(delta)
    eps_budget = _validate.epsilon(budget, "budget")
    name = _accountant(accountant) if statistics_noise_multiplier is None else "rdp"
    cap = _MAX_STEPS_SEARCH if upper is None else _validate.steps(upper)
    per_step = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=1)
    fixed = _statistics_rdp(statistics_noise_multiplier)

    def rdp_eps(t: int) -> float:
        return max(float(_epsilon_per_order(DEFAULT_ORDERS, _composed(t, per_step) + fixed, d).min()), 0.0)

    if rdp_eps(0) > eps_budget:
        return 0

    def pld_eps(t: int) -> float:
        return pld_epsilon(sample_rate=q, noise_multiplier=sigma, steps=t, delta=d).value

    start, f_start = 0, 0.0
    if name == "pld":
        t_rdp = _grow_and_find(rdp_eps, eps_budget, 0, 0.0, cap)
        f_rdp = pld_eps(t_rdp) if t_rdp > 0 else 0.0
        if f_rdp <= eps_budget:
            start, f_start = t_rdp, f_rdp
    result = _grow_and_find(rdp_eps if name == "rdp" else pld_eps, eps_budget, start, f_start, cap)
    if result == cap and upper is None:
        raise ValueError(
            f"the budget epsilon={eps_budget:g} is not exhausted within {cap} steps (sample_rate={q:g}, "
            f"noise_multiplier={sigma:g}, delta={d:g}); pass `upper` to cap the search"
        )
    return result


def calibrate_noise_multiplier(
    *,
    sample_rate: float,
    steps: int,
    target_epsilon: float,
    delta: float,
    accountant: str = "pld",
    tolerance: float = 1e-3,
    statistics_noise_multiplier: float | None = None,
) -> float:
    """Smallest noise multiplier, on the grid of multiples of `tolerance`, with epsilon <= target.

    Returns sigma = m * tolerance (m whole) with dpsgd_epsilon(sigma) <= target_epsilon and
    dpsgd_epsilon(sigma - tolerance) > target_epsilon, i.e. minimal to within `tolerance` and
    rounded up so the target is met. Searched in NOISE_MULTIPLIER_RANGE = [0.1, 1000]. For "pld"
    the RDP answer (cheap; RDP epsilon >= PLD epsilon) brackets the search. ValueError when the
    target cannot be met within the range, or is already met at its lower end.
    `statistics_noise_multiplier`: as dpsgd_epsilon (the target then covers both, by RDP).
    """
    q = _validate.sample_rate(sample_rate)
    t = _validate.steps(steps)
    d = _validate.delta(delta)
    target = _validate.epsilon(target_epsilon, "target_epsilon")
    tol = _validate.positive("tolerance", tolerance)
    name = _accountant(accountant) if statistics_noise_multiplier is None else "rdp"
    lo_sigma, hi_sigma = NOISE_MULTIPLIER_RANGE
    if tol > 0.1:
        raise ValueError(f"tolerance must be in (0, 0.1] (noise multiplier units); got {tolerance!r}")
    if q == 0.0 or t == 0:
        raise ValueError(
            f"nothing to calibrate: with sample_rate={sample_rate!r} and steps={steps!r} no example is "
            "used, so every noise multiplier gives epsilon 0"
        )
    # Grid sigma = m * tol; epsilon falls as m grows. The bottom of the range (large epsilon,
    # slowest to evaluate) is evaluated only if the search gets there.
    m_lo, m_hi = math.ceil(lo_sigma / tol - 1e-9), math.floor(hi_sigma / tol + 1e-9)
    digits = max(0, -math.floor(math.log10(tol))) + 6

    def sigma_of(m: int) -> float:
        return round(m * tol, digits)

    @functools.lru_cache(maxsize=None)
    def epsilon_at(m: int, which: str) -> float:
        return dpsgd_epsilon(
            sample_rate=q, noise_multiplier=sigma_of(m), steps=t, delta=d, accountant=which,
            statistics_noise_multiplier=statistics_noise_multiplier,
        ).value

    def log_eps_on(which: str) -> Callable[[int], float]:
        return lambda m: log_of(epsilon_at(m, which))

    goal = log_of(target)
    f = log_eps_on(name)
    f_top = f(m_hi)
    if f_top > goal:
        raise ValueError(
            f"target_epsilon={target_epsilon!r} cannot be reached with noise_multiplier <= {hi_sigma:g} "
            f"(epsilon there is {epsilon_at(m_hi, name):.4g} at delta={d:g}, {t} steps, sample_rate={q:g}); "
            "allow a larger epsilon or delta, fewer steps or a smaller sample rate"
        )
    bracketing = "rdp"  # cheap; RDP epsilon >= PLD epsilon
    g = log_eps_on(bracketing) if name == "pld" else f
    g_bottom = g(m_lo)  # RDP at the bottom: if it meets the target, so does PLD
    if g_bottom <= goal:
        raise _already_met(target_epsilon, epsilon_at(m_lo, bracketing))
    if name == "rdp":
        bracket = (m_hi, f_top, m_lo, g_bottom)
    else:
        bracket = _bracket_from_rdp(f, g, goal, (m_lo, g_bottom), (m_hi, f_top))
    m = find_boundary(f, goal, *bracket, log_scale=True)
    if m == m_lo:
        raise _already_met(target_epsilon, epsilon_at(m_lo, name))
    return sigma_of(m)


def _bracket_from_rdp(
    f: Callable[[int], float], g: Callable[[int], float], goal: float,
    bottom: tuple[int, float], top: tuple[int, float],
) -> tuple[int, float, int, float]:
    """(ok, f(ok), fail, f(fail)) around the PLD calibration's answer, found from the RDP answer.

    f and g: log PLD and log RDP epsilon of m; bottom = (m_lo, g(m_lo)) fails the goal under RDP,
    top = (m_hi, f(m_hi)) meets it under PLD. RDP epsilon >= PLD epsilon, so the RDP answer
    meets the goal under PLD too. PLD usually allows 5-15% less noise (up to a third at tiny
    sample rates): one probe below it follows the RDP curve's slope, aiming 10% past the target,
    so that it usually fails and closes the bracket. Without an RDP answer in range, the whole
    range below `top` is the bracket (m_lo - 1: below the range, never evaluated).
    """
    (m_lo, g_bottom), (m_hi, f_top) = bottom, top
    ok, f_ok, fail, f_fail = m_hi, f_top, m_lo - 1, math.inf
    g_top = g(m_hi)
    if g_top > goal:
        return ok, f_ok, fail, f_fail
    m_rdp = find_boundary(g, goal, m_hi, g_top, m_lo, g_bottom, log_scale=True)
    f_rdp = f(m_rdp)
    if f_rdp > goal:  # RDP >= PLD up to the accountants' rounding; search the whole range then
        return ok, f_ok, fail, f_fail
    ok, f_ok = m_rdp, f_rdp
    m_near = max(m_lo, min(m_rdp - 1, int(0.9 * m_rdp)))  # m_rdp > m_lo: the RDP search never returns m_lo
    slope = (g(m_near) - g(m_rdp)) / (math.log(m_near) - math.log(m_rdp))
    if not slope < 0.0:
        return ok, f_ok, fail, f_fail
    probe = min(max(int(m_rdp * math.exp((goal + math.log(1.1) - f_rdp) / slope)), m_lo), m_rdp - 1)
    f_probe = f(probe)
    if f_probe <= goal:
        return probe, f_probe, fail, f_fail
    return ok, f_ok, probe, f_probe


def _already_met(target_epsilon: float, eps_bottom: float) -> ValueError:
    lo_sigma, hi_sigma = NOISE_MULTIPLIER_RANGE
    return ValueError(
        f"target_epsilon={target_epsilon!r} is already met at noise_multiplier={lo_sigma:g} (epsilon "
        f"{eps_bottom:.4g}); the calibrated value would be below the supported range [{lo_sigma:g}, {hi_sigma:g}]"
    )


def _grow_and_find(f: Callable[[int], float], budget: float, lo: int, f_lo: float, cap: int) -> int:
    """Largest x in [lo, cap] with f(x) <= budget, given f(lo) <= budget and f non-decreasing.

    Steps up from lo until f exceeds the budget (or cap is reached), then searches. Each step
    at least doubles x and, where f is known, extrapolates as if f grew like sqrt(x) (epsilon
    of many small steps does, roughly), so few evaluations are spent on the bracket.
    """
    while True:
        guess = 2 * lo + 1
        if lo > 0 and 0.0 < f_lo < budget:
            guess = max(guess, math.ceil(lo * 1.2 * (budget / f_lo) ** 2))
        hi = min(guess, cap)
        if hi <= lo:
            return lo
        f_hi = f(hi)
        if f_hi > budget:
            return find_boundary(f, budget, lo, f_lo, hi, f_hi)
        if hi == cap:
            return cap
        lo, f_lo = hi, f_hi


def _accountant(name: str) -> str:
    if name not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}; got {name!r}")
    return name
