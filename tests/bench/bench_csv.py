"""Benchmark: time and peak memory of loading a large CSV table (engine.datasets.load_dataset).

Generates a CSV like the one in the reliability findings (row 5.8: 1,000,000 rows, numeric columns
f0..f19 with 5 decimals and a 0/1 label, 172 MB) in a temporary folder, then loads it in a fresh
subprocess that reports its own peak RSS (resource.getrusage) after importing the engine and after
loading. The numeric data is rows x columns x 8 bytes (float64).

    .venv/bin/python tests/bench/bench_csv.py            # 1,000,000 x 20
    .venv/bin/python tests/bench/bench_csv.py --rows 200000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHILD = r"""
import json, resource, sys, time
import numpy as np, torch  # what a runner has loaded anyway
from engine.datasets import load_dataset
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
progress = []
start, cpu = time.perf_counter(), time.process_time()
d = load_dataset(sys.argv[1], progress=lambda done, total: progress.append((done, total)))
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "rss_before_kb": base, "rss_peak_kb": peak, "num_train": d.num_train,
                  "num_test": d.num_test, "features": d.input_shape[0], "progress_events": len(progress)}))
"""


def write_csv(path: Path, rows: int, cols: int, seed: int = 0) -> None:
    """Rows of `cols` standard-normal features (5 decimals) and a 0/1 label, written in blocks."""
    rng = np.random.default_rng(seed)
    header = ",".join([f"f{i}" for i in range(cols)] + ["label"])
    with open(path, "w", encoding="utf-8") as f:
        f.write(header + "\n")
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            x = rng.standard_normal((n, cols))
            y = (x[:, 0] + x[:, 1] > 0).astype(int)
            np.savetxt(f, np.c_[x, y], delimiter=",", fmt=["%.5f"] * cols + ["%d"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=20)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.csv"
        t0 = time.perf_counter()
        write_csv(path, args.rows, args.cols)
        size_mb = path.stat().st_size / 1e6
        print(f"wrote {args.rows:,} x {args.cols} ({size_mb:.0f} MB) in {time.perf_counter() - t0:.0f} s", flush=True)
        out = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=root, capture_output=True, text=True,
                             check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    numeric_mb = args.rows * args.cols * 8 / 1e6
    before, peak = result["rss_before_kb"] / 1e3, result["rss_peak_kb"] / 1e3
    print(f"load: {result['seconds']:.1f} s wall, {result['cpu_seconds']:.1f} s CPU; peak RSS {peak:.0f} MB ({before:.0f} MB after imports, "
          f"+{peak - before:.0f} MB loading = {(peak - before) / numeric_mb:.2f}x the {numeric_mb:.0f} MB of float64 "
          f"features; {peak / numeric_mb:.2f}x counting the interpreter); {result['num_train']:,} train / "
          f"{result['num_test']:,} test; {result['progress_events']} progress events")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB)")


if __name__ == "__main__":
    main()
