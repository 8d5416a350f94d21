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
- `composition`: every run may be released; the study's epsilon composes all of them: DP-SGD runs
  by PLD (engine.privacy.pld.pld_epsilon_composed, each run its own sample rate, noise and steps),
  PATE runs by summing their data-independent RDP curves.
- `exploratory`: the runs are compared freely and the best (by test accuracy) is marked selected;
  nothing is claimed for the selection (engine.publication.EXPLORATORY_NOTE).

A PATE candidate is accounted by its data-independent bound: every one of its `num_queries` answered
[PSMRTE18] (its data-dependent and smooth-sensitivity figures are functions of the votes and not a
bound a search over settings can use).

A study that stops early (Stop, SIGTERM: "stopped"; its process killed: "interrupted", by
Store.reconcile_studies) releases nothing chosen, and its epsilon is the composition of every
candidate started (as planned, so a candidate cut short or still finishing on its own is covered).
For a private study this is the bound that holds, not the repeat-and-select one: that theorem is
about running all K candidates, K drawn from D; a study cut off after k of them ran min(K, k) (or a
number the stopper chose after seeing progress, which depends on the data), and every candidate's
model and metrics stay in the store. So before each candidate starts, the study writes on its row
the composition of the candidates started so far: a kill at any moment leaves the spend recorded.

[PS22] N. Papernot, T. Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022.
[PSMRTE18] N. Papernot, S. Song, I. Mironov, A. Raghunathan, K. Talwar, U. Erlingsson, "Scalable
       Private Learning with PATE", ICLR 2018 (data-independent RDP of GNMax and Confident GNMax).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection

import numpy as np

from engine import rounding
from engine.config import RunConfig
from engine.privacy import pate as pate_privacy
from engine.privacy.accountants import dpsgd_epsilon
from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed
from engine.privacy.rdp import DEFAULT_ORDERS, compute_rdp, rdp_to_epsilon
from engine.privacy.tuning import num_runs_probability, num_runs_quantiles, repeat_and_select_rdp, sample_num_runs
from engine.privacy.types import Epsilon
from engine.store import Store, now_iso
from engine.study_config import StudyConfig

if TYPE_CHECKING:  # torch stays out of the window's process, which reads study plans
    from engine.randomness import PrivateRandomness

Launch = Callable[[int], str]  # run id -> final status ("finished", "stopped", "failed")
Emit = Callable[..., Any]
PRIVATE_ACCOUNTANT = "rdp-repeat-and-select"
COMPOSITION_ACCOUNTANT = "pld-composition"  # DP-SGD candidates
RDP_COMPOSITION_ACCOUNTANT = "rdp-composition"  # PATE candidates (data-independent RDP)
STOPPED_EARLY = ("stopped", "interrupted")


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
    from engine.randomness import PrivateRandomness

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
    """RDP curve of one candidate from its public plan: a DP-SGD training (as its runner plans it), or
    a PATE run's data-independent bound (pate_candidate_rdp)."""
    if config.mechanism == "pate":
        return pate_candidate_rdp(config, orders)
    plan = _dpsgd_plan(config, num_train)
    return compute_rdp(sample_rate=plan.sample_rate, noise_multiplier=plan.noise_multiplier,
                       steps=plan.steps_planned, orders=orders)


def pate_candidate_rdp(config: RunConfig, orders=DEFAULT_ORDERS) -> np.ndarray:
    """Data-independent RDP of a PATE run asking all its `num_queries` [PSMRTE18]
    (engine.privacy.pate.data_independent_rdp)."""
    from engine.pate.aggregation import aggregator_noise

    return pate_privacy.data_independent_rdp(mechanism=config.aggregator, num_queries=config.num_queries,
                                             orders=orders, **aggregator_noise(config.to_dict()))


def _dpsgd_plan(config: RunConfig, num_train: int):
    from engine.dpsgd.trainer import plan_privacy

    return plan_privacy(config, num_train)


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


def composition_epsilon(configs: list[RunConfig], num_train: int, delta: float, orders=DEFAULT_ORDERS, *,
                        steps_done: list[int] | None = None) -> Epsilon:
    """Every candidate released: DP-SGD runs composed by PLD (each its own sample rate, noise and
    planned steps, or the steps each took: `steps_done`, once they ran), PATE runs by the sum of their
    data-independent RDP curves (planned queries), converted at `delta`.

    Never below the epsilon a candidate states for itself (DP-SGD: its own accountant at those steps;
    PATE: its data-independent bound at its own orders). Both are upper bounds, so the larger is one
    too, and a study reading below a run it releases (a run accounted by RDP, looser than the PLD of
    the same steps) would look like an error."""
    if all(c.mechanism == "dpsgd" for c in configs):
        plans = [_dpsgd_plan(c, num_train) for c in configs]
        taken = ([p.steps_planned for p in plans] if steps_done is None else
                 [min(int(done), p.steps_planned) for p, done in zip(plans, steps_done)])
        ran = [(p, steps) for p, steps in zip(plans, taken) if steps > 0]
        if not ran:  # no step taken: only the (data-independent) initial models
            return Epsilon(value=0.0, delta=delta, accountant=COMPOSITION_ACCOUNTANT)
        eps = pld_epsilon_composed(mechanisms=[SubsampledGaussian(p.sample_rate, p.noise_multiplier, steps)
                                               for p, steps in ran], delta=delta)
        value = max([eps.value] + [_own_epsilon(p, steps, delta) for p, steps in ran])
        return Epsilon(value=value, delta=eps.delta, accountant=COMPOSITION_ACCOUNTANT)
    total = np.sum([candidate_rdp(c, num_train, orders) for c in configs], axis=0)
    eps = rdp_to_epsilon(orders=orders, rdp=total, delta=delta)
    from engine.pate.aggregation import planned_epsilon_data_independent

    # A PATE run states its bound at PATE's own orders, a little above this grid's for few queries.
    own = [planned_epsilon_data_independent(c, delta) for c in configs if c.mechanism == "pate"]
    return Epsilon(value=max([eps.value] + own), delta=eps.delta, accountant=RDP_COMPOSITION_ACCOUNTANT,
                   order=eps.order)


def _own_epsilon(plan, steps: int, delta: float) -> float:
    """The epsilon a DP-SGD candidate states for itself after `steps` at `delta`, as its run accounts it."""
    return _stated_epsilon(plan.sample_rate, plan.noise_multiplier, steps, delta, plan.accountant,
                           plan.statistics_noise_multiplier)


@functools.lru_cache(maxsize=1024)
def _stated_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, accountant: str,
                    statistics_noise_multiplier: float | None) -> float:
    """dpsgd_epsilon's value, kept: a study composes every prefix of its candidates (before each one
    starts), most of them with the same privacy settings."""
    return dpsgd_epsilon(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, delta=delta,
                         accountant=accountant, statistics_noise_multiplier=statistics_noise_multiplier).value


def training_size(config: RunConfig, *, checked_before: Collection[str] = ()) -> int | None:
    """N, the training split's size (public under add/remove, as every run's plan treats it); None for
    PATE, whose data-independent bound does not depend on it. `checked_before`: as engine.runs.prepare."""
    if config.mechanism == "pate":
        return None
    from engine.runs import prepare

    return prepare(config, checked_before=checked_before).data.num_train


# ---- the plan as shown before a study runs ------------------------------------------------------------
def plan_summary(config: StudyConfig, *, with_epsilon: bool = True,
                 checked_before: Collection[str] = ()) -> dict[str, Any]:
    """What a study will do, from public settings only (`dpw study --plan`, the window's Study dialog):
    its space and grid size, how many runs (private: K's distribution, never a draw), and with
    `with_epsilon` (which loads the dataset for its size; `checked_before` as engine.runs.prepare) the
    study's epsilon before it runs next to one candidate's alone. Exploratory studies claim nothing
    for the selection: no study epsilon."""
    grid = config.grid()
    summary: dict[str, Any] = {
        "name": config.name, "mode": config.mode, "mechanism": config.base.mechanism,
        "dataset": config.base.dataset, "search": config.search,
        "space": {k: list(v) for k, v in config.space.items()}, "grid_size": len(grid), "delta": config.base.delta,
    }
    if config.mode == "private":
        quantiles = num_runs_quantiles(mean_runs=config.mean_runs, shape=config.shape, probabilities=[0.5, 0.9])
        summary["num_runs"] = {
            "distribution": "poisson" if np.isinf(config.shape) else "truncated negative binomial",
            "mean": config.mean_runs, "shape": None if np.isinf(config.shape) else config.shape,
            "median": quantiles[0], "p90": quantiles[1],
            "p_none": num_runs_probability(mean_runs=config.mean_runs, shape=config.shape, k=0)}
    else:
        summary["num_runs"] = {"fixed": len(grid) if config.search == "grid" else config.num_candidates}
    if not with_epsilon or config.mode == "exploratory" or config.base.mechanism not in ("dpsgd", "pate"):
        return summary
    num_train = training_size(config.candidate(grid[0]), checked_before=checked_before)
    if config.mode == "private":
        eps = private_study_epsilon(config, num_train)
    else:
        eps = composition_epsilon(plan_candidates(config).configs, num_train, config.base.delta)
    if config.mode == "private":  # the same RDP analysis as the bound, so the difference is the search's price
        single = max(rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=candidate_rdp(config.candidate(s), num_train),
                                    delta=config.base.delta).value for s in grid)
    else:
        single = max(composition_epsilon([config.candidate(s)], num_train, config.base.delta).value for s in grid)
    summary.update(epsilon=eps.value, accountant=eps.accountant, single_run_epsilon=single, num_train=num_train)
    return summary


def plan_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The plan as (label, text) rows, worded once for `dpw study --plan` and the window's dialog."""
    space = "; ".join(f"{k} in {', '.join(map(str, v))}" for k, v in summary["space"].items())
    runs = summary["num_runs"]
    if "fixed" in runs:
        count = f"{runs['fixed']} (" + ("every combination of the grid" if summary["search"] == "grid"
                                        else "drawn at random from the grid with the public seed") + ")"
    else:
        kind = "Poisson" if runs["distribution"] == "poisson" else \
            f"truncated negative binomial, shape {runs['shape']:g}" + (" (geometric)" if runs["shape"] == 1 else "")
        count = (f"random, drawn secretly: {kind}, mean {runs['mean']:g}; median {runs['median']}, "
                 f"90% of studies run at most {runs['p90']}")
        if runs["p_none"] > 0:
            count += f"; with probability {runs['p_none']:.3g} none (nothing released)"
    rows = [("Study", f"{summary['name']} ({summary['mode']}, {summary['mechanism']} on {summary['dataset']})"),
            ("Space", f"{space} ({summary['grid_size']} combination{'s' if summary['grid_size'] != 1 else ''})"),
            ("Runs", count)]
    if summary["mode"] == "exploratory":
        rows.append(("Privacy", "each run states its own epsilon; choosing among them is not covered "
                     "(exploratory: nothing is claimed for the selection)"))
    elif summary.get("epsilon") is not None:
        what = "the released best candidate, covering the whole search" if summary["mode"] == "private" \
            else "all runs, every one releasable"
        rows.append(("Study epsilon", f"{rounding.up(summary['epsilon'], '.4g')} at delta {summary['delta']:g} "
                     f"({summary['accountant']}): {what}"))
        rows.append(("One run alone",
                     f"{rounding.up(summary['single_run_epsilon'], '.4g')} (the costliest setting of the space)"))
    return rows


# ---- running -------------------------------------------------------------------------------------
def first_candidate(config: StudyConfig, plan: StudyPlan) -> RunConfig:
    """The candidate whose data a study checks before it runs (one of the grid's when none was drawn):
    every candidate trains on the same data."""
    return plan.configs[0] if plan.configs else config.candidate(config.grid()[0])


def run_study(config: StudyConfig, store: Store, launch: Launch, *, emit: Emit | None = None,
              plan: StudyPlan | None = None, should_stop: Callable[[], bool] = lambda: False,
              num_train: int | None = None) -> StudyResult:
    """Store the study, run its candidates one after another with `launch` (run id -> status), score
    them, choose the released run and record the study's epsilon. Before each candidate starts, the
    privacy of every candidate started so far is written on the study's row (a killed study keeps it).
    A stopped candidate stops the study ("stopped": nothing is released and the epsilon is that
    composition; module docstring), and so does `should_stop()` before the next candidate is created.
    `num_train`: N as the caller's check of the data found it (else read here when the study accounts)."""
    emit = emit or (lambda *a, **k: None)
    plan = plan or plan_candidates(config)
    accounted = config.mode in ("private", "composition")
    first = first_candidate(config, plan)
    if num_train is None and accounted:
        num_train = training_size(first, checked_before=store.checked_fingerprints(first.dataset))
    study_id = store.create_study(name=config.name, mode=config.mode,
                                  config=json.dumps(config.to_dict(), sort_keys=True))
    emit("study", study_id=study_id, mode=config.mode, candidates=len(plan.configs))
    run_ids: list[int] = []
    status = "finished"
    for index, run_config in enumerate(plan.configs):
        if should_stop():
            status = "stopped"
            break
        if accounted:
            _record(store, study_id, composition_epsilon(plan.configs[:index + 1], num_train, config.base.delta),
                    num_candidates=index + 1)
        run_id = store.create_run(run_config)
        store.update_run(run_id, study_id=study_id)
        run_ids.append(run_id)
        emit("candidate", index=index + 1, run_id=run_id, setting=plan.settings[index])
        if launch(run_id) == "stopped":
            status = "stopped"
            break
    runs = [store.get_run(r) for r in run_ids]
    scores = _scores(config, runs, plan)
    released = max(scores, key=scores.get) if scores and status == "finished" else None
    epsilon = None
    if config.mode == "private" and status == "finished":
        epsilon = private_study_epsilon(config, num_train)
    elif accounted:  # what the candidates spent: the steps each took (a stopped one: fewer than planned)
        epsilon = composition_epsilon(plan.configs[:len(run_ids)], num_train, config.base.delta,
                                      steps_done=[run.get("steps_done") or 0 for run in runs])
    _record(store, study_id, epsilon, num_candidates=len(run_ids), status=status, finished=now_iso(),
            released_run_id=released)
    if config.mode == "private" and released is not None:
        # Its runner skipped the audit while it was a candidate not (yet) released (engine.audit_job).
        from engine.audit_job import audit_after_training

        audit_after_training(store, released)
    emit("study_finished", study_id=study_id, status=status, released_run_id=released,
         epsilon=None if epsilon is None else epsilon.value)
    return StudyResult(study_id, status, run_ids, released, epsilon, scores)


def _record(store: Store, study_id: int, epsilon: Epsilon | None, **fields: Any) -> None:
    store.update_study(study_id, epsilon=None if epsilon is None else epsilon.value,
                       delta=None if epsilon is None else epsilon.delta,
                       accountant=None if epsilon is None else epsilon.accountant, **fields)


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
