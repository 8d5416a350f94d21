"""`dpw audit RUN`: the membership-inference audit of a stored run's released model.

Training only produces the scores; the statements come from the pure `engine.audit` module. Here:
load the run's saved model (engine.export) and its data split (the same config and seed give the
same split; the dataset fingerprint recorded at training is checked), take an equal number of
training members and held-out non-members, score each by minus its cross-entropy loss (the loss
attack of Yeom et al. 2018), and compare with the theoretical curve of the run's guarantee
(engine.attack_risk). Members and non-members: DP-SGD, the training split against the test split;
PATE, the teachers' private training data against the student's held-out evaluation examples
(the public pool the student learnt from is neither).

A run trained with `audit_canaries` also carries the one-run canary audit (Steinke, Nasr and
Jagielski 2023) computed at the end of its training (engine.dpsgd.canaries): its counts and epsilon
lower bound are read from the run's summary (which canaries were included was never stored).

The result is computed from private data: it is shown locally, and a report carries it only when
asked (`dpw report --include-audit`), flagged at its top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import rounding
from engine.errors import DPWError

DEFAULT_EXAMPLES = 5000
"""At most this many members and as many non-members (TPR at FPR 0.1% needs >= 1,000 non-members)."""


@dataclass(frozen=True)
class RunAudit:
    run_id: int
    epsilon: float | None
    delta: float | None
    guarantee: bool
    mia: Any  # engine.audit.MembershipAudit
    members_from: str
    nonmembers_from: str
    seed: int
    canaries: dict[str, Any] | None = None  # the run's canary audit (count, kind, epsilon_lower_bound, ...)

    def to_json(self) -> dict[str, Any]:
        """The `dpw audit --json` object."""
        return {
            "run": self.run_id,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "guarantee": self.guarantee,
            "computed_from_private_data": True,
            "attack": "loss threshold (score = -cross-entropy of the true label)",
            "members": self.members_from,
            "nonmembers": self.nonmembers_from,
            "seed": self.seed,
            "mia": self.mia.to_json(),
            "canaries": self.canaries,
        }


def audit_run(store, run_ref: str | int, *, examples: int = DEFAULT_EXAMPLES, seed: int = 0,
              bootstrap: int = 1000, confidence: float = 0.95, data_dir: str | None = None) -> RunAudit:
    """Membership-inference audit of a run's released model on its own data split.

    `seed` picks the audited examples and drives the bootstrap (the audit's own randomness, not the
    run's). `data_dir` overrides where the run's dataset is read from.
    """
    from engine.attack_risk import run_attack_risk
    from engine.audit import membership_audit
    from engine.export import load_trained_model
    from engine.publication import publishable_epsilon

    if examples < 1:
        raise DPWError(f"--examples must be at least 1; got {examples}")
    trained = load_trained_model(store, run_ref, doing="audit")
    run = trained.run
    x_in, y_in, x_out, y_out, members_from, nonmembers_from = _split(store, run, data_dir)
    rng = np.random.default_rng(seed)
    k = min(examples, len(y_in), len(y_out))
    pick_in = np.sort(rng.permutation(len(y_in))[:k])
    pick_out = np.sort(rng.permutation(len(y_out))[:k])
    member_scores = -_losses(trained.model, x_in[pick_in], y_in[pick_in])
    nonmember_scores = -_losses(trained.model, x_out[pick_out], y_out[pick_out])
    risk = run_attack_risk(run).risk
    mia = membership_audit(
        member_scores=member_scores, nonmember_scores=nonmember_scores, rng=rng, confidence=confidence,
        bootstrap=bootstrap,
        theory_fpr=None if risk is None else risk.tradeoff_fpr,
        theory_tpr=None if risk is None else risk.tradeoff_tpr,
    )
    eps = publishable_epsilon(run)
    return RunAudit(int(run["id"]), eps.value, eps.delta, eps.holds, mia, members_from, nonmembers_from, seed,
                    canary_result(run))


CANARY_KEYS = ("count", "kind", "epsilon_lower_bound", "confidence", "delta", "guesses", "correct")


def kept_or_new_audit(store, run: dict[str, Any]) -> dict[str, Any]:
    """The `dpw audit --json` object for a report: the membership audit kept with the run (Audit tab or
    `python -m engine.audit_job`), so the report states what the window showed and needs no data files,
    with the run's canary audit; computed now (engine defaults) when none was kept."""
    from engine.audit.membership import restated
    from engine.audit_job import MEMBERSHIP_AUDIT_KEY

    kept = (run.get("summary") or {}).get(MEMBERSHIP_AUDIT_KEY)
    if kept:
        return {**kept, "mia": restated(kept["mia"]), "canaries": canary_result(run)}
    return audit_run(store, run["id"]).to_json()


def canary_result(run: dict[str, Any]) -> dict[str, Any] | None:
    """The canary audit a run recorded in its summary (None for a run without canaries)."""
    recorded = (run.get("summary") or {}).get("canaries")
    if not recorded:
        return None
    return {key: recorded.get(key) for key in CANARY_KEYS}


def canary_text(canaries: dict[str, Any] | None) -> str:
    """The one-run canary audit a run recorded (canary_result), in one line."""
    if canaries is None:
        return "none (the run had no audit_canaries)"
    return (f"epsilon >= {rounding.down(canaries['epsilon_lower_bound'], '.3g')} at delta {canaries['delta']:g} "
            f"({100 * canaries['confidence']:g}% confidence; {canaries['correct']} of {canaries['guesses']} "
            f"guesses right, {canaries['count']} {canaries['kind']} canaries)")


def audit_model_line(run: dict[str, Any]) -> str | None:
    """One line for exports and reports of a model trained with audit canaries (None otherwise)."""
    canaries = canary_result(run)
    if canaries is None:
        return None
    return (f"audit model: trained with {canaries['count']} {canaries['kind']} canaries (one-run privacy audit), "
            "which change what it learnt; train without audit_canaries for the model to deploy")


def _split(store, run: dict[str, Any], data_dir: str | None):
    """(x_members, y_members, x_nonmembers, y_nonmembers, descriptions) of the run's data, loaded as
    engine.runs.prepare loads it (dataset, split seed and rule, train_subset), checked against the fingerprint."""
    from engine.config import RunConfig
    from engine.data_split import split_rule_of
    from engine.datasets import load_dataset
    from engine.runs import train_subset

    config = RunConfig.from_dict(run["config"])
    if config.mechanism == "dpsgd" and config.normalization == "dp":
        raise DPWError(f"run {run['id']} scaled its table with DP statistics drawn from secret noise, which are "
                       "not stored: its inputs cannot be rebuilt for an audit",
                       hint="audit runs with normalization = 'bounds' or 'exact'")
    plan = store.plan_event(run["id"])
    rule = split_rule_of(plan)
    data = load_dataset(
        config.dataset, data_dir=data_dir or config.data_dir, label_column=config.label_column,
        test_fraction=config.test_fraction, seed=config.seed, allow_download=False,
        normalization=config.normalization, feature_bounds=config.feature_bounds, classes=config.classes,
        test_data=config.test_data, checked_before=store.checked_fingerprints(config.dataset), split_rule=rule,
    )
    if config.train_subset is not None and config.train_subset < data.num_train:
        data = train_subset(data, config.train_subset, seed=config.seed, split_rule=rule)
    recorded = plan.get("dataset_fingerprint")
    if recorded and recorded != data.fingerprint:
        raise DPWError(f"the dataset {config.dataset!r} found now is not the one run {run['id']} trained on "
                       "(its fingerprint differs)", hint="point --data-dir at the files the run used")
    if config.mechanism == "pate":
        from engine.array_data import take_rows

        held_out = _held_out_rows(store, run, data.num_test, config.seed)
        return (data.x_train, data.y_train, take_rows(data.x_test, held_out), data.y_test[held_out],
                "the teachers' private training data", "the student's held-out examples (after the public pool)")
    return data.x_train, data.y_train, data.x_test, data.y_test, "training split", "test split"


def _held_out_rows(store, run: dict[str, Any], num_test: int, seed: int):
    """The test rows the PATE run held out from its public pool, in the order the run recorded
    (runs before the order was recorded used the split as stored)."""
    import torch

    from engine.pate.shards import AS_STORED, public_rows

    plan = store.plan_event(run["id"])
    if plan.get("public_pool_size") is None:
        raise DPWError(f"run {run['id']} recorded no public pool size: its held-out examples are unknown")
    rows = public_rows(num_test, order=plan.get("public_order", AS_STORED), seed=seed)
    return torch.from_numpy(rows[int(plan["public_pool_size"]):])


def _losses(model, x, y, chunk: int = 2048) -> np.ndarray:
    """Per-example cross-entropy of the true label (the model in eval mode, no gradients)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    out = []
    with torch.no_grad():
        for start in range(0, x.shape[0], chunk):
            logits = model(x[start:start + chunk])
            out.append(F.cross_entropy(logits, y[start:start + chunk], reduction="none").double().numpy())
    losses = np.concatenate(out) if out else np.zeros(0)
    return np.minimum(losses, 1e6)  # an infinite loss would be a certain "non-member": keep it finite
