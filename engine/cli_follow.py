"""Following a run's runner from the terminal: start it (or hand its run to one on standby), pass
Ctrl-C on to it as a stop after the current step, and draw its events as a progress bar. `dpw run`,
`dpw resume` and `dpw study` share it (engine.cli)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from engine import rounding
from engine.errors import DPWError
from engine.lock_watch import on_terminal


def runner_command(db_path: Path, run_id: int, launch: Any = None) -> list[str]:
    """The runner's command line; under torchrun (engine.distributed_launch) for a `--nproc` run."""
    args = [str(run_id), "--db", str(db_path)]
    if launch is not None and launch.distributed:
        return launch.command(args)
    return [sys.executable, "-m", "engine.runner", *args]


class StandbyRunner:
    """A runner process started before its run is stored (`python -m engine.runner --standby`): it
    loads torch and the engine at once. `check` has it check the config against its data by preparing
    the run, which it keeps to train (engine.prepared_ahead): this process imports no torch and the data
    is read once. `hand` gives it the stored run; one never handed a run (the check refused the config,
    or Ctrl-C) is ended when this closes, having opened no store. Only for a run in one process (not
    under torchrun)."""

    def __init__(self) -> None:
        own_group = {"process_group": 0} if sys.platform != "win32" else {}  # as follow_runner's runner
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-m", "engine.runner", "--standby"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1, **own_group)

    def check(self, config: Any, *, checked_before: frozenset[str] = frozenset()) -> int:
        """Raise the engine's DPWError (one line, with a hint) if `config` would fail before training, as
        engine.precheck.check_before_storing does; else the number of training examples. A runner that
        ended without answering (killed, out of memory) leaves the check to this process, so a config's
        problem is still what is said."""
        from engine.errors import error_from_reply
        from engine.prepared_ahead import check_answer, check_request

        reply = None
        with contextlib.suppress(OSError, ValueError):  # a pipe closed by a runner that ended
            self.proc.stdin.write(check_request(config, checked_before))
            self.proc.stdin.flush()
            while reply is None and (line := self.proc.stdout.readline()):
                reply = check_answer(line)
        if reply is None:
            from engine.precheck import check_before_storing

            return int(check_before_storing(config, checked_before=checked_before).data.num_train)
        if not reply["ok"]:
            raise error_from_reply(reply)
        return int(reply["num_train"])

    def hand(self, db_path: Path, run_id: int) -> subprocess.Popen | None:
        """The process, now executing stored run `run_id` of the store at `db_path`; None when it has
        ended already (killed, out of memory while checking): the caller starts a runner of its own."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return None
        with contextlib.suppress(OSError):  # it died just now: follow_runner marks the run failed, saying so
            proc.stdin.write(json.dumps({"run_id": run_id, "db": str(db_path)}) + "\n")
            proc.stdin.close()
        return proc

    def close(self) -> None:
        """End a runner never handed a run at once: it has opened nothing, and a refused config's
        message should not wait for its imports."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def __enter__(self) -> "StandbyRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StopRequests:
    """Ctrl-C, SIGTERM or SIGHUP to this process while it follows runners: remembered (`requested`) and
    passed on (SIGTERM) to the runner being followed, which stops after its current step. A study keeps
    one for its whole length, so a stop between candidates, or while a runner is still starting up and
    dies of it, still stops the study."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self) -> None:
        self.requested = False
        self.runner: subprocess.Popen | None = None

    @contextlib.contextmanager
    def installed(self):
        signals = [getattr(signal, name) for name in self.SIGNALS if hasattr(signal, name)]
        previous = {sig: signal.signal(sig, self._handle) for sig in signals}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.runner is not None and self.runner.poll() is None:
            self.runner.send_signal(signal.SIGTERM)
        with contextlib.suppress(OSError):
            click.echo("\nstopping after the current step…", err=True)


def follow_runner(db_path: Path, run_id: int, *, as_json: bool = False, store=None, launch: Any = None,
                  stops: StopRequests | None = None, summary_follows: bool = False,
                  standby: StandbyRunner | None = None, watch: Any = None) -> str:
    """Start the runner process and render its events until it ends; returns the final status.
    With `summary_follows`, the caller prints the run's summary, which states its error: the run's
    error event is then not printed as well.
    Ctrl-C, SIGTERM or SIGHUP to this process asks the runner to stop after its current step (never
    an orphan runner); `stops`, when given, is already installed and remembers them. With
    `store`, the runner is recorded as the run's owner, and a runner that ended without reporting
    leaves its run marked failed with the reason before this returns. `standby`: the runner to hand
    the run to, already started (else, or if it has ended, one is started here). `watch`: the
    engine.lock_watch.LockWatch started when the run was stored (else one is started here), told of
    each line and stopped at the end."""
    if stops is None:
        stops = StopRequests()
        installed = stops.installed()
    else:
        installed = contextlib.nullcontext()
    # Its own process group: the terminal's Ctrl-C reaches only this process, which asks the runner to
    # stop (SIGTERM); a runner still starting never dies of it with a KeyboardInterrupt traceback.
    own_group = {"process_group": 0} if sys.platform != "win32" else {}
    with installed:
        proc = standby.hand(db_path, run_id) if standby is not None else None
        if proc is None:
            proc = subprocess.Popen(runner_command(db_path, run_id, launch), stdout=subprocess.PIPE, text=True,
                                    bufsize=1, **own_group)
        stops.runner = proc
        if stops.requested:  # asked before the runner existed
            proc.send_signal(signal.SIGTERM)
        try:
            return _render_runner(proc, run_id, as_json=as_json, store=store, summary_follows=summary_follows,
                                  watch=watch if watch is not None else on_terminal(db_path, as_json=as_json))
        finally:
            stops.runner = None


def _render_runner(proc: subprocess.Popen, run_id: int, *, as_json: bool, store, summary_follows: bool,
                   watch: Any = None) -> str:
    """follow_runner's loop: render the events until the runner ends; its final status."""
    from engine.events import decode

    if store is not None:
        store.assign_runner(run_id, proc.pid)
    display = None if as_json else ProgressDisplay(show_errors=not summary_follows)
    status = "failed"
    try:
        while True:
            line = proc.stdout.readline()
            if watch is not None:
                watch.heard()
            if not line:
                break
            event = decode(line)
            if event is None:
                continue
            if as_json:
                click.echo(line.rstrip())
            else:
                display.handle(event)
            if event["type"] == "finished":
                status = event["status"]
    finally:
        if watch is not None:
            watch.stop()
        proc.wait()
        if display:
            display.close()
        if store is not None:
            store.reconcile_orphans()
    if display and not display.show_errors and display.last_error and not _recorded(store, run_id,
                                                                                       display.last_error):
        click.echo(f"error: {display.last_error}", err=True)  # the summary cannot state it (e.g. the disk is full)
    return status


def _recorded(store: Any, run_id: int, error: str) -> bool:
    """Whether the store's row of the run states `error` (the runner's last error event), as the
    summary printed from it would: not when the runner could not write it, e.g. to a full disk."""
    if store is None:
        return False
    try:
        row = store.get_run(run_id)
    except DPWError:
        return False
    return bool(row.get("error")) and row["error"] in error


class ProgressDisplay:
    """A progress bar on stderr, labelled with the epsilon the run reports and the last test accuracy.
    The epsilon is the plan's accountant's latest (as the window's runs list shows it): DP-SGD also
    streams a looser live RDP bound every step, which would alternate with it, and can read above a
    target the reported accountant meets."""

    PHASES = {"loading": "loading", "training": "training", "teachers": "teachers", "querying": "queries",
              "student": "student"}

    def __init__(self, *, show_errors: bool = True) -> None:
        self.show_errors = show_errors  # False where the run's summary, which states its error, follows
        self.last_error: str | None = None  # the runner's last error event, with its hint
        self.bar = None
        self.phase: str | None = None
        self.done = 0
        self.epsilon: float | None = None
        self.accountant: str | None = None  # the plan's: the one the run reports
        self.accuracy: float | None = None

    def _label(self) -> str:
        parts = []
        if self.epsilon is not None:
            parts.append(f"ε={rounding.up(self.epsilon, '.3f')}")
        if self.accuracy is not None:
            parts.append(f"acc={self.accuracy:.4f}")
        return " ".join(parts)

    def handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "plan":
            self.accountant = event.get("accountant")
        if kind == "plan" and event.get("mechanism") == "pate":
            click.echo(
                f"run {event['run_id']}: {event['num_train']} private training examples, {event['num_teachers']} "
                f"teachers ({event['teacher_model']}, about {event['shard_size']} examples each), "
                f"{event['aggregator']} on {event['steps']} queries, student {event['model']} on {event['device']}",
                err=True,
            )
        elif kind == "plan":
            sigma = event.get("noise_multiplier")
            click.echo(
                f"run {event['run_id']}: {event['num_train']} training examples, model {event['model']} on "
                f"{event['device']}, {event['steps']} steps"
                + (f", q={event['sample_rate']:.5g}, noise multiplier {sigma:.4g}" if sigma else ", non-private"),
                err=True,
            )
        elif kind == "progress" and event["phase"] in self.PHASES:
            if self.phase != event["phase"]:
                self.close()
                self.phase, self.done = event["phase"], 0
            if self.bar is None:
                self.bar = click.progressbar(length=event["total"], label=self.PHASES[event["phase"]], file=sys.stderr,
                                             item_show_func=lambda item: item, show_eta=True)
                self.bar.__enter__()
            self.bar.update(event["done"] - self.done, current_item=self._label())
            self.done = event["done"]
        elif kind == "privacy" and (self.accountant is None or event.get("accountant") == self.accountant):
            self.epsilon = event["epsilon"]
        elif kind == "metric" and event["name"] == "test_accuracy":
            self.accuracy = event["value"]
        if kind in ("warning", "error"):
            text = event["message"] + (f" — {event['hint']}" if event.get("hint") else "")
            if kind == "error":
                self.last_error = text
            if kind == "warning" or self.show_errors:
                self.close()
                click.echo(f"{kind}: {text}", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
