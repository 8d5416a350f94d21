"""Privacy reports: one run's guarantee, how it was obtained, what it costs in utility, and
what it does not cover — as JSON and HTML here, as PDF through the workbench (Qt, offline).

A report contains no private data: no training examples, no raw PATE vote histograms, no
statistics of PATE's non-private teachers and no data-dependent epsilon (all computed from the
private data without noise), unless the caller explicitly asks for the votes or the teacher
statistics; the report then says so at its top. Nothing identifying leaves either: the user's data
is named by file name and fingerprint only, never by its folder, and realised sample counts and
per-step training losses stay in the local store. Which epsilon is stated, and whether a run
carries a guarantee at all, is decided by engine.publication.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from engine import rounding
from engine.config import AGGREGATOR_FIELDS
from engine.settings_in_effect import settings_in_effect
from engine.errors import DPWError
from engine.events import to_json_safe
from engine.publication import (
    EXACT_STATISTICS,
    NO_FINITE_BOUND_STATEMENT,
    NO_GUARANTEE_HEADLINE,
    PATE_DATA_INDEPENDENT,
    RELEASED_ESTIMATE,
    SEEDED_NOISE,
    STOPPED_ON_VOTES,
    budget_on_private_votes,
    check_releasable,
    no_guarantee_reason,
    no_guarantee_statement,
    pate_released_estimate,
    public_dataset_name,
    publishable_epsilon,
    randomness,
    release_from_votes,
)
from engine.store import Store, now_iso

REPORT_FORMAT = "dp-workbench privacy report v1"
UNIT_OF_PRIVACY = "one training example"
NEIGHBOURING = "add/remove one example (datasets that differ by the presence of one training example)"
ACCOUNTANT_DESCRIPTIONS = {
    "pld": "privacy loss distribution of the Poisson-subsampled Gaussian, composed by FFT with pessimistic "
    "discretisation (an upper bound on epsilon)",
    "rdp": "Rényi differential privacy of the Poisson-subsampled Gaussian (Mironov et al. 2019), converted to "
    "(epsilon, delta) with the bound of Balle et al. 2020",
    "pate-dd": "data-dependent Rényi DP analysis of PATE's noisy aggregation (Papernot et al. 2018, Theorem 6 "
    "and the threshold check of Confident GNMax), composed over the answered queries and converted to "
    "(epsilon, delta) at the best order; depends on the private votes",
    "pate-di": "data-independent Rényi DP bound of PATE's noisy aggregation (Papernot et al. 2018, "
    "Proposition 8): the worst case over all vote histograms",
    "pate-released": "the data-dependent epsilon released through smooth sensitivity (Papernot et al. 2018, "
    "Section 4.4 and Appendix C), including the cost of the release: safe to publish as an estimate, not a bound "
    "(its noise is centred on the data-dependent cost)",
}
PATE_EPSILON_KIND = "the data-independent bound: it holds whatever the teachers' votes"


def _engine_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-workbench")
    except PackageNotFoundError:
        return "unknown"


def software_versions() -> dict[str, str]:
    from engine.runs import software_versions as versions

    return versions()


# Why a run without a guarantee has none (engine.publication.no_guarantee_reason), and what would give it one.
_WITHOUT_GUARANTEE = {
    SEEDED_NOISE: (", a debugging setting: anyone who knows the seed can rebuild every noise draw and sampled batch "
                   "and remove them.", "With secret noise"),
    EXACT_STATISTICS: (": those statistics reveal the training data, and the model was trained on features scaled by "
                       "them.", "Trained with normalization = \"bounds\" or \"dp\" (counted in epsilon)"),
    STOPPED_ON_VOTES: (": how many queries were answered depends on the votes themselves.",
                       "With the budget checked on the data-independent epsilon"),
}


def privacy_statement(run: dict[str, Any]) -> dict[str, Any]:
    """The guarantee in numbers and in words: the publishable epsilon (engine.publication), and for a
    run that carries no guarantee (engine.publication.no_guarantee_reason), first of all that and why."""
    mechanism = run["mechanism"]
    eps = publishable_epsilon(run)
    if mechanism == "none" or eps.value is None:
        return {
            "mechanism": mechanism,
            "epsilon": None,
            "delta": None,
            "holds": False,
            "statement": "This model was trained without differential privacy (a non-private baseline): "
            "it carries no privacy guarantee." if mechanism == "none" else
            "This run recorded no privacy guarantee (it did not train).",
        }
    value, delta, accountant = eps.value, eps.delta, eps.accountant
    name = {"dpsgd": "DP-SGD", "pate": "PATE"}.get(mechanism, mechanism)
    subject = "This model" if run.get("status") != "failed" else (
        "This run failed before its end, and what it released (the curves and results it recorded; any saved "
        "model) is covered by the privacy of the steps it took: it")
    shown, shown_delta = rounding.up(value, ".4g"), rounding.up(delta, ".3g")
    statement = (
        f"{subject} satisfies ({shown}, {shown_delta})-differential privacy with respect to {UNIT_OF_PRIVACY}: "
        f"for any two training sets that differ by adding or removing one example, the probability of any "
        f"outcome of training on one is at most e^{shown}{_about_exp(value)} times its probability on the "
        f"other, plus {shown_delta}. Mechanism: {name}; epsilon computed by the '{accountant}' accountant."
    )
    if mechanism == "pate":
        statement += pate_statement(run)
    processes = distributed_statement(run)
    if processes:
        statement += " " + processes
    if run.get("resumed_from") is not None and run.get("steps_resumed"):
        statement += (f" This run continued run {run['resumed_from']} from its checkpoint at step "
                      f"{run['steps_resumed']}: epsilon covers all {run.get('steps_done')} steps the model took, "
                      "in both runs.")
    if eps.note:
        statement += f" Tuning study: {eps.note}."
    if not math.isfinite(value):
        statement = (f"{NO_FINITE_BOUND_STATEMENT} at delta {delta:.3g} ('{accountant}' accountant): epsilon is "
                     f"infinite, which bounds nothing. Mechanism: {name}. The attacker figures below, read from the "
                     f"whole privacy profile, can still be finite.")
    elif not eps.guarantee:
        reason = no_guarantee_reason(run)
        why, would_hold = _WITHOUT_GUARANTEE.get(reason, ("", "Otherwise"))
        statement = (f"{no_guarantee_statement(run)}{why} The accountant's figure below would hold only "
                     f"without that. " + statement.replace(
                         f"{subject} satisfies", f"{would_hold}, {subject[0].lower() + subject[1:]} would satisfy", 1))
    out = {
        "mechanism": mechanism,
        "epsilon": value,
        "delta": delta,
        "holds": eps.holds,
        "accountant": accountant,
        "accountant_version": f"engine.privacy ({accountant}) of dp-workbench {_engine_version()}",
        "accountant_description": ACCOUNTANT_DESCRIPTIONS.get(accountant, accountant),
        "unit_of_privacy": UNIT_OF_PRIVACY,
        "neighbouring_relation": NEIGHBOURING,
        "statement": statement,
    }
    distributed = (run.get("summary") or {}).get("distributed")
    if distributed:
        out["processes"] = {"count": distributed.get("world_size"), "noise_added_by": distributed.get("noise_added_by"),
                            "trusted": "every process (each sees the sum of the clipped gradients before the noise)"}
    if mechanism == "pate":
        summary = run.get("summary") or {}
        out.update(epsilon_kind=PATE_EPSILON_KIND, epsilon_data_independent=summary.get("epsilon_data_independent"),
                   epsilon_released=pate_released_estimate(run), epsilon_released_kind=RELEASED_ESTIMATE)
    return out


def distributed_statement(run: dict[str, Any]) -> str | None:
    """For a DP-SGD run trained by several processes (`dpw run --nproc`), who added the noise and whom
    the guarantee trusts (engine.dpsgd.distributed); None for a run of one process."""
    distributed = (run.get("summary") or {}).get("distributed")
    if not distributed:
        return None
    count = distributed.get("world_size")
    return (f"Trained by {count} processes (torch.distributed): the Gaussian noise was added once per step in "
            f"total, by {distributed.get('noise_added_by', 'rank 0')} alone, to the sum of every process's clipped "
            f"gradients, and the accountant counts exactly the single-process sampling rate, noise and steps. "
            f"Every process sees that sum before the noise, so all {count} processes and the machines they ran on "
            f"are trusted as one training process: the guarantee covers what leaves the run.")


def pate_statement(run: dict[str, Any]) -> str:
    """What PATE's epsilon is, in words (appended to the guarantee), and its released estimate if any."""
    text = " This epsilon is PATE's data-independent bound: it holds whatever the teachers' votes."
    estimate = pate_released_estimate(run)
    if estimate is not None:
        text += (f" The votes' data-dependent epsilon is estimated at {estimate:.4g}, {RELEASED_ESTIMATE}; "
                 "this model's guarantee is the bound above.")
    return text


def _about_exp(x: float) -> str:
    """" (about 20.1x)" for e^x, rounded up; nothing where e^x is beyond a float (the statement's e^x says it)."""
    return f" (about {rounding.up(math.exp(x), '.3g')}x)" if x < 700 else ""


def _exact_statistics(plan: dict[str, Any]) -> bool:
    """Whether the run's features were scaled by the training data's own statistics (engine.feature_scaling)."""
    return "training split" in str((plan.get("normalization") or {}).get("source", ""))


GROUP_SIZES = (2, 3, 5)
"""Group sizes (rows of one person) whose guarantee the caveats state."""


def _bound(x: float, digits: int) -> str:
    """A bound to `digits` significant digits, rounded up, without trailing zeros: 0.0002919 -> "0.0003"."""
    from engine.rounding import significant_up

    return f"{float(significant_up(x, digits)):.{digits}g}"


def group_privacy_caveat(run: dict[str, Any]) -> str:
    """The unit of privacy (one row), and what is left for a person with several rows: the group bound
    for k = GROUP_SIZES rows at this run's epsilon (engine.privacy.group), or that it bounds nothing."""
    from engine.privacy.group import group_bound

    text = ("The unit of privacy is one training example: one row of the data. A person with k rows is covered "
            "only by the group bound (kε, k·e^((k−1)ε)·δ)")
    eps = publishable_epsilon(run)
    if not eps.holds or eps.value is None or eps.delta is None:
        return text + "."
    bounds = []
    for k in GROUP_SIZES:
        bound = group_bound(epsilon=eps.value, delta=eps.delta, group_size=k)
        bounds.append(f"{k} rows, no guarantee (δ would be {_bound(bound.delta, 2)} ≥ 1)" if bound.vacuous else
                      f"{k} rows, ε = {_bound(bound.epsilon, 4)} and δ = {_bound(bound.delta, 2)}")
    return text + ": " + "; ".join(bounds) + "."


def split_caveat(run: dict[str, Any], plan: dict[str, Any]) -> str | None:
    """What one example more or less in the user's data does to the examples the run trained on
    (engine.data_split), where the run drew its split or a training subset; None where it did not."""
    from engine.data_split import SPLIT_BY_EXAMPLE
    from engine.datasets import has_published_test_split, is_registered

    drawn = str(plan.get("data_split") or "")
    subset = (run.get("config") or {}).get("train_subset") is not None and "training subset" in drawn
    if plan.get("split_rule") == SPLIT_BY_EXAMPLE:
        if "per-example split" not in drawn and not subset:
            return None
        text = ("Which examples were trained on was decided per example, by a keyed hash of each example and the "
                "seed: one example more or less in the data changes the training split by that example alone")
        if subset:
            return text + (", but can swap one example of the training subset for another: for the data as given, "
                           "the guarantee is the group bound for 2 rows above.")
        return text + (", so the guarantee protects each training example as part of the data given, not only of "
                       "the split drawn from it.")
    dataset = str(run.get("dataset") or "")
    # Drawn for certain: a CSV file, or a registered dataset without test files (an .npz or a folder
    # may hold test arrays of its own, which a run before the rule did not record).
    split_here = dataset.lower().endswith(".csv") or (is_registered(dataset) and not has_published_test_split(dataset))
    if not plan or not (split_here or (run.get("config") or {}).get("train_subset") is not None):
        return None
    return ("This run drew its training examples by a seeded permutation of the whole data, as runs did before "
            "the per-example split: one example more or less in the data changes which other examples were "
            "trained on, so the guarantee covers the training examples as drawn, not the data as given. Train "
            "again for a guarantee on the data as given.")


TREATED_AS_PUBLIC_SIZE = ("Treated as public: the size of the training set. Under add/remove neighbours the guarantee "
                          "hides whether one example was present, not how many examples there were; the report "
                          "states the size.")


def classes_caveat(run: dict[str, Any]) -> str | None:
    """For a user's own data whose classes the config did not declare (engine.declared_classes): their
    set came from the data's labels; None for a registered dataset or declared classes."""
    from engine.datasets import is_registered

    if is_registered(str(run.get("dataset") or "")) or (run.get("config") or {}).get("classes"):
        return None
    return ("Treated as public: the set of classes, read from the data's own labels. The model and its export "
            "have one output per class found, so an example whose class no other example has is not hidden by "
            "the guarantee; declare the classes (classes = \"a, b, ...\") from public knowledge to hide it.")


def pate_pool_caveat(plan: dict[str, Any]) -> str:
    """PATE's student learns from the test split's examples without noise: they must be public."""
    text = ("Treated as public: the student's pool (the examples the teachers label and the student trains on) "
            "and the held-out examples it is scored on, both from the test split. The guarantee protects the "
            "teachers' training examples only.")
    drawn = str(plan.get("data_split") or "")
    if drawn.startswith(("per-example split", "stratified split")):
        text += (" This run drew its test split from the data given (test_fraction of it): those examples are not "
                 "protected. When all of the data is private, give PATE public pool data of its own (test_data for a "
                 "CSV file or an image folder; x_test and y_test beside x and y in an .npz).")
    return text


def caveats(run: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """What the guarantee does and does not cover, in plain words."""
    from engine.audit_run import audit_model_line

    audit_model = [line[0].upper() + line[1:] + "."] if (line := audit_model_line(run)) else []
    if run["mechanism"] == "none":
        return ["This is a non-private baseline: the model may reveal its training examples."] + audit_model
    items = [
        group_privacy_caveat(run),
        TREATED_AS_PUBLIC_SIZE,
        "Treated as public: the test metrics. Test accuracy is measured on held-out data, without privacy: "
        "the guarantee does not protect that data, and if it is sensitive the reported accuracies reveal "
        "something about it.",
        (f"Tuning study: {publishable_epsilon(run).note}." if publishable_epsilon(run).note else
         "This epsilon covers this one run. Trying several settings on the same data and publishing the best "
         "run spends privacy for every run tried; their epsilons add up (at least), and this epsilon counts "
         "one.") + " The total spent on the dataset by all its runs is stated by `dpw ledger`.",
    ]
    if run["mechanism"] == "pate":
        items.insert(2, "Treated as public: the number of teachers (and so the size of each teacher's shard), "
                        "which the report states.")
        items.insert(3, pate_pool_caveat(plan))
    if (split := split_caveat(run, plan)) is not None:
        items.insert(1, split)
    if (classes := classes_caveat(run)) is not None:
        items.insert(items.index(TREATED_AS_PUBLIC_SIZE) + 1, classes)
    if randomness(run)["privacy_noise"] == "secret":
        items.append("The privacy noise and the sampling came from secret operating-system randomness that was "
                     "never stored: the published seed does not determine them (it governs only initialisation, "
                     "splits, shards and training order).")
    else:
        items.insert(0, no_guarantee_statement(run) + ": this run was made for debugging. Do not publish its "
                        "model as private; train it again with secret noise.")
    if no_guarantee_reason(run) == EXACT_STATISTICS or _exact_statistics(plan):
        items.insert(0, f"{NO_GUARANTEE_HEADLINE}: the table's feature normalization (per-feature mean and standard "
                        "deviation) was computed from the training data without noise and is part of the released "
                        "model. Do not publish this model as private; train it again with normalization = "
                        "\"bounds\" (declared ranges) or \"dp\" (statistics counted in epsilon).")
    if run["mechanism"] == "pate":
        items.append(
            "PATE's data-dependent epsilon depends on the private votes and is not itself safe to publish: it is "
            "not stated here. The teachers and their accuracies are never released."
        )
        if release_from_votes(run):
            items.append(
                "The smooth-sensitivity release's parameters (order, beta, sigma) were chosen by looking at the "
                "private votes (release_parameters = \"data-dependent\"): its estimate of the data-dependent "
                "epsilon does not cover that choice and is not shown. Fix them from public settings (the default) "
                "for an estimate that is shown."
            )
        if budget_on_private_votes(run):
            items.insert(0,
                f"{NO_GUARANTEE_HEADLINE}: this PATE run had an epsilon budget, checked against the "
                "data-dependent epsilon after every query: whether and where the teachers stopped answering "
                "depends on the private votes themselves, and none of the epsilons in this report accounts for "
                "that dependence. For a guarantee that covers it, check the budget on the data-independent "
                "epsilon (pate_budget_on = \"data-independent\"), or run without a budget and choose the number "
                "of queries in advance from public information."
            )
    if run.get("stop_reason") == "budget":
        items.append("Training stopped early, at the epsilon budget; the model is the one after the last step taken.")
    return items + audit_model


def _baseline(store: Store, run: dict[str, Any]) -> dict[str, Any] | None:
    """The newest finished non-private run on the same dataset, if the user ran one."""
    for other in reversed(store.list_runs()):
        if other["mechanism"] == "none" and other["status"] == "finished" and other["dataset"] == run["dataset"] \
                and other["id"] != run["id"]:
            return {"run_id": other["id"], "name": other["name"], "model": other["model"],
                    "test_accuracy": other["accuracy"]}
    return None


def private_data_notice(*, include_votes: bool, include_teacher_stats: bool, include_audit: bool = False,
                        exact_statistics: bool = False) -> str | None:
    """The line at the top of a report that holds private data (None when it holds none): on request, or
    the exact feature statistics a run with normalization = "exact" was trained with (they are the model's)."""
    what = []
    if exact_statistics:
        what.append("the table's feature mean and standard deviation (normalization = \"exact\"), which the "
                    "model ships with")
    if include_audit:
        what.append("a membership-inference audit (the model's losses on training examples against held-out ones, "
                    "and the run's canary audit if it had one)")
    if include_votes:
        what.append("the raw teacher vote histograms and the data-dependent epsilon computed from them")
    if include_teacher_stats:
        what.append("the accuracies of the teachers and of their plurality vote (models trained without "
                    "privacy on private data)")
    if not what:
        return None
    requested = " on request" if len(what) > int(exact_statistics) else ""
    return ("THIS REPORT CONTAINS PRIVATE DATA: " + " and ".join(what) + ", computed from the private training "
            f"data without noise, were included{requested}. Do not publish it.")


def public_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run's settings as they may leave the machine: only those the run read (a DP-SGD run lists
    no PATE settings: engine.settings_in_effect), the dataset by file name only, no data folder."""
    used = settings_in_effect(config)
    out = {name: config[name] for name in used if name in config}
    if "dataset" in out:
        out["dataset"] = public_dataset_name(out["dataset"])
    out.pop("data_dir", None)
    return out


def build_report(store: Store, run_ref: str | int, *, include_votes: bool = False,
                 include_teacher_stats: bool = False, figures: bool = True,
                 include_audit: bool = False) -> dict[str, Any]:
    """Every field of the report as plain data (what the JSON file holds)."""
    run = store.find_run(run_ref)
    check_releasable(run)
    if run["status"] in ("queued", "running"):
        raise DPWError(f"run {run['id']} is {run['status']}; a report needs a finished, stopped or failed run")
    run_id = run["id"]
    plan = store.plan_event(run_id)
    summary = run.get("summary") or {}
    config = run["config"]
    exact_statistics = _exact_statistics(plan)
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "generated": now_iso(),
        "contains_private_data": bool(include_votes or include_teacher_stats or include_audit or exact_statistics),
        "private_data_notice": private_data_notice(include_votes=include_votes,
                                                   include_teacher_stats=include_teacher_stats,
                                                   include_audit=include_audit, exact_statistics=exact_statistics),
        "run": {
            "id": run_id, "name": run["name"], "status": run["status"], "stop_reason": run.get("stop_reason"),
            "created": run["created"], "started": run.get("started"), "finished": run.get("finished"),
            "error": run.get("error"),
        },
        "guarantee": privacy_statement(run),
        "attacker": attacker_section(run),
        "randomness": randomness(run),
        "training": {
            "mechanism": run["mechanism"],
            "dataset": public_dataset_name(run["dataset"]),
            "dataset_size": run.get("num_train"),
            "test_size": run.get("num_test"),
            "dataset_fingerprint": plan.get("dataset_fingerprint"),
            "data_split": plan.get("data_split"),
            "normalization": plan.get("normalization"),
            "model": run.get("model"),
            "device": run.get("device"),
        },
        "utility": {
            "test_accuracy": run.get("accuracy"),
            "per_class_accuracy": summary.get("per_class_accuracy"),
            "non_private_baseline": _baseline(store, run),
        },
        "config": public_config(config),
        "config_hash": run["config_hash"],
        "seed": config.get("seed"),
        "software": plan.get("software") or {},
        "report_software": software_versions(),
        "caveats": caveats(run, plan),
    }
    if run["mechanism"] == "dpsgd":
        report["dpsgd"] = {
            "sampling": "Poisson",
            "sample_rate": run.get("sample_rate"),
            "expected_batch_size": config.get("expected_batch_size"),
            "clipping_norm": run.get("clipping_norm"),
            "noise_multiplier": run.get("noise_multiplier"),
            "noise_calibrated_from_target_epsilon": plan.get("noise_calibrated")
            and not config.get("target_attack_tpr"),
            "noise_calibrated_from_target_attack_tpr": plan.get("noise_calibrated")
            and bool(config.get("target_attack_tpr")),
            "steps": run.get("steps_done"),
            "steps_planned": run.get("steps_planned"),
            "continued_from_run": run.get("resumed_from"),
            "steps_in_that_run": run.get("steps_resumed"),
            "epochs": run.get("epochs_done"),
            "optimizer": config.get("optimizer"),
            "learning_rate": config.get("learning_rate"),
            "epsilon_budget": run.get("epsilon_budget"),
        }
    if run["mechanism"] == "pate":
        report["pate"] = pate_section(store, run, summary, include_votes=include_votes,
                                      include_teacher_stats=include_teacher_stats)
    if include_audit:
        from engine.audit_run import kept_or_new_audit

        report["audit"] = kept_or_new_audit(store, run)
    report["curves"] = curves(store, run)
    if figures:
        report["figures"] = render_figures(report["curves"], run)
    return report


def attacker_section(run: dict[str, Any]) -> dict[str, Any] | None:
    """"What this epsilon means for an attacker": the attack figures of the run's guarantee
    (engine.attack_risk, public parameters only), in numbers and plain words; None for a run with no
    guarantee (non-private, or noise reproducible from the seed), which makes no such claim."""
    from engine.attack_risk import attacker_statements, run_attack_risk

    result = run_attack_risk(run)
    if result.risk is None:
        return None
    figures = result.risk
    return {
        "title": "What this epsilon means for an attacker",
        "statements": attacker_statements(figures),
        "basis": result.basis,
        "max_advantage": figures.max_advantage,
        "tpr_at_fpr": {f"{k:g}": v for k, v in figures.tpr_at_fpr.items()},
        "posterior": {f"{k:g}": v for k, v in figures.posterior.items()},
        "posterior_fails_with_probability": figures.delta,
        "tradeoff": {"fpr": figures.tradeoff_fpr.tolist(), "tpr": figures.tradeoff_tpr.tolist()},
    }


def pate_section(store: Store, run: dict[str, Any], summary: dict[str, Any], *, include_votes: bool,
                 include_teacher_stats: bool = False) -> dict[str, Any]:
    """How PATE answered, with public figures only; the votes with the data-dependent epsilon, and
    the teachers' accuracies, only on request."""
    config = run["config"]
    section: dict[str, Any] = {
        "teachers": config.get("num_teachers"),
        "aggregator": config.get("aggregator"),
        "aggregator_parameters": {k: config.get(k) for k in AGGREGATOR_FIELDS.get(config.get("aggregator"), ())},
        "queries_asked": summary.get("queries"),
        "queries_answered": summary.get("answered"),
        "epsilon_data_independent": summary.get("epsilon_data_independent"),
        "epsilon_released": pate_released_estimate(run),
        "smooth_sensitivity_release": summary.get("release"),
        "label_accuracy": summary.get("label_accuracy"),
        "semi_supervised": config.get("semi_supervised"),
    }
    if include_teacher_stats:
        section["teacher_accuracy_private"] = summary.get("teacher_accuracy")
        section["ensemble_accuracy_private"] = summary.get("ensemble_accuracy")
    if include_votes:
        # A function of the votes, which are in the report now anyway.
        section["epsilon_data_dependent_not_publishable"] = summary.get("epsilon_data_dependent")
        section["votes"] = [
            {"query": v["query_index"], "histogram": v["histogram"], "answered": v["answered"], "label": v["label"]}
            for v in store.votes(run["id"])
        ]
    return section


def curves(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Accuracy and epsilon against step (no private data: aggregate metrics only). A PATE run has one
    epsilon curve, the publishable one (engine.publication): never the data-dependent series."""
    run_id = run["id"]
    acc = store.metrics(run_id, "test_accuracy")
    result: dict[str, Any] = {"test_accuracy": {"step": [m["step"] for m in acc], "value": [m["value"] for m in acc]}}
    if run["mechanism"] == "pate":
        di = store.privacy(run_id, PATE_DATA_INDEPENDENT)
        if di:
            result["epsilon_publishable"] = {"step": [int(p["step"]) for p in di],
                                             "value": [float(p["epsilon"]) for p in di]}
        return result
    for accountant in sorted({p["accountant"] for p in store.privacy(run_id)}):
        rows = store.privacy(run_id, accountant)
        result[f"epsilon_{accountant}"] = {"step": [p["step"] for p in rows], "value": [p["epsilon"] for p in rows]}
    return result


def render_figures(curve_data: dict[str, Any], run: dict[str, Any]) -> dict[str, str]:
    """PNG images (data URLs) of the epsilon and accuracy curves, drawn offline with matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    images = {}
    eps_keys = [k for k in curve_data if k.startswith("epsilon_")]
    if eps_keys:
        fig = Figure(figsize=(6, 3.2), dpi=110)
        ax = fig.add_subplot()
        for key in eps_keys:
            label = key.removeprefix("epsilon_")
            if label == "publishable":
                label = "publishable (min of data-independent and released)"
            elif not publishable_epsilon(run).guarantee:
                label += " (no guarantee)"
            ax.plot(curve_data[key]["step"], curve_data[key]["value"], label=label,
                    marker="o" if len(curve_data[key]["step"]) < 40 else None, markersize=3)
        if run.get("epsilon_budget"):
            ax.axhline(run["epsilon_budget"], color="crimson", linestyle="--", label="budget")
        ax.set_xlabel("step" if run["mechanism"] != "pate" else "queries")
        ax.set_ylabel("epsilon")
        ax.set_title("Privacy spent")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        images["epsilon"] = _png(fig)
    acc = curve_data["test_accuracy"]
    if acc["step"]:
        fig = Figure(figsize=(6, 3.2), dpi=110)
        ax = fig.add_subplot()
        ax.plot(acc["step"], acc["value"], marker="o", markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("test accuracy")
        ax.set_title("Utility")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        images["accuracy"] = _png(fig)
    return images


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


# ---- HTML ------------------------------------------------------------------------------------
_BOUND_KEYS = {"epsilon", "epsilon_data_independent", "epsilon_data_independent_if_all_answered"}
"""Keys whose value is an upper bound a reviewer may quote: shown rounded up (engine.rounding)."""


def _fmt(value: Any, key: Any = None) -> str:
    """A value as HTML: a nested mapping as a table of labelled rows (never raw JSON), a list of plain
    values as a comma-separated line, a list of mappings as one small table each."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return rounding.up(value, ".6g") if key in _BOUND_KEYS else f"{value:.6g}"
    if isinstance(value, dict):
        return _table(value, nested=True) if value else "—"
    if isinstance(value, (list, tuple)):
        if not value:
            return "—"
        if all(isinstance(v, dict) for v in value):
            return "".join(_table(v, nested=True) for v in value)
        return ", ".join(_fmt(v) for v in value)
    return html.escape(str(value))


_KEY_LABELS = {
    # the smooth-sensitivity release (engine.privacy.pate_smooth.SmoothSensitivityRelease)
    "order": "RDP order",
    "beta": "smoothness beta",
    "sigma_ss": "noise sigma of the release",
    "rdp_released": "released data-dependent RDP (noisy, may fall below 0; counted as at least 0)",
    "release_rdp": "RDP cost of the release",
    "conditions_hold": "conditions of the data-dependent bound hold",
    "parameters_from_data": "parameters chosen from the votes",
}
"""Row labels for nested keys whose names alone would puzzle a reviewer."""


def _label(key: Any) -> str:
    return html.escape(_KEY_LABELS.get(str(key), str(key).replace("_", " ")))


def _table(rows: dict[str, Any], *, nested: bool = False) -> str:
    body = "".join(f"<tr><th>{_label(k)}</th><td>{_fmt(v, k)}</td></tr>" for k, v in rows.items())
    return f"<table class='nested'>{body}</table>" if nested else f"<table>{body}</table>"


def render_html(report: dict[str, Any]) -> str:
    """A self-contained HTML page (inline CSS and images)."""
    run, guarantee = report["run"], report["guarantee"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Privacy report — run {run['id']} ({html.escape(run['name'])})</title>",
        "<style>body{font-family:sans-serif;max-width:52em;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "th{background:#f3f3f3;font-weight:normal}table.nested{margin:0}table.nested th{background:#fafafa}"
        ".guarantee{border:2px solid #2a6;padding:.6em 1em;background:#f2fbf5}"
        ".private{border:3px solid #c00;padding:.6em 1em;background:#fee;font-weight:bold}</style></head><body>",
    ]
    if report.get("private_data_notice"):
        parts.append(f"<p class='private'>{html.escape(report['private_data_notice'])}</p>")
    parts.append(f"<h1>Privacy report: {html.escape(run['name'])} (run {run['id']})</h1>")
    parts.append(f"<p>Status: {_fmt(run['status'])}; stop reason: {_fmt(run.get('stop_reason'))}; "
                 f"generated {_fmt(report['generated'])}.</p>")
    parts.append("<h2>Guarantee</h2>")
    if guarantee.get("epsilon") is not None and not guarantee.get("holds", True):
        headlines = [f"{NO_GUARANTEE_HEADLINE}: {why}" for why in _WITHOUT_GUARANTEE] + [NO_FINITE_BOUND_STATEMENT]
        headline = next((h for h in headlines
                         if guarantee["statement"].startswith(h)), "")
        rest = guarantee["statement"].removeprefix(headline)
        parts.append(f"<p class='private'><b>{html.escape(headline)}</b><span style='font-weight:normal'>"
                     f"{html.escape(rest)}</span></p>")
        parts.append(_table({k: guarantee[k] for k in ("unit_of_privacy", "neighbouring_relation", "accountant",
                                                       "accountant_version", "accountant_description")}))
    elif guarantee.get("epsilon") is not None:
        shown = f"ε = {rounding.up(guarantee['epsilon'], '.4g')}, δ = {rounding.up(guarantee['delta'], '.3g')}"
        parts.append(f"<p class='guarantee'><b>{shown}</b><br>"
                     f"{html.escape(guarantee['statement'])}</p>")
        parts.append(_table({k: guarantee[k] for k in ("unit_of_privacy", "neighbouring_relation", "accountant",
                                                       "accountant_version", "accountant_description")}))
    else:
        parts.append(f"<p class='guarantee'>{html.escape(guarantee['statement'])}</p>")
    if report.get("attacker"):
        attacker = report["attacker"]
        parts.append(f"<h3>{html.escape(attacker['title'])}</h3><ul>"
                     + "".join(f"<li>{html.escape(line)}</li>" for line in attacker["statements"])
                     + f"</ul><p><small>Upper bounds from the guarantee alone (f-DP trade-off curve); computed "
                     f"from {html.escape(attacker['basis'])}.</small></p>")
    if "dpsgd" in report:
        parts.append("<h2>How: DP-SGD</h2>" + _table(report["dpsgd"]))
    if "pate" in report:
        pate = {k: v for k, v in report["pate"].items() if k != "votes"}
        parts.append("<h2>How: PATE</h2>" + _table(pate))
    parts.append("<h2>Training data and model</h2>" + _table(report["training"]))
    utility = report["utility"]
    parts.append("<h2>Utility</h2>" + _table({"test_accuracy": utility["test_accuracy"],
                                              "non_private_baseline": utility["non_private_baseline"]}))
    if utility.get("per_class_accuracy"):
        parts.append("<h3>Per-class test accuracy</h3>" + _table(utility["per_class_accuracy"]))
    for key, title in (("epsilon", "Privacy spent"), ("accuracy", "Test accuracy")):
        if key in report.get("figures", {}):
            parts.append(f"<h3>{title}</h3><p><img alt='{title}' src='{report['figures'][key]}' width='600'></p>")
    parts.append("<h2>What the guarantee does and does not cover</h2><ul>"
                 + "".join(f"<li>{html.escape(c)}</li>" for c in report["caveats"]) + "</ul>")
    parts.append("<h2>Reproducibility</h2>" + _table({"config_hash": report["config_hash"], "seed": report["seed"],
                                                      "randomness": report.get("randomness"),
                                                      "software": report["software"]}))
    parts.append("<h3>Config</h3>" + _table(report["config"]))
    if report.get("audit"):
        parts.append("<h2>Membership-inference audit (PRIVATE: computed from the training data)</h2>"
                     + _table(audit_rows(report["audit"])))
    if report.get("pate", {}).get("votes") is not None:
        parts.append("<h2>Teacher votes (PRIVATE)</h2><table><tr><th>query</th><th>histogram</th><th>answered</th>"
                     "<th>label</th></tr>" + "".join(
                         f"<tr><td>{v['query']}</td><td>{_fmt(v['histogram'])}</td><td>{v['answered']}</td>"
                         f"<td>{_fmt(v['label'])}</td></tr>" for v in report["pate"]["votes"]) + "</table>")
    parts.append("</body></html>")
    return "".join(parts)


def audit_rows(audit: dict[str, Any]) -> dict[str, str]:
    """The report's audit table from a `dpw audit --json` object: a TPR below FPR 1 / non-members is
    stated as not measurable, and the theory check in words (engine.audit.membership)."""
    from engine.audit.membership import not_measurable, theory_check_text
    from engine.audit_run import canary_text

    mia = audit["mia"]
    rows = {
        "attack": audit["attack"],
        "computed": audit.get("computed", "with this report"),
        "examples": f"{mia['members']} members, {mia['nonmembers']} non-members",
        "AUC": f"{mia['auc']:.4f} [{mia['auc_interval'][0]:.4f}, {mia['auc_interval'][1]:.4f}] "
               f"({100 * mia['confidence']:g}% bootstrap)",
    }
    for key, tpr in mia["tpr_at_fpr"].items():
        why = not_measurable(float(key), mia["nonmembers"])
        lo, hi = mia["tpr_interval"].get(key) or (None, None)
        rows[f"TPR at FPR {100 * float(key):g}%"] = why if tpr is None or why else (
            f"{100 * tpr:.3g}% [{100 * lo:.3g}%, {100 * hi:.3g}%]")
    theory = mia.get("theory")
    rows["theory check"] = (theory_check_text(theory, members=mia["members"], nonmembers=mia["nonmembers"])
                            if theory else "no guarantee to check against")
    rows["canary audit"] = canary_text(audit.get("canaries"))
    return rows


def write_report(store: Store, run_ref: str | int, out: str | Path, *, include_votes: bool = False,
                 include_teacher_stats: bool = False, include_audit: bool = False) -> Path:
    """Write the report as .json, .html or .pdf (chosen by the file's extension)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".json", ".html", ".htm", ".pdf"):
        raise DPWError(f"--out {out}: unknown report format {suffix or '(none)'}; use .html, .pdf or .json")
    report = build_report(store, run_ref, include_votes=include_votes, include_teacher_stats=include_teacher_stats,
                          include_audit=include_audit)
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        # Strict JSON: an infinite epsilon is the string "Infinity" (engine.events.to_json_safe), as in --json.
        out.write_text(json.dumps(to_json_safe(report), indent=2, default=str, allow_nan=False), encoding="utf-8")
    elif suffix in (".html", ".htm"):
        out.write_text(render_html(report), encoding="utf-8")
    else:
        from workbench.report_pdf import html_to_pdf  # Qt renders the PDF offline; no browser

        html_to_pdf(render_html(report), out)
    return out
