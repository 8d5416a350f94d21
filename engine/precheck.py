"""Check a run config against its data before the run is stored.

A config that cannot train (data not found, delta >= 1/N, a model that does not fit the data, a
target epsilon out of reach ...) should cost the user one clear line, not a failed run in the
list and a used-up run id. `check_before_storing` does what the runner does before its first step
(`engine.runs.prepare`: load the data, apply the rules that need it, build the model, plan the
privacy) and throws the result away; the runner repeats it for real. Data the config allows to
download is fetched here, in the foreground, with a progress bar on stderr.
"""

from __future__ import annotations

from engine.config import RunConfig


def check_before_storing(config: RunConfig) -> None:
    """Raise the engine's DPWError (one line, with a hint) if `config` would fail before training."""
    from engine.runs import prepare

    prepare(config)
