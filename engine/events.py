"""The runner's event stream: one JSON object per line, version 1.

Every event has `v` (format version), `type`, `run_id`, `t` (seconds since the run started)
and a payload that depends on the type:

| type       | payload                                                               |
|------------|-----------------------------------------------------------------------|
| started    | name, mechanism, dataset, config (dict), config_hash; a run continued |
|            | from another's checkpoint: resumed_from (run id), from_step           |
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

The `finished` event's `summary` (also the store's `runs.summary`) is made by the mechanism's
`finish` (engine.runs.PreparedRun, engine.pate.run.PreparedPATERun). A DP-SGD run launched with
`dpw run CONFIG --nproc N` adds `distributed`: {`world_size` (N), `noise_added_by` ("rank 0": the
Gaussian noise is added once per step, by rank 0 alone), `parameters_identical` (true when every
rank ended with the same weights, compared by a sha256 of each rank's parameters; rank 0's model is
saved either way)} (engine.dpsgd.distributed). After the `finished` event, a finished run's runner adds
`membership_audit` to the store's summary (engine.audit_job.audit_after_training: the loss attack on
the run's model, computed from private data, kept locally); no event carries it.

Non-finite numbers (an epsilon of inf when the noise is tiny, a NaN loss) are written as the
strings "Infinity", "-Infinity" and "NaN" (JSON has no such numbers), so every line stays strict
JSON; `decode` (and the store's replay) turn them back into floats, except in free-text fields
(TEXT_FIELDS, e.g. a run named "NaN").
"""

from __future__ import annotations

import json
import math
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


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
TEXT_FIELDS = frozenset({"name", "message", "hint", "where", "traceback", "path", "dataset", "config", "software",
                         "error", "kind", "phase", "status", "accountant", "mechanism", "model", "device"})


def to_json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by its NON_FINITE string (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: to_json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_safe(v) for v in value]
    return value


def from_json_safe(value: Any) -> Any:
    """The inverse of to_json_safe, leaving the values of TEXT_FIELDS as they are."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: v if k in TEXT_FIELDS else from_json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_safe(v) for v in value]
    return value


def loads(text: str) -> Any:
    """json.loads, then NON_FINITE strings back into floats (only when the text holds one: a replay of
    many events pays for the walk only where it is needed)."""
    value = json.loads(text)
    return from_json_safe(value) if ('"NaN"' in text or 'Infinity"' in text) else value


def make_event(type_: str, run_id: int, t: float, **payload: Any) -> dict[str, Any]:
    if type_ not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type_!r}; known: {', '.join(EVENT_TYPES)}")
    return {"v": EVENT_VERSION, "type": type_, "run_id": run_id, "t": round(t, 4), **payload}


def encode(event: dict[str, Any]) -> str:
    """One strict JSON line (non-finite numbers as NON_FINITE strings)."""
    return json.dumps(to_json_safe(event), separators=(",", ":"), allow_nan=False)


def decode(line: str) -> dict[str, Any] | None:
    """Parse one line of runner output; None for lines that are not events (e.g. stray prints)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = loads(line)
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
            line = encode(event) + "\n"  # an event that cannot be encoded is a bug: it raises here
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                # The reader went away (window closed: a broken pipe, or a closed file's ValueError);
                # the store still has every event.
                self.stream = None
        return event
