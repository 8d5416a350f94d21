"""The privacy spent on each dataset: every run that touched it, deleted ones included, composed.

Each run states its own guarantee, but a reviewer must also know what all of them together cost the
people in the data: ten runs at epsilon 1 on one dataset are not epsilon 1. `dataset_ledgers` groups
the store's runs (and the records of deleted runs) by dataset and bounds their total:

- DP-SGD runs whose sample rate, noise multiplier and steps are in the store are composed exactly
  as one privacy event (the PLD of every run's subsampled Gaussian steps on one grid,
  `engine.privacy.pld.pld_epsilon_composed`), at the dataset's delta, with the other Gaussian
  releases their own epsilons include (DP feature statistics, a private study's noisy scores),
  and never below the epsilon any of those runs states for itself;
- a run continued from another's checkpoint (engine.checkpoint) adds only its own steps: the steps
  before are the first run's, counted with it (its own epsilon covers both, as its model took both);
- every other run (PATE, deleted runs, rows without those numbers) adds its own (epsilon, delta):
  basic composition, always valid;
- a non-private run, or one whose noise is reproducible from its published seed, makes the total
  unbounded: nothing bounds what it revealed.

Runs of a study are counted one by one, as if each were released, with their scores: the
composition of the runs the study actually drew (its number of runs is drawn independently of the
data), which can be below the study's own epsilon, stated before that number was known. A queued
run, or one that failed before its first step, spent nothing.

Datasets are told apart by the name runs give them (a registry name or a file path) and by the
fingerprint of their contents (a hash, recorded when a run loads the data): runs that share either,
directly or through other runs, count in one ledger, so a copied file under another name adds to the
original's total. Runs deleted before fingerprints were recorded are matched by name only. Other data
about the same people (an updated file, another table) or another store are still apart here, and
their owner must add them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine import rounding
from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed
from engine.publication import no_guarantee_reason, publishable_epsilon, run_epsilon


@dataclass(frozen=True)
class LedgerEntry:
    """One run's spend on the data: how it enters the total (`composed` by PLD, `added`, `unbounded`
    or `none`) and why."""

    run_id: int
    name: str | None
    mechanism: str | None
    status: str | None
    deleted: bool
    epsilon: float | None
    delta: float | None
    accountant: str | None
    counted: str  # "composed", "added", "unbounded", "none"
    why: str = ""
    gaussians: tuple[SubsampledGaussian, ...] = ()  # composed by PLD: DP-SGD's steps, DP statistics, a study's score

    def to_json(self) -> dict[str, Any]:
        return {"id": self.run_id, "name": self.name, "mechanism": self.mechanism, "status": self.status,
                "deleted": self.deleted, "epsilon": None if self.epsilon == math.inf else self.epsilon,
                "delta": self.delta,
                "accountant": self.accountant, "counted": self.counted, "why": self.why or None}


@dataclass(frozen=True)
class DatasetLedger:
    """Everything spent on one dataset and its bound: (epsilon, delta), or epsilon = inf with the
    runs that make it unbounded. `composed_epsilon` is the PLD part (None without such runs)."""

    dataset: str
    entries: list[LedgerEntry]
    epsilon: float
    delta: float
    composed_epsilon: float | None = None
    composed_delta: float | None = None
    still_running: list[int] = field(default_factory=list)
    also_named: list[str] = field(default_factory=list)  # other names of the same contents (same fingerprint)

    @property
    def title(self) -> str:
        """The dataset's name, with the other names its runs gave the same data."""
        if not self.also_named:
            return self.dataset
        return f"{self.dataset} (the same data also as {', '.join(self.also_named)})"

    def named(self, name: str) -> bool:
        return name == self.dataset or name in self.also_named

    @property
    def unbounded(self) -> list[LedgerEntry]:
        return [e for e in self.entries if e.counted == "unbounded"]

    def statement(self) -> str:
        """The total in one line, as `dpw ledger` and the window state it."""
        spending = [e for e in self.entries if e.counted != "none"]
        runs = f"{len(spending)} run{'s' if len(spending) != 1 else ''}"
        deleted = sum(e.deleted for e in spending)
        runs += f" ({deleted} deleted)" if deleted else ""
        if self.unbounded:
            ids = ", ".join(str(e.run_id) for e in self.unbounded)
            return f"{runs}: no bound on the privacy spent (run{'s' if len(self.unbounded) > 1 else ''} {ids}: " \
                   f"{self.unbounded[0].why})"
        if not spending:
            return "no privacy spent yet"
        if not math.isfinite(self.epsilon):
            return f"{runs}: no finite bound (ε = inf: a run's noise is too small for any bound on it)"
        text = f"{runs}: together (ε = {rounding.up(self.epsilon, '.4g')}, δ = {rounding.up(self.delta, '.3g')})-DP"
        if self.still_running:
            text += f"; still growing: run {', '.join(map(str, self.still_running))} is running"
        return text

    def to_json(self) -> dict[str, Any]:
        bounded = not self.unbounded and math.isfinite(self.epsilon)
        return {"dataset": self.dataset, "also_named": self.also_named, "epsilon": self.epsilon if bounded else None,
                "delta": self.delta if bounded else None, "bounded": bounded, "statement": self.statement(),
                "composed": None if self.composed_epsilon is None else
                {"accountant": "pld", "epsilon": self.composed_epsilon, "delta": self.composed_delta},
                "still_running": self.still_running, "runs": [e.to_json() for e in self.entries]}


def live_entry(run: dict[str, Any]) -> LedgerEntry:
    """How a run in the store counts: its own epsilon (never its study's), its DP-SGD parameters."""
    common = dict(run_id=run["id"], name=run.get("name"), mechanism=run.get("mechanism"), status=run.get("status"),
                  deleted=False)
    if run.get("status") == "queued" or (not run.get("started") and not run.get("steps_done")):
        return LedgerEntry(**common, epsilon=None, delta=None, accountant=None, counted="none",
                           why="never started")
    if run.get("mechanism") == "none":
        return LedgerEntry(**common, epsilon=math.inf, delta=None, accountant=None, counted="unbounded",
                           why="trained without privacy")
    if (reason := no_guarantee_reason(run)) is not None:
        return LedgerEntry(**common, epsilon=None, delta=None, accountant=None, counted="unbounded", why=reason)
    eps = run_epsilon(run)
    q, sigma, steps = run.get("sample_rate"), run.get("noise_multiplier"), run.get("steps_done")
    why = _alone(run, eps.value)
    if steps and run.get("steps_resumed"):  # continued from another run's checkpoint: those steps are counted there
        steps = max(0, int(steps) - int(run["steps_resumed"]))
        why = f"its steps after {run['steps_resumed']} (those before are run {run.get('resumed_from')}'s)"
    if run.get("mechanism") == "dpsgd" and q and sigma and steps:
        training = (SubsampledGaussian(float(q), float(sigma), int(steps)),)
        return LedgerEntry(**common, epsilon=eps.value, delta=eps.delta, accountant=eps.accountant, why=why,
                           counted="composed", gaussians=training + _released_statistics(run) + _study_score(run))
    if eps.value is None or (run.get("mechanism") == "dpsgd" and not steps):
        return LedgerEntry(**common, epsilon=None, delta=None, accountant=None, counted="none",
                           why="no step taken")
    return LedgerEntry(**common, epsilon=eps.value, delta=eps.delta or 0.0, accountant=eps.accountant,
                       counted="added", gaussians=_study_score(run))


def _alone(run: dict[str, Any], own: float | None) -> str:
    """For a run of a study, which states the study's epsilon everywhere else: that the ledger counts
    the run alone (the study's runs count one by one here), and what the study states."""
    stated = publishable_epsilon(run)
    if stated.note is None or stated.value is None or stated.value == own:
        return ""
    return f"this run alone (its study states ε = {rounding.up(stated.value, '.4g')})"


def _released_statistics(run: dict[str, Any]) -> tuple[SubsampledGaussian, ...]:
    """normalization = "dp": the feature statistics released before training, a Gaussian mechanism
    of sensitivity 1 (engine.privacy.feature_stats), which the run's own epsilon includes."""
    config = run.get("config") or {}
    multiplier = config.get("normalization_noise_multiplier")
    if config.get("normalization") != "dp" or not multiplier:
        return ()
    return (SubsampledGaussian(1.0, float(multiplier), 1),)


def _study_score(run: dict[str, Any]) -> tuple[SubsampledGaussian, ...]:
    """A private study's candidate: its noisy score on the data (sensitivity 1, engine.study.score_rdp),
    which the study's epsilon includes, counted whether or not the candidate was scored."""
    study = run.get("study") or {}
    multiplier = (study.get("config") or {}).get("score_noise_multiplier")
    if study.get("mode") != "private" or not multiplier:
        return ()
    return (SubsampledGaussian(1.0, float(multiplier), 1),)


def deleted_entry(record: dict[str, Any]) -> LedgerEntry:
    """How a deleted run counts: the (epsilon, delta) kept when it was deleted (its steps are gone);
    one that carried no guarantee, or trained without privacy, leaves the data's spend unbounded."""
    common = dict(run_id=record["id"], name=record.get("name"), mechanism=record.get("mechanism"),
                  status=record.get("status"), deleted=True)
    if record.get("mechanism") == "none" and record.get("status") != "queued":
        return LedgerEntry(**common, epsilon=math.inf, delta=None, accountant=None, counted="unbounded",
                           why="trained without privacy (deleted)")
    if record.get("no_guarantee") and record.get("status") != "queued":
        return LedgerEntry(**common, epsilon=None, delta=None, accountant=None, counted="unbounded",
                           why=f"{record['no_guarantee']} (deleted)")
    if record.get("epsilon") is None:
        return LedgerEntry(**common, epsilon=None, delta=None, accountant=None, counted="none",
                           why="nothing accounted")
    return LedgerEntry(**common, epsilon=float(record["epsilon"]), delta=float(record.get("delta") or 0.0),
                       accountant=record.get("accountant"), counted="added")


def dataset_ledgers(runs: list[dict[str, Any]], deleted: list[dict[str, Any]], *,
                    delta: float | None = None) -> list[DatasetLedger]:
    """One ledger per dataset (runs sharing a name or a fingerprint), largest spend first. `delta`: the
    delta at which the DP-SGD runs are composed; by default the largest delta any of them was accounted at."""
    spent = [(run, live_entry(run)) for run in runs] + [(record, deleted_entry(record)) for record in deleted]
    spent.sort(key=lambda pair: pair[1].run_id)
    groups: dict[int, list[tuple[dict[str, Any], LedgerEntry]]] = {}
    for group, pair in zip(same_data([(str(row.get("dataset")), row.get("dataset_fingerprint")) for row, _ in spent]),
                           spent):
        groups.setdefault(group, []).append(pair)
    ledgers = []
    for pairs in groups.values():
        names = list(dict.fromkeys(str(row.get("dataset")) for row, _ in pairs))  # the earliest run's name first
        ledger = _total(names[0], [entry for _, entry in pairs], delta)
        ledgers.append(dataclasses.replace(ledger, also_named=names[1:]))
    return sorted(ledgers, key=lambda ledger: (-ledger.epsilon, ledger.dataset))


def same_data(keys: list[tuple[str, str | None]]) -> list[int]:
    """For each (name, fingerprint), the index of its group: keys that share a name or a fingerprint,
    directly or through others, are one group (union-find); a missing fingerprint matches nothing."""
    parent = list(range(len(keys)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, (name, fingerprint) in enumerate(keys):
        for key in [("name", name)] + ([("fingerprint", fingerprint)] if fingerprint else []):
            if key in first:
                parent[root(i)] = root(first[key])
            else:
                first[key] = i
    return [root(i) for i in range(len(keys))]


def _own_bounds(entries: list[LedgerEntry], delta: float) -> list[float]:
    """The epsilons the composed runs state for themselves at `delta` or below. The composed total is
    never less than any of them: each is an upper bound like the PLD's own, so the larger one is still
    one, and a total below one of its parts (a run accounted by RDP, or on a coarser grid) reads as an error."""
    return [e.epsilon for e in entries
            if e.counted == "composed" and e.epsilon is not None and e.delta is not None and e.delta <= delta]


def _total(dataset: str, entries: list[LedgerEntry], delta: float | None) -> DatasetLedger:
    running = [e.run_id for e in entries if e.status == "running" and not e.deleted]
    if any(e.counted == "unbounded" for e in entries):
        return DatasetLedger(dataset, entries, math.inf, 0.0, still_running=running)
    composed = [e for e in entries if e.counted in ("composed", "added") and e.gaussians]
    added = [e for e in entries if e.counted == "added"]
    epsilon = sum(e.epsilon for e in added)
    total_delta = sum(e.delta for e in added)
    composed_epsilon = composed_delta = None
    if composed:
        composed_delta = delta if delta is not None else max(e.delta or 0.0 for e in composed)
        gaussians = [g for e in composed for g in e.gaussians]
        composed_epsilon = max([pld_epsilon_composed(mechanisms=gaussians, delta=composed_delta).value]
                               + _own_bounds(composed, composed_delta))
        epsilon += composed_epsilon
        total_delta += composed_delta
    return DatasetLedger(dataset, entries, epsilon, total_delta, composed_epsilon, composed_delta, running)
