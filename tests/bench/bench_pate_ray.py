"""PATE teacher training on this machine vs. on Ray (a script, not a test): prints one table.

The same 250 MNIST teachers (same seed, shards, groups, optimizer, epochs) are trained twice:
- local: engine.pate.teachers.train_teachers in this process (torch on `--threads` threads, a row
  for each count given);
- ray: engine.pate.ray_backend.train_teachers_on_ray on a local Ray with `--workers` CPUs, one
  stacked group per task (each task one thread, as Ray sets it).
Both are then asked to vote on the last 1,000 test images; the table shows the wall time of
training (Ray's start-up is shown apart), the teachers' mean accuracy and the ensemble's, and
whether the two backends' votes are identical.

Every epoch costs about the same (250 teachers x 240 examples = all 60,000 images once), so
`--teacher-epochs 1` gives the per-epoch cost at a fifth of the time of the default 5.

Example (5 epochs took 16 minutes for 2 threads and Ray together on 2 busy, shared cores):
    python tests/bench/bench_pate_ray.py --data-dir ../shared/data
A quick look:
    python tests/bench/bench_pate_ray.py --data-dir ../shared/data --teachers 50 --teacher-epochs 2

Scaling to 5,000 teachers on a cluster (estimated, not measured): an epoch of teacher training is
one pass over the training set however many teachers share it, so the work is data x epochs x the
per-example cost. cifar_cnn teachers on SVHN-shaped images cost 3.2-3.9 ms per example per epoch on
one core here (build_teachers/train_teachers, 1 thread, 20 x 200 and 100 x 40 synthetic examples), so
5,000 teachers over SVHN's 604,388 images cost 0.54-0.65 core-hours per epoch: 22-26 core-hours for
40 epochs, 20-25 minutes on 64 cores as independent group tasks, plus start-up and Ray's per-task cost.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.datasets import load_dataset  # noqa: E402
from engine.pate.ray_backend import RaySession, train_teachers_on_ray  # noqa: E402
from engine.pate.shards import partition  # noqa: E402
from engine.pate.teachers import build_teachers, train_teachers, vote_counts  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="folder holding mnist/ (the four IDX .gz files)")
    parser.add_argument("--teachers", type=int, default=250)
    parser.add_argument("--teacher-model", default="mnist_cnn")
    parser.add_argument("--teacher-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray (one task each)")
    parser.add_argument("--threads", default="1,2", help="torch threads of the local backend, one row each (e.g. 1,2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]

    import ray
    from tabulate import tabulate

    data = load_dataset("mnist", data_dir=args.data_dir)
    x, y = data.x_train, data.y_train
    x_eval, y_eval = data.x_test[-1000:], data.y_test[-1000:].numpy()
    shards = partition(len(x), args.teachers, seed=args.seed)
    optimizer = functools.partial(torch.optim.Adam, lr=1e-3)  # picklable for the Ray workers

    def models():
        return build_teachers(args.teacher_model, input_shape=data.input_shape, num_classes=10,
                              num_teachers=args.teachers, seed=args.seed)

    common = dict(epochs=args.teacher_epochs, batch_size=args.batch_size, make_optimizer=optimizer, seed=args.seed,
                  model_name=args.teacher_model)
    rows, votes = [], {}

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        t0 = time.monotonic()
        local = train_teachers(models(), x, y, shards, **common)
        seconds = time.monotonic() - t0
        pred = local.predict(x_eval)
        votes["local"] = vote_counts(pred, 10)
        rows.append(_row("local", f"1 process, {threads} thread(s)", 0.0, seconds, pred, y_eval, votes["local"],
                         len(local.groups)))
    torch.set_num_threads(1)

    t0 = time.monotonic()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    startup = time.monotonic() - t0
    try:
        session = RaySession()
        t0 = time.monotonic()
        on_ray = train_teachers_on_ray(models(), x, y, shards, session=session, **common)
        seconds = time.monotonic() - t0
        pred = on_ray.predict(x_eval)
        votes["ray"] = vote_counts(pred, 10)
        rows.append(_row("ray", f"{args.workers} workers x 1 thread", startup, seconds, pred, y_eval, votes["ray"],
                         len(on_ray.group_refs)))
    finally:
        ray.shutdown()

    print(f"\n{args.teachers} {args.teacher_model} teachers on MNIST ({len(x) // args.teachers} examples each), "
          f"{args.teacher_epochs} epochs, batch {args.batch_size}, Adam; torch {torch.__version__}, "
          f"ray {ray.__version__}; 1-minute load average at the start {load_at_start:.1f}, at the end "
          f"{os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores)")
    print(tabulate(rows, headers="keys", floatfmt=".4g"))
    same = np.array_equal(votes["local"], votes["ray"])
    print(f"votes on the 1,000 evaluation images identical across backends: {same}")


def _row(backend: str, how: str, startup: float, seconds: float, pred: torch.Tensor, y: np.ndarray,
         votes: np.ndarray, groups: int) -> dict:
    accuracy = (pred.numpy() == y[None, :]).mean(axis=1)
    return {
        "backend": backend,
        "resources": how,
        "groups": groups,
        "start-up s": round(startup, 1),
        "training s": round(seconds, 1),
        "teachers/s": pred.shape[0] / seconds,
        "teacher acc (mean)": float(accuracy.mean()),
        "ensemble acc": float((votes.argmax(axis=1) == y).mean()),
    }


if __name__ == "__main__":
    main()
