"""Privacy accounting for DP-SGD: pure functions of numbers (numpy/scipy only, no I/O, no state).

Mechanism: Poisson sampling with rate `sample_rate`, per-example clipping to norm C, Gaussian
noise of std `noise_multiplier` * C on the sum; neighbouring datasets differ by adding or
removing one example. Every function returns an upper bound on epsilon (or delta).

    rdp.py          Renyi DP of the subsampled Gaussian and the RDP -> (eps, delta) conversion
    pld.py          privacy loss distributions: tight (eps, delta), pessimistic discretisation
    accountants.py  what the trainer, CLI and window call (named accountants, curves, budgets)
    group.py        group privacy: the bound for k examples (one person's several rows)
    risk.py         epsilon in attacker's terms: f-DP trade-off curve, advantage, TPR, posterior
    tuning.py       a tuning study: K random candidates, best released (repeat-and-select RDP)
"""

from engine.privacy.accountants import (
    ACCOUNTANTS,
    NOISE_MULTIPLIER_RANGE,
    LiveAccountant,
    calibrate_noise_multiplier,
    dpsgd_epsilon,
    epsilon_curve,
    max_steps_within_budget,
)
from engine.privacy.group import GroupBound, group_bound
from engine.privacy.pld import pld_delta, pld_epsilon
from engine.privacy.rdp import DEFAULT_ORDERS, compute_rdp, rdp_to_epsilon
from engine.privacy.risk import (
    AttackRisk,
    PrivacyProfile,
    attack_risk,
    calibrate_noise_multiplier_for_attack,
    dpsgd_attack_risk,
    dpsgd_privacy_profile,
    highest_tpr,
    rdp_privacy_profile,
)
from engine.privacy.tuning import TuningEpsilon, repeat_and_select_rdp, sample_num_runs, tuning_epsilon
from engine.privacy.types import Epsilon

__all__ = [
    "ACCOUNTANTS",
    "GroupBound",
    "group_bound",
    "AttackRisk",
    "PrivacyProfile",
    "attack_risk",
    "calibrate_noise_multiplier_for_attack",
    "dpsgd_attack_risk",
    "dpsgd_privacy_profile",
    "highest_tpr",
    "rdp_privacy_profile",
    "DEFAULT_ORDERS",
    "NOISE_MULTIPLIER_RANGE",
    "Epsilon",
    "TuningEpsilon",
    "LiveAccountant",
    "calibrate_noise_multiplier",
    "compute_rdp",
    "dpsgd_epsilon",
    "epsilon_curve",
    "max_steps_within_budget",
    "pld_delta",
    "pld_epsilon",
    "rdp_to_epsilon",
    "repeat_and_select_rdp",
    "sample_num_runs",
    "tuning_epsilon",
]
