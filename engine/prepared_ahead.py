"""A run prepared before it is stored, by the runner that will train it.

`dpw run` and `dpw study` start a runner on standby and ask it to check the config against its data
(the window asks its runner on standby at Start); the check is the run's own preparation
(engine.runs.prepare: the data loaded, the model built, the privacy planned), which the runner keeps
and trains once the run is stored. Checked in another process instead, a run imported torch twice on
the same cores and read its data twice. The events
the preparation emits (its plan, any warning) wait until the run exists, then go to its stream in
order; its loading progress, long over by then, is dropped.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Callable

from engine.config import RunConfig
from engine.errors import DPWError
from engine.precheck import refusal

Emit = Callable[..., Any]


class HeldEvents:
    """The emit of a run prepared before it exists: holds the events until `connect` gives it the
    run's, then passes them on, and every later one as it comes."""

    def __init__(self) -> None:
        self._held: list[tuple[str, dict[str, Any]]] = []
        self._emit: Emit | None = None

    def __call__(self, type_: str, **payload: Any) -> None:
        if self._emit is not None:
            self._emit(type_, **payload)
        elif type_ != "progress":
            self._held.append((type_, payload))

    def connect(self, emit: Emit, *, plan_update: dict[str, Any]) -> None:
        """Send the held events to `emit`, the plan's with `plan_update` (what was settled only once the
        run was handed over), and every later event too."""
        held, self._held = self._held, []
        self._emit = emit
        for type_, payload in held:
            emit(type_, **({**payload, **plan_update} if type_ == "plan" else payload))


@dataclass
class PreparedAhead:
    config: dict[str, Any]  # the config prepared (RunConfig.to_dict)
    prepared: Any  # engine.runs.PreparedRun, or a PATE run's engine.pate.run.PreparedPATERun
    events: HeldEvents

    def take(self, config: RunConfig, emit: Emit) -> Any:
        """The prepared run for the stored run of `config`, its events now going to `emit`; None when
        the stored config is not the one prepared (then the run is prepared again, as it was stored)."""
        if config.to_dict() != self.config:
            return None
        import torch

        # The runner sets the run's CPU threads once it knows the run (engine.runner.threads_for).
        self.events.connect(emit, plan_update={"threads": torch.get_num_threads()})
        return self.prepared


def check_request(config: RunConfig, checked_before: Collection[str] = ()) -> str:
    """The line asking a standby runner to check `config` (engine.runner.wait_for_run). `checked_before`:
    fingerprints of data that passed the load's check before (engine.runs.prepare)."""
    return json.dumps({"check": config.to_dict(), "checked_before": sorted(checked_before)}) + "\n"


def answer_line(reply: dict[str, Any]) -> str:
    """The line a standby runner answers a check request with (`prepare_ahead`'s reply)."""
    return json.dumps({"checked": reply}, default=str) + "\n"


CAPABILITIES_REQUEST = json.dumps({"capabilities": True}) + "\n"  # what the engine offers (engine.capabilities)


def capabilities_line() -> str:
    """A standby runner's answer to CAPABILITIES_REQUEST: {"capabilities": engine.capabilities' dict}."""
    from engine.capabilities import engine_capabilities

    return json.dumps({"capabilities": engine_capabilities()}) + "\n"


def capabilities_answer(line: str | bytes) -> dict[str, Any] | None:
    """What the engine offers if `line` is a standby runner's `capabilities_line`; None for any other."""
    return _answer(line, "capabilities")


def check_answer(line: str | bytes) -> dict[str, Any] | None:
    """The reply if `line` is a standby runner's answer (`answer_line`); None for any other line (one a
    library printed)."""
    return _answer(line, "checked")


def _answer(line: str | bytes, key: str) -> dict[str, Any] | None:
    """The value under `key` of a standby runner's answer line; None for any other line."""
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    return answer.get(key) if isinstance(answer, dict) else None


def prepare_ahead(request: dict[str, Any]) -> tuple[dict[str, Any], PreparedAhead | None]:
    """The check a standby runner is asked for, {"check": config, "checked_before": fingerprints}: its
    reply ({"ok": true, "num_train": N}, or engine.precheck.refusal's) and, when it passed, the
    prepared run."""
    from engine.runs import prepare

    events = HeldEvents()
    try:
        config = RunConfig.from_dict(request["check"])
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the runner's protocol (a download prints)
            prepared = prepare(config, emit=events, checked_before=frozenset(request.get("checked_before", ())))
    except Exception as exc:  # refused: the caller says why and stores no run
        if not isinstance(exc, DPWError):  # a bug: its traceback on the terminal, as in the caller's own check
            traceback.print_exc()
        return refusal(exc), None
    return {"ok": True, "num_train": int(prepared.data.num_train)}, PreparedAhead(config.to_dict(), prepared, events)
