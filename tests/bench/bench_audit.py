"""Benchmark: the guarantee's attack bound against the loss attack that `dpw audit` runs.

For MNIST DP-SGD at target epsilon 1, 3, 8 and a non-private run of the same model and data:
theoretical TPR at FPR 1% (engine.attack_risk, from the run's public parameters), the empirical
loss-attack AUC and TPR at FPR 1% with 95% bootstrap intervals (engine.audit_run), whether the
empirical ROC stays under the theory curve, test accuracy, training time and the audit's wall time.
Then the one-run canary audit (engine.dpsgd.canaries): each setting trained again with input canaries
and (DP-SGD) with gradient canaries, their epsilon lower bounds at 95% confidence, and what the
canaries cost: the change in test accuracy and in wall time against the run without them (each run
has its own secret noise, so an accuracy change within run-to-run spread is no cost).

    .venv/bin/python tests/bench/bench_audit.py --data-dir ../shared/data [--train-subset 10000] [--epochs 2]
        [--input-canaries 1000] [--gradient-canaries 5000]

Measured 2026-11-24 with the defaults (MNIST subset of 10,000, 2 epochs, expected batch 256, 79 steps,
2 CPU threads, a quiet machine at load 0.4-2: about 5 minutes in all): input canaries gave a bound of
0 at every epsilon and 0.03 non-privately (1,000 random-label noise images seen about twice each are not
memorised in 2 epochs; digits over 30 epochs are, see tests/engine/test_audit_canaries.py); 5,000
gradient canaries gave 0.27 / 0.97 / 1.80 at epsilon 1 / 3 / 8 (a second run, sharing the machine with
another benchmark: 0.14 / 0.78 / 2.31), costing 18-33 s each, most of it orthonormalising the 5,000
directions over the CNN's 26,010 parameters. 79 steps is few for a one-run audit: on digits, 561 steps
at epsilon 8 reach 3.0 on average (resources/examples/audit-digits.toml).
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
    parser.add_argument("--input-canaries", type=int, default=1000)
    parser.add_argument("--gradient-canaries", type=int, default=5000)
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
            canary_columns = []
            for kind, count in (("input", args.input_canaries), ("gradient", args.gradient_canaries)):
                if kind == "gradient" and change.get("mechanism") == "none":
                    canary_columns.append("- (DP-SGD only)")
                    continue
                start = time.perf_counter()
                audited_id, _ = train_in_store(store, name=f"{label} {kind} canaries", audit_canaries=count,
                                               audit_canary_kind=kind, **{**common, **change})
                seconds = time.perf_counter() - start
                audited_run = store.get_run(audited_id)
                result = audited_run["summary"]["canaries"]
                canary_columns.append(
                    f"{result['epsilon_lower_bound']:.2f} ({result['correct']}/{result['guesses']} of {count}); "
                    f"acc {100 * (audited_run['accuracy'] - run['accuracy']):+.1f} pt, "
                    f"{seconds - trained:+.0f} s")
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
                *canary_columns,
            ])
            print(" | ".join(rows[-1]), flush=True)
    header = ["run", "epsilon", "theory TPR@1%", "loss-attack TPR@1% [95%]", "AUC [95%]", "ROC vs theory",
              "test accuracy", "training", "audit", "input canaries: bound (right/guesses of m); cost",
              "gradient canaries: bound (right/guesses of m); cost"]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
