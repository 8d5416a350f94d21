"""Audit tab benchmark: does the window's event loop stall while the theory curve and the attack are computed?

    python tests/bench/bench_audit_view.py                                  # a digits DP-SGD run made here
    python tests/bench/bench_audit_view.py --db runs.sqlite --run 1 --data-dir ../shared/data   # e.g. MNIST

Measures the lateness of a 5 ms Qt timer (tests/bench/bench_gui.py's StallMeter) in the real main window
(a) while the Audit tab shows a run whose trade-off curve is computed in the worker thread, (b) while
"Run audit" runs the membership audit in its process until its result is kept and the list re-read, and
(c) with the window idle (the machine's floor). Prints one row per phase: seconds, max and p99 stall (ms).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gui import StallMeter  # noqa: E402


def digits_run(folder: Path) -> tuple[Path, int]:
    config = folder / "digits.toml"
    config.write_text(textwrap.dedent("""\
        name = "bench-audit"
        dataset = "digits"
        model = "auto"
        mechanism = "dpsgd"
        noise_multiplier = 1.0
        clipping_norm = 1.0
        delta = 1e-5
        expected_batch_size = 64
        epochs = 3
        learning_rate = 0.5
        seed = 0
        """))
    db = folder / "runs.sqlite"
    subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(db)], check=True,
                   cwd=REPO, capture_output=True)
    return db, 1


def measure(app, until, timeout_s: float = 900.0) -> dict[str, float]:
    meter = StallMeter()
    t0 = time.monotonic()
    while not until() and time.monotonic() - t0 < timeout_s:
        app.processEvents()
        time.sleep(0.001)
    seconds = time.monotonic() - t0
    meter.stop()
    lateness = sorted(meter.lateness[1:]) or [float("nan")]
    return {"seconds": seconds, "max_stall_ms": float(lateness[-1]),
            "p99_stall_ms": float(lateness[int(0.99 * (len(lateness) - 1))])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--run", type=int, default=1)
    parser.add_argument("--data-dir", help="DPW_DATA_DIR for the audit process (where the run's data is)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpw-bench-audit-"))
    from workbench.settings import use_folder

    use_folder(folder / "settings")
    db, run_id = (args.db, args.run) if args.db else digits_run(folder)
    from workbench.app import create_app
    from workbench.main_window import MainWindow

    app = create_app()
    window = MainWindow(db, probe=False)
    if args.data_dir:
        window.client.environment["DPW_DATA_DIR"] = str(Path(args.data_dir).resolve())
    window.resize(1500, 950)
    window.show()
    window.select_run(run_id)
    for _ in range(50):
        app.processEvents()
        time.sleep(0.01)
    rows = {}
    window.tabs.setCurrentWidget(window.audit)
    rows["theory curve (worker thread)"] = measure(
        app, lambda: window.audit.figure is not None and window.audit.figure.theory is not None)
    stored = []
    window.audit.stored.connect(stored.append)
    window.audit.run_audit()
    rows["Run audit (process) until kept"] = measure(app, lambda: not window.audit.jobs)
    rows["idle window"] = measure(app, lambda: False, timeout_s=5.0)
    error = window.audit.errors.get(run_id)
    window.close()
    print(f"store {db}, run {run_id}: audit {'kept' if stored else 'NOT kept: ' + str(error)}")
    print(f"{'phase':34} {'seconds':>8} {'max stall ms':>13} {'p99 stall ms':>13}")
    for name, row in rows.items():
        print(f"{name:34} {row['seconds']:8.1f} {row['max_stall_ms']:13.0f} {row['p99_stall_ms']:13.0f}")


if __name__ == "__main__":
    main()
