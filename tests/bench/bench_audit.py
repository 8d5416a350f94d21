"""Benchmark: the guarantee's attack bound against the loss attack that `dpw audit` runs.

For MNIST DP-SGD at target epsilon 1, 3, 8 and a non-private run of the same model and data:
theoretical TPR at FPR 1% (engine.attack_risk, from the run's public parameters), the empirical
loss-attack AUC and TPR at FPR 1% with 95% bootstrap intervals (engine.audit_run), whether the
empirical ROC stays under the theory curve, test accuracy, training time and the audit's wall time.
Canary audits are not in this table: training does not insert canaries yet.

    .venv/bin/python tests/bench/bench_audit.py --data-dir ../shared/data [--train-subset 10000] [--epochs 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "engine"))

from engine.attack_risk import percent_up, run_attack_risk  # noqa: E402
from engine.audit_run import audit_run  # noqa: E402
from engine.store import Store  # noqa: E402
from test_export_report import train_in_store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--train-subset", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--examples", type=int, default=5000, help="members and non-members audited")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = "mnist_cnn" if args.dataset == "mnist" else "auto"
    common = dict(dataset=args.dataset, data_dir=args.data_dir, model=model,
                  train_subset=args.train_subset, expected_batch_size=256, epochs=args.epochs, learning_rate=2.0,
                  delta=1e-5, seed=0)
    settings = [("epsilon 1", dict(target_epsilon=1.0)), ("epsilon 3", dict(target_epsilon=3.0)),
                ("epsilon 8", dict(target_epsilon=8.0)),
                ("non-private", dict(mechanism="none", learning_rate=0.1, optimizer="momentum", momentum=0.9))]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "runs.sqlite")
        for label, change in settings:
            start = time.perf_counter()
            run_id, _ = train_in_store(store, name=label, **{**common, **change})
            trained = time.perf_counter() - start
            run = store.get_run(run_id)
            theory = run_attack_risk(run).risk
            start = time.perf_counter()
            audit = audit_run(store, run_id, examples=args.examples, bootstrap=1000)
            audited = time.perf_counter() - start
            mia = audit.mia
            lo, hi = mia.tpr_interval[0.01]
            rows.append([
                label,
                f"{run['epsilon']:.3g}" if run.get("epsilon") is not None else "-",
                percent_up(theory.tpr_at_fpr[0.01]) if theory is not None else "100%",  # a bound: rounded up
                f"{100 * mia.tpr_at_fpr[0.01]:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}]",
                f"{mia.auc:.4f} [{mia.auc_interval[0]:.4f}, {mia.auc_interval[1]:.4f}]",
                "-" if mia.theory is None else ("ABOVE" if mia.theory.above_theory else "under"),
                f"{run['accuracy']:.4f}",
                f"{trained:.0f} s",
                f"{audited:.1f} s",
            ])
            print(" | ".join(rows[-1]), flush=True)
    header = ["run", "epsilon", "theory TPR@1%", "loss-attack TPR@1% [95%]", "AUC [95%]", "ROC vs theory",
              "test accuracy", "training", "audit"]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
