"""Opening the window: seconds until the engine's answer (device, datasets, models) and the CPU its
child processes use meanwhile.

    python tests/bench/bench_window_start.py                      # this checkout, 3 openings
    python tests/bench/bench_window_start.py --tree ../old --runs 5

Each opening is a fresh process (offscreen, settings and store of its own) that opens the window,
lets it run `--seconds` (default 20), and reports: when the engine probe answered, how many child
processes the window started, and the CPU seconds they used (read from /proc while they live, so
processes that already ended are counted too). With --tree, another checkout (a git worktree of an
earlier commit) opens its window alternately with this one. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

OPENING = r"""
import json, os, sys, tempfile, time
from pathlib import Path
from workbench.settings import use_folder
use_folder(tempfile.mkdtemp())
from workbench.app import create_app
app = create_app(["dpw"])
from workbench.main_window import MainWindow
start = time.monotonic()
window = MainWindow(Path(tempfile.mkdtemp()) / "runs.sqlite")
answered, cpu, me, tick = None, {}, os.getpid(), os.sysconf("SC_CLK_TCK")
while time.monotonic() - start < float(sys.argv[1]):
    app.processEvents()
    time.sleep(0.01)
    if answered is None and window.probe.result is not None:
        answered = time.monotonic() - start
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            cpu[pid] = max(cpu.get(pid, 0.0), (int(fields[11]) + int(fields[12])) / tick)
window.close()
app.processEvents()
print(json.dumps({"answered": answered, "children": len(cpu), "cpu": sum(cpu.values())}))
"""


def one_opening(tree: Path, seconds: float) -> dict:
    out = subprocess.run([sys.executable, "-c", OPENING, str(seconds)], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree), "QT_QPA_PLATFORM": "offscreen"}, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: the opening failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="another checkout to compare with, alternately")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each window stays open")
    args = parser.parse_args()
    trees = [REPO] + ([args.tree.resolve()] if args.tree else [])
    rows: dict[Path, list[dict]] = {tree: [] for tree in trees}
    print(f"{'tree':<40} {'engine answered (s)':>20} {'children':>9} {'child CPU (s)':>14}")
    for _ in range(args.runs):
        for tree in trees:
            row = one_opening(tree, args.seconds)
            rows[tree].append(row)
            answered = "never" if row["answered"] is None else f"{row['answered']:.2f}"
            print(f"{str(tree):<40} {answered:>20} {row['children']:>9} {row['cpu']:>14.1f}", flush=True)
    print("medians:")
    for tree, runs in rows.items():
        times = [r["answered"] for r in runs if r["answered"] is not None]
        answered = f"{statistics.median(times):.2f}" if times else "never"
        print(f"{str(tree):<40} {answered:>20} {statistics.median(r['children'] for r in runs):>9} "
              f"{statistics.median(r['cpu'] for r in runs):>14.1f}")


if __name__ == "__main__":
    main()
