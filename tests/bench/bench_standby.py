"""Start latency in the window: nothing loaded ahead against what the window loads as it opens (a
runner on standby, which also answers the engine probe).

    python tests/bench/bench_standby.py              # 3 pairs, offscreen unless $DISPLAY is set
    python tests/bench/bench_standby.py --pairs 5

Each pair opens a window on a new store, waits as a user filling the form would (--wait seconds),
starts the same quick DP-SGD run on the built-in digits (no files needed), and times Start to the
first training step and to the run's end: once cold (the check's helper and the runner start at
Start), once warm (EngineClient.keep_standby and the engine probe asked of that runner, as the window
does as it opens; the runner then checks the config at Start and trains what it prepared),
alternating. Prints a table and the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

QUICK = dict(name="standby-bench", dataset="digits", model="auto", mechanism="dpsgd", noise_multiplier="1.0",
             target_epsilon="", expected_batch_size="64", epochs="1", learning_rate="0.5", delta="1e-4",
             evaluations_per_epoch="1")


def wait_until(app, condition, limit_s: float = 300.0) -> None:
    start = time.monotonic()
    while not condition():
        app.processEvents()
        time.sleep(0.005)
        if time.monotonic() - start > limit_s:
            raise TimeoutError("the run did not get there in time")


def one_run(app, *, standby: bool, wait_s: float) -> tuple[float, float, str]:
    """(seconds to the first training step, seconds to the end, final status) of one run from Start."""
    from workbench.main_window import MainWindow

    window = MainWindow(Path(tempfile.mkdtemp()) / "runs.sqlite", probe=False)
    try:
        if standby:
            window.client.keep_standby()
            window.probe.start()
        end = time.monotonic() + wait_s
        wait_until(app, lambda: time.monotonic() > end)
        for name, value in QUICK.items():
            window.form.set_value(name, value)
        before = set(window.run_data)
        started = time.monotonic()
        window.act_start.trigger()
        (run_id,) = set(window.run_data) - before
        data = window.run_data[run_id]
        wait_until(app, lambda: len(data.metrics.get("train_loss", ())) > 0 or data.finished)
        first_step = time.monotonic() - started
        wait_until(app, lambda: data.finished)
        return first_step, time.monotonic() - started, data.status
    finally:
        window.client.shutdown()
        window.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--wait", type=float, default=8.0, help="seconds between opening the window and Start")
    args = parser.parse_args()
    from tabulate import tabulate

    from workbench.app import create_app

    app = create_app()
    rows, times = [], {False: [], True: []}
    for pair in range(1, args.pairs + 1):
        for standby in (False, True):
            first, total, status = one_run(app, standby=standby, wait_s=args.wait)
            times[standby].append((first, total))
            rows.append([pair, "warm" if standby else "cold", f"{first:.2f}", f"{total:.2f}", status])
    print(tabulate(rows, headers=["pair", "start", "Start to first step (s)", "Start to end (s)", "status"]))
    for standby in (False, True):
        firsts, totals = zip(*times[standby])
        print(f"median {'warm' if standby else 'cold'}: first step {statistics.median(firsts):.2f} s, "
              f"end {statistics.median(totals):.2f} s")


if __name__ == "__main__":
    main()
