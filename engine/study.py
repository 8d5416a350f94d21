"""Run a tuning study: its candidate runs through the ordinary run machinery, then one privacy
statement for the group.

Modes (engine.study_config):
- `private` [PS22]: the number of candidates K is drawn from the study's secret generator
  (engine.randomness; seeded only with reproducible_noise), and so is each candidate's setting
  (uniform over the space: the candidates are one randomised algorithm repeated). Each candidate
  is scored on the private test split: its count of correct answers plus Gaussian noise of std
  `score_noise_multiplier` (sensitivity 1 under add/remove), whose RDP alpha / (2 sigma^2) is added
  to the candidate's. No public validation data exists for the built-in datasets, and the test split
  is the same private data, so its exact accuracy may not choose (it would leak through the choice).
  Only the best candidate is released; the study's epsilon is the repeat-and-select bound
  (engine.privacy.tuning) of the pointwise maximum of the RDP curves of every setting the search
  could draw. K itself is not part of the release (the released run's statement never names it).
- `composition`: every run may be released; the study's epsilon is their RDP curves summed.
- `exploratory`: the runs are compared freely and the best (by test accuracy) is marked selected;
  nothing is claimed for the selection (engine.publication.EXPLORATORY_NOTE).

[PS22] N. Papernot, T. Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from engine.config import RunConfig
from engine.privacy.rdp import DEFAULT_ORDERS, compute_rdp, rdp_to_epsilon
from engine.privacy.tuning import repeat_and_select_rdp, sample_num_runs
from engine.privacy.types import Epsilon
from engine.randomness import PrivateRandomness
from engine.store import Store, now_iso
from engine.study_config import StudyConfig

Launch = Callable[[int], str]  # run id -> final status ("finished", "stopped", "failed")
Emit = Callable[..., Any]
PRIVATE_ACCOUNTANT = "rdp-repeat-and-select"
COMPOSITION_ACCOUNTANT = "rdp-composition"


@dataclass
class StudyPlan:
    """The candidates a study will run (settings and configs, in order) and how K was drawn."""

    settings: list[dict[str, Any]]
    configs: list[RunConfig]
    randomness: PrivateRandomness | None = field(default=None, repr=False)


@dataclass
class StudyResult:
    study_id: int
    status: str
    run_ids: list[int]
    released_run_id: int | None
    epsilon: Epsilon | None
    scores: dict[int, float]


# ---- planning -------------------------------------------------------------------------------------
def study_randomness(config: StudyConfig) -> PrivateRandomness:
    """The study's secret generator (the base run's noise settings: reproducible_noise seeds it)."""
    return PrivateRandomness.for_run(config.base)


def plan_candidates(config: StudyConfig, randomness: PrivateRandomness | None = None) -> StudyPlan:
    """Which candidates to run. Private: K ~ D(mean_runs, shape) and each setting drawn uniformly,
    both from the secret generator. Grid: every combination. Random: num_candidates settings drawn
    with the public `seed`."""
    if config.mode == "private":
        randomness = randomness or study_randomness(config)
        k = sample_num_runs(rng=randomness.numpy_generator("study_num_runs"), mean_runs=config.mean_runs,
                            shape=config.shape)
        settings = _draw_settings(config, randomness.numpy_generator("study_settings"), k)
    elif config.search == "grid":
        settings = config.grid()
    else:
        settings = _draw_settings(config, np.random.default_rng(config.seed), config.num_candidates)
    configs = [config.candidate(s) for s in settings]
    return StudyPlan(settings, configs, randomness)


def _draw_settings(config: StudyConfig, rng: Any, count: int) -> list[dict[str, Any]]:
    """`count` settings, each field's value uniform over its list (one `rng.random()` per field)."""
    settings = []
    for _ in range(count):
        setting = {}
        for key, values in config.space.items():
            index = min(int(float(rng.random()) * len(values)), len(values) - 1)
            setting[key] = values[index]
        settings.append(setting)
    return settings


# ---- accounting -------------------------------------------------------------------------------------
def candidate_rdp(config: RunConfig, num_train: int, orders=DEFAULT_ORDERS) -> np.ndarray:
    """RDP curve of one DP-SGD candidate's training, from its public plan (as its runner plans it)."""
    from engine.dpsgd.trainer import plan_privacy

    plan = plan_privacy(config, num_train)
    return compute_rdp(sample_rate=plan.sample_rate, noise_multiplier=plan.noise_multiplier,
                       steps=plan.steps_planned, orders=orders)


def score_rdp(score_noise_multiplier: float, orders=DEFAULT_ORDERS) -> np.ndarray:
    """RDP of releasing a count (sensitivity 1) with Gaussian noise of std sigma: alpha / (2 sigma^2)
    [Mironov 2017, Prop. 7], as compute_rdp's unsubsampled single step."""
    return compute_rdp(sample_rate=1.0, noise_multiplier=score_noise_multiplier, steps=1, orders=orders)


def private_study_rdp(config: StudyConfig, num_train: int, orders=DEFAULT_ORDERS) -> np.ndarray:
    """The RDP curve of a private study at `orders` [PS22, Thms. 2 and 6]: repeat-and-select of one
    candidate whose curve is the pointwise maximum, over every setting the search can draw, of its
    training plus its noisy score (a mixture of mechanisms is bounded by the worst, Renyi divergence
    being quasi-convex). Attack figures of the released run can be read off this curve."""
    curves = [candidate_rdp(config.candidate(s), num_train, orders) for s in config.grid()]
    candidate = np.max(curves, axis=0) + score_rdp(config.score_noise_multiplier, orders)
    return repeat_and_select_rdp(orders=orders, rdp=candidate, mean_runs=config.mean_runs, shape=config.shape)


def private_study_epsilon(config: StudyConfig, num_train: int, orders=DEFAULT_ORDERS) -> Epsilon:
    """The (epsilon, delta) of a private study: its RDP curve (private_study_rdp) at the base's delta."""
    eps = rdp_to_epsilon(orders=orders, rdp=private_study_rdp(config, num_train, orders), delta=config.base.delta)
    return Epsilon(value=eps.value, delta=eps.delta, accountant=PRIVATE_ACCOUNTANT, order=eps.order)


def composition_epsilon(configs: list[RunConfig], num_train: int, delta: float, orders=DEFAULT_ORDERS) -> Epsilon:
    """Every candidate released: the sum of their RDP curves, converted at `delta`."""
    total = np.sum([candidate_rdp(c, num_train, orders) for c in configs], axis=0) if configs else \
        np.zeros(len(orders))
    eps = rdp_to_epsilon(orders=orders, rdp=total, delta=delta)
    return Epsilon(value=eps.value, delta=eps.delta, accountant=COMPOSITION_ACCOUNTANT, order=eps.order)


def training_size(config: RunConfig) -> int:
    """N, the training split's size (public under add/remove, as every run's plan treats it)."""
    from engine.runs import prepare

    return prepare(config).data.num_train


# ---- running -------------------------------------------------------------------------------------
def run_study(config: StudyConfig, store: Store, launch: Launch, *, emit: Emit | None = None,
              plan: StudyPlan | None = None) -> StudyResult:
    """Store the study, run its candidates one after another with `launch` (run id -> status), score
    them, choose the released run and record the study's epsilon. A stopped candidate stops the study
    (status "stopped": a private study then releases nothing, as its K was not run)."""
    emit = emit or (lambda *a, **k: None)
    plan = plan or plan_candidates(config)
    accounted = config.mode in ("private", "composition")
    num_train = training_size(plan.configs[0] if plan.configs else config.candidate(config.grid()[0])) \
        if accounted else None
    study_id = store.create_study(name=config.name, mode=config.mode,
                                  config=json.dumps(config.to_dict(), sort_keys=True))
    emit("study", study_id=study_id, mode=config.mode, candidates=len(plan.configs))
    run_ids: list[int] = []
    status = "finished"
    for index, run_config in enumerate(plan.configs):
        run_id = store.create_run(run_config)
        store.update_run(run_id, study_id=study_id)
        run_ids.append(run_id)
        emit("candidate", index=index + 1, run_id=run_id, setting=plan.settings[index])
        if launch(run_id) == "stopped":
            status = "stopped"
            break
    store.update_study(study_id, num_candidates=len(run_ids))
    runs = [store.get_run(r) for r in run_ids]
    scores = _scores(config, runs, plan)
    released = max(scores, key=scores.get) if scores and status == "finished" else None
    epsilon = None
    if config.mode == "private" and status == "finished":
        epsilon = private_study_epsilon(config, num_train)
    elif config.mode == "composition":
        epsilon = composition_epsilon([RunConfig.from_dict(r["config"]) for r in runs], num_train, config.base.delta)
    store.update_study(study_id, status=status, finished=now_iso(), released_run_id=released,
                       epsilon=None if epsilon is None else epsilon.value,
                       delta=None if epsilon is None else epsilon.delta,
                       accountant=None if epsilon is None else epsilon.accountant)
    emit("study_finished", study_id=study_id, status=status, released_run_id=released,
         epsilon=None if epsilon is None else epsilon.value)
    return StudyResult(study_id, status, run_ids, released, epsilon, scores)


def _scores(config: StudyConfig, runs: list[dict[str, Any]], plan: StudyPlan) -> dict[int, float]:
    """Each finished candidate's score. Private: its noisy count of correct test answers (noise from
    the study's secret generator); otherwise its test accuracy. Failed candidates have none."""
    finished = [r for r in runs if r["status"] == "finished" and r.get("accuracy") is not None]
    if config.mode != "private":
        return {r["id"]: float(r["accuracy"]) for r in finished}
    rng = (plan.randomness or study_randomness(config)).numpy_generator("study_score")
    scores = {}
    for r in runs:  # one draw per candidate, finished or not, so the draws do not depend on outcomes
        noise = float(rng.normal(0.0, config.score_noise_multiplier))
        if r in finished:
            scores[r["id"]] = round(float(r["accuracy"]) * int(r["num_test"])) + noise
    return scores


def study_runs(store: Store, study_id: int) -> list[dict[str, Any]]:
    return [r for r in store.list_runs() if r.get("study_id") == study_id]
