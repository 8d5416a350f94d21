"""DP-SGD throughput with 1 and 2 processes (`dpw run CONFIG --nproc N`, torchrun + gloo on the CPU).

Not a test (CI does not run it). Usage:

    python tests/bench/bench_distributed.py [--data-dir ../shared/data] [--rounds 1] [--out FILE.json]

Each case is a real `dpw run` into a scratch store; samples/s is the run's own figure (its training
loop: samples drawn / seconds of training, no start-up or data loading), and wall is the whole
command (interpreter, torch import, torchrun's rendezvous, data loading, saving the model). Cases:

  1 process, 1 thread     the single-process baseline at one core's worth of torch threads
  1 process, 2 threads    the same run letting torch use both cores (DPW_THREADS=2)
  2 processes, 1 thread   --nproc 2: two ranks of one thread each (torchrun sets OMP_NUM_THREADS=1)

Workloads: digits with the small MLP (steps of ~64 examples: communication and per-step overhead
dominate) and an MNIST subset with the CNN (more compute per step). Cases run interleaved, round
by round, so load from other processes on the machine hits them alike; the median over rounds is
printed. On a 2-core machine the best 2 processes can do is what 2 threads in one process do: the
point of --nproc is more machines or GPUs, and this measures its overhead (two all-reduces and a
broadcast per step, one process start-up more) rather than a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = {
    "digits-mlp": 'dataset = "digits"\nmodel = "mlp"\nexpected_batch_size = 64\nepochs = 4\nlearning_rate = 1.0\n',
    "mnist-cnn-6k": 'dataset = "mnist"\nmodel = "mnist_cnn"\ntrain_subset = 6000\nexpected_batch_size = 256\n'
                    'epochs = 1\nlearning_rate = 2.0\n',
}
COMMON = ('mechanism = "dpsgd"\nnoise_multiplier = 1.0\nclipping_norm = 1.0\ndelta = 1e-5\noptimizer = "sgd"\n'
          'evaluations_per_epoch = 1\nseed = 0\n')
CASES = {"1 process, 1 thread": (1, "1"), "1 process, 2 threads": (1, "2"), "2 processes, 1 thread": (2, "1")}


def one_run(config: Path, db: Path, nproc: int, threads: str, data_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "DPW_THREADS")}
    if nproc == 1:
        env["DPW_THREADS"] = threads
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(db), "--json",
                          "--data-dir", data_dir, "--nproc", str(nproc)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    wall = time.monotonic() - start
    finished = [json.loads(line) for line in out.stdout.splitlines() if '"type":"finished"' in line]
    if out.returncode != 0 or not finished:
        raise SystemExit(f"run failed ({nproc} processes): {out.stderr.strip()[-500:]}")
    summary = finished[-1]["summary"]
    return {"samples_per_second": summary["samples_per_second"], "wall_s": wall,
            "accuracy": summary["test_accuracy"], "epsilon": summary["epsilon"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for workload in args.workloads.split(","):
            config = Path(scratch) / f"{workload}.toml"
            config.write_text(f'name = "{workload}"\n' + WORKLOADS[workload] + COMMON)
            per_case = results.setdefault(workload, {case: [] for case in CASES})
            for round_index in range(args.rounds):
                order = list(CASES)[round_index % len(CASES):] + list(CASES)[:round_index % len(CASES)]
                for case in order:
                    nproc, threads = CASES[case]
                    per_case[case].append(one_run(config, Path(scratch) / "runs.sqlite", nproc, threads,
                                                  args.data_dir))
    print(f"cpu cores: {os.cpu_count()}, load average before the last run: {os.getloadavg()[0]:.1f}")
    print(f"{'workload':<14} {'case':<22} {'samples/s':>10} {'wall s':>8} {'accuracy':>9} {'epsilon':>8}")
    for workload, per_case in results.items():
        for case, runs in per_case.items():
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{workload:<14} {case:<22} {median['samples_per_second']:>10.0f} {median['wall_s']:>8.1f} "
                  f"{median['accuracy']:>9.3f} {median['epsilon']:>8.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
