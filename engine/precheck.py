"""Check a run config against its data before the run is stored.

A config that cannot train (data not found, delta >= 1/N, a model that does not fit the data, a
target epsilon out of reach ...) should cost the user one clear line, not a failed run in the
list and a used-up run id. `check_before_storing` does what the runner does before its first step
(`engine.runs.prepare`: load the data, apply the rules that need it, build the model, plan the
privacy) and throws the result away; the runner repeats it for real. Data the config allows to
download is fetched here, in the foreground, with a progress bar on stderr.
"""

from __future__ import annotations

from collections.abc import Collection

from engine.config import RunConfig


def check_before_storing(config: RunConfig, *, checked_before: Collection[str] = ()):
    """Raise the engine's DPWError (one line, with a hint) if `config` would fail before training;
    returns the prepared run (its data and plan), untrained. `checked_before`: as engine.runs.prepare."""
    from engine.runs import prepare

    return prepare(config, checked_before=checked_before)


def data_size(config: RunConfig, *, checked_before: Collection[str] = ()) -> dict:
    """How many training and test examples the config's data holds, read as a run reads it (for
    the window's privacy-cost preview of a dataset it has no table for: a user's file or folder)."""
    from engine.runs import load_run_data

    data = load_run_data(config, checked_before=checked_before)
    return {"num_train": int(data.num_train), "num_test": int(data.num_test)}


def answer(request: dict) -> dict:
    """One request's reply. A run config: the check, {"ok": true}. {"size_of": config}: the data's
    size, {"ok": true, "num_train", "num_test"}. {"capabilities": true}: what the engine offers here
    (engine.capabilities), {"ok": true, "device", ...}. A failure: `refusal`'s reply. A config or
    size_of may carry "checked_before": fingerprints of data that passed the load's check before
    (engine.runs.prepare)."""
    request = dict(request)
    checked = frozenset(request.pop("checked_before", ()))
    try:
        if request.get("capabilities") is True:
            from engine.capabilities import engine_capabilities

            return {"ok": True, **engine_capabilities()}
        if "size_of" in request:
            return {"ok": True, **data_size(RunConfig.from_dict(request["size_of"]), checked_before=checked)}
        check_before_storing(RunConfig.from_dict(request), checked_before=checked)
    except Exception as exc:  # the service keeps serving whatever one config does
        return refusal(exc)
    return {"ok": True}


def refusal(exc: Exception) -> dict:
    """A failed check as another process gets it (engine.errors.error_from_reply reads it back):
    {"ok": false, "message", "hint", "type", "field"}: a DPWError's one line, anything else (a bug)
    as its type and text."""
    from engine.errors import ConfigError, DPWError

    if isinstance(exc, DPWError):
        return {"ok": False, "message": exc.message, "hint": exc.hint, "type": type(exc).__name__,
                "field": exc.field if isinstance(exc, ConfigError) else None}
    return {"ok": False, "message": f"{type(exc).__name__}: {exc}", "hint": None, "type": None, "field": None}


def serve(stdin, stdout) -> int:
    """`python -m engine.precheck`: one request (JSON, see `answer`) per line in, one reply per line
    out, until end of input. The window keeps one such process, so torch is imported once, not per run
    (it also answers the window's question of what the engine offers)."""
    import json

    stdout.write(json.dumps({"ready": True}) + "\n")
    stdout.flush()
    for line in stdin:
        if not line.strip():
            continue
        try:
            reply = answer(json.loads(line))
        except ValueError as exc:
            reply = {"ok": False, "message": f"unreadable request: {exc}", "hint": None, "field": None}
        stdout.write(json.dumps(reply, default=str) + "\n")
        stdout.flush()
    return 0


def main() -> int:
    import os
    import sys

    # The protocol owns stdout: a library's print (or a download's progress) goes to stderr.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr
    return serve(sys.stdin, protocol)


if __name__ == "__main__":
    raise SystemExit(main())
