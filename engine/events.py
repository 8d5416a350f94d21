"""The runner's event stream: one JSON object per line, version 1.

Every event has `v` (format version), `type`, `run_id`, `t` (seconds since the run started)
and a payload that depends on the type:

| type       | payload                                                               |
|------------|-----------------------------------------------------------------------|
| started    | name, mechanism, dataset, config (dict), config_hash                  |
| plan       | model, device, num_train, num_test, input_shape, num_classes,         |
|            | dataset_fingerprint, normalization, sample_rate, steps,               |
|            | steps_allowed, noise_multiplier, noise_calibrated, delta, accountant, |
|            | epsilon_budget (what the settings imply, fixed before training)       |
| progress   | phase ("loading", "calibrating", "training", "evaluating", ...),      |
|            | done, total                                                           |
| metric     | step, epoch, name ("train_loss", "test_accuracy", "test_loss", ...),  |
|            | value                                                                 |
| privacy    | step, epsilon, delta, accountant                                      |
| vote_batch | (PATE) first_query, count, answered, rejected                         |
| artifact   | kind, path, sha256                                                    |
| warning    | message                                                               |
| error      | message, where, hint, traceback (only for internal errors)            |
| finished   | status ("finished", "stopped", "failed", "budget_exhausted"), summary |

The same events are written to the store's `events` table, so a reopened window can replay a run.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any, Callable

EVENT_VERSION = 1
EVENT_TYPES = (
    "started",
    "plan",
    "progress",
    "metric",
    "privacy",
    "vote_batch",
    "artifact",
    "warning",
    "error",
    "finished",
)


def make_event(type_: str, run_id: int, t: float, **payload: Any) -> dict[str, Any]:
    if type_ not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type_!r}; known: {', '.join(EVENT_TYPES)}")
    return {"v": EVENT_VERSION, "type": type_, "run_id": run_id, "t": round(t, 4), **payload}


def encode(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), allow_nan=False)


def decode(line: str) -> dict[str, Any] | None:
    """Parse one line of runner output; None for lines that are not events (e.g. stray prints)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(event, dict) or event.get("v") != EVENT_VERSION or event.get("type") not in EVENT_TYPES:
        return None
    return event


class EventWriter:
    """Writes a run's events to a stream (stdout) and hands each to `sink` (the store)."""

    def __init__(
        self,
        run_id: int,
        *,
        stream: IO[str] | None = None,
        sink: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.run_id = run_id
        self.stream = stream if stream is not None else sys.stdout
        self.sink = sink
        self.t0 = time.monotonic()

    def emit(self, type_: str, **payload: Any) -> dict[str, Any]:
        event = make_event(type_, self.run_id, time.monotonic() - self.t0, **payload)
        if self.sink is not None:
            self.sink(event)
        if self.stream is not None:
            try:
                self.stream.write(encode(event) + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                # The reader went away (window closed); the store still has every event.
                self.stream = None
        return event
