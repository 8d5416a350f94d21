"""Accuracy against epsilon of a DP-SGD config on real data, through the real runner.

    python tests/bench/bench_accuracy.py [CONFIG.toml] [--data-dir ../shared/data] [--db PATH]

Runs the config (default: resources/examples/dpsgd-mnist.toml) with `dpw run`, then prints the
test accuracy at every evaluation beside the reported (pld) and live (rdp) epsilon at that step.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.store import Store  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "resources/examples/dpsgd-mnist.toml"))
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared/data"))
    parser.add_argument("--db", default=None)
    args = parser.parse_args()
    db = Path(args.db or Path(tempfile.mkdtemp()) / "bench.sqlite")
    subprocess.run([sys.executable, "-m", "engine.cli", "run", args.config, "--data-dir", args.data_dir,
                    "--db", str(db)], check=False, cwd=REPO)
    store = Store(db)
    run = store.list_runs()[-1]
    pld = {p["step"]: p["epsilon"] for p in store.privacy(run["id"], "pld")}
    rdp = {p["step"]: p["epsilon"] for p in store.privacy(run["id"], "rdp")}
    print(f"\nrun {run['id']} {run['name']}: status {run['status']}, stop reason {run['stop_reason']}, "
          f"{(run.get('summary') or {}).get('samples_per_second')} samples/s")
    print(f"{'step':>7} {'epoch':>7} {'test acc':>9} {'eps (pld)':>10} {'eps (rdp)':>10}")
    for m in store.metrics(run["id"], "test_accuracy"):
        step = m["step"]
        print(f"{step:>7} {m['epoch']:>7.2f} {m['value']:>9.4f} {pld.get(step, float('nan')):>10.4f} "
              f"{rdp.get(step, float('nan')):>10.4f}")
    print(f"final: accuracy {run['accuracy']:.4f} at epsilon {run['epsilon']:.4f} (delta {run['delta']:g}, "
          f"{run['accountant']}); budget {run['epsilon_budget']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
