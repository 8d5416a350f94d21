"""Membership-inference audit: how well a score separates training members from held-out non-members.

Scores in (higher = "more likely a member"; for the loss attack of Yeom et al. 2018 the score is
minus the per-example loss), statements out: the ROC curve, AUC (the Mann-Whitney statistic, ties
counted one half), the highest TPR at FPR 1% and 0.1% among threshold rules, each with a percentile
bootstrap interval (members and non-members resampled independently, from the caller's generator),
and a check against the theoretical trade-off curve of the run's guarantee (engine.privacy.risk):

    The empirical ROC of a DP model must lie under the theory curve. The check is simultaneous
    over all thresholds: by the Dvoretzky-Kiefer-Wolfowitz inequality with Massart's constant,
    P(sup_t |F_n(t) - F(t)| > e) <= 2 exp(-2 n e^2), so with probability >= confidence every
    threshold's true TPR is >= tpr_hat - e_m and its true FPR <= fpr_hat + e_n (the miss
    probability split between the two samples). A point with tpr_hat - e_m above the theory
    curve at fpr_hat + e_n contradicts the guarantee at that confidence: a bug or a broken
    assumption (e.g. the model was trained on more than the run accounted for). It is flagged.
    Otherwise the ROC is "not significantly above" the curve, which is weak evidence with few
    examples: the check states its resolution, the smallest TPR at FPR 1% it would have flagged.

A TPR at an FPR below 1 / non-members is not measured (only FPR 0 is left below it, and a bootstrap
interval at that extreme is not valid): it is None, with the reason.

The attack is the simplest one (a global loss threshold); it lower-bounds what an attacker can do,
never the guarantee. Numbers near AUC 0.5 say this attack failed, not that no attack succeeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from engine.rounding import percent

__all__ = ["MembershipAudit", "TheoryCheck", "auc", "membership_audit", "not_measurable", "restated",
           "roc_curve", "theory_check_short", "theory_check_text", "tpr_at_fpr"]

FPR_LEVELS = (0.01, 0.001)
RESOLUTION_FPR = 0.01
"""The FPR at which the theory check states its resolution (the smallest TPR it would flag)."""
LOWER_BOUND_NOTE = "one attack gives a lower bound on the risk: its failing cannot confirm the guarantee"


@dataclass(frozen=True)
class TheoryCheck:
    """Whether the empirical ROC rises above the theory curve, simultaneously at `confidence`.

    `above_theory` is True when some threshold's TPR lower bound exceeds the theory's TPR at that
    threshold's FPR upper bound; `worst` is the point with the largest such margin (fpr, tpr,
    tpr_lower, fpr_upper, theory_tpr, margin), reported whether or not it is a violation.
    `resolution`: the smallest measured TPR at FPR `RESOLUTION_FPR` the check would flag (1.0: none),
    which says how large a violation the band could have seen.
    """

    above_theory: bool
    confidence: float
    band_members: float
    band_nonmembers: float
    worst: dict[str, float]
    message: str
    resolution: dict[str, float] | None = None

    def to_json(self) -> dict:
        return {"above_theory": self.above_theory, "confidence": self.confidence,
                "band": {"members": self.band_members, "nonmembers": self.band_nonmembers},
                "worst": self.worst, "resolution": self.resolution, "message": self.message}


@dataclass(frozen=True)
class MembershipAudit:
    """The statements of a membership-inference audit, each interval at `confidence`. A TPR at an FPR
    below 1 / nonmembers is None (not_measurable says why), with no interval."""

    members: int
    nonmembers: int
    auc: float
    auc_interval: tuple[float, float]
    tpr_at_fpr: dict[float, float | None]
    tpr_interval: dict[float, tuple[float, float] | None]
    roc_fpr: np.ndarray
    roc_tpr: np.ndarray
    confidence: float
    bootstrap: int
    theory: TheoryCheck | None

    def to_json(self) -> dict:
        """The `mia` object of `dpw audit --json` (FPR keys as strings, e.g. "0.01")."""
        return {
            "auc": self.auc,
            "auc_interval": list(self.auc_interval),
            "tpr_at_fpr": {f"{k:g}": v for k, v in self.tpr_at_fpr.items()},
            "tpr_interval": {f"{k:g}": None if v is None else list(v) for k, v in self.tpr_interval.items()},
            "tpr_not_measurable": {f"{k:g}": why for k in self.tpr_at_fpr
                                   if (why := not_measurable(k, self.nonmembers)) is not None},
            "confidence": self.confidence,
            "bootstrap": self.bootstrap,
            "members": self.members,
            "nonmembers": self.nonmembers,
            "roc": {"fpr": self.roc_fpr.tolist(), "tpr": self.roc_tpr.tolist()},
            "theory": None if self.theory is None else self.theory.to_json(),
        }


def _scores(name: str, values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError(f"{name} is empty: the audit needs at least one score of each kind")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds a NaN or infinite score; pass finite scores (e.g. clip the losses)")
    return x


def roc_curve(*, member_scores, nonmember_scores) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) of the rules "member if score >= t" over every distinct score t, from (0, 0) to (1, 1)."""
    m = _scores("member_scores", member_scores)
    n = _scores("nonmember_scores", nonmember_scores)
    values = np.concatenate([m, n])
    is_member = np.concatenate([np.ones(m.size), np.zeros(n.size)])
    order = np.argsort(-values, kind="stable")
    values, is_member = values[order], is_member[order]
    last_of_value = np.r_[values[1:] != values[:-1], True]  # ties enter the curve together
    tp = np.cumsum(is_member)[last_of_value]
    fp = np.cumsum(1.0 - is_member)[last_of_value]
    return np.r_[0.0, fp / n.size], np.r_[0.0, tp / m.size]


def _auc_rows(members: np.ndarray, nonmembers: np.ndarray) -> np.ndarray:
    """AUC of each row pair (Mann-Whitney U / (n_m n_n), ties one half)."""
    both = np.concatenate([members, nonmembers], axis=-1)
    ranks = stats.rankdata(both, axis=-1)
    k_m, k_n = members.shape[-1], nonmembers.shape[-1]
    u = ranks[..., :k_m].sum(axis=-1) - k_m * (k_m + 1) / 2.0
    return u / (k_m * k_n)


def auc(*, member_scores, nonmember_scores) -> float:
    """Area under the ROC curve: P(member score > non-member score) + P(equal) / 2."""
    m = _scores("member_scores", member_scores)
    n = _scores("nonmember_scores", nonmember_scores)
    return float(_auc_rows(m, n))


def _tpr_rows(members: np.ndarray, nonmembers: np.ndarray, level: float) -> np.ndarray:
    """Highest TPR of "member if score > t" with FPR <= level, per row: t is the (k+1)-th largest
    non-member score, k = floor(level n), so at most k non-members lie strictly above it."""
    k = int(math.floor(level * nonmembers.shape[-1] + 1e-9))
    if k >= nonmembers.shape[-1]:
        return np.ones(members.shape[:-1])
    threshold = -np.partition(-nonmembers, k, axis=-1)[..., k]
    return (members > threshold[..., None]).mean(axis=-1)


def tpr_at_fpr(*, member_scores, nonmember_scores, fpr: float) -> float:
    """Highest TPR of a threshold rule whose empirical FPR is at most `fpr` (ties count against it)."""
    m = _scores("member_scores", member_scores)
    n = _scores("nonmember_scores", nonmember_scores)
    return float(_tpr_rows(m, n, float(fpr)))


def not_measurable(level: float, nonmembers: int) -> str | None:
    """Why TPR at FPR `level` cannot be measured from `nonmembers` held-out examples, None when it can:
    below FPR 1 / nonmembers the only rule left is FPR 0, where a bootstrap interval is not valid."""
    if level * nonmembers >= 1.0 - 1e-9:
        return None
    return (f"not measurable with {nonmembers:,} non-members (FPR {percent(level)} needs at least "
            f"{math.ceil(1.0 / level - 1e-9):,})")


def _resolution_words(theory: dict) -> str | None:
    """"only a TPR above 27.2% at FPR 1% would have been flagged" from a TheoryCheck's JSON (None for one
    recorded before the resolution was)."""
    resolution = theory.get("resolution")
    if not resolution:
        return None
    at = f"at FPR {percent(resolution['fpr'])}"
    if resolution["tpr"] >= 1.0:
        return f"no TPR {at} would have been flagged"
    return f"only a TPR above {100 * resolution['tpr']:.3g}% {at} would have been flagged"


def theory_check_text(theory: dict, *, members: int, nonmembers: int) -> str:
    """The theory check in words, from a TheoryCheck's JSON: a violation as found; otherwise "not
    significantly above", how large a rise the band could see, and that one attack confirms nothing."""
    if theory.get("above_theory"):
        return theory["message"]
    band = f"{100 * theory['confidence']:g}% band"
    words = _resolution_words(theory)
    if words is not None:
        band += f": with {members:,} members and {nonmembers:,} non-members, {words}"
    return f"not significantly above the guarantee's curve ({band}); {LOWER_BOUND_NOTE}"


def theory_check_short(theory: dict) -> str:
    """The theory check in a few words, for a one-line summary."""
    if theory.get("above_theory"):
        return "ABOVE the guarantee's curve: a bug or a broken assumption"
    words = _resolution_words(theory)
    return ("not significantly above the guarantee's curve" + (f", where {words}" if words else "")
            + "; a lower bound on the risk, not a confirmation")


def restated(mia: dict) -> dict:
    """A MembershipAudit's JSON kept from an earlier version, with today's statements: TPRs below FPR
    1 / non-members as None with the reason, and the theory check's words."""
    out = {**mia, "tpr_at_fpr": dict(mia["tpr_at_fpr"]), "tpr_interval": dict(mia["tpr_interval"]),
           "tpr_not_measurable": {}}
    for key in mia["tpr_at_fpr"]:
        why = not_measurable(float(key), mia["nonmembers"])
        if why is not None:
            out["tpr_at_fpr"][key] = out["tpr_interval"][key] = None
            out["tpr_not_measurable"][key] = why
    theory = mia.get("theory")
    if theory and not theory.get("above_theory"):
        out["theory"] = {**theory, "message": theory_check_text(theory, members=mia["members"],
                                                                nonmembers=mia["nonmembers"])}
    return out


def _dkw_band(n: int, miss: float) -> float:
    """e with P(sup |F_n - F| > e) <= miss for n samples (DKW with Massart's constant)."""
    return math.sqrt(math.log(2.0 / miss) / (2.0 * n))


def _theory_at(theory_fpr: np.ndarray, theory_tpr: np.ndarray, fpr: np.ndarray) -> np.ndarray:
    """The theory TPR at `fpr`, read at the next grid point at or above it (the curve is non-decreasing,
    so this never understates it: the check errs towards not flagging)."""
    k = np.searchsorted(theory_fpr, np.minimum(fpr, 1.0), side="left")
    return np.where(k < theory_fpr.size, theory_tpr[np.minimum(k, theory_fpr.size - 1)], 1.0)


def check_against_theory(*, member_scores, nonmember_scores, theory_fpr, theory_tpr,
                         confidence: float = 0.95) -> TheoryCheck:
    """Does the empirical ROC rise above the theory curve beyond its simultaneous confidence band?"""
    m = _scores("member_scores", member_scores)
    n = _scores("nonmember_scores", nonmember_scores)
    grid = np.asarray(theory_fpr, dtype=float).ravel()
    curve = np.asarray(theory_tpr, dtype=float).ravel()
    if grid.size == 0 or grid.shape != curve.shape or np.any(np.diff(grid) < 0):
        raise ValueError("theory_fpr and theory_tpr must be equally long, non-empty, with theory_fpr increasing")
    c = _confidence(confidence)
    miss = (1.0 - c) / 2.0
    band_m, band_n = _dkw_band(m.size, miss), _dkw_band(n.size, miss)
    fpr, tpr = roc_curve(member_scores=m, nonmember_scores=n)
    tpr_lower = np.maximum(tpr - band_m, 0.0)
    fpr_upper = np.minimum(fpr + band_n, 1.0)
    theory = _theory_at(grid, curve, fpr_upper)
    margin = tpr_lower - theory
    i = int(np.argmax(margin))
    worst = {"fpr": float(fpr[i]), "tpr": float(tpr[i]), "tpr_lower": float(tpr_lower[i]),
             "fpr_upper": float(fpr_upper[i]), "theory_tpr": float(theory[i]), "margin": float(margin[i])}
    above = bool(margin[i] > 0.0)
    flagged_from = float(_theory_at(grid, curve, np.array([RESOLUTION_FPR + band_n]))[0]) + band_m
    resolution = {"fpr": RESOLUTION_FPR, "tpr": min(flagged_from, 1.0)}
    if above:
        message = (f"EMPIRICAL ROC ABOVE THE THEORETICAL BOUND: at FPR {fpr[i]:.4g} the attack reaches TPR "
                   f"{tpr[i]:.4g} (at least {tpr_lower[i]:.4g} at {100 * c:g}% confidence), the guarantee allows "
                   f"at most {theory[i]:.4g} at FPR {fpr_upper[i]:.4g}: a bug or a broken assumption "
                   f"(the guarantee does not hold for this model as trained)")
    else:
        message = theory_check_text({"above_theory": False, "confidence": c, "resolution": resolution},
                                    members=m.size, nonmembers=n.size)
    return TheoryCheck(above, c, band_m, band_n, worst, message, resolution)


def _confidence(value: float) -> float:
    c = float(value)
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {value!r}")
    return c


def membership_audit(
    *,
    member_scores,
    nonmember_scores,
    rng: np.random.Generator,
    confidence: float = 0.95,
    bootstrap: int = 1000,
    fpr_levels: Sequence[float] = FPR_LEVELS,
    theory_fpr=None,
    theory_tpr=None,
) -> MembershipAudit:
    """AUC, TPR at `fpr_levels` with percentile bootstrap intervals at `confidence` (None at a level
    below 1 / non-members: not_measurable), the ROC curve, and (given the theory curve) the check that
    the ROC does not rise above it.

    `rng` drives the bootstrap resampling only (pass a seeded generator for repeatable intervals).
    """
    m = _scores("member_scores", member_scores)
    n = _scores("nonmember_scores", nonmember_scores)
    c = _confidence(confidence)
    if int(bootstrap) < 1:
        raise ValueError(f"bootstrap must be a number of resamples >= 1; got {bootstrap!r}")
    levels = [float(a) for a in fpr_levels]
    fpr, tpr = roc_curve(member_scores=m, nonmember_scores=n)
    point_auc = float(_auc_rows(m, n))
    measurable = [a for a in levels if not_measurable(a, n.size) is None]
    point_tpr = {a: float(_tpr_rows(m, n, a)) if a in measurable else None for a in levels}
    lo_q, hi_q = (1.0 - c) / 2.0, (1.0 + c) / 2.0
    aucs, tprs = [], {a: [] for a in measurable}
    chunk = max(1, 2_000_000 // (m.size + n.size))  # bound the memory of a resample block
    for start in range(0, int(bootstrap), chunk):
        rows = min(chunk, int(bootstrap) - start)
        bm = m[rng.integers(0, m.size, size=(rows, m.size))]
        bn = n[rng.integers(0, n.size, size=(rows, n.size))]
        aucs.append(_auc_rows(bm, bn))
        for a in measurable:
            tprs[a].append(_tpr_rows(bm, bn, a))
    all_auc = np.concatenate(aucs)
    auc_interval = (float(np.quantile(all_auc, lo_q)), float(np.quantile(all_auc, hi_q)))
    tpr_interval = {a: None for a in levels}
    for a in measurable:
        values = np.concatenate(tprs[a])
        tpr_interval[a] = (float(np.quantile(values, lo_q)), float(np.quantile(values, hi_q)))
    theory = None
    if theory_fpr is not None and theory_tpr is not None:
        theory = check_against_theory(member_scores=m, nonmember_scores=n, theory_fpr=theory_fpr,
                                      theory_tpr=theory_tpr, confidence=c)
    return MembershipAudit(m.size, n.size, point_auc, auc_interval, point_tpr, tpr_interval, fpr, tpr, c,
                           int(bootstrap), theory)
