"""`dpw`: the engine without a window. Each command is a thin shell over an engine function.

Heavy imports (torch) happen only inside the commands that train; `dpw privacy ...` and
`dpw list` start fast.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import click

from engine import rounding
from engine.cli_follow import StandbyRunner, StopRequests, follow_runner
from engine.lock_watch import on_terminal
from engine.cli_privacy import RISK_LABEL, check_number, echo_risk_rows, privacy
from engine.cli_shell import (
    DPWGroup,
    RunCommand,
    UserError,
    db_option,
    echo_json,
    epsilon_text,
    fail,
    open_store,
    open_store_after_check,
    say_on_terminal,
)
from engine.errors import DPWError


@click.group(cls=DPWGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dp-workbench")
def cli() -> None:
    """DP Workbench: train models with differential privacy and state the guarantee.

    Example: dpw run resources/examples/quickstart.toml
    """


# ---- run ---------------------------------------------------------------------------------------
@cli.command()
@click.argument("config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@db_option
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where registered datasets' files are (overrides the config's data_dir).")
@click.option("--name", default=None, help="Name of the run (overrides the config's name).")
@click.option("--download", is_flag=True,
              help="Fetch the dataset's files into the data folder if they are missing (sets allow_download; "
              "needs network).")
@click.option("--json", "as_json", is_flag=True, help="Print the events as JSON lines instead of a progress bar.")
@click.option("--nproc", type=int, default=1, show_default=True,
              help="DP-SGD processes on this machine (torchrun; gloo on CPU, NCCL on GPUs): one run, one store row.")
@click.option("--nnodes", type=int, default=1, show_default=True,
              help="Machines taking part (torchrun --nnodes); run the same command on each.")
@click.option("--node-rank", type=int, default=0, show_default=True,
              help="This machine's number, 0 to nnodes-1 (torchrun --node-rank); machine 0 stores the run.")
@click.option("--master-addr", default=None,
              help="Address of machine 0, reachable from every machine (torchrun --master-addr).")
@click.option("--master-port", type=int, default=None,
              help="A free TCP port on machine 0 (torchrun --master-port; default 29500 with --master-addr).")
def run(config_file: Path, db: Path | None, data_dir: Path | None, name: str | None, download: bool,
        as_json: bool, nproc: int, nnodes: int, node_rank: int, master_addr: str | None,
        master_port: int | None) -> None:
    """Train one run from a TOML config in a background engine process.

    The config is checked against its data first (files present, delta below 1/N, the model fits
    the data, ...): a config that cannot train prints one line and stores no run.

    With --nproc N (DP-SGD), N processes train the run under torch.distributed.run, each
    Poisson-sampling its shard of the data at the run's rate; the noise is added once per step,
    by rank 0, and the privacy is the single-process run's. Across machines, run the same command
    on every machine with --nnodes, --node-rank (0 on the machine that keeps the store),
    --master-addr and --master-port; the other machines need the same dataset files (--data-dir).

    \b
    Example: dpw run resources/examples/quickstart.toml
    Example: dpw run resources/examples/quickstart.toml --nproc 2
    Example, machine 1 of 2 (machine 0 the same with --node-rank 0):
      dpw run quickstart.toml --nproc 4 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500
    """
    from engine.config import RunConfig

    config = RunConfig.load_toml(config_file)
    changes: dict[str, Any] = {}
    if data_dir is not None:
        changes["data_dir"] = str(data_dir.resolve())
    if name:
        changes["name"] = name
    if download:
        changes["allow_download"] = True
    config = config.replace(**changes) if changes else config
    warn_settings_without_effect(config)
    from engine.distributed_launch import Launch, check_distributable

    launch = Launch(nproc=nproc, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                    master_port=master_port)
    launch.check()
    if launch.distributed:
        check_distributable(config)
    if not launch.stores_the_run:  # this machine's ranks train; machine 0 stores the run and its events
        sys.exit(subprocess.call(launch.command(["--data-dir", config.data_dir] if config.data_dir else [])))
    from engine.precheck import check_before_storing

    with StandbyRunner() if not launch.distributed else contextlib.nullcontext() as standby:
        if not as_json:  # reading a large dataset takes a while before anything else is said
            say_on_terminal(f"checking {config_file.name} against its data…")
        check = standby.check if standby is not None else check_before_storing  # the runner keeps what it checked
        store = open_store_after_check(
            db, lambda checked: check(config, checked_before=checked), dataset=config.dataset)
        watch = on_terminal(store.path, as_json=as_json)  # storing the run may wait on another's lock too
        run_id = store.create_run(config)
        status = follow_runner(store.path, run_id, as_json=as_json, store=store, launch=launch,
                               summary_follows=True, standby=standby, watch=watch)
    end_of_run(store, run_id, status, as_json=as_json)


def end_of_run(store: Any, run_id: int, status: str, *, as_json: bool) -> None:
    """After dpw run or resume: the run's summary from the store, and exit status 1 if it failed. A run
    deleted once it had finished (its audit may still have been running) has no row left to summarise."""
    try:
        run_row = store.get_run(run_id)
    except DPWError:
        if not any(r["id"] == run_id for r in store.deleted_runs()):
            raise
        click.echo(f"run {run_id} ended ({status}) and was deleted meanwhile; the privacy it spent stays in "
                   "the dataset's ledger (dpw list --deleted, dpw ledger)", err=as_json)
    else:
        if not as_json:
            print_summary(run_row, store=store)
    if status == "failed":
        sys.exit(1)


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the events as JSON lines instead of a progress bar.")
@click.option("--nproc", type=int, default=1, show_default=True,
              help="DP-SGD processes on this machine for the steps left (as dpw run --nproc), whatever the "
              "first run used.")
def resume(run_ref: str, db: Path | None, as_json: bool, nproc: int) -> None:
    """Continue a stopped or failed DP-SGD run from its last checkpoint, as a new run.

    A run keeps a checkpoint at every evaluation, every few minutes and when training ends. The new
    run takes the same config and data, starts at the checkpoint's step and trains the steps left.
    Its epsilon is that of all the steps its model took (both runs' together); the dataset's ledger
    counts the first run's steps with it and the new run's own steps with the new run. The number
    of processes does not change the privacy: each step samples at the run's rate either way.

    \b
    Example: dpw resume 12
    Example: dpw resume 12 --nproc 4
    """
    from engine.checkpoint import load_checkpoint
    from engine.config import RunConfig
    from engine.precheck import check_before_storing
    from engine.runner import check_continues, checkpoint_of, resumable

    from engine.distributed_launch import Launch, check_distributable

    launch = Launch(nproc=nproc)
    launch.check()
    store = open_store(db)
    store.reconcile_orphans()  # a run whose runner was killed is marked failed before it is judged
    parent = store.find_run(run_ref)
    parent = resumable(store, parent["id"])
    with StandbyRunner() if not launch.distributed else contextlib.nullcontext() as standby:
        checkpoint = load_checkpoint(checkpoint_of(store, parent["id"]))  # readable, before a run is stored
        store.check_writable()
        config = RunConfig.from_dict(parent["config"])
        if launch.distributed:
            check_distributable(config)
        prepared = check_before_storing(config, checked_before=store.checked_fingerprints(config.dataset))
        check_continues(parent, prepared)  # the same data, sample rate and noise
        watch = on_terminal(store.path, as_json=as_json)
        run_id = store.create_run(config, resumed_from=parent["id"])
        if not as_json:
            click.echo(f"run {run_id}: continues run {parent['id']} ({parent['name']}) from step "
                       f"{checkpoint['step']} of {parent.get('steps_planned') or '?'}")
        status = follow_runner(store.path, run_id, as_json=as_json, store=store, launch=launch,
                               summary_follows=True, standby=standby, watch=watch)
    end_of_run(store, run_id, status, as_json=as_json)


@cli.command()
@click.argument("study_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@db_option
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where registered datasets' files are (overrides the base config's data_dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the study's and its runs' events as JSON lines.")
@click.option("--plan", "plan_only", is_flag=True,
              help="Print what the study will run and its epsilon before it runs, then exit (nothing is stored).")
def study(study_file: Path, db: Path | None, data_dir: Path | None, as_json: bool, plan_only: bool) -> None:
    """Run a tuning study from a TOML file: candidate runs of one base config over a search space,
    and one epsilon for the group (private: only the best run is released; composition: all runs;
    exploratory: nothing claimed for the choice).

    Example: dpw study resources/examples/study-digits.toml --plan
    """
    from engine.study import first_candidate, plan_candidates, plan_lines, plan_summary
    from engine.study_config import StudyConfig

    config = StudyConfig.load_toml(study_file)
    if data_dir is not None:
        config = config.with_data_dir(str(data_dir.resolve()))
    if plan_only:  # nothing is stored; a store already there says which data its runs checked
        summary = plan_summary(config, checked_before=_checked_in(db, config.base.dataset))
        if as_json:
            echo_json(summary)
        for label, text in [] if as_json else plan_lines(summary):
            click.echo(f"  {label:<14} {text}")
        return
    from engine.precheck import check_before_storing

    plan = plan_candidates(config)
    first = first_candidate(config, plan)
    standbys = [StandbyRunner()] if plan.configs else []  # the first candidate's runner, which checks it
    with contextlib.ExitStack() as ends:
        ends.callback(lambda: [standby.close() for standby in standbys])
        checked = []  # as dpw run's: the data is read and the config checked before a store is created
        if not as_json:
            say_on_terminal(f"checking {study_file.name} against its data…")

        def check(before: frozenset[str]) -> None:
            if standbys:
                checked.append(standbys[0].check(first, checked_before=before))
            else:
                checked.append(check_before_storing(first, checked_before=before).data.num_train)

        store = open_store_after_check(db, check, dataset=first.dataset)
        _run_study(config, plan, store, standbys, num_train=checked[0], as_json=as_json)


def _run_study(config: Any, plan: Any, store: Any, standbys: list, *, num_train: int, as_json: bool) -> None:
    """dpw study's run: its candidates one after another, each handed to the runner loaded on standby
    ahead of it (the next one loads while the one before it trains), then the study's summary."""
    from engine.study import run_study

    def emit(kind: str, **payload: Any) -> None:
        if as_json:
            echo_json({"type": kind, **payload}, default=str)
        elif kind == "candidate":
            setting = ", ".join(f"{k} = {v!r}" for k, v in payload["setting"].items())
            click.echo(f"candidate {payload['index']}: run {payload['run_id']} ({setting})", err=True)

    stops = StopRequests()
    launched = 0
    with stops.installed():  # for the whole study: a stop between candidates, or while one starts, is not lost

        def launch(run_id: int) -> str:
            nonlocal launched
            standby = standbys.pop()
            launched += 1
            if launched < len(plan.configs):  # the next candidate's runner loads while this one trains
                standbys.append(StandbyRunner())
            status = follow_runner(store.path, run_id, as_json=as_json, store=store, stops=stops, standby=standby)
            return "stopped" if stops.requested else status

        result = run_study(config, store, launch, emit=emit, plan=plan, should_stop=lambda: stops.requested,
                           num_train=num_train)
    if as_json:
        return
    row = store.get_study(result.study_id)
    click.echo(f"study {row['id']} ({row['name']}, {row['mode']}): {row['status']}, {len(result.run_ids)} runs")
    if row.get("epsilon") is not None:
        click.echo(f"  privacy        ε = {epsilon_text(row['epsilon'])}, δ = {row['delta']:g} ({row['accountant']})")
    if result.released_run_id is not None:
        label = "released" if config.mode != "exploratory" else "selected"
        click.echo(f"  {label:<14} run {result.released_run_id}: dpw show {result.released_run_id}")
    elif config.mode == "private":
        why = "no candidate finished" if row["status"] == "finished" else f"the study was {row['status']}"
        click.echo(f"  released       nothing ({why})")


@cli.command()
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array (each study with its config).")
def studies(db: Path | None, as_json: bool) -> None:
    """List the tuning studies in the store: mode, status, candidates run, the study's epsilon and the
    run it released (dpw show RUN states that epsilon for it).

    Example: dpw studies
    """
    store = open_store(db)
    store.reconcile_orphans()  # a study whose process was killed reads "interrupted"
    found = store.list_studies()
    if as_json:
        echo_json(found, indent=1, default=str)
        return
    if not found:
        click.echo(f"no studies yet in {store.path}")
        return
    from tabulate import tabulate

    rows = [{"id": s["id"], "name": s["name"], "mode": s["mode"],
             "dataset": ((s.get("config") or {}).get("base") or {}).get("dataset"), "status": s["status"],
             "runs": s.get("num_candidates"), "epsilon": bound_cell(s.get("epsilon")), "delta": s.get("delta"),
             "accountant": s.get("accountant"), "released": _released_cell(s)} for s in found]
    click.echo(tabulate(rows, headers="keys", floatfmt=".4g", missingval="-", disable_numparse=True))


def _released_cell(study: dict[str, Any]) -> str | None:
    """The run a study released; an exploratory study's is only selected (nothing covers the choice)."""
    run_id = study.get("released_run_id")
    if run_id is None:
        return None
    return f"{run_id} (selected)" if study.get("mode") == "exploratory" else str(run_id)


def _checked_in(db: Path | None, dataset: str) -> frozenset[str]:
    """Store.checked_fingerprints of the store at --db (or the default) if one is there; none otherwise
    (a command that stores nothing creates no store)."""
    from engine.store import Store, check_store_path, default_db_path

    path = db or default_db_path()
    if not check_store_path(path):
        return frozenset()
    return Store(path, readonly=True).checked_fingerprints(dataset)


def warn_settings_without_effect(config: Any) -> None:
    """One warning line per setting the config sets that the run will not read (settings_without_effect)."""
    from engine.config import as_toml
    from engine.settings_in_effect import settings_without_effect, why_without_effect

    values = config.to_dict()
    for name in settings_without_effect(values):
        click.echo(f"warning: {name} = {as_toml(values[name])} has no effect: {why_without_effect(name, values)}",
                   err=True)


def print_summary(run_row: dict[str, Any], *, include_teacher_stats: bool = False, store: Any = None) -> None:
    """The run in a few lines; with `store`, a stopped or failed run that can be continued says how."""
    from engine.audit_run import audit_model_line, canary_result, canary_text
    from engine.publication import (
        NO_FINITE_BOUND_STATEMENT,
        NOT_PUBLISHABLE,
        RELEASED_ESTIMATE,
        no_guarantee_statement,
        pate_released_estimate,
        publishable_epsilon,
        release_from_votes,
    )

    lines = [f"run {run_row['id']} ({run_row['name']}): {run_row['status']}"]
    if run_row.get("resumed_from") is not None:
        lines.append(f"  continued      from run {run_row['resumed_from']} at step {run_row.get('steps_resumed') or '?'} "
                     "(ε covers every step of both)")
    if run_row.get("stop_reason") == "budget":
        lines.append("  stopped at the epsilon budget")
    if run_row.get("accuracy") is not None:
        lines.append(f"  test accuracy  {run_row['accuracy']:.4f}")
    eps = publishable_epsilon(run_row)
    if eps.value is not None:
        lines.append(f"  privacy        ε = {epsilon_text(eps.value)}, δ = {eps.delta:g} ({eps.accountant}"
                     f"{eps.at_step(run_row.get('steps_done'))})" + ("" if eps.guarantee else "  NO GUARANTEE"))
    elif run_row.get("mechanism") == "none":
        lines.append("  privacy        none (non-private baseline)")
    if eps.note:
        lines.append(f"  study          {eps.note}")
    if run_row.get("mechanism") in ("dpsgd", "pate") and not eps.guarantee:
        lines.append(f"  caveat         {no_guarantee_statement(run_row)}")
    elif eps.value == math.inf:
        lines.append(f"  caveat         {NO_FINITE_BOUND_STATEMENT}")
    summary = run_row.get("summary") or {}
    if run_row.get("mechanism") == "pate":
        if (estimate := pate_released_estimate(run_row)) is not None:
            lines.append(f"  estimate       data-dependent ε ≈ {estimate:.4g}, {RELEASED_ESTIMATE}")
        if summary.get("epsilon_data_dependent") is not None:
            lines.append(f"  diagnostic     data-dependent ε {summary['epsilon_data_dependent']:.4g} ({NOT_PUBLISHABLE})")
        if release_from_votes(run_row):
            lines.append("  caveat         the release's parameters were chosen from the votes: its estimate of the "
                         "data-dependent ε does not cover that choice and is not shown")
        if summary.get("queries") is not None:
            lines.append(f"  queries        {summary['queries']} of {run_row.get('steps_planned')}, "
                         f"{summary.get('answered', 0)} answered")
        if summary.get("teacher_accuracy") and include_teacher_stats:
            lines.append(f"  teachers       {summary['num_teachers']}, mean accuracy (private, not covered by ε) "
                         f"{summary['teacher_accuracy']['mean']:.4f} (ensemble {summary.get('ensemble_accuracy') or 0:.4f})")
    elif run_row.get("steps_done") is not None and run_row.get("steps_planned"):
        lines.append(f"  steps          {run_row['steps_done']} of {run_row['steps_planned']}")
    if summary.get("seconds") is not None and run_row.get("mechanism") == "pate":
        lines.append(f"  training time  {summary['seconds']:.1f} s (teachers {summary.get('teacher_seconds', 0):.1f} s)")
    elif summary.get("seconds") is not None:
        lines.append(f"  training time  {summary['seconds']:.1f} s ({summary.get('samples_per_second', 0):.0f} samples/s)")
    if summary.get("distributed"):
        lines.append(f"  processes      {summary['distributed']['world_size']} (torch.distributed; the noise added "
                     f"once per step, by {summary['distributed']['noise_added_by']})")
    membership = membership_line(summary, run_row["id"])
    if membership:
        lines.append(f"  membership     {membership}")
    canaries = canary_result(run_row)
    if canaries is not None:
        lines.append(f"  canary audit   {canary_text(canaries)}")
        lines.append(f"  audit model    {audit_model_line(run_row).removeprefix('audit model: ')}")
    if run_row.get("error"):
        lines.append(f"  error          {run_row['error']}")
        if run_row.get("error_hint"):
            lines.append(f"  hint           {run_row['error_hint']}")
    if store is not None and continuable(store, run_row):
        lines.append(f"  continue       dpw resume {run_row['id']} (from its last checkpoint)")
    lines.append(f"  details        dpw show {run_row['id']}")
    click.echo("\n".join(lines))


def continuable(store: Any, run_row: dict[str, Any]) -> bool:
    from engine.checkpoint import can_continue

    return can_continue(run_row, store=store,
                        continuations=[store.get_run(i) for i in store.continued_by(run_row["id"])])


def membership_line(summary: dict[str, Any], run_id: int) -> str | None:
    """The membership audit kept with a run, in one line (None before one was computed). It comes from
    private data, so it is printed locally, never put in a report unasked."""
    from engine.audit.membership import not_measurable, theory_check_short
    from engine.audit_job import MEMBERSHIP_AUDIT_KEY

    mia = (summary.get(MEMBERSHIP_AUDIT_KEY) or {}).get("mia")
    if not mia:
        return None
    theory = mia.get("theory")
    where = f"{theory_check_short(theory)}; " if theory else ""
    tpr, why = mia["tpr_at_fpr"].get("0.01"), not_measurable(0.01, mia["nonmembers"])
    measured = f"TPR at FPR 1% {why}" if tpr is None or why else f"TPR {100 * tpr:.2f}% at FPR 1%"
    return f"loss attack AUC {mia['auc']:.3f}, {measured} ({where}from private data, kept locally: dpw audit {run_id})"


# ---- list / show -------------------------------------------------------------------------------
LIST_FIELDS = ("id", "name", "mechanism", "dataset", "status", "epsilon", "delta", "epsilon_budget", "accuracy")


def list_row(run: dict[str, Any]) -> dict[str, Any]:
    """A run as `dpw list` shows it: the publishable epsilon (engine.publication) and whether it holds (not
    for a run without a guarantee, e.g. reproducible noise, nor for an infinite epsilon: it bounds nothing)."""
    from engine.publication import publishable_epsilon

    eps = publishable_epsilon(run)
    row = {k: run.get(k) for k in LIST_FIELDS}
    row.update(epsilon=eps.value, delta=eps.delta, accountant=eps.accountant, guarantee=eps.holds)
    return row


def bound_cell(epsilon: float | None) -> str | None:
    """An epsilon in a `dpw list` or `dpw ledger` table: engine.rounding.bound_cell at 4 significant
    digits (None is shown "-")."""
    return rounding.bound_cell(epsilon, ".4g")


@cli.command("list")
@click.argument("search", nargs=-1, metavar="[WORD]...")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--deleted", is_flag=True,
              help="List what the store keeps of deleted runs (their privacy spent, tags, notes, when deleted).")
def list_runs(search: tuple[str, ...], db: Path | None, as_json: bool, deleted: bool) -> None:
    """List the runs in the store, with their tags (`dpw tag`). With words, only the runs whose name,
    dataset, mechanism, status, tags or study contain every one of them, as the window's filter box.

    \b
    Example: dpw list --json
    Example: dpw list digits finished
    """
    from engine.run_filter import matches

    words = " ".join(search).lower().split()
    store = open_store(db)
    if deleted:
        list_deleted(store, as_json=as_json, words=words)
        return
    runs = store.list_runs()
    found = [run for run in runs if matches(run, words)]
    if words and not found and not as_json:
        click.echo(f"no runs match {' '.join(search)!r} (of {len(runs)} in {store.path})")
        return
    rows = []
    for run in found:
        row = list_row(run)
        row["budget"] = row.pop("epsilon_budget")
        row.update(tags=run.get("tags") or [], notes=run.get("notes"))
        rows.append(row)
    if as_json:
        echo_json(rows, indent=1)
        return
    if not rows:
        click.echo(f"no runs yet in {store.path}")
        return
    from tabulate import tabulate

    from engine.publication import NO_GUARANTEE

    for r in rows:
        r.pop("accountant")
        r.pop("notes")  # free text of any length: `dpw show` and --json have it
        text = bound_cell(r["epsilon"])
        if r.pop("guarantee") is False and r["mechanism"] != "none":
            text = f"{text} ({NO_GUARANTEE})" if text is not None else NO_GUARANTEE
        r["epsilon"] = text
        r["tags"] = ", ".join(r["tags"]) or None

    click.echo(tabulate(rows, headers="keys", floatfmt=".4g", missingval="-"))


DELETED_FIELDS = ("id", "name", "mechanism", "dataset", "status", "epsilon", "delta", "accountant", "no_guarantee",
                  "deleted", "tags", "notes")


def list_deleted(store, *, as_json: bool, words: list[str]) -> None:
    """`dpw list --deleted`: the records of deleted runs; their privacy was spent on the data all the same."""
    from engine.run_filter import matches

    rows = [{k: r.get(k) for k in DELETED_FIELDS} for r in store.deleted_runs() if matches(r, words)]
    if as_json:
        echo_json(rows, indent=1)
        return
    if not rows:
        click.echo(f"no deleted runs in {store.path}")
        return
    from tabulate import tabulate

    from engine.publication import NO_GUARANTEE

    for r in rows:
        r["tags"] = ", ".join(r["tags"]) or None
        r["deleted"] = (r["deleted"] or "")[:16].replace("T", " ") or None
        no_guarantee = r.pop("no_guarantee")
        if r["epsilon"] is not None:
            r["epsilon"] = bound_cell(r["epsilon"]) + (f" ({NO_GUARANTEE})" if no_guarantee else "")
    click.echo(tabulate(rows, headers="keys", floatfmt=".4g", missingval="-"))


@cli.command()
@db_option
@click.option("--dataset", "dataset_name", default=None, help="Only this dataset (as `dpw list` names it).")
@click.option("--delta", type=float, default=None,
              help="Delta at which the DP-SGD runs are composed (default: the largest delta among them).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per dataset.")
def ledger(db: Path | None, dataset_name: str | None, delta: float | None, as_json: bool) -> None:
    """The privacy spent on each dataset by all its runs, deleted ones included, composed: DP-SGD runs
    exactly (PLD), the others by adding their (epsilon, delta); a non-private run leaves no bound.

    Example: dpw ledger --dataset digits
    """
    from engine.ledger import dataset_ledgers

    if delta is not None:
        check_number("delta", delta, 0.0, 1.0, open_high=True)
    store = open_store(db)
    ledgers = dataset_ledgers(store.list_runs(), store.deleted_runs(), delta=delta)
    if dataset_name is not None:
        ledgers = [entry for entry in ledgers if entry.named(dataset_name)]
        if not ledgers:
            raise fail(DPWError(f"no runs on dataset {dataset_name!r} in {store.path}",
                                hint="`dpw ledger` without --dataset lists every dataset"))
    if as_json:
        echo_json([entry.to_json() for entry in ledgers], indent=1)
        return
    if not ledgers:
        click.echo(f"no runs yet in {store.path}")
        return
    from tabulate import tabulate

    for i, entry in enumerate(ledgers):
        click.echo(("\n" if i else "") + f"{entry.title}: {entry.statement()}")
        if entry.composed_epsilon is not None:
            composed = sum(e.counted == "composed" for e in entry.entries)
            click.echo(f"  the {composed} run{'s' if composed > 1 else ''} counted 'composed' below, together (PLD): "
                       f"ε = {rounding.up(entry.composed_epsilon, '.4g')} at "
                       f"δ = {rounding.up(entry.composed_delta, '.3g')}")
        rows = [{"id": e.run_id, "name": e.name, "mechanism": e.mechanism,
                 "status": "deleted" if e.deleted else e.status, "epsilon": bound_cell(e.epsilon), "delta": e.delta,
                 "counted": e.counted + (f": {e.why}" if e.why else "")} for e in entry.entries]
        click.echo(tabulate(rows, headers="keys", floatfmt=".4g", missingval="-"))


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--include-teacher-stats", is_flag=True,
              help="PATE: also show the teachers' accuracies (statistics of non-private models of the private data).")
@click.option("--risk", is_flag=True,
              help="Show only what the run's guarantee allows the best membership attacker (as dpw privacy risk).")
def show(run_ref: str, db: Path | None, as_json: bool, include_teacher_stats: bool, risk: bool) -> None:
    """Show one run: config, results, privacy, artifacts.

    Example: dpw show 3 --json
    """
    store = open_store(db)
    store.reconcile_orphans()
    if risk:
        show_risk(store.find_run(run_ref), as_json=as_json)
        return
    info = run_details(store, run_ref, include_teacher_stats=include_teacher_stats)
    if as_json:
        echo_json(info, indent=1, default=str)
        return
    run_row = info["run"]
    print_summary(run_row, include_teacher_stats=include_teacher_stats, store=store)
    click.echo(f"  config hash    {run_row['config_hash']}")
    if run_row.get("tags"):
        click.echo(f"  tags           {', '.join(run_row['tags'])}")
    if run_row.get("notes"):
        click.echo(f"  notes          {run_row['notes']}")
    if data_split := store.plan_event(run_row["id"]).get("data_split"):
        click.echo(f"  data split     {data_split}")
    click.echo(f"  rows           {info['rows']}")
    for art in info["artifacts"]:
        click.echo(f"  artifact       {art['kind']}: {art['path']}")
    from engine.settings_in_effect import settings_in_effect

    config = run_row["config"]
    used = set(settings_in_effect(config))
    click.echo("config (the settings this run uses; --json has all):")
    for key, value in config.items():
        if key in used:
            click.echo(f"  {key} = {value!r}")


def show_risk(run_row: dict[str, Any], *, as_json: bool) -> None:
    """`dpw show RUN --risk`: the attack figures of a stored run (engine.attack_risk), upper bounds, with
    the run's epsilon as `dpw show` prints it."""
    from engine.attack_risk import run_attack_risk
    from engine.publication import publishable_epsilon

    result = run_attack_risk(run_row)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(f"run {run_row['id']} ({run_row['name']}): best membership attack its guarantee allows")
    if result.risk is None:
        click.echo(f"  no bound         {result.reason}")
        return
    click.echo(f"  {'from':<{RISK_LABEL}} {result.basis}")
    upper = "; every figure below is an upper bound"
    echo_risk_rows(result.risk, epsilon=result.publishable_epsilon,
                   note=f"({publishable_epsilon(run_row).accountant})" + upper)


@cli.command(cls=RunCommand)
@click.argument("run_refs", nargs=-1, required=True, metavar="RUN...")
@db_option
@click.option("--all", "show_all", is_flag=True, help="Also list the settings the runs share.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"runs": [{"id", "name", "results", "settings"}, ...], "differ": [...]}; a run\'s '
              '"settings" are those it read.')
def compare(run_refs: tuple[str, ...], db: Path | None, show_all: bool, as_json: bool) -> None:
    """Runs side by side: their results, with the epsilon each may state, then the settings that differ
    between the runs that read them (as the window's Compare table).

    Accuracy is comparable on one dataset and epsilon within one mechanism: runs that span several
    datasets or mechanisms are said to.

    \b
    Example: dpw compare 1 2 3
    Example: dpw compare -1 -2 --all
    """
    from tabulate import tabulate

    from engine.run_comparison import NOT_USED, RESULT_ROWS, compare_runs, group_label, groups_of

    store = open_store(db)
    store.reconcile_orphans()
    rows = store.find_runs(run_refs)
    comparison = compare_runs(rows)
    if as_json:
        echo_json({"runs": [{"id": row["id"], "name": row["name"],
                             "results": {key: comparison.results[key][j] for key, _ in RESULT_ROWS},
                             "settings": comparison.values[j]} for j, row in enumerate(rows)],
                   "differ": sorted(comparison.differ)}, default=str)
        return
    shown = [key for key in comparison.settings if show_all or key in comparison.differ]
    table = [[label, *comparison.results[key]] for key, label in RESULT_ROWS]
    table += [[key, *(comparison.setting_text(key, j) for j in range(len(rows)))] for key in shown]
    click.echo(tabulate(table, headers=["", *(f"{row['id']}: {row['name']}" for row in rows)],
                        disable_numparse=True))
    if not comparison.differ and len(rows) > 1:
        click.echo("(the runs read the same settings)")
    elif not show_all:
        click.echo(f"(settings that differ; {NOT_USED}: the run does not read it; --all lists the shared ones too)")
    groups = groups_of(rows)
    if len(groups) > 1:
        spans = "; ".join(f"{group_label(key)}: {', '.join(map(str, ids))}" for key, ids in groups.items())
        click.echo(f"note: accuracy is comparable on one dataset and ε within one mechanism; these runs span {spans}")


@cli.command(cls=RunCommand)
@click.argument("run_refs", nargs=-1, required=True, metavar="RUN...")
@db_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(run_refs: tuple[str, ...], db: Path | None, yes: bool) -> None:
    """Delete runs with their rows and saved models. A running run is refused.

    The store keeps one line per deleted run (name, status, epsilon, dates, tags, notes; `dpw list
    --deleted` shows them): the privacy the run spent on its data was spent all the same. Ids are
    never reused.

    Example: dpw delete 3 4 --yes
    """
    from engine.runner import remove_run
    from engine.store import check_deletable

    store = open_store(db)
    store.reconcile_orphans()
    runs = store.find_runs(run_refs)
    for run in runs:  # all of them before any is deleted
        check_deletable(run)
    names = ", ".join(f"{r['id']} ({r['name']}, {r['status']})" for r in runs)
    if not yes and not click.confirm(f"Delete run{'s' if len(runs) > 1 else ''} {names} and saved models?"):
        raise click.Abort()
    for run in runs:
        remove_run(store, run["id"])
        click.echo(f"deleted run {run['id']} ({run['name']})")


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@click.argument("tags", nargs=-1, required=True, metavar="TAG...")
@db_option
def tag(run_ref: str, tags: tuple[str, ...], db: Path | None) -> None:
    """Tag a run; `dpw list` and the window's filter show them.

    A tag is kept once per run; commas separate tags, as in the window's tags box.

    Example: dpw tag 3 baseline "lr 0.5"
    """
    store = open_store(db)
    run = store.find_run(run_ref)
    kept = store.add_tags(run["id"], tags)
    click.echo(f"run {run['id']} ({run['name']}) tags: {', '.join(kept) or '-'}")


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@click.argument("tags", nargs=-1, required=True, metavar="TAG...")
@db_option
def untag(run_ref: str, tags: tuple[str, ...], db: Path | None) -> None:
    """Take tags off a run; a tag the run does not have is ignored.

    Example: dpw untag 3 baseline
    """
    store = open_store(db)
    run = store.find_run(run_ref)
    kept = store.remove_tags(run["id"], tags)
    click.echo(f"run {run['id']} ({run['name']}) tags: {', '.join(kept) or '-'}")


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@click.argument("text")
@db_option
def note(run_ref: str, text: str, db: Path | None) -> None:
    """Set a run's notes, replacing any before; "" clears them.

    Example: dpw note 3 "clipping norm too tight: retry with 1.5"
    """
    store = open_store(db)
    run = store.find_run(run_ref)
    store.set_notes(run["id"], text)
    click.echo(f"run {run['id']} ({run['name']}) notes " + ("set" if text.strip() else "cleared"))


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@click.argument("new_name", metavar="NAME")
@db_option
def rename(run_ref: str, new_name: str, db: Path | None) -> None:
    """Give a run another name; its guarantee, config hash and report are otherwise unchanged.

    Example: dpw rename 3 "digits lr 0.5"
    """
    store = open_store(db)
    run = store.find_run(run_ref)
    name = store.rename_run(run["id"], new_name)
    click.echo(f"run {run['id']} renamed: {run['name']} -> {name}")


TEACHER_STATS = ("teacher_accuracy", "ensemble_accuracy")


def run_details(store, run_ref: str, *, include_teacher_stats: bool = False) -> dict[str, Any]:
    """A run for `dpw show`: its epsilon the publishable one (engine.publication), with whether it
    holds and the run's randomness; PATE teacher statistics only when asked for."""
    from engine.publication import publishable_epsilon, randomness

    run_row = dict(store.find_run(run_ref))
    run_id = run_row["id"]
    eps = publishable_epsilon(run_row)
    run_row.update(epsilon=eps.value, delta=eps.delta, accountant=eps.accountant, guarantee=eps.holds,
                   randomness=randomness(run_row), study_note=eps.note)
    if run_row.get("summary"):
        summary = {k: v for k, v in run_row["summary"].items() if include_teacher_stats or k not in TEACHER_STATS}
        if "epsilon" in summary:  # a PATE run stored before the publishable epsilon led holds the data-dependent one
            summary.update(epsilon=eps.value, accountant=eps.accountant)
        run_row["summary"] = summary
    metrics = store.metrics(run_id, "test_accuracy")
    return {
        "run": run_row,
        "rows": store.table_counts(run_id),
        "test_accuracy": [{"step": m["step"], "epoch": m["epoch"], "value": m["value"]} for m in metrics],
        "privacy": store.privacy(run_id, run_row.get("accountant")) if run_row.get("accountant") else [],
        "artifacts": store.artifacts(run_id),
    }


# ---- export and report -------------------------------------------------------------------------
def named_path(value: str | None, option: str) -> Path | None:
    """`value` as a Path, refused when empty: Path("") is the current folder, so an unset shell variable
    in `--out "$DIR"` exported into whatever folder the command ran in."""
    if value is not None and not value.strip():
        raise UserError(f"{option}: is empty; give a path (`.` for the current folder)")
    return None if value is None else Path(value)


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@db_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              callback=lambda _ctx, _param, value: named_path(value, "--out"),
              help="Folder for model.safetensors, model.pt2, model.onnx and model_card.json.")
@click.option("--force", is_flag=True, help="Replace those files where the folder already holds them.")
def export(run_ref: str, db: Path | None, out_dir: Path, force: bool) -> None:
    """Export a run's trained model (the student, for PATE) with its model card.

    Example: dpw export 3 --out exported/
    """
    from engine.export import export_run

    from engine.audit_run import audit_model_line

    store = open_store(db)
    run_row = store.find_run(run_ref)  # read first: a run deleted during its export is still exported whole
    files = export_run(store, run_row["id"], out_dir, force=force)
    for name, digest in files.items():
        click.echo(f"{out_dir / name}  {digest}")
    if line := audit_model_line(run_row):
        click.echo(f"NOTE: {line}")


@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@db_option
@click.option("--out", "out_file", type=click.Path(dir_okay=False), required=True,
              callback=lambda _ctx, _param, value: named_path(value, "--out"),
              help="FILE.html, FILE.pdf or FILE.json (the format follows the extension).")
@click.option("--include-votes", is_flag=True,
              help="Include PATE's raw teacher vote histograms (private data: the report then says so at its top).")
@click.option("--include-teacher-stats", is_flag=True,
              help="Include PATE's teacher and ensemble accuracies (private data: the report then says so at its top).")
@click.option("--include-audit", is_flag=True,
              help="Include the membership-inference audit of dpw audit (private data: the report then says so at "
              "its top).")
def report(run_ref: str, db: Path | None, out_file: Path, include_votes: bool, include_teacher_stats: bool,
           include_audit: bool) -> None:
    """Write a run's privacy report: the guarantee, how it was obtained, utility, caveats.

    Example: dpw report 3 --out report.pdf
    """
    from engine.report import write_report

    click.echo(write_report(open_store(db), run_ref, out_file, include_votes=include_votes,
                            include_teacher_stats=include_teacher_stats, include_audit=include_audit))


# ---- audit -------------------------------------------------------------------------------------
@cli.command(cls=RunCommand)
@click.argument("run_ref", metavar="RUN")
@db_option
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the run's dataset is (default: the folder the run used).")
@click.option("--examples", type=click.IntRange(min=1), default=5000, show_default=True,
              help="At most this many training members and as many held-out non-members.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the audit's own randomness (which examples, bootstrap resamples).")
@click.option("--bootstrap", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Bootstrap resamples for the confidence intervals.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"epsilon", "mia": {"auc", "tpr_at_fpr", ...}, "canaries"}.')
def audit(run_ref: str, db: Path | None, data_dir: Path | None, examples: int, seed: int, bootstrap: int,
          as_json: bool) -> None:
    """Membership-inference audit of a run's model: how well its per-example loss tells training
    members from held-out examples (AUC, TPR at FPR 1% and 0.1%, 95% bootstrap intervals), checked
    against the theoretical bound of the run's guarantee. Computed from private data: shown here only.
    A run trained with audit_canaries also shows its one-run canary audit: an epsilon lower bound at
    95% confidence.

    Example: dpw audit 3 --json
    """
    from engine.audit_job import MEMBERSHIP_AUDIT_KEY
    from engine.audit_run import audit_run, kept_or_new_audit
    from engine.errors import DataError

    store = open_store(db)
    try:
        result = audit_run(store, run_ref, examples=examples, seed=seed, bootstrap=bootstrap,
                           data_dir=str(data_dir) if data_dir is not None else None)
    except DataError as exc:  # the data is gone or changed: the audit kept with the run, if there is one
        run = store.find_run(run_ref)
        if not (run.get("summary") or {}).get(MEMBERSHIP_AUDIT_KEY):
            raise
        kept = kept_or_new_audit(store, run)
        click.echo(f"note: {exc.message}; showing the audit kept with run {run['id']} (computed {kept['computed']})",
                   err=True)
        _echo_kept_audit(kept, as_json)
        return
    _echo_audit(result.to_json(), as_json,
                f"run {result.run_id}: membership-inference audit (loss attack; computed from private data)")


def _echo_kept_audit(kept: dict[str, Any], as_json: bool) -> None:
    """`dpw audit`'s output from the audit kept with a run (engine.audit_job), when its data is gone."""
    _echo_audit({**kept, "kept": True}, as_json,
                f"run {kept['run']}: membership-inference audit kept with the run (loss attack; computed from "
                f"private data on {kept['computed']})")


def _echo_audit(body: dict[str, Any], as_json: bool, heading: str) -> None:
    """Print a `dpw audit --json` object (computed now or kept with the run) as JSON or as text; a ROC
    above the guarantee's curve is also a warning on stderr."""
    from engine.audit.membership import not_measurable, theory_check_text
    from engine.audit_run import canary_text

    mia = body["mia"]
    theory = mia.get("theory")
    if as_json:
        echo_json(body)
    else:
        eps = (f"{rounding.up(body['epsilon'], '.4g')} at delta {body['delta']:g}"
               if body.get("epsilon") is not None else "none")
        click.echo(heading)
        click.echo(f"  epsilon          {eps}" + ("" if body.get("guarantee") else " (no guarantee)"))
        click.echo(f"  examples         {mia['members']} members ({body['members']}), {mia['nonmembers']} "
                   f"non-members ({body['nonmembers']})")
        lo, hi = mia["auc_interval"]
        click.echo(f"  AUC              {mia['auc']:.4f}  [{lo:.4f}, {hi:.4f}] ({100 * mia['confidence']:g}%)")
        for fpr, tpr in sorted(mia["tpr_at_fpr"].items(), key=lambda item: -float(item[0])):
            why = not_measurable(float(fpr), mia["nonmembers"])
            if tpr is None or why is not None:
                click.echo(f"  TPR at FPR {rounding.percent(float(fpr)):<5} {why}")
                continue
            lo, hi = mia["tpr_interval"][fpr]
            click.echo(f"  TPR at FPR {rounding.percent(float(fpr)):<5} {100 * tpr:.3g}%  [{100 * lo:.3g}%, {100 * hi:.3g}%]")
        if theory and not theory["above_theory"]:
            text = theory_check_text(theory, members=mia["members"], nonmembers=mia["nonmembers"])
            click.echo(f"  theory check     {text}")
        click.echo("  canary audit     " + canary_text(body.get("canaries")))
    if theory and theory["above_theory"]:
        click.echo(f"WARNING: {theory['message']}", err=True)


# ---- window ------------------------------------------------------------------------------------
@cli.command()
@db_option
def gui(db: Path | None) -> None:
    """Open the workbench window over the same store.

    Example: dpw gui --db runs.sqlite
    """
    from workbench.app import main as gui_main  # Qt is imported only here, never by the engine

    sys.exit(gui_main(db_path=db))


# ---- registries --------------------------------------------------------------------------------
@cli.command()
def datasets() -> None:
    """List the registered datasets.

    Example: dpw datasets
    """
    from engine.datasets import list_datasets

    for info in list_datasets():
        click.echo(f"{info.name:15} {info.kind:6} {info.description}")


@cli.command()
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array: name, default, allowed, mechanisms, help.")
def settings(names: tuple[str, ...], as_json: bool) -> None:
    """List the settings a run config may hold (every one a top-level key of the TOML file): default,
    allowed values and what each does; with NAMES, only those.

    Example: dpw settings noise_multiplier delta
    """
    from engine.config import as_toml, config_fields

    fields = [(n, d, s) for n, d, s in config_fields() if not names or n in names]
    unknown = sorted(set(names) - {n for n, _, _ in fields})
    if unknown:
        raise UserError(f"no setting named {', '.join(map(repr, unknown))}; dpw settings lists them all")
    rows = [{"name": n, "default": d, "allowed": s.allowed(), "mechanisms": list(s.mechanisms) or None,
             "help": s.help} for n, d, s in fields]
    if as_json:
        echo_json(rows, indent=1)
        return
    for row in rows:
        default = "unset" if row["default"] is None else as_toml(row["default"])
        used = f"; {', '.join(row['mechanisms'])} only" if row["mechanisms"] else ""
        click.echo(f"{row['name']} = {default}    ({row['allowed']}{used})")
        click.echo(textwrap.fill(row["help"], width=100, initial_indent="    ", subsequent_indent="    "))


@cli.command()
def models() -> None:
    """List the registered models.

    Example: dpw models
    """
    from engine.models import list_models

    for info in list_models():
        click.echo(f"{info.name:12} {','.join(info.kinds):12} {info.description}")


cli.add_command(privacy)


def main() -> None:
    cli(prog_name="dpw")


if __name__ == "__main__":
    main()
