"""One-run canary audit: an epsilon lower bound from guesses about randomly included canaries.

Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023
(arXiv:2305.08846). m canaries are each included independently with probability 1/2; after one
training run the auditor guesses "in" or "out" for r of them (abstaining on the rest) and v guesses
are right. Their Theorem 1 (main result): if the training is (eps, delta)-DP, then

    P[v correct or more] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i,

    f(k) = P[Binomial(r, q) >= k],  q = e^eps / (1 + e^eps)

(for delta = 0, the correct guesses are dominated by r tosses of eps-randomized response). That
right-hand side is a p-value for the hypothesis "the training is (eps, delta)-DP"; the largest eps
rejected at level 1 - confidence is a lower bound on the true epsilon at that confidence.

How many guesses to make must be fixed before any score is seen. Black-box scores (input canaries)
cannot be predicted, so several shares are tried at a Bonferroni-corrected level (`canary_audit`).
White-box gradient canaries are scored by the exact likelihood ratio of the subsampled Gaussian, whose
distribution follows from the run's public parameters alone: `plan_gradient_guesses` simulates that
ideal audit and picks the counts of "in" and "out" guesses with the best expected bound, which are then
tested at the full confidence.
Pure numpy/scipy; which examples are canaries and their scores come from training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

__all__ = ["CanaryAudit", "CanaryGuesses", "canary_audit", "canary_guesses", "epsilon_lower_bound", "p_value",
           "plan_gradient_guesses"]

GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.25)
"""The auditor guesses "in" for this share of the canaries (the highest scores) and "out" for as many (the
lowest), abstaining on the rest [SNJ23, Sec. 5]. Abstaining on the uncertain middle makes the bound tight,
but how much to abstain depends on how well the scores separate (a memorising model: guess a lot; DP
noise: guess only the extremes). Each share is tried and the best bound kept, each tested at level
(1 - confidence) / (number of shares) (Bonferroni): the shares are fixed before any score is seen, so the
kept bound holds at the stated confidence."""


def _counts(canaries: int, guesses: int, correct: int) -> tuple[int, int, int]:
    m, r, v = (int(x) for x in (canaries, guesses, correct))
    if not 0 <= v <= r <= m or m < 1:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries and canaries >= 1; got correct={correct}, "
                         f"guesses={guesses}, canaries={canaries}")
    return m, r, v


def p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float = 0.0) -> float:
    """Probability of at least `correct` right guesses out of `guesses` if the training is
    (epsilon, delta)-DP [SNJ23, Theorem 1]; capped at 1."""
    m, r, v = _counts(canaries, guesses, correct)
    if not (epsilon >= 0.0) or not 0.0 <= delta <= 1.0:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1]; got epsilon={epsilon!r}, delta={delta!r}")
    q = float(special.expit(epsilon))  # accuracy of epsilon-randomized response
    tail = float(stats.binom.sf(v - 1, r, q))  # f(v) = P[Bin(r, q) >= v]
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    # f(v - i) - f(v) = P[v - i <= Bin < v] = sum_{k=v-i}^{v-1} pmf(k), for i = 1..v
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    slope = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * slope, 1.0)


def epsilon_lower_bound(*, canaries: int, guesses: int, correct: int, delta: float = 0.0,
                        confidence: float = 0.95, tolerance: float = 1e-6) -> float:
    """The largest epsilon that `correct` of `guesses` right rejects at `confidence`: the training is
    not (epsilon, delta)-DP for any smaller epsilon, except with probability 1 - confidence.
    0 when even epsilon = 0 is not rejected. Found by bisection (the p-value rises with epsilon),
    rounded down by at most `tolerance`."""
    m, r, v = _counts(canaries, guesses, correct)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence!r}")
    level = 1.0 - confidence

    def excess(eps: float) -> float:
        return p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=delta) - level

    if excess(0.0) >= 0.0:
        return 0.0
    high = 1.0
    while excess(high) < 0.0:
        high *= 2.0
        if high > 1e4:
            return math.inf  # every finite epsilon rejected (cannot happen with v <= r < inf)
    root = optimize.brentq(excess, 0.0, high, xtol=tolerance / 4, rtol=1e-12)
    return max(0.0, root - tolerance / 2)


@dataclass(frozen=True)
class CanaryGuesses:
    """The auditor's guesses: `guesses` made (abstaining on the rest), `correct` of them right."""

    canaries: int
    guesses: int
    correct: int


def canary_guesses(*, scores, included, guess_in: int, guess_out: int) -> CanaryGuesses:
    """Guess "in" for the `guess_in` highest-scoring canaries and "out" for the `guess_out` lowest,
    abstain on the rest [SNJ23, Sec. 5]; count the right guesses against `included`."""
    s = np.asarray(scores, dtype=float).ravel()
    inc = np.asarray(included, dtype=bool).ravel()
    if s.shape != inc.shape or s.size == 0 or not np.all(np.isfinite(s)):
        raise ValueError("scores and included must be equally long, non-empty and finite")
    k_in, k_out = int(guess_in), int(guess_out)
    if k_in < 0 or k_out < 0 or k_in + k_out > s.size:
        raise ValueError(f"guess_in + guess_out must be at most the {s.size} canaries; got {k_in} + {k_out}")
    order = np.argsort(s, kind="stable")
    right = int(inc[order[s.size - k_in:]].sum()) if k_in else 0
    right += int((~inc[order[:k_out]]).sum())
    return CanaryGuesses(int(s.size), k_in + k_out, right)


@dataclass(frozen=True)
class CanaryAudit:
    """The result of a one-run canary audit: all that may leave the run (never which canaries were in)."""

    count: int
    kind: str
    guesses: int
    correct: int
    epsilon_lower_bound: float
    confidence: float
    delta: float

    def to_json(self) -> dict:
        return {"count": self.count, "kind": self.kind, "epsilon_lower_bound": self.epsilon_lower_bound,
                "confidence": self.confidence, "delta": self.delta, "guesses": self.guesses,
                "correct": self.correct}


def canary_audit(*, scores, included, kind: str, delta: float, confidence: float = 0.95,
                 guess_fractions=GUESS_FRACTIONS, planned: tuple[int, int] | None = None) -> CanaryAudit:
    """Guess on the highest and as many lowest `scores` (higher = more likely included) for each share
    in `guess_fractions`, count the right guesses against `included`, and keep the largest epsilon lower
    bound, each share tested at (1 - confidence) / len(shares) so the result holds at `confidence` for
    the run's `delta` [SNJ23, Theorem 1; Bonferroni over the shares]. `planned` = (guess_in, guess_out)
    fixed before the scores were seen (`plan_gradient_guesses`) replaces the shares and is tested at the
    full `confidence`."""
    s = np.asarray(scores, dtype=float).ravel()
    m = int(s.size)
    if m < 1:
        raise ValueError("a canary audit needs at least one canary")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence!r}")
    if planned is not None:
        sides = [(int(planned[0]), int(planned[1]))]
    else:
        if not guess_fractions or not all(0.0 < f <= 0.5 for f in guess_fractions):
            raise ValueError(f"guess_fractions must be shares in (0, 0.5]; got {guess_fractions!r}")
        sides = [(k, k) for k in sorted({min(m // 2, max(1, int(round(f * m)))) for f in guess_fractions} - {0})]
    best = CanaryAudit(m, kind, 0, 0, 0.0, float(confidence), float(delta))
    each = 1.0 - (1.0 - confidence) / max(1, len(sides))
    for k_in, k_out in sides:
        guesses = canary_guesses(scores=s, included=included, guess_in=k_in, guess_out=k_out)
        bound = epsilon_lower_bound(canaries=m, guesses=guesses.guesses, correct=guesses.correct, delta=delta,
                                    confidence=each)
        if bound > best.epsilon_lower_bound or best.guesses == 0:
            best = CanaryAudit(m, kind, guesses.guesses, guesses.correct, float(bound), float(confidence),
                               float(delta))
    return best


def plan_gradient_guesses(*, canaries: int, sample_rate: float, noise_multiplier: float, steps: int, delta: float,
                          confidence: float = 0.95, simulations: int = 6) -> tuple[int, int]:
    """(guess_in, guess_out) with the best mean bound in `simulations` ideal white-box audits of `canaries`
    gradient canaries: each included with probability 1/2, joining each of `steps` steps with probability
    `sample_rate`, seen as N(joined, noise_multiplier^2) and scored by the summed log-likelihood ratio
    (exactly engine.dpsgd.canaries.GradientCanaries' score). Uses only the run's public parameters, never
    its scores, so the plan may be tested at the full confidence. The simulation's draws decide only how
    many guesses to make, not any released value, so they come from a fixed public seed."""
    m, q, sigma, t = int(canaries), float(sample_rate), float(noise_multiplier), int(steps)
    if m < 2 or t < 1 or not 0.0 < q <= 1.0 or not sigma > 0.0:
        raise ValueError(f"need canaries >= 2, steps >= 1, sample_rate in (0, 1] and noise_multiplier > 0; got "
                         f"canaries={canaries}, steps={steps}, sample_rate={sample_rate}, "
                         f"noise_multiplier={noise_multiplier}")
    rng = np.random.default_rng(0)
    runs = max(2, min(int(simulations), int(6e7 // (m * t))))  # at most ~6e7 draws in all
    half = m // 2
    ins = sorted({max(1, int(round(k))) for k in np.geomspace(min(5, half), half, 14)})
    outs = [0, *ins]
    totals: dict[tuple[int, int], float] = {}
    for _ in range(runs):
        scores, included = _ideal_gradient_scores(m, q, sigma, t, rng)
        order = included[np.argsort(scores, kind="stable")]
        right_in = np.cumsum(order[::-1])  # right among the k highest
        right_out = np.cumsum(~order)  # right among the k lowest
        for k_in in ins:
            for k_out in outs:
                if k_in + k_out > m:
                    continue
                right = int(right_in[k_in - 1]) + (int(right_out[k_out - 1]) if k_out else 0)
                bound = epsilon_lower_bound(canaries=m, guesses=k_in + k_out, correct=right, delta=delta,
                                            confidence=confidence, tolerance=1e-3)
                totals[(k_in, k_out)] = totals.get((k_in, k_out), 0.0) + bound
    return max(totals, key=lambda k: (totals[k], -sum(k)))


def _ideal_gradient_scores(m: int, q: float, sigma: float, steps: int, rng: np.random.Generator):
    """One simulated white-box audit: summed per-step log-likelihood ratios and which canaries were in."""
    included = rng.random(m) < 0.5
    log_out, log_in = math.log1p(-q) if q < 1.0 else -math.inf, math.log(q)
    scores = np.zeros(m)
    for _ in range(steps):
        x = rng.standard_normal(m) * sigma
        x += included & (rng.random(m) < q)
        scores += np.logaddexp(log_out, log_in + (2.0 * x - 1.0) / (2.0 * sigma * sigma))
    return scores, included
