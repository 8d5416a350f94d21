"""What of a run may be shown as its guarantee, and how it is labelled wherever it appears.

Every view of a run's epsilon (`dpw list/show/run`, the report, the model card, the window's runs
list, dashboard and compare view) asks here, so the rules live in one place:

- `publishable_epsilon(run)`: the epsilon that is safe to state as the run's guarantee. DP-SGD: the
  accountant's value. PATE: the data-independent bound, the only one that holds whatever the votes.
  The data-dependent epsilon is a function of the private votes and is never shown as more than a
  diagnostic labelled "not publishable"; its smooth-sensitivity release (`pate_released_estimate`)
  is safe to show, as an estimate: its noise is centred on the data-dependent cost, so it falls
  below that cost about half the time and bounds nothing.
- `no_guarantee_reason(run)` / `carries_guarantee(run)`: a private run carries no guarantee at all,
  whatever its epsilon, when its privacy noise was seeded from the published `seed`
  (`reproducible_noise = true`), when its model ships the training data's exact feature statistics
  (`normalization = "exact"`), or when a PATE run stopped where the data-dependent epsilon met its
  budget (`pate_budget_on = "data-dependent"`): each releases something no epsilon accounts for.
- PATE's smooth-sensitivity estimate is shown only when its parameters were fixed before the votes
  (`release_parameters = "data-independent"`, the default): a release tuned on the votes is not shown.
- `public_dataset_name(dataset)`: user files are named by their file name only, never their folders.
- A run of a tuning study (engine.study; the store attaches its row as `run["study"]`) states the
  study's epsilon, never its own: a private study's released run the repeat-and-select bound, its
  other candidates nothing (never released); a composition study's runs the composition of all
  (of all it started, when it was stopped or interrupted early);
  an exploratory study's runs their own epsilon with `EXPLORATORY_NOTE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from engine import rounding
from engine.errors import DPWError

NO_GUARANTEE_HEADLINE = "No differential privacy guarantee"
SEEDED_NOISE = "the noise is reproducible from the published seed (reproducible_noise = true)"
NO_GUARANTEE_STATEMENT = f"{NO_GUARANTEE_HEADLINE}: {SEEDED_NOISE}"
EXACT_STATISTICS = ("the model ships the training data's own feature mean and standard deviation, computed without "
                    "noise (normalization = \"exact\")")
STOPPED_ON_VOTES = ("whether and where the teachers stopped answering was decided from the private votes (the "
                    "epsilon budget was checked on the data-dependent epsilon: pate_budget_on = \"data-dependent\")")
NO_GUARANTEE_IN_SHORT = {SEEDED_NOISE: "reproducible noise", EXACT_STATISTICS: "exact normalization",
                         STOPPED_ON_VOTES: "budget on the votes"}  # where a view has a few words for the reason
NO_FINITE_BOUND_STATEMENT = "No finite differential privacy guarantee: the noise is too small for any bound on epsilon"
NO_GUARANTEE = "no guarantee"
NOT_PUBLISHABLE = "not publishable: a function of the private votes"
RELEASED_ESTIMATE = ("released privately with smooth-sensitivity noise: an estimate, not a bound (its noise is "
                     "centred on the data-dependent cost)")
PATE_DATA_INDEPENDENT = "pate-di"
PATE_DATA_DEPENDENT = "pate-dd"
EXPLORATORY_NOTE = "selected among {n} runs on the same data; the selection is not covered by this epsilon"
WITHHELD = "not released"


@dataclass(frozen=True)
class PublishableEpsilon:
    """The epsilon a run may state. `guarantee` is False when the noise was seeded (no guarantee
    whatever the number) or the run is non-private; `value` is None when nothing was accounted."""

    value: float | None
    delta: float | None
    accountant: str | None
    guarantee: bool
    note: str | None = None  # what the value covers beyond this run (its study), in words
    withheld: bool = False  # a candidate of a private study: never exported nor reported
    step: int | None = None  # a running run's value is its accountant's at this step, before its latest ones

    def at_step(self, steps_done: int | None) -> str:
        """" at step 495" where the value covers fewer steps than the run has taken so far, else ""."""
        return f" at step {self.step}" if self.step is not None and self.step != steps_done else ""

    @property
    def holds(self) -> bool:
        """Whether the run may state a guarantee: secret noise and an epsilon that bounds something (an
        infinite one bounds nothing). What `dpw list`/`show`/`audit --json` and reports call holding."""
        return self.guarantee and self.value != math.inf


def exploratory_note(num_runs: int | None) -> str:
    """EXPLORATORY_NOTE for a choice among `num_runs` runs ("1 run", "3 runs"; "several runs" if unknown):
    what every view of a run chosen without a private selection says about the choice."""
    runs = "several runs" if not num_runs else f"{num_runs} run" + ("" if num_runs == 1 else "s")
    return f"selected among {runs} on the same data; the selection is not covered by this epsilon"


def pate_publishable(epsilon_data_independent: float | None) -> tuple[float | None, str | None]:
    """(epsilon, accountant) of PATE's guarantee: the data-independent bound, the worst case over all
    vote histograms. The smooth-sensitivity release is never the guarantee (`pate_released_estimate`)."""
    if epsilon_data_independent is None or math.isnan(float(epsilon_data_independent)):
        return None, None
    return float(epsilon_data_independent), PATE_DATA_INDEPENDENT


def pate_released_estimate(run: dict[str, Any]) -> float | None:
    """A PATE run's privately released estimate of its data-dependent epsilon (Papernot et al. 2018's
    smooth-sensitivity release), to show beside the guarantee and labelled as an estimate: its noise
    is centred on the data-dependent cost, so it is below that cost about half the time. None where
    there is none, where it equals the data-independent bound (LNMax), and where its parameters were
    chosen from the votes, which it does not cover."""
    released = (run.get("summary") or {}).get("epsilon_released")
    if released is None or release_from_votes(run) or (run.get("config") or {}).get("aggregator") == "lnmax":
        return None
    return float(released)


def randomness(run: dict[str, Any]) -> dict[str, str]:
    """{"privacy_noise": "secret" | "seeded", "noise_sampler": "standard" | "hardened"} of a run: as the
    engine recorded it (summary or plan), else from its config. A config from before
    `reproducible_noise` existed was trained when the noise still came from the seed: "seeded"."""
    for source in (run.get("summary") or {}, run.get("plan") or {}):
        recorded = source.get("randomness")
        if isinstance(recorded, dict) and recorded.get("privacy_noise") in ("secret", "seeded"):
            return {"privacy_noise": recorded["privacy_noise"],
                    "noise_sampler": recorded.get("noise_sampler", "standard")}
    config = run.get("config") or {}
    seeded = config.get("reproducible_noise", True) if config else False
    return {"privacy_noise": "seeded" if seeded else "secret",
            "noise_sampler": config.get("noise_sampler", "standard")}


def budget_on_private_votes(run: dict[str, Any]) -> bool:
    """A PATE run whose budget was checked on the data-dependent epsilon (runs stored before the
    choice existed were)."""
    config = run.get("config") or {}
    return (run.get("mechanism") == "pate" and config.get("epsilon_budget") is not None
            and config.get("pate_budget_on", "data-dependent") == "data-dependent")


def no_guarantee_reason(run: dict[str, Any]) -> str | None:
    """Why a private run carries no guarantee whatever its epsilon, in words (None: the epsilon holds
    as stated, or the run is non-private). Each reason is a release no accountant counts."""
    if run.get("mechanism") == "none":
        return None
    if randomness(run)["privacy_noise"] == "seeded":
        return SEEDED_NOISE
    if (run.get("config") or {}).get("normalization") == "exact":  # refused for image data (engine.runs)
        return EXACT_STATISTICS
    if budget_on_private_votes(run):
        return STOPPED_ON_VOTES
    return None


def no_guarantee_statement(run: dict[str, Any]) -> str:
    """NO_GUARANTEE_HEADLINE and its reason, for a run without a guarantee."""
    return f"{NO_GUARANTEE_HEADLINE}: {no_guarantee_reason(run) or 'the run is not private'}"


def release_from_votes(run: dict[str, Any]) -> bool:
    """A PATE run whose smooth-sensitivity release had its parameters chosen from the private votes."""
    return bool(((run.get("summary") or {}).get("release") or {}).get("parameters_from_data"))


def carries_guarantee(run: dict[str, Any]) -> bool:
    """False for a non-private run and for a run with a reason it carries no guarantee (no_guarantee_reason)."""
    if run.get("mechanism") == "none":
        return False
    return no_guarantee_reason(run) is None


def publishable_epsilon(run: dict[str, Any]) -> PublishableEpsilon:
    """The epsilon of `run` (a store row with its config and summary, and its study if any) that may
    be stated: the run's own (`run_epsilon`), or its study's."""
    own = run_epsilon(run)
    study = run.get("study")
    if not study:
        return own
    mode, finished = study.get("mode"), study.get("status") == "finished"
    if mode == "exploratory":
        return PublishableEpsilon(own.value, own.delta, own.accountant, own.guarantee,
                                  note=exploratory_note(study.get("num_candidates")))
    name = f"study {study.get('id')} ({study.get('name')})"
    if mode == "private" and study.get("released_run_id") != run.get("id"):
        return PublishableEpsilon(None, None, None, own.guarantee, withheld=True,
                                  note=f"a candidate of private {name} that was not released")
    early = study.get("status") in ("stopped", "interrupted")
    if mode == "composition" and early and study.get("epsilon") is not None:
        return PublishableEpsilon(float(study["epsilon"]), study.get("delta"), study.get("accountant"), own.guarantee,
                                  note=f"one of the runs of {name}, which was {study['status']} early; this epsilon "
                                  f"composes the {study.get('num_candidates')} runs it started")
    if not finished or study.get("epsilon") is None:
        return PublishableEpsilon(None, None, None, own.guarantee,
                                  note=f"part of {name}, which has not finished: its epsilon covers all its runs")
    note = ("the best of a random number of candidate runs on the same data; this epsilon covers the search"
            if mode == "private" else "one of the runs of a study, all releasable; this epsilon composes all of them")
    return PublishableEpsilon(float(study["epsilon"]), study.get("delta"), study.get("accountant"), own.guarantee,
                              note=f"{note} ({name})")


def check_releasable(run: dict[str, Any]) -> None:
    """Refuse a candidate of a private study that was not released: its model and scores never leave
    the store (the study's epsilon covers releasing the best candidate only)."""
    eps = publishable_epsilon(run)
    if eps.withheld:
        released = (run.get("study") or {}).get("released_run_id")
        raise DPWError(f"run {run['id']} ({run['name']}) is {eps.note}; its model and scores are never exported "
                       "or reported (the study's epsilon covers only the released run)",
                       hint=f"use the released run {released}" if released is not None else
                       "a private study releases its best candidate once it has finished")


def run_epsilon(run: dict[str, Any]) -> PublishableEpsilon:
    """The epsilon of `run` alone, as its own accountant stated it (ignoring any study)."""
    guarantee = carries_guarantee(run)
    if run.get("mechanism") == "pate":
        summary = run.get("summary") or {}
        value, accountant = pate_publishable(summary.get("epsilon_data_independent"))
        if value is None and run.get("accountant") == PATE_DATA_INDEPENDENT:
            value, accountant = run.get("epsilon"), run.get("accountant")
        delta = summary.get("delta", run.get("delta")) if value is not None else None
        return PublishableEpsilon(value, delta, accountant, guarantee)
    if run.get("mechanism") == "none" or run.get("epsilon") is None:
        return PublishableEpsilon(None, None, None, guarantee)
    stated = run.get("stated_privacy")  # a running run: its stated accountant's latest value (engine.store)
    if stated and run.get("status") == "running":
        return PublishableEpsilon(float(stated["epsilon"]), stated["delta"], stated["accountant"], guarantee,
                                  step=stated.get("step"))
    return PublishableEpsilon(float(run["epsilon"]), run.get("delta"), run.get("accountant"), guarantee)


def epsilon_label(run: dict[str, Any], fmt: str = ".3g") -> str:
    """The epsilon as a list shows it, rounded up (engine.rounding): "1.96", "1.96 (no guarantee)", "∞"
    (non-private), "∞ (no guarantee)" (noise too small for any bound), "" (none yet)."""
    if run.get("mechanism") == "none":
        return "∞"
    eps = publishable_epsilon(run)
    if eps.withheld:
        return WITHHELD
    if eps.value is None:
        return "" if eps.guarantee else NO_GUARANTEE
    if eps.value == math.inf:
        return f"∞ ({NO_GUARANTEE})"
    text = rounding.up(eps.value, fmt)
    return text if eps.guarantee else f"{text} ({NO_GUARANTEE})"


def publishable_text(run: dict[str, Any], fmt: str = ".4g") -> str:
    """What a view shows beside the label "ε (publishable)": the epsilon rounded up, or why there is none.
    A run without a guarantee reads "none: no guarantee (reproducible noise); accounted 2.32", never
    "2.32 (no guarantee)" under that label. "" while a run has no epsilon yet."""
    if run.get("mechanism") == "none":
        return "∞ (non-private)"
    eps = publishable_epsilon(run)
    if eps.withheld:
        return "not released"
    if not eps.guarantee:
        reason = NO_GUARANTEE_IN_SHORT.get(no_guarantee_reason(run) or "", "")
        accounted = "" if eps.value is None else f"; accounted {rounding.up(eps.value, fmt)}"
        return f"none: {NO_GUARANTEE}" + (f" ({reason})" if reason else "") + accounted
    if eps.value is None:
        return ""
    if eps.value == math.inf:
        return "∞ (no finite guarantee: the noise bounds nothing)"
    return rounding.up(eps.value, fmt)


def public_dataset_name(dataset: str | None) -> str | None:
    """A dataset as it may leave the machine: a registered name as it is, a user's file by its file
    name only (no folder, absolute or relative, on any platform)."""
    if dataset is None:
        return None
    text = str(dataset)
    if "/" not in text and "\\" not in text:
        return text
    return PureWindowsPath(PurePosixPath(text).name).name
