"""Starts runner processes (`python -m engine.runner RUN_ID --db PATH`) one queue slot at a time,
reads their JSON-line events as they come, and notices runners that end without a word. One runner
can wait on standby, loaded, for the next run (`keep_standby`).
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any, Collection

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

from engine.errors import DPWError, error_from_reply
from engine.events import decode
from engine.prepared_ahead import CAPABILITIES_REQUEST, capabilities_answer, check_answer, check_request
from engine.store import now_iso

STDERR_KEPT = 4000  # characters of a runner's stderr kept to explain a crash


def runner_arguments(db_path: Path, run_id: int) -> list[str]:
    """Arguments after the interpreter: the same command `dpw run` starts."""
    return ["-m", "engine.runner", str(run_id), "--db", str(db_path)]


STANDBY_ARGUMENTS = ["-m", "engine.runner", "--standby"]  # loads, then reads {"run_id", "db"} on stdin
# (after a {"check": config} first, if asked: EngineClient.check_on_standby, and {"capabilities": true}:
# EngineClient.ask_capabilities)


class _Job:
    def __init__(self, run_id: int, process: QProcess):
        self.run_id = run_id
        self.process = process
        self.buffer = b""
        self.stderr = b""
        self.finished_status: str | None = None  # from the runner's `finished` event
        self.stop_requested = False


class EngineClient(QObject):
    """A queue of stored runs and the runner processes that execute them. `store`: the window's
    StoreClient (or an engine Store: the same methods).

    Signals carry batches: `events(run_id, [event, ...])` once per chunk of stdout read, never
    once per event, so a fast run cannot flood the event loop.
    """

    events = Signal(int, list)
    run_started = Signal(int)
    run_ended = Signal(int, str)  # run id, final status
    run_lost = Signal(int, str, str)  # run id, message, hint: ended without a finished event
    queue_changed = Signal()
    capabilities = Signal(dict)  # what the engine offers, as the runner on standby answered (ask_capabilities)
    capabilities_unanswered = Signal()  # the runner asked ended or was handed a run before it answered

    def __init__(self, store: Any, *, max_parallel: int = 1, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.max_parallel = max_parallel
        self.queue: deque[int] = deque()
        self.jobs: dict[int, _Job] = {}
        self.environment: dict[str, str] = {}
        self.standby: QProcess | None = None  # a runner loaded ahead of the next run
        self._standby_environment: dict[str, str] = {}
        self._standby_wanted = False
        self._standby_output = b""  # the standby's stdout not yet split into lines
        self._capabilities_asked = False  # asked, not yet answered
        self._check_reply: dict[str, Any] | None = None
        self._check_wait: Any = None  # the local event loop of a check in progress

    # ---- queue ---------------------------------------------------------------------------------
    def submit(self, config: Any, *, continues: int | None = None) -> int:
        """Store `config` as a queued run and start it when a slot is free; returns its id. With
        `continues`, the run instead continues that run from its last checkpoint (same config)."""
        run_id = self.store.create_run(config) if continues is None else self.store.continue_run(continues)
        self.queue.append(run_id)
        self.queue_changed.emit()
        self._start_next()
        return run_id

    def is_active(self, run_id: int) -> bool:
        return run_id in self.jobs or run_id in self.queue

    def active_ids(self) -> list[int]:
        return list(self.jobs) + list(self.queue)

    def stop(self, run_id: int) -> None:
        """Ask a running runner to stop after its current step (SIGTERM); drop a queued run."""
        if run_id in self.queue:
            self.queue.remove(run_id)
            self.store.update_run(run_id, status="stopped", finished=now_iso(), stop_reason="stopped",
                                  error=None)
            self.queue_changed.emit()
            self.run_ended.emit(run_id, "stopped")
            return
        job = self.jobs.get(run_id)
        if job is not None:
            job.stop_requested = True
            job.process.terminate()

    def kill(self, run_id: int) -> None:
        """End a runner at once (SIGKILL); it cannot clean up, so the window marks the run failed."""
        job = self.jobs.get(run_id)
        if job is not None:
            job.process.kill()

    def keep_standby(self) -> None:
        """Keep one runner loaded ahead of the next run (`python -m engine.runner --standby`): it has
        imported torch and the engine and waits for its run, so the next run starts without those
        imports (2 to 3 s on a 2-core machine). Started now when no run is running, else when the
        last one ends; one that dies waiting is not replaced (the next run starts its own runner,
        which then says what is wrong)."""
        self._standby_wanted = True
        self._start_standby()

    def _start_standby(self) -> None:
        if not self._standby_wanted or self.standby is not None or self.jobs:
            return  # loading it beside a run would slow the run down
        process = self._new_process()
        process.finished.connect(lambda *_: self._standby_died(process))
        process.errorOccurred.connect(lambda error: error == QProcess.ProcessError.FailedToStart
                                      and self._standby_died(process))  # no `finished` then
        process.readyReadStandardOutput.connect(lambda: self._read_standby(process))
        self.standby, self._standby_environment = process, dict(self.environment)
        self._standby_output = b""
        process.start(sys.executable, STANDBY_ARGUMENTS)

    def ask_capabilities(self) -> bool:
        """Ask the runner on standby what the engine offers (engine.capabilities: device, datasets,
        models); the answer comes as `capabilities`, once it has loaded. One process imports torch for
        both, where a probe of its own imported it again at every window start. False when there is no
        runner on standby to ask (`capabilities_unanswered` follows if it ends before answering)."""
        if self.standby is None:
            return False
        self._capabilities_asked = True
        self.standby.write(CAPABILITIES_REQUEST.encode())  # read once it has loaded
        return True

    def _read_standby(self, process: QProcess) -> None:
        """The standby's answers, to a capabilities question or a check (any other line is a library's)."""
        if process is not self.standby:
            return
        *lines, self._standby_output = (self._standby_output + bytes(process.readAllStandardOutput())).split(b"\n")
        for line in lines:
            if (offered := capabilities_answer(line)) is not None:
                self._capabilities_asked = False
                self.capabilities.emit(offered)
            elif (reply := check_answer(line)) is not None and self._check_wait is not None:
                self._check_reply = reply
                self._check_wait.quit()

    def _let_go(self, process: QProcess) -> None:
        """Stop listening to the standby being handed a run or ended (no more 'died', no more answers)."""
        for signal in (process.finished, process.errorOccurred, process.readyReadStandardOutput):
            signal.disconnect()
        self._standby_gone()

    def _standby_gone(self) -> None:
        """The standby ended or was handed a run: a question it did not answer is not answered."""
        self._standby_output = b""
        if self._check_wait is not None:
            self._check_wait.quit()
        if self._capabilities_asked:
            self._capabilities_asked = False
            self.capabilities_unanswered.emit()

    def check_on_standby(self, config: Any, *, checked_before: Collection[str] = ()) -> tuple[bool, DPWError | None]:
        """Have the runner on standby check `config` against its data, as `dpw run`'s does: it keeps the
        run it prepared in checking and trains it once `submit` hands it the stored run, so the data is
        read once (engine.prepared_ahead). Asked only when that runner will take the run (loaded with the
        runners' variables, no run running or queued). The window's event loop runs meanwhile (a local
        loop). Returns (asked, problem): asked False when no runner on standby answered (none, busy,
        or it ended while checking): the caller checks the config elsewhere."""
        process = self.standby
        if (process is None or self.jobs or self.queue or process.state() != QProcess.ProcessState.Running
                or self._standby_environment != self.environment):
            return False, None
        from PySide6.QtCore import QEventLoop

        self._check_reply, self._check_wait = None, QEventLoop()
        try:
            process.write(check_request(config, checked_before).encode())
            self._check_wait.exec()  # until _read_standby has the answer or the runner is gone
        finally:
            reply, self._check_reply, self._check_wait = self._check_reply, None, None
        if reply is None:
            return False, None
        return True, None if reply["ok"] else error_from_reply(reply)

    def _standby_died(self, process: QProcess) -> None:
        if self.standby is process:
            self.standby, self._standby_wanted = None, False
            self._standby_gone()
            process.deleteLater()

    def _take_standby(self, run_id: int) -> QProcess | None:
        """The standby runner, now handed stored run `run_id`; None when there is none to hand it
        (not started, still starting, dead, or started with other variables than the runners' now)."""
        process, self.standby = self.standby, None
        if process is None:
            return None
        self._let_go(process)
        if process.state() != QProcess.ProcessState.Running or self._standby_environment != self.environment:
            self._end(process)
            return None
        process.write((json.dumps({"run_id": run_id, "db": str(self.store.path)}) + "\n").encode())
        process.closeWriteChannel()
        return process

    def _end_standby(self) -> None:
        self._standby_wanted = False
        process, self.standby = self.standby, None
        if process is not None:
            self._let_go(process)
            self._end(process)

    @staticmethod
    def _end(process: QProcess) -> None:
        """End a runner that holds no run: it has opened nothing."""
        process.kill()
        process.waitForFinished(1000)
        process.deleteLater()

    def shutdown(self, timeout_ms: int = 5000) -> None:
        """Stop everything (window closing): queued runs are dropped, runners asked to stop."""
        self._end_standby()
        for run_id in list(self.queue):
            self.stop(run_id)
        for job in list(self.jobs.values()):
            job.stop_requested = True
            job.process.terminate()
        for job in list(self.jobs.values()):
            if not job.process.waitForFinished(timeout_ms):
                job.process.kill()
                job.process.waitForFinished(1000)

    def detach(self) -> list[int]:
        """Let the runners finish without the window (it is closing); returns their run ids. Queued
        runs, which only this window would start, are dropped. A runner outlives its closed output
        (the store keeps every event). Destroying a QProcess kills a process it still counts as
        running, so each is marked not running before it is let go."""
        self._end_standby()
        for run_id in list(self.queue):
            self.stop(run_id)
        kept = list(self.jobs)
        for job in self.jobs.values():
            for signal in (job.process.readyReadStandardOutput, job.process.readyReadStandardError,
                           job.process.finished, job.process.errorOccurred):
                signal.disconnect()
            job.process.closeReadChannel(QProcess.ProcessChannel.StandardOutput)
            job.process.closeReadChannel(QProcess.ProcessChannel.StandardError)
            job.process.setProcessState(QProcess.ProcessState.NotRunning)
            job.process.deleteLater()
        self.jobs.clear()
        self.queue_changed.emit()
        return kept

    # ---- processes -----------------------------------------------------------------------------
    def _start_next(self) -> None:
        while self.queue and len(self.jobs) < self.max_parallel:
            run_id = self.queue.popleft()
            self._launch(run_id)
        self.queue_changed.emit()

    def _new_process(self) -> QProcess:
        """A runner process, not started, with the runners' variables."""
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        repo = str(Path(__file__).resolve().parents[1])
        env.insert("PYTHONPATH", repo + os.pathsep + env.value("PYTHONPATH", "") if env.contains("PYTHONPATH") else repo)
        for key, value in self.environment.items():
            env.insert(key, value)
        process.setProcessEnvironment(env)
        return process

    def _launch(self, run_id: int) -> None:
        process = self._take_standby(run_id)
        handed = process is not None
        process = process or self._new_process()
        job = _Job(run_id, process)
        self.jobs[run_id] = job
        process.readyReadStandardOutput.connect(lambda: self._read(job))
        process.readyReadStandardError.connect(lambda: self._read_stderr(job))
        process.finished.connect(lambda code, status: self._ended(job, code, status))
        process.errorOccurred.connect(lambda error: self._failed_to_start(job, error))
        if not handed:
            process.start(sys.executable, runner_arguments(self.store.path, run_id))
        self.run_started.emit(run_id)

    def _read(self, job: _Job) -> None:
        data = job.buffer + bytes(job.process.readAllStandardOutput())
        *lines, job.buffer = data.split(b"\n")
        batch = []
        for line in lines:
            event = decode(line.decode("utf-8", errors="replace"))
            if event is None:
                continue
            if event["type"] == "finished":
                job.finished_status = str(event.get("status") or "finished")
            batch.append(event)
        if batch:
            self.events.emit(job.run_id, batch)

    def _read_stderr(self, job: _Job) -> None:
        job.stderr = (job.stderr + bytes(job.process.readAllStandardError()))[-STDERR_KEPT:]

    def _failed_to_start(self, job: _Job, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._ended(job, -1, QProcess.ExitStatus.CrashExit)

    def _ended(self, job: _Job, code: int, status: QProcess.ExitStatus) -> None:
        if self.jobs.get(job.run_id) is not job:
            return  # already handled (errorOccurred and finished can both arrive)
        self._read(job)
        self._read_stderr(job)
        del self.jobs[job.run_id]
        if job.finished_status is not None:
            final = job.finished_status  # as reported (the store's row may be gone: `dpw delete`)
        elif job.stop_requested and self._stopped_unstarted(job.run_id):
            final = "stopped"  # Stop reached the runner before it could take the run (Python starting)
        else:
            final = "failed"
            message, hint = self._explain(job, code, status)
            self._mark_failed(job.run_id, message, hint)
            self.run_lost.emit(job.run_id, message, hint)
        job.process.deleteLater()
        self.run_ended.emit(job.run_id, final)
        self._start_next()
        self._start_standby()

    def _explain(self, job: _Job, code: int, status: QProcess.ExitStatus) -> tuple[str, str]:
        tail = job.stderr.decode("utf-8", errors="replace").strip().splitlines()
        last = tail[-1] if tail else ""
        if job.process.error() == QProcess.ProcessError.FailedToStart:
            return (f"the runner could not be started ({sys.executable}): {job.process.errorString()}",
                    "check that the Python environment of dp-workbench is intact")
        if status == QProcess.ExitStatus.CrashExit:
            return ("the runner process was killed or crashed before it reported an end"
                    + (f": {last}" if last else ""),
                    "everything up to its last completed step is kept; a DP-SGD run goes on from its last "
                    "checkpoint with Run ▸ Continue run, or start it again")
        return (f"the runner process exited with status {code} without reporting an end"
                + (f": {last}" if last else ""),
                "see the message above; everything up to its last completed step is kept")

    def _stopped_unstarted(self, run_id: int) -> bool:
        """A run whose runner was stopped before it took the run over (still queued: nothing ran, no
        privacy spent) is marked stopped, as a queued run is, not failed; True when it was."""
        try:
            if self.store.get_run(run_id)["status"] != "queued":
                return False
        except DPWError:  # deleted from the store meanwhile
            return False
        self.store.update_run(run_id, status="stopped", finished=now_iso(), stop_reason="stopped", error=None)
        return True

    def _mark_failed(self, run_id: int, message: str, hint: str) -> None:
        """The runner could not record its own end: record it for it, once."""
        self.store.reconcile_orphans()
        try:
            row = self.store.get_run(run_id)
        except DPWError:  # deleted from the store meanwhile: nothing left to mark
            return
        if row["status"] in ("queued", "running"):
            self.store.update_run(run_id, status="failed", finished=now_iso(), error=message, error_hint=hint)
        elif row["status"] == "failed" and (row.get("error") or "").startswith("the runner process ended"):
            self.store.update_run(run_id, error=message, error_hint=hint)
