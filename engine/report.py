"""Privacy reports: one run's guarantee, how it was obtained, what it costs in utility, and
what it does not cover — as JSON and HTML here, as PDF through the workbench (Qt, offline).

A report contains no private data: no training examples and no raw PATE vote histograms (they
are computed from the private data), unless the caller explicitly asks for the votes; the
report then says so at its top.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from engine.config import AGGREGATOR_FIELDS
from engine.errors import DPWError
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
    "pate-released": "the data-dependent bound released through smooth sensitivity (Papernot et al. 2018, "
    "Section 4.4 and Appendix C), including the cost of the release: safe to publish",
}


def _engine_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-workbench")
    except PackageNotFoundError:
        return "unknown"


def software_versions() -> dict[str, str]:
    from engine.runs import software_versions as versions

    return versions()


def privacy_statement(run: dict[str, Any]) -> dict[str, Any]:
    """The guarantee in numbers and in words."""
    mechanism = run["mechanism"]
    if mechanism == "none" or run.get("epsilon") is None:
        return {
            "mechanism": mechanism,
            "epsilon": None,
            "delta": None,
            "statement": "This model was trained without differential privacy (a non-private baseline): "
            "it carries no privacy guarantee." if mechanism == "none" else
            "This run recorded no privacy guarantee (it did not train).",
        }
    eps, delta, accountant = run["epsilon"], run["delta"], run["accountant"]
    name = {"dpsgd": "DP-SGD", "pate": "PATE"}.get(mechanism, mechanism)
    statement = (
        f"This model satisfies ({eps:.4g}, {delta:.3g})-differential privacy with respect to {UNIT_OF_PRIVACY}: "
        f"for any two training sets that differ by adding or removing one example, the probability of any "
        f"outcome of training changes by at most a factor of e^{eps:.4g} (about {_exp(eps)}x), except with "
        f"probability {delta:.3g}. Mechanism: {name}; epsilon computed by the '{accountant}' accountant."
    )
    if mechanism == "pate":
        statement += pate_statement(run, delta)
    return {
        "mechanism": mechanism,
        "epsilon": eps,
        "delta": delta,
        "accountant": accountant,
        "accountant_version": f"engine.privacy ({accountant}) of dp-workbench {_engine_version()}",
        "accountant_description": ACCOUNTANT_DESCRIPTIONS.get(accountant, accountant),
        "unit_of_privacy": UNIT_OF_PRIVACY,
        "neighbouring_relation": NEIGHBOURING,
        "statement": statement,
        **({"epsilon_kind": "data-dependent (not itself private)",
            "epsilon_released": (run.get("summary") or {}).get("epsilon_released"),
            "epsilon_data_independent": (run.get("summary") or {}).get("epsilon_data_independent")}
           if mechanism == "pate" else {}),
    }


def pate_statement(run: dict[str, Any], delta: float) -> str:
    """What PATE's three epsilons mean, in words (appended to the guarantee)."""
    summary = run.get("summary") or {}
    released, independent = summary.get("epsilon_released"), summary.get("epsilon_data_independent")
    text = (" This epsilon is PATE's data-dependent bound: it depends on the private teacher votes, so the "
            "number itself is not safe to publish.")
    if released is not None:
        text += (f" The value safe to state publicly is the smooth-sensitivity release, epsilon = {released:.4g} "
                 f"(delta {delta:.3g}), which also pays for releasing the bound.")
    if independent is not None:
        text += (f" The worst-case (data-independent) bound for the same queries is epsilon = {independent:.4g}.")
    return text


def _exp(x: float) -> str:
    import math

    return f"{math.exp(x):.3g}" if x < 700 else "inf"


def _plan(store: Store, run_id: int) -> dict[str, Any]:
    return next((e for e in store.events(run_id) if e["type"] == "plan"), {})


def budget_on_private_votes(run: dict[str, Any]) -> bool:
    """A PATE run whose budget was checked on the data-dependent epsilon (runs stored before the
    choice existed were)."""
    config = run.get("config") or {}
    return (run.get("mechanism") == "pate" and config.get("epsilon_budget") is not None
            and config.get("pate_budget_on", "data-dependent") == "data-dependent")


def caveats(run: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """What the guarantee does and does not cover, in plain words."""
    items = [
        f"The guarantee protects each single training example. A person who contributed k examples is "
        f"protected with roughly k times the epsilon (group privacy), and more delta.",
        "It covers the released model and everything computed from it alone. Test accuracy is measured on "
        "held-out data that the guarantee does not protect: if that data is sensitive too, the reported "
        "accuracies reveal something about it.",
        "It covers this one run. Trying several settings on the same data and publishing the best run "
        "spends privacy for every run tried; their epsilons add up (at least), and this report counts one.",
        "The numbers assume the data set was fixed before training and that sampling and noise came from "
        "the engine's seeded random generators; an attacker who knows the seed could remove the noise. "
        "Keep seeds of published runs secret, or use fresh random seeds.",
    ]
    norm = plan.get("normalization") or {}
    if "training split" in str(norm.get("source", "")):
        items.append(
            "The table's feature normalization (per-feature mean and standard deviation) was computed from the "
            "training data without noise and is part of the released model: it is not covered by the guarantee."
        )
    if run["mechanism"] == "pate":
        items.append(
            "PATE's data-dependent epsilon depends on the private votes and is not itself safe to publish; the "
            "released (smooth-sensitivity) epsilon is the one to state. The teachers are never released."
        )
        if budget_on_private_votes(run):
            items.append(
                "This PATE run had an epsilon budget, checked against the data-dependent epsilon after every "
                "query: whether and where the teachers stopped answering depends on the private votes "
                "themselves, and none of the epsilons in this report accounts for that dependence. For a "
                "guarantee that covers it, check the budget on the data-independent epsilon "
                "(pate_budget_on = \"data-independent\"), or run without a budget and choose the number of "
                "queries in advance from public information."
            )
    if run.get("stop_reason") == "budget":
        items.append("Training stopped early, at the epsilon budget; the model is the one after the last step taken.")
    if run["mechanism"] == "none":
        items = ["This is a non-private baseline: the model may reveal its training examples."]
    return items


def _baseline(store: Store, run: dict[str, Any]) -> dict[str, Any] | None:
    """The newest finished non-private run on the same dataset, if the user ran one."""
    for other in reversed(store.list_runs()):
        if other["mechanism"] == "none" and other["status"] == "finished" and other["dataset"] == run["dataset"] \
                and other["id"] != run["id"]:
            return {"run_id": other["id"], "name": other["name"], "model": other["model"],
                    "test_accuracy": other["accuracy"]}
    return None


def build_report(store: Store, run_ref: str | int, *, include_votes: bool = False,
                 figures: bool = True) -> dict[str, Any]:
    """Every field of the report as plain data (what the JSON file holds)."""
    run = store.find_run(run_ref)
    if run["status"] in ("queued", "running"):
        raise DPWError(f"run {run['id']} is {run['status']}; a report needs a finished, stopped or failed run")
    run_id = run["id"]
    plan = _plan(store, run_id)
    summary = run.get("summary") or {}
    config = run["config"]
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "generated": now_iso(),
        "contains_private_data": bool(include_votes),
        "private_data_notice": (
            "THIS REPORT CONTAINS PRIVATE DATA: the raw teacher vote histograms, computed from the private "
            "training data, were included on request. Do not publish it." if include_votes else None
        ),
        "run": {
            "id": run_id, "name": run["name"], "status": run["status"], "stop_reason": run.get("stop_reason"),
            "created": run["created"], "started": run.get("started"), "finished": run.get("finished"),
            "error": run.get("error"),
        },
        "guarantee": privacy_statement(run),
        "training": {
            "mechanism": run["mechanism"],
            "dataset": run["dataset"],
            "dataset_size": run.get("num_train"),
            "test_size": run.get("num_test"),
            "dataset_fingerprint": plan.get("dataset_fingerprint"),
            "normalization": plan.get("normalization"),
            "model": run.get("model"),
            "device": run.get("device"),
        },
        "utility": {
            "test_accuracy": run.get("accuracy"),
            "per_class_accuracy": summary.get("per_class_accuracy"),
            "non_private_baseline": _baseline(store, run),
        },
        "config": config,
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
            "noise_calibrated_from_target_epsilon": plan.get("noise_calibrated"),
            "steps": run.get("steps_done"),
            "steps_planned": run.get("steps_planned"),
            "epochs": run.get("epochs_done"),
            "optimizer": config.get("optimizer"),
            "learning_rate": config.get("learning_rate"),
            "epsilon_budget": run.get("epsilon_budget"),
        }
    if run["mechanism"] == "pate":
        report["pate"] = pate_section(store, run, summary, include_votes=include_votes)
    report["curves"] = curves(store, run)
    if figures:
        report["figures"] = render_figures(report["curves"], run)
    return report


def pate_section(store: Store, run: dict[str, Any], summary: dict[str, Any], *, include_votes: bool) -> dict[str, Any]:
    config = run["config"]
    teacher_accuracy = summary.get("teacher_accuracy") or {}
    section = {
        "teachers": config.get("num_teachers"),
        "aggregator": config.get("aggregator"),
        "aggregator_parameters": {k: config.get(k) for k in AGGREGATOR_FIELDS.get(config.get("aggregator"), ())},
        "queries_asked": summary.get("queries"),
        "queries_answered": summary.get("answered"),
        "epsilon_data_dependent": summary.get("epsilon_data_dependent"),
        "epsilon_data_independent": summary.get("epsilon_data_independent"),
        "epsilon_released": summary.get("epsilon_released"),
        "smooth_sensitivity_release": summary.get("release"),
        "teacher_accuracy_mean": teacher_accuracy.get("mean"),
        "label_accuracy": summary.get("label_accuracy"),
        "semi_supervised": config.get("semi_supervised"),
    }
    if include_votes:
        section["votes"] = [
            {"query": v["query_index"], "histogram": v["histogram"], "answered": v["answered"], "label": v["label"]}
            for v in store.votes(run["id"])
        ]
    return section


def curves(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Accuracy and epsilon against step (no private data: aggregate metrics only)."""
    run_id = run["id"]
    acc = store.metrics(run_id, "test_accuracy")
    result: dict[str, Any] = {"test_accuracy": {"step": [m["step"] for m in acc], "value": [m["value"] for m in acc]}}
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
            ax.plot(curve_data[key]["step"], curve_data[key]["value"], label=key.removeprefix("epsilon_"),
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
def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return html.escape(json.dumps(value))
    return html.escape(str(value))


def _table(rows: dict[str, Any]) -> str:
    body = "".join(f"<tr><th>{html.escape(k.replace('_', ' '))}</th><td>{_fmt(v)}</td></tr>" for k, v in rows.items())
    return f"<table>{body}</table>"


def render_html(report: dict[str, Any]) -> str:
    """A self-contained HTML page (inline CSS and images)."""
    run, guarantee = report["run"], report["guarantee"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Privacy report — run {run['id']} ({html.escape(run['name'])})</title>",
        "<style>body{font-family:sans-serif;max-width:52em;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "th{background:#f3f3f3;font-weight:normal}.guarantee{border:2px solid #2a6;padding:.6em 1em;background:#f2fbf5}"
        ".private{border:3px solid #c00;padding:.6em 1em;background:#fee;font-weight:bold}</style></head><body>",
    ]
    if report.get("private_data_notice"):
        parts.append(f"<p class='private'>{html.escape(report['private_data_notice'])}</p>")
    parts.append(f"<h1>Privacy report: {html.escape(run['name'])} (run {run['id']})</h1>")
    parts.append(f"<p>Status: {_fmt(run['status'])}; stop reason: {_fmt(run.get('stop_reason'))}; "
                 f"generated {_fmt(report['generated'])}.</p>")
    parts.append("<h2>Guarantee</h2>")
    if guarantee.get("epsilon") is not None:
        parts.append(f"<p class='guarantee'><b>ε = {guarantee['epsilon']:.4g}, δ = {guarantee['delta']:.3g}</b><br>"
                     f"{html.escape(guarantee['statement'])}</p>")
        parts.append(_table({k: guarantee[k] for k in ("unit_of_privacy", "neighbouring_relation", "accountant",
                                                       "accountant_version", "accountant_description")}))
    else:
        parts.append(f"<p class='guarantee'>{html.escape(guarantee['statement'])}</p>")
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
                                                      "software": report["software"]}))
    parts.append("<h3>Config</h3>" + _table(report["config"]))
    if report.get("pate", {}).get("votes") is not None:
        parts.append("<h2>Teacher votes (PRIVATE)</h2><table><tr><th>query</th><th>histogram</th><th>answered</th>"
                     "<th>label</th></tr>" + "".join(
                         f"<tr><td>{v['query']}</td><td>{_fmt(v['histogram'])}</td><td>{v['answered']}</td>"
                         f"<td>{_fmt(v['label'])}</td></tr>" for v in report["pate"]["votes"]) + "</table>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(store: Store, run_ref: str | int, out: str | Path, *, include_votes: bool = False) -> Path:
    """Write the report as .json, .html or .pdf (chosen by the file's extension)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".json", ".html", ".htm", ".pdf"):
        raise DPWError(f"--out {out}: unknown report format {suffix or '(none)'}; use .html, .pdf or .json")
    report = build_report(store, run_ref, include_votes=include_votes)
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        out.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    elif suffix in (".html", ".htm"):
        out.write_text(render_html(report), encoding="utf-8")
    else:
        from workbench.report_pdf import html_to_pdf  # Qt renders the PDF offline; no browser

        html_to_pdf(render_html(report), out)
    return out
