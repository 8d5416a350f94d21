"""The attack risk of a stored run: what its publishable guarantee allows the best membership attacker.

One function, `run_attack_risk(run)`, used by `dpw show --risk`, the report and the window. It
reads only the run's public parameters and calls the pure functions of `engine.privacy.risk`:

- DP-SGD: the Poisson-subsampled Gaussian (sample rate, noise multiplier) over the steps actually
  taken, from the pessimistic PLD. With DP feature statistics (`normalization = "dp"`) the release
  is composed with training by RDP, so the profile is the one implied by that RDP curve.
- PATE: the guarantee is the data-independent bound, whose RDP curve is recomputed from the
  aggregator's noise and the number of queries asked, each charged as answered.
- A non-private run or a reproducible-noise run: no figures, and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.publication import NO_GUARANTEE_IN_SHORT, carries_guarantee, no_guarantee_reason, publishable_epsilon
from engine.rounding import percent_up

BASIS_PLD = "DP-SGD: pessimistic PLD of the Poisson-subsampled Gaussian over the steps taken"
BASIS_RDP_STATISTICS = ("DP-SGD with DP feature statistics: RDP of the training steps composed with the "
                        "statistics' Gaussian release")
BASIS_PRIVATE_STUDY = ("private tuning study: RDP curve of repeat-and-select over its candidates (training and "
                       "noisy score), engine.study")
BASIS_PATE_DI = "PATE: RDP curve of the data-independent bound (every query asked charged as answered)"


@dataclass(frozen=True)
class RunAttackRisk:
    """Attack figures of a run (`risk` is None when there is no guarantee to translate: `reason`)."""

    run_id: int
    risk: Any  # engine.privacy.risk.AttackRisk | None
    basis: str | None
    reason: str | None
    publishable_epsilon: float | None
    delta: float | None

    def to_json(self) -> dict[str, Any]:
        """The `dpw show RUN --risk --json` object: `dpw privacy risk`'s keys plus run, basis and reason."""
        body: dict[str, Any] = {"run": self.run_id, "guarantee": self.risk is not None, "basis": self.basis,
                                "reason": self.reason, "publishable_epsilon": self.publishable_epsilon}
        if self.risk is None:
            body.update(max_advantage=None, tpr_at_fpr=None, posterior=None, tradeoff=None, epsilon=None,
                        delta=self.delta, loss_bound=None)
        else:
            body.update(self.risk.to_json())
        return body


def _no_risk(run: dict[str, Any], reason: str) -> RunAttackRisk:
    eps = publishable_epsilon(run)
    return RunAttackRisk(int(run["id"]), None, None, reason, eps.value, eps.delta)


def run_attack_risk(run: dict[str, Any]) -> RunAttackRisk:
    """Attack figures of `run` (a store row with config and summary) from its public parameters."""
    from engine.privacy import risk

    mechanism = run.get("mechanism")
    if mechanism == "none":
        return _no_risk(run, "non-private run: no bound, an attacker may reach TPR 1 at FPR 0")
    if not carries_guarantee(run):
        short = NO_GUARANTEE_IN_SHORT[no_guarantee_reason(run)]
        return _no_risk(run, f"{short}: no guarantee, so no bound on any attack")
    eps = publishable_epsilon(run)
    if eps.value is None or eps.delta is None:
        return _no_risk(run, eps.note or "nothing was accounted yet (the run took no private step)")
    study = run.get("study") or {}
    if study.get("mode") == "private":
        figures = risk.attack_risk(profile=_private_study_profile(run, study), delta=float(eps.delta))
        return RunAttackRisk(int(run["id"]), figures, BASIS_PRIVATE_STUDY, None, eps.value, float(eps.delta))
    if study.get("mode") == "composition":
        return _no_risk(run, "a run of a composition study: its guarantee covers all the study's runs, whose attack "
                             "figures are not computed yet (this run's own would understate the risk)")
    if mechanism == "dpsgd":
        profile, basis = _dpsgd_profile(run)
    elif mechanism == "pate":
        profile, basis = _pate_profile(run)
    else:
        return _no_risk(run, f"no attack figures for mechanism {mechanism!r}")
    figures = risk.attack_risk(profile=profile, delta=float(eps.delta))
    return RunAttackRisk(int(run["id"]), figures, basis, None, eps.value, float(eps.delta))


def _dpsgd_profile(run: dict[str, Any]):
    config = run.get("config") or {}
    statistics = config.get("normalization_noise_multiplier") if config.get("normalization") == "dp" else None
    return dpsgd_profile(sample_rate=float(run["sample_rate"]), noise_multiplier=float(run["noise_multiplier"]),
                         steps=int(run.get("steps_done") or 0), statistics_noise_multiplier=statistics)


def dpsgd_profile(*, sample_rate: float, noise_multiplier: float, steps: int,
                  statistics_noise_multiplier: float | None = None):
    """(privacy profile, basis) of DP-SGD: the PLD's, or with a DP feature-statistics release the one
    implied by the composed RDP curve (the PLD accountant composes only the training steps)."""
    from engine.privacy import risk

    q, sigma, statistics = sample_rate, noise_multiplier, statistics_noise_multiplier
    if statistics is None:
        return risk.dpsgd_privacy_profile(sample_rate=q, noise_multiplier=sigma, steps=steps), BASIS_PLD
    from engine.privacy.feature_stats import gaussian_rdp
    from engine.privacy.rdp import DEFAULT_ORDERS, compute_rdp

    curve = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps) + gaussian_rdp(
        noise_multiplier=float(statistics), orders=DEFAULT_ORDERS)
    return risk.rdp_privacy_profile(orders=DEFAULT_ORDERS, rdp=curve), BASIS_RDP_STATISTICS


def _private_study_profile(run: dict[str, Any], study: dict[str, Any]):
    """The released run of a private study: the study's RDP curve (engine.study.private_study_rdp)."""
    from engine.privacy import risk
    from engine.privacy.rdp import DEFAULT_ORDERS
    from engine.study import private_study_rdp
    from engine.study_config import StudyConfig

    curve = private_study_rdp(StudyConfig.from_dict(study["config"]), int(run["num_train"]), DEFAULT_ORDERS)
    return risk.rdp_privacy_profile(orders=DEFAULT_ORDERS, rdp=curve)


def pate_data_independent_rdp(run: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP) of a PATE run's data-independent bound: every query asked pays the aggregator's
    noisy argmax and (Confident GNMax) its threshold check (engine.privacy.pate.data_independent_rdp)."""
    from engine.pate.aggregation import aggregator_noise
    from engine.privacy import pate as analysis

    config = run.get("config") or {}
    queries = int((run.get("summary") or {}).get("queries") or 0)
    orders = analysis.PATE_ORDERS
    return orders, analysis.data_independent_rdp(mechanism=config.get("aggregator"), num_queries=queries,
                                                 orders=orders, **aggregator_noise(config))


def _pate_profile(run: dict[str, Any]):
    from engine.privacy import risk

    orders, curve = pate_data_independent_rdp(run)
    return risk.rdp_privacy_profile(orders=orders, rdp=curve), BASIS_PATE_DI


def attacker_statements(figures) -> list[str]:
    """The attack figures (engine.privacy.risk.AttackRisk) in plain words, every number rounded up."""
    tpr = figures.tpr_at_fpr
    lines = []
    if 0.01 in tpr:
        text = (f"An attacker who knows every training record but one, and sees the released model, detects "
                f"whether that record was used with a true-positive rate (TPR) of at most {percent_up(tpr[0.01])} "
                f"at a false-positive rate (FPR) of 1%")
        if 0.001 in tpr:
            text += f", and at most {percent_up(tpr[0.001])} at FPR 0.1%"
        lines.append(text + ".")
    lines.append(f"Whatever test it uses, its advantage (TPR minus FPR) is at most "
                 f"{percent_up(figures.max_advantage)}.")
    post = figures.posterior
    if 0.01 in post and 0.5 in post:
        lines.append(f"An attacker who thought it 1% likely that the record was used ends up at most "
                     f"{percent_up(post[0.01])} sure of it; one who thought it 50% likely, at most "
                     f"{percent_up(post[0.5])} (each except with probability {figures.delta:g}).")
    return lines


def preview_statement(tpr_at_1_percent: float) -> str:
    """One line for the setup preview: the TPR bound at FPR 1%."""
    return (f"An attacker who knows everything but one record detects it with TPR at most "
            f"{percent_up(tpr_at_1_percent)} at 1% FPR.")
