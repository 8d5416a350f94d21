"""Workbench window benchmark: launch time, event-loop stalls while a run streams, pan frame time.

    python tests/bench/bench_gui.py                  # offscreen unless $DISPLAY is set
    python tests/bench/bench_gui.py --epochs 40      # a longer streaming run

Prints a table. The streaming run is a real DP-SGD run (built-in digits, no files needed) with a
small batch, so the runner emits hundreds of events a second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CHILD_FLAG = "--launch-child"


def launch_child(db: str) -> None:
    """Child process: build and show the window, print when it has been painted once."""
    from workbench.app import create_app
    from workbench.main_window import MainWindow

    app = create_app()
    window = MainWindow(db)
    window.show()
    window.repaint()
    app.processEvents()
    print(f"shown {time.time():.6f}", flush=True)
    window.close()


def bench_launch(folder: Path, repeats: int = 3) -> list[float]:
    """Wall time from starting `python` to the window shown (interpreter start and imports included)."""
    times = []
    env = dict(os.environ, XDG_CONFIG_HOME=str(folder / "config"))
    for _ in range(repeats):
        t0 = time.time()
        out = subprocess.run([sys.executable, __file__, CHILD_FLAG, str(folder / "launch.sqlite")],
                             capture_output=True, text=True, env=env, timeout=120)
        line = next((l for l in out.stdout.splitlines() if l.startswith("shown ")), None)
        if line is None:
            raise RuntimeError(f"the window did not come up: {out.stderr[-2000:]}")
        times.append(float(line.split()[1]) - t0)
    return times


class StallMeter:
    """How late a 5 ms Qt timer fires, in ms, while `measuring`: the event loop's stalls."""

    INTERVAL_MS = 5

    def __init__(self, measuring: bool = True) -> None:
        from PySide6.QtCore import QElapsedTimer, QTimer

        self.measuring = measuring
        self.lateness: list[int] = []
        self._clock = QElapsedTimer()
        self._clock.start()
        self._last = self._clock.elapsed()
        self._timer = QTimer()
        self._timer.setInterval(self.INTERVAL_MS)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _tick(self) -> None:
        now = self._clock.elapsed()
        if self.measuring:
            self.lateness.append(now - self._last - self.INTERVAL_MS)
        self._last = now

    def stop(self) -> None:
        self._timer.stop()


def bench_store_calls(window, run_id: int, repeats: int = 30) -> dict[str, float]:
    """Median ms of the window's store calls, each a round trip to its store helper process: the
    list it polls every 1.5 s, and the replay of a whole run (selecting it in the list)."""
    import statistics

    def median_ms(call) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    store = window.store
    return {"ping": median_ms(lambda: store.call("ping")), "list_runs": median_ms(store.list_runs),
            "replay": median_ms(lambda: store.replay(run_id)),
            "replay_rows": sum(len(v) for k, v in store.replay(run_id).items() if k in ("metrics", "privacy"))}


def bench_stream(folder: Path, epochs: int, runner_threads: int | None = None) -> dict[str, float]:
    """Longest lateness of a 5 ms timer while a real run streams into the dashboard."""
    from workbench.app import create_app
    from workbench.main_window import MainWindow
    from workbench.settings import use_folder

    use_folder(folder / "settings")
    app = create_app()
    window = MainWindow(folder / "stream.sqlite", probe=False)
    if runner_threads:
        window.client.environment["OMP_NUM_THREADS"] = str(runner_threads)
    window.resize(1500, 950)
    window.show()
    form = window.form
    for name, value in dict(name="bench-stream", dataset="digits", model="auto", mechanism="dpsgd", noise_multiplier="1.0",
                            target_epsilon="", expected_batch_size="16", epochs=str(epochs), learning_rate="0.2",
                            delta="1e-4", evaluations_per_epoch="4").items():
        form.set_value(name, value)
    assert form.valid, form.summary.text()
    run_id = window.start_run(form.config())
    data = window.run_data[run_id]
    store_call_ms: list[float] = []  # the window's store calls while it streams (GUI thread, blocking)
    plain_call = window.store.call

    def timed_call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return plain_call(*args, **kwargs)
        finally:
            store_call_ms.append((time.perf_counter() - t0) * 1000)

    window.store.call = timed_call

    meter = StallMeter(measuring=False)
    events_at_start = 0
    t_stream = None
    deadline = time.monotonic() + 600
    while not data.finished and time.monotonic() < deadline:
        app.processEvents()
        if not meter.measuring and len(data.metrics.get("train_loss", ())) > 0:
            meter.measuring = True
            t_stream = time.monotonic()
            events_at_start = data.version
        time.sleep(0.001)
    seconds = time.monotonic() - (t_stream or time.monotonic())
    meter.stop()
    events = data.version - events_at_start
    window.store.call = plain_call
    calls = bench_store_calls(window, run_id)
    calls["streaming_calls"] = len(store_call_ms)
    calls["streaming_longest"] = max(store_call_ms, default=float("nan"))
    window.close()
    lateness = sorted(meter.lateness)
    return {
        "events": events,
        "seconds": seconds,
        "events_per_second": events / max(seconds, 1e-9),
        "max_stall_ms": float(max(lateness)) if lateness else float("nan"),
        "p99_stall_ms": float(lateness[int(0.99 * (len(lateness) - 1))]) if lateness else float("nan"),
        "status": data.status,
        "store_calls": calls,
    }


def bench_idle(seconds: float = 5.0) -> float:
    """Longest lateness of the same 5 ms timer with the window open and nothing running: the floor
    set by the machine (other processes, the scheduler), not by the window."""
    from workbench.app import create_app
    from workbench.main_window import MainWindow

    app = create_app()
    folder = Path(tempfile.mkdtemp(prefix="dpw-bench-idle-"))
    window = MainWindow(folder / "idle.sqlite", probe=False)
    window.resize(1500, 950)
    window.show()
    meter = StallMeter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.001)
    meter.stop()
    window.close()
    lateness = meter.lateness
    return float(max(lateness[1:])) if len(lateness) > 1 else float("nan")


def bench_pan(points: int = 100_000, frames: int = 200) -> dict[str, float]:
    """ms per frame while panning a curve of `points` points (setXRange + repaint)."""
    import numpy as np
    from PySide6.QtWidgets import QApplication

    from workbench.app import create_app
    from workbench.plots import Plot, set_curve

    app = create_app()
    plot = Plot("pan", "step", "loss")
    plot.resize(1200, 700)
    plot.show()
    x = np.arange(points, dtype=float)
    y = np.exp(-x / 30_000) + 0.05 * np.random.default_rng(0).standard_normal(points)
    set_curve(plot.curve("train loss", 0), x, y)
    app.processEvents()
    results = {}
    for label, width in (("full view", points), ("10% window", points // 10)):
        plot.setXRange(0, width, padding=0)
        plot.repaint()
        app.processEvents()
        step = (points - width) / frames if width < points else points / frames / 10
        t0 = time.perf_counter()
        for i in range(frames):
            lo = (i * step) % max(points - width, 1) if width < points else -i * step
            plot.setXRange(lo, lo + width, padding=0)
            plot.repaint()
            QApplication.processEvents()
        results[label] = (time.perf_counter() - t0) / frames * 1000
    plot.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the streaming run (digits, batch 16)")
    parser.add_argument("--runner-threads", type=int, default=None,
                        help="OMP_NUM_THREADS of the runner (default: torch's choice, all cores)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpw-bench-gui-"))
    platform = os.environ.get("QT_QPA_PLATFORM") or "xcb/wayland"
    launch = bench_launch(folder)
    stream = bench_stream(folder, args.epochs, args.runner_threads)
    pan = bench_pan()
    idle = bench_idle()
    rows = [
        ("launch to window shown (median of 3)", f"{sorted(launch)[1] * 1000:.0f} ms",
         "new python process, imports included"),
        ("streaming run", f"{stream['events']:,} events in {stream['seconds']:.1f} s",
         f"{stream['events_per_second']:.0f} events/s, status {stream['status']}"),
        ("longest event-loop stall while streaming", f"{stream['max_stall_ms']:.0f} ms",
         f"5 ms timer lateness; p99 {stream['p99_stall_ms']:.0f} ms; target < 50 ms"),
        ("longest stall, window idle (machine floor)", f"{idle:.0f} ms", "same timer, no run"),
    ]
    calls = stream["store_calls"]
    rows += [
        ("store round trip (helper process): ping", f"{calls['ping']:.2f} ms", "median of 30"),
        ("store round trip: list_runs", f"{calls['list_runs']:.2f} ms", "polled every 1.5 s"),
        ("longest store call while streaming", f"{calls['streaming_longest']:.1f} ms",
         f"{calls['streaming_calls']} calls on the GUI thread during the run"),
        ("store round trip: replay the streamed run", f"{calls['replay']:.1f} ms",
         f"{calls['replay_rows']:,} metric and privacy rows"),
    ]
    for label, ms in pan.items():
        rows.append((f"pan 100,000-point curve, {label}", f"{ms:.1f} ms/frame", "setXRange + repaint, 1200x700"))
    width = max(len(r[0]) for r in rows)
    print(f"platform: {platform}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; runner threads: {args.runner_threads or 'default'}")
    print(f"{'measure':{width}}  {'value':>28}  notes")
    for label, value, note in rows:
        print(f"{label:{width}}  {value:>28}  {note}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD_FLAG:
        launch_child(sys.argv[2])
    else:
        main()
