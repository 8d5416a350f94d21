"""Execute one stored run in this process: `python -m engine.runner RUN_ID --db PATH`.

Writes the run's events as JSON lines to stdout and to the store. SIGTERM, SIGINT or SIGHUP (the
terminal closed) stops the run cleanly after the current step: it is marked `stopped` and
everything so far is kept. An exception marks it `failed` with its message, keeping what the run
had done (the privacy spent is on the run row from the first step on: engine.store); a fully
trained run whose model cannot be saved keeps its results and names the path it tried. When
even the store cannot take the failure (full disk), the stream still carries it, and the next
`dpw list` marks the run failed. A finished run is then audited by the same process: the loss
attack on its model, kept in its summary (engine.audit_job.audit_after_training; the config's
`membership_audit = false` turns it off). Exit status: 0 finished or stopped, 1 failed.

Under torchrun (`dpw run CONFIG --nproc N`: engine.distributed_launch) rank 0 does all of the above
and hands the config (and a continued run's checkpoint) to the other ranks, which only train
(`serve_rank`) and never open the store.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from engine.artifacts import artifacts_dir, claim_artifacts, note_unrecorded_failure
from engine.checkpoint import CHECKPOINT_FILE, CannotResume, in_the_way, load_checkpoint, resume_refusal
from engine.config import RunConfig
from engine.data_split import SPLIT_BY_EXAMPLE, split_rule_of
from engine.errors import DPWError, explain
from engine.events import EventWriter
from engine.store import Store, now_iso


class StopFlag:
    """Set by SIGTERM/SIGINT; the training loop checks it between steps."""

    def __init__(self) -> None:
        self.requested = False
        self.interrupts = False  # after training: a stop ends the work at once (interruptible)

    def install(self) -> None:
        for name in ("SIGTERM", "SIGINT", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.interrupts:
            raise StopRequested()

    def __call__(self) -> bool:
        return self.requested

    @contextlib.contextmanager
    def interruptible(self):
        """Work after the run has ended (its audit) that a stop abandons at once instead of after it:
        the window closing or Ctrl-C does not wait for it. An abandoned write is rolled back whole."""
        self.interrupts = True
        try:
            yield
        except StopRequested:
            pass
        finally:
            self.interrupts = False


class StopRequested(Exception):
    """A stop arrived during interruptible work (StopFlag.interruptible)."""


def remove_run(store: Store, run_id: int) -> dict:
    """Delete a run from the store (`Store.delete_run`: refused while it runs) and its saved files."""
    run = store.delete_run(run_id)
    shutil.rmtree(artifacts_dir(store, run_id), ignore_errors=True)
    return run


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def execute(store: Store, run_id: int, *, stream=None, stop: StopFlag | None = None, data_parallel: Any = None,
            ahead: Any = None) -> str:
    """Run a stored run to its end; returns its final status. With `data_parallel` this is rank 0 of a
    distributed run (engine.dpsgd.distributed): it hands the config to the other ranks. `ahead`: the run
    as this runner prepared it before it was stored (engine.prepared_ahead), trained if the stored
    config is the one prepared."""
    stop = stop or StopFlag()
    writer = EventWriter(run_id, stream=stream, sink=store.record_event)
    emit = writer.emit
    run = store.get_run(run_id)
    if run["status"] != "queued":
        raise DPWError(
            f"run {run_id} is {run['status']}, not queued; only a queued run can be executed",
            hint="create a new run from its config (`dpw run`)",
        )
    store.mark_running(run_id)
    phase = "reading the config"
    prepared = result = None
    try:
        phase = "claiming the artifacts folder"
        claim_artifacts(store)
        phase = "reading the config"
        config = RunConfig.from_dict(run["config"])
        resume = parent = None
        split_rule = SPLIT_BY_EXAMPLE
        if run.get("resumed_from") is not None:
            phase = "reading the checkpoint"
            parent = resumable(store, run["resumed_from"], for_run=run_id)
            resume = load_checkpoint(checkpoint_of(store, parent["id"]))
            store.update_run(run_id, steps_resumed=resume["step"])
            split_rule = split_rule_of(store.plan_event(parent["id"]))  # the first run's training examples
        if data_parallel is not None:  # every rank starts from the same checkpoint (weights, optimizer, step)
            data_parallel.share((config, resume, split_rule))
        emit("started", name=config.name, mechanism=config.mechanism, dataset=config.dataset,
             config=config.to_dict(), config_hash=config.config_hash(),
             **({"resumed_from": parent["id"], "from_step": resume["step"]} if resume is not None else {}))
        phase = "loading the data"
        emit("progress", phase="loading", done=0, total=1)
        from engine.runs import PreparedRun, prepare, store_votes

        if ahead is not None and resume is None and data_parallel is None:
            prepared = ahead.take(config, emit)
        if prepared is None:
            prepared = prepare(config, emit=emit, data_parallel=data_parallel,
                               checked_before=store.checked_fingerprints(config.dataset), split_rule=split_rule)
        store_votes(prepared, store, run_id)
        if isinstance(prepared, PreparedRun):  # under torchrun this is rank 0, whose weights are every rank's
            prepared.checkpoint_path = checkpoint_of(store, run_id)
        if resume is not None:  # in as many processes as `dpw resume --nproc` asks, whatever the first run's count
            if not isinstance(prepared, PreparedRun):
                raise CannotResume(f"run {parent['id']} cannot be continued in this way (DP-SGD or non-private)")
            check_continues(parent, prepared)
            prepared.resume = resume
        phase = "training"
        if stop():
            result = None
        else:
            result = prepared.train(should_stop=stop)
        phase = "saving the model"
        summary = prepared.finish(result, store=store, out_dir=artifacts_dir(store, run_id), emit=emit)
        status = "stopped" if result is None or result.stop_reason == "stopped" else "finished"
        fields = prepared.run_fields(result)
        if result is None:  # stopped before its first step
            fields["stop_reason"] = "stopped"
        store.update_run(run_id, status=status, finished=now_iso(), summary=summary, **fields)
        if status == "finished":  # nothing left to continue: its checkpoint would only take room
            checkpoint_of(store, run_id).unlink(missing_ok=True)
        emit("finished", status=status, summary=summary)
        return status
    except Exception as exc:  # every failure is recorded; the store stays consistent
        return record_failure(store, run_id, writer, exc, where=phase, prepared=prepared, result=result)


def resumable(store: Store, parent_id: int, *, for_run: int | None = None) -> dict[str, Any]:
    """The stored run to continue, or CannotResume saying why not: its kind, not continued already
    (by a run other than `for_run`), a checkpoint kept. Reads no checkpoint (no torch): `dpw resume` and
    the window ask this before they store a run; the runner asks again and then loads the checkpoint."""
    parent = store.get_run(parent_id)
    later = [store.get_run(i) for i in store.continued_by(parent_id) if i != for_run]
    refusal = resume_refusal(parent, continued_by=in_the_way(later, store=store),
                             checkpoint=checkpoint_of(store, parent_id))
    if refusal is not None:
        raise refusal
    return parent


def checkpoint_of(store: Store, run_id: int) -> Path:
    """Where a run keeps its checkpoint (engine.checkpoint): beside its saved model."""
    return artifacts_dir(store, run_id) / CHECKPOINT_FILE


def check_continues(parent: dict[str, Any], prepared: Any) -> None:
    """The continued run trains on the first run's data with its sample rate and noise: otherwise its
    steps would not be the same mechanism continued, and its epsilon would not be one run's."""
    ref = f"run {parent['id']}"
    if parent.get("dataset_fingerprint") and parent["dataset_fingerprint"] != prepared.data.fingerprint:
        raise CannotResume(f"the dataset's contents changed since {ref} (another fingerprint)",
                           hint="continue only on the same data; start a new run for the new data")
    plan = prepared.plan
    for name, now, then in (("sample rate", plan.sample_rate, parent.get("sample_rate")),
                            ("noise multiplier", plan.noise_multiplier, parent.get("noise_multiplier"))):
        if then is not None and (now is None or abs(float(now) - float(then)) > 1e-12 * max(1.0, abs(float(then)))):
            raise CannotResume(f"the {name} is now {now} but {ref} trained with {then}",
                               hint="continue only with the first run's settings and data")


def record_failure(store: Store, run_id: int, writer: EventWriter, exc: Exception, *, where: str,
                   prepared: Any = None, result: Any = None) -> str:
    """Mark the run failed with a message for a person, keeping what it did: the ledger already holds
    the privacy spent; a trained `result` adds its final figures (and the summary a failed model save
    carries). If the store cannot take it (full disk, locked), the event stream still says why, and
    so does a note beside the run's files, which the store states once it marks the lost run failed."""
    message, hint, is_bug = explain(exc, store_path=store.path)
    fields: dict[str, Any] = {"status": "failed", "finished": now_iso(), "error": message, "error_hint": hint}
    if prepared is not None and result is not None:
        try:
            fields.update(prepared.run_fields(result))
        except Exception:  # the failure itself is what must be recorded
            pass
    if getattr(exc, "summary", None):
        fields["summary"] = exc.summary
    try:
        store.update_run(run_id, **fields)
    except Exception as store_exc:
        writer.sink = None
        note_unrecorded_failure(store, run_id, message, hint)  # for whoever marks the lost run failed
        stored, _, _ = explain(store_exc, store_path=store.path)
        message += f"; the store could not record this failure ({stored})"
    details = {"traceback": traceback.format_exc() if is_bug else None}
    for kind, payload in (("error", dict(message=message, where=where, hint=hint, **details)),
                          ("finished", dict(status="failed", summary={"error": message}))):
        try:
            writer.emit(kind, **payload)
        except Exception:
            writer.sink = None  # the store stopped taking events: the stream alone tells the reader
            writer.emit(kind, **payload)
    return "failed"


def threads_for(store: Store, run_id: int) -> int | None:
    """How many CPU threads this run's torch should use: the cores shared among the runners now
    working on this store. torch's default (one thread per core in every process) makes concurrent
    runs spin-wait on each other: two small digits runs side by side on 2 cores took 25.9 s with
    the default and 5.4 s with one thread each. `DPW_THREADS` sets it; with `OMP_NUM_THREADS`
    set, torch's own choice stands (None)."""
    if os.environ.get("DPW_THREADS"):
        try:
            return max(1, int(os.environ["DPW_THREADS"]))
        except ValueError:
            raise DPWError(f"DPW_THREADS={os.environ['DPW_THREADS']!r} is not a whole number",
                           hint="set it to the number of CPU threads a run may use, e.g. 2") from None
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    others = sum(1 for r in store.list_runs() if r["status"] == "running" and r["id"] != run_id)
    return max(1, (os.cpu_count() or 1) // (others + 1))


def serve_rank(data_parallel: Any, stop: StopFlag, *, data_dir: str | None = None) -> int:
    """A rank other than 0 of a distributed run: train with the others on rank 0's config, never
    touching the store (rank 0 records the run). `data_dir`: where this machine keeps the datasets."""
    from engine.runs import prepare

    try:
        config, resume, split_rule = data_parallel.share(None)
        if data_dir:
            config = config.replace(data_dir=data_dir)
        prepared = prepare(config, data_parallel=data_parallel, split_rule=split_rule)
        prepared.resume = resume
        prepared.train(should_stop=stop)
    except Exception as exc:  # rank 0 records the run's failure; this rank says why it ended, in one line
        message, hint, is_bug = explain(exc)
        print(f"error (rank {data_parallel.rank}): {message}" + (f" ({hint})" if hint else ""), file=sys.stderr)
        if is_bug:
            traceback.print_exc()
        return 1
    return 0


def wait_for_run() -> tuple[int, str, Any] | None:
    """A runner on standby (engine.cli_follow's StandbyRunner, the window's EngineClient): import what a
    run needs, then read which run to execute: (run id, store path, the run prepared ahead or None), or
    None when the caller stored none (end of input, or an empty line). The imports are most of a small
    run's start: torch and the engine, and torch._dynamo, which torch imports when the first optimizer
    is made (1.3 s on a quiet 2-core machine). Before the run, the caller may ask for its config to be
    checked, {"check": config, "checked_before": fingerprints}: the answer, {"checked": reply}, comes on
    standard output, and the run prepared in checking is the one trained (engine.prepared_ahead). It may
    also ask what the engine offers, {"capabilities": true} (the window's engine probe, as it starts it),
    answered {"capabilities": {...}} (engine.capabilities)."""
    import json
    import select

    from engine.prepared_ahead import capabilities_line

    # A question asked as it started is answered once torch is in, before the rest of the imports.
    try:
        first = sys.stdin.readline() if select.select([sys.stdin], [], [], 0)[0] else None
    except (OSError, ValueError):  # no select on this stdin (Windows pipes): the loop below answers it
        first = None
    if first and json.loads(first).get("capabilities") is True:
        sys.stdout.write(capabilities_line())
        sys.stdout.flush()
        first = None
    import torch._dynamo  # noqa: F401
    import engine.runs  # noqa: F401
    from engine.prepared_ahead import answer_line, prepare_ahead

    ahead = None
    while (line := first if first is not None else sys.stdin.readline()).strip():
        first = None
        request = json.loads(line)
        if request.get("capabilities") is True:
            sys.stdout.write(capabilities_line())
        elif "check" in request:
            reply, ahead = prepare_ahead(request)
            sys.stdout.write(answer_line(reply))
        else:
            return int(request["run_id"]), str(request["db"]), ahead
        sys.stdout.flush()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.runner", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", type=int, nargs="?", help="the queued run (rank 0; other ranks get it from rank 0)")
    parser.add_argument("--db", help="the store file holding the queued run (rank 0 only)")
    parser.add_argument("--data-dir", help="a distributed run's ranks other than 0: where this machine keeps "
                        "the datasets (default: the run's data_dir)")
    parser.add_argument("--standby", action="store_true",
                        help='load the engine, then read the run from standard input as one JSON line, '
                        '{"run_id": N, "db": PATH}; end quietly at the end of input (no run was stored)')
    args = parser.parse_args(argv)
    stop = StopFlag()
    stop.install()
    ahead = None
    if args.standby:
        handed = wait_for_run()
        if handed is None:
            return 0
        args.run_id, args.db, ahead = handed
    data_parallel = None
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun (engine.distributed_launch)
        from engine.dpsgd.distributed import DataParallel

        data_parallel = DataParallel.from_environment()
    try:
        if data_parallel is not None:
            data_parallel.start()
            if not data_parallel.reports:
                return serve_rank(data_parallel, stop, data_dir=args.data_dir)
        if args.run_id is None or args.db is None:
            parser.error("RUN_ID and --db are needed (they name the queued run)")
        store = Store(args.db)
        threads = threads_for(store, args.run_id) if data_parallel is None else None
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        status = execute(store, args.run_id, stream=sys.stdout, stop=stop, data_parallel=data_parallel, ahead=ahead)
    except Exception as exc:  # before the run could start: one line, never a traceback for the user's situation
        message, hint, is_bug = explain(exc, store_path=args.db)
        if is_bug:
            raise
        print(f"error: {message}" + (f" ({hint})" if hint else ""), file=sys.stderr)
        return 1
    finally:
        if data_parallel is not None:
            data_parallel.stop()  # the other ranks are done: they do not wait for the audit below
    if status == "finished" and not stop():
        from engine.audit_job import audit_after_training

        with stop.interruptible():
            audit_after_training(store, args.run_id)
    return 0 if status in ("finished", "stopped") else 1


if __name__ == "__main__":
    sys.exit(main())
