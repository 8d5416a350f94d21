"""What the window knows about one run, without Qt: curves, progress, messages.

Fed either live (events decoded from the runner's stdout) or from the store (a reopened
window replays the stored rows). Appending is cheap; plots read the arrays on a timer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Series:
    """A growing (x, y) curve backed by numpy arrays (amortised doubling)."""

    def __init__(self) -> None:
        self._x = np.empty(64)
        self._y = np.empty(64)
        self.n = 0

    def append(self, x: float, y: float) -> None:
        if self.n == self._x.size:
            self._x = np.concatenate([self._x, np.empty(self._x.size)])
            self._y = np.concatenate([self._y, np.empty(self._y.size)])
        self._x[self.n] = x
        self._y[self.n] = y if y is not None else np.nan
        self.n += 1

    def extend(self, xs, ys) -> None:
        xs = np.asarray(xs, dtype=float)
        ys = np.asarray(ys, dtype=float)
        need = self.n + xs.size
        if need > self._x.size:
            size = max(need, 2 * self._x.size)
            self._x = np.concatenate([self._x[: self.n], np.empty(size - self.n)])
            self._y = np.concatenate([self._y[: self.n], np.empty(size - self.n)])
        self._x[self.n : need] = xs
        self._y[self.n : need] = ys
        self.n = need

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.n]

    def last(self) -> float | None:
        return float(self._y[self.n - 1]) if self.n else None

    def __len__(self) -> int:
        return self.n


@dataclass
class Message:
    level: str  # "error" or "warning" or "info"
    text: str
    hint: str | None = None


@dataclass
class RunData:
    """Curves and state of one run, keyed the way the engine names them."""

    run_id: int
    name: str = ""
    mechanism: str = ""
    status: str = "queued"
    config: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Series] = field(default_factory=dict)
    privacy: dict[str, Series] = field(default_factory=dict)
    phase: str = ""
    done: int = 0
    total: int = 0
    phase_started: float | None = None  # monotonic time the current phase's progress began
    phase_done_at_start: int = 0
    answered: Series = field(default_factory=Series)  # cumulative answered vs queries processed
    rejected: Series = field(default_factory=Series)
    answered_total: int = 0
    rejected_total: int = 0
    messages: list[Message] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    study: dict[str, Any] | None = None  # the study's store row when the run is one of its candidates
    continues: tuple[int, int] | None = None  # (run, step): a run continued from that run's checkpoint
    finished: bool = False
    version: int = 0  # bumped on every change; views redraw when it moved

    # ---- live events ---------------------------------------------------------------------------
    def apply(self, event: dict[str, Any], *, live: bool = True) -> None:
        kind = event.get("type")
        if kind == "metric":
            self.series(self.metrics, event["name"]).append(event["step"], event["value"])
        elif kind == "privacy":
            self.series(self.privacy, event["accountant"]).append(event["step"], event["epsilon"])
        elif kind == "progress":
            self._progress(event, live)
        elif kind == "vote_batch":
            self.answered_total += int(event["answered"])
            self.rejected_total += int(event["rejected"])
            queries = int(event["first_query"]) + int(event["count"])
            self.answered.append(queries, self.answered_total)
            self.rejected.append(queries, self.rejected_total)
        elif kind == "started":
            self.name = event.get("name", self.name)
            self.mechanism = event.get("mechanism", self.mechanism)
            self.config = event.get("config", self.config) or {}
            self.status = "running"
            if event.get("resumed_from") is not None:
                self.continues = (int(event["resumed_from"]), int(event.get("from_step") or 0))
        elif kind == "plan":
            self.plan = {k: v for k, v in event.items() if k not in ("v", "type", "run_id", "t")}
        elif kind == "warning":
            self.messages.append(Message("warning", event.get("message", "")))
        elif kind == "error":
            where = event.get("where")
            text = event.get("message", "") + (f" (while {where})" if where else "")
            self.messages.append(Message("error", text, event.get("hint")))
        elif kind == "finished":
            self.status = event.get("status", "finished")
            self.summary = event.get("summary") or {}
            self.finished = True
        self.version += 1

    def _progress(self, event: dict[str, Any], live: bool) -> None:
        phase = event.get("phase", "")
        if phase != self.phase:
            self.phase = phase
            self.phase_started = time.monotonic() if live else None
            self.phase_done_at_start = int(event.get("done", 0))
            if phase == "training" and self.continues is not None:  # the continued run's steps: not this pace
                self.phase_done_at_start = max(self.phase_done_at_start, self.continues[1])
        self.done = int(event.get("done", 0))
        self.total = int(event.get("total", 0))

    @staticmethod
    def series(table: dict[str, Series], name: str) -> Series:
        if name not in table:
            table[name] = Series()
        return table[name]

    def fail(self, text: str, hint: str | None = None) -> None:
        """The runner ended without saying why (killed, crashed)."""
        self.messages.append(Message("error", text, hint))
        self.status = "failed"
        self.finished = True
        self.version += 1

    # ---- derived -------------------------------------------------------------------------------
    def seconds_left(self) -> float | None:
        """Time left in the current phase, extrapolated from its progress so far."""
        if self.phase_started is None or self.total <= 0 or self.finished:
            return None
        done = self.done - self.phase_done_at_start
        if done <= 0:
            return None
        elapsed = time.monotonic() - self.phase_started
        return elapsed / done * (self.total - self.done)

    def epsilon_series(self) -> tuple[str | None, Series | None]:
        """The curve of the reported epsilon: the run's accountant, else the live one. PATE: its
        guarantee, the data-independent bound (engine.publication)."""
        if not self.privacy:
            return None, None
        if self.mechanism == "pate" and "pate-di" in self.privacy:
            return "publishable", self.privacy["pate-di"]
        for name in (self.plan.get("accountant"), self.config.get("accountant"), "pate-dd", "pld", "rdp"):
            if name in self.privacy:
                return name, self.privacy[name]
        name = next(iter(self.privacy))
        return name, self.privacy[name]

    def as_run(self) -> dict[str, Any]:
        """What engine.publication reads of a run (id, mechanism, config, summary, plan, study)."""
        return {"id": self.run_id, "mechanism": self.mechanism, "config": self.config, "summary": self.summary,
                "plan": self.plan, "study": self.study}

    def set_study(self, study: dict[str, Any] | None) -> None:
        """The run's study as the store now lists it (its status and epsilon change as it runs)."""
        if study != self.study:
            self.study = study
            self.version += 1

    @property
    def budget(self) -> float | None:
        budget = self.plan.get("epsilon_budget", self.config.get("epsilon_budget"))
        return float(budget) if budget is not None else None

    # ---- from the store ------------------------------------------------------------------------
    @classmethod
    def from_store(cls, store: Any, run_id: int) -> "RunData":
        """Replay a stored run: curves from its metric/privacy rows, the rest from its events.
        `store`: the window's StoreClient (one round trip), or an engine Store."""
        if hasattr(store, "replay"):
            stored = store.replay(run_id)
        else:
            from engine.store_service import replay

            stored = replay(store, run_id)
        row = stored["run"]
        data = cls(run_id=run_id, name=row["name"], mechanism=row["mechanism"], status=row["status"],
                   config=row.get("config") or {}, study=row.get("study"))
        if row.get("resumed_from") is not None:  # as its `started` event says, which a replay leaves out
            data.continues = (int(row["resumed_from"]), int(row.get("steps_resumed") or 0))
        for table, curves in ((data.metrics, stored["metrics"]), (data.privacy, stored["privacy"])):
            for name, (steps, values) in curves.items():
                cls.series(table, name).extend(steps, np.array(values, dtype=float))  # None -> nan
        for event in stored["events"]:
            data.apply(event, live=False)
        data.status = row["status"]
        if row["status"] in ("finished", "stopped", "failed"):
            data.finished = True
            if row["status"] == "failed" and not any(m.level == "error" for m in data.messages) and row.get("error"):
                data.messages.append(Message("error", row["error"], row.get("error_hint")))
        data.version += 1
        return data
