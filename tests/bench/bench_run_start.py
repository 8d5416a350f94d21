"""`dpw run` from the command to its run's first training step, and the CPU its processes used.

    python tests/bench/bench_run_start.py CONFIG.toml                      # this checkout, 3 runs
    python tests/bench/bench_run_start.py CONFIG.toml --tree ../old --runs 5 --data-dir ../shared/data

Each run is `python -m engine.cli run CONFIG --json` on a store of its own; the events are read as
they come with a clock. With --tree, another checkout of the engine (a git worktree of an earlier
commit) runs the same config, alternating with this one, so a change to the start can be measured
side by side on one machine. Prints one row per run and the medians per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKS = ("started", "first step", "finished", "exit")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(tree: Path, config: Path, db: Path, data_dir: Path | None) -> dict[str, float]:
    """Seconds from the command to each mark, and the CPU seconds of the command and its runner."""
    args = [sys.executable, "-m", "engine.cli", "run", str(config.resolve()), "--db", str(db), "--json"]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir.resolve())]
    cpu_before = children_cpu_s()
    start = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=tree,
                            env={**os.environ, "PYTHONPATH": str(tree)})
    marks: dict[str, float] = {}
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("type")
        if kind == "started" or kind == "finished":
            marks.setdefault(kind, time.monotonic() - start)
        elif kind == "progress" and event.get("phase") == "training" and event.get("done", 0) >= 1:
            marks.setdefault("first step", time.monotonic() - start)
    if proc.wait() != 0:
        raise SystemExit(f"{tree}: dpw run ended with status {proc.returncode}")
    marks["exit"] = time.monotonic() - start
    marks["cpu"] = children_cpu_s() - cpu_before
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--tree", type=Path, help="another checkout to run alternately with this one")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree")
    parser.add_argument("--data-dir", type=Path, help="where the config's registered dataset is")
    args = parser.parse_args()
    trees = [REPO] + ([args.tree.resolve()] if args.tree else [])
    rows: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(args.runs):
            for i, tree in enumerate(trees):
                marks = one_run(tree, args.config, Path(scratch) / f"runs-{i}-{k}.sqlite", args.data_dir)
                rows[tree].append(marks)
                print(f"{tree.name:<12} " + "  ".join(f"{m} {marks.get(m, float('nan')):6.2f} s"
                                                      for m in MARKS) + f"  cpu {marks['cpu']:5.1f} s", flush=True)
    print(f"\nmedians over {args.runs} runs, load average {os.getloadavg()[0]:.2f}")
    for tree, marks in rows.items():
        print(f"{tree.name:<12} " + "  ".join(
            f"{m} {statistics.median(r.get(m, float('nan')) for r in marks):6.2f} s" for m in (*MARKS, "cpu")))


if __name__ == "__main__":
    main()
