"""PATE benchmark on real MNIST (a script, not a test): prints tables.

1. Teacher training: the stacked ensemble (engine.pate.teachers.train_teachers) against the
   textbook loop (one model, optimizer and DataLoader per teacher, train_teachers_one_by_one) with
   the same models, shards, batch size, optimizer and epochs, both on --device. The loop is timed on a
   sample of teachers and extrapolated linearly (every teacher costs the same); accuracies are on the
   last 1,000 test images. --group-sizes times the stacked ensemble at several group sizes ("auto":
   the engine's choice, what a run uses); the speed-up is that of the engine's choice (target >= 5x,
   issue 17). Both are warmed up first (one epoch of two teachers), so neither pays the device's
   start-up; on a GPU each timing ends with a synchronisation.
2. Analysis time: the privacy analysis of the teachers' real votes on all 10,000 test images.
3. Student accuracy against epsilon for GNMax and Confident GNMax: the teachers label the pool
   (first 9,000 test images) in order until the data-dependent epsilon budget would be exceeded,
   the student learns from the released labels (optionally semi-supervised from the whole pool)
   and is evaluated on the last 1,000 test images.

Example (the full benchmark, about 30-60 minutes on 2 cores):
    python tests/bench/bench_pate.py --data-dir ../shared/data
A quick look (a few minutes):
    python tests/bench/bench_pate.py --data-dir ../shared/data --teachers 50 --teacher-epochs 5 \
        --loop-sample 5 --budgets 2 --student-epochs 10
250 MNIST teachers on a GPU, stacked against the loop (table 1 only):
    python tests/bench/bench_pate.py --data-dir ../shared/data --device cuda --only-teachers \
        --group-sizes auto,50,250
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.datasets import load_dataset  # noqa: E402
from engine.models import build_model  # noqa: E402
from engine.pate.aggregation import aggregate  # noqa: E402
from engine.pate.shards import partition  # noqa: E402
from engine.pate.student import train_student  # noqa: E402
from engine.pate.teachers import build_teachers, train_teachers, train_teachers_one_by_one, vote_counts  # noqa: E402
from engine.privacy import pate as analysis  # noqa: E402
from engine.privacy import pate_smooth  # noqa: E402


def table(rows: list[dict], title: str) -> None:
    from tabulate import tabulate

    print(f"\n{title}")
    print(tabulate(rows, headers="keys", floatfmt=".4g"))
    sys.stdout.flush()


def make_optimizer(name: str, lr: float):
    if name == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr, fused=True)
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9, fused=True)


def make_loop_optimizer(name: str, lr: float):
    # The textbook loop uses the default (for-each) implementation, as a tutorial would.
    if name == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr)
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def group_sizes_arg(text: str) -> list[int | None]:
    """ "auto,50,250" -> [None, 50, 250] (None: the engine's choice)."""
    sizes: list[int | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "auto":
            sizes.append(None)
        elif part.isdigit() and int(part) > 0:
            sizes.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"{part!r} is not a group size; write auto or a positive number, "
                                             f"comma-separated (e.g. auto,50,250)")
    if not sizes:
        raise argparse.ArgumentTypeError("no group size given; write e.g. auto,50,250")
    return sizes


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def accuracy_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=None, help="folder holding mnist/ (default: $DPW_DATA_DIR)")
    p.add_argument("--teachers", type=int, default=250)
    p.add_argument("--teacher-model", default="mnist_cnn")
    p.add_argument("--teacher-epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--optimizer", default="adam", choices=["adam", "momentum"])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--loop-sample", type=int, default=25, help="teachers trained by the loop (extrapolated)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where teachers and students train")
    p.add_argument("--group-sizes", type=group_sizes_arg, default=[None],
                   help="teachers per stacked group, comma-separated; auto = the engine's choice (default: auto)")
    p.add_argument("--only-teachers", action="store_true", help="stop after table 1 (teacher training)")
    p.add_argument("--budgets", default="1,2,4", help="data-dependent epsilon budgets, comma-separated")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--gnmax-sigma", type=float, default=40.0)
    p.add_argument("--threshold", type=float, default=200.0)
    p.add_argument("--sigma1", type=float, default=150.0)
    p.add_argument("--sigma2", type=float, default=40.0)
    p.add_argument("--student-model", default="mnist_cnn")
    p.add_argument("--student-epochs", type=int, default=40)
    p.add_argument("--semi-supervised", default="both", choices=["yes", "no", "both"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is available here; use --device cpu")
    device = torch.device(args.device)

    data = load_dataset("mnist", data_dir=args.data_dir)
    x_test, y_test = data.x_test, data.y_test
    x_pool, y_pool = x_test[:9000], y_test[:9000]
    x_hold, y_hold = x_test[9000:], y_test[9000:]
    k = args.teachers
    shards = partition(data.num_train, k, seed=args.seed)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"MNIST: {data.num_train} training images in {k} shards of ~{data.num_train // k}; "
          f"{args.teacher_model} teachers, {args.teacher_epochs} epochs, batch {args.batch_size}, "
          f"{args.optimizer} lr {args.lr}; device {device_name}; torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")

    # ---- 1. teachers -------------------------------------------------------------------------------
    def build(count: int) -> list[torch.nn.Module]:
        return build_teachers(args.teacher_model, input_shape=data.input_shape, num_classes=10, num_teachers=count,
                              seed=args.seed)

    def stacked(models, group_size: int | None):
        return train_teachers(models, data.x_train, data.y_train, shards[: len(models)], epochs=args.teacher_epochs,
                              batch_size=args.batch_size, make_optimizer=make_optimizer(args.optimizer, args.lr),
                              seed=args.seed, model_name=args.teacher_model, device=device, group_size=group_size)

    # The loop gets the data on the device (one copy), each teacher its model there.
    x_dev, y_dev = data.x_train.to(device), data.y_train.to(device)

    def loop(models, which):
        return train_teachers_one_by_one([m.to(device) for m in models], x_dev, y_dev, [shards[i] for i in which],
                                         epochs=args.teacher_epochs, batch_size=args.batch_size,
                                         make_optimizer=make_loop_optimizer(args.optimizer, args.lr), seed=args.seed)

    # Warm-up: the device's start-up (CUDA context, kernels) is paid here, by neither timing.
    epochs, args.teacher_epochs = args.teacher_epochs, 1
    stacked(build(min(2, k)), None)
    loop(build(min(2, k)), list(range(min(2, k))))
    args.teacher_epochs = epochs
    sync(device)

    x_hold_dev = x_hold.to(device)
    timed = []  # (group size asked, seconds, trained teachers)
    for size in args.group_sizes:
        models = build(k)
        sync(device)
        t0 = time.perf_counter()
        trained_stack = stacked(models, size)
        sync(device)
        timed.append((size, time.perf_counter() - t0, trained_stack))
    default = next((t for t in timed if t[0] is None), timed[0])
    stacked_s, teachers = default[1], default[2]
    hold_pred = teachers.predict(x_hold_dev).cpu()
    acc = (hold_pred == y_hold[None, :]).float().mean(dim=1).numpy()

    sample = np.linspace(0, k - 1, min(args.loop_sample, k)).round().astype(int)
    loop_models = build(k)
    sync(device)
    t0 = time.perf_counter()
    trained = loop([loop_models[i] for i in sample], sample)
    sync(device)
    loop_sample_s = time.perf_counter() - t0
    loop_s = loop_sample_s * k / len(sample)
    loop_acc = np.array([accuracy_of(m, x_hold_dev, y_hold.to(device)) for m in trained])
    ensemble_acc = float((vote_counts(hold_pred, 10).argmax(1) == y_hold.numpy()).mean())
    rows = []
    for size, seconds, result in timed:
        groups = [g.num_members for g in result.groups]
        label = f"stacked ensemble, groups of {groups[0]}" + (" (engine's choice)" if size is None else "")
        pred = hold_pred if result is teachers else result.predict(x_hold_dev).cpu()
        result_acc = (pred == y_hold[None, :]).float().mean(dim=1).numpy()
        rows.append({"training": label, "teachers": k, "seconds": seconds, "teachers/s": k / seconds,
                     "speed-up vs loop": loop_s / seconds, "mean acc": result_acc.mean(),
                     "mean acc (sample)": result_acc[sample].mean(), "min acc": result_acc.min()})
    rows.append({"training": f"one-by-one loop ({len(sample)} timed, extrapolated)", "teachers": k,
                 "seconds": loop_s, "teachers/s": k / loop_s, "speed-up vs loop": 1.0, "mean acc": float("nan"),
                 "mean acc (sample)": loop_acc.mean(), "min acc": loop_acc.min()})
    speedup = loop_s / stacked_s
    named = rows[[t[2] for t in timed].index(teachers)]["training"]
    table(rows, f"1. Teacher training on {device_name} (speed-up of the {named}: "
                f"{speedup:.2f}x, target >= 5x: {'met' if speedup >= 5 else 'NOT met'}; "
                f"plurality of all teachers: {ensemble_acc:.4f})")
    del timed, trained
    if args.only_teachers:
        return

    # ---- 2. analysis time -----------------------------------------------------------------------------
    t0 = time.perf_counter()
    all_votes = vote_counts(teachers.predict(x_test.to(device)).cpu(), 10)  # the teachers' votes on all 10,000 test images
    vote_s = time.perf_counter() - t0
    pool_votes = all_votes[:9000]
    rows = []
    for name, kw in (("gnmax", {"sigma": args.gnmax_sigma}),
                     ("confident", {"threshold": args.threshold, "sigma1": args.sigma1, "sigma2": args.sigma2})):
        t0 = time.perf_counter()
        res = analysis.pate_epsilon(votes=all_votes, mechanism=name, delta=args.delta, **kw)
        t_eps = time.perf_counter() - t0
        t0 = time.perf_counter()
        costs = analysis.query_costs(votes=all_votes, mechanism=name, **kw)
        analysis.epsilon_after_each(rdp_per_query=costs.data_dependent, delta=args.delta)
        t_live = time.perf_counter() - t0
        t0 = time.perf_counter()
        rel = pate_smooth.release_epsilon(votes=all_votes, mechanism=name, delta=args.delta, noise=0.0,
                                          num_teachers=k, **kw)
        t_rel = time.perf_counter() - t0
        rows.append({"aggregator": name, "queries": len(all_votes), "epsilon (dd, all answered)": res.epsilon_data_dependent,
                     "epsilon (di)": res.epsilon_data_independent, "s: epsilon": t_eps,
                     "s: epsilon after each query": t_live, "s: smooth-sensitivity release": t_rel,
                     "release cost (rdp)": rel.release_rdp})
    table(rows, f"2. Analysing 10,000 queries (teachers voted in {vote_s:.1f} s)")
    del teachers

    # ---- 3. student accuracy against epsilon --------------------------------------------------------
    budgets = [float(b) for b in args.budgets.split(",") if b]
    semis = {"yes": [True], "no": [False], "both": [False, True]}[args.semi_supervised]
    rows = []
    for name, kw, noise in (
        ("gnmax", {"sigma": args.gnmax_sigma}, {"sigma": args.gnmax_sigma}),
        ("confident", {"threshold": args.threshold, "sigma1": args.sigma1, "sigma2": args.sigma2},
         {"threshold": args.threshold, "sigma1": args.sigma1, "sigma2": args.sigma2}),
    ):
        released = aggregate(pool_votes, aggregator=name, rng=np.random.default_rng(args.seed + 6), **noise)
        real = analysis.query_costs(votes=pool_votes, mechanism=name, answered=released.answered, **kw)
        worst = analysis.query_costs(votes=pool_votes, mechanism=name, answered=np.ones(9000, bool), **kw)
        for budget in budgets:
            n = analysis.queries_within_budget(rdp_per_query=real.data_dependent, rdp_worst_case=worst.data_dependent,
                                               delta=args.delta, budget=budget)
            ans = released.answered[:n]
            res = analysis.pate_epsilon(votes=pool_votes[:n], mechanism=name, answered=ans, delta=args.delta, **kw)
            rel = pate_smooth.release_epsilon(votes=pool_votes[:n], mechanism=name, answered=ans, delta=args.delta,
                                              noise=float(np.random.default_rng(args.seed + 7).standard_normal()),
                                              num_teachers=k, **kw)
            idx = np.flatnonzero(ans)
            labels = torch.as_tensor(released.labels[:n][idx])
            label_acc = float((labels == y_pool[idx]).float().mean()) if len(idx) else float("nan")
            for semi in semis:
                torch.manual_seed(args.seed)
                student = build_model(args.student_model, input_shape=data.input_shape, num_classes=10)
                t0 = time.perf_counter()
                out = train_student(student, x_pool[idx], labels, x_pool=x_pool, x_eval=x_hold, y_eval=y_hold,
                                    epochs=args.student_epochs, batch_size=64,
                                    make_optimizer=make_optimizer(args.optimizer, args.lr), seed=args.seed,
                                    semi_supervised=semi, device=device)
                rows.append({"aggregator": name, "budget": budget, "queries": n, "answered": len(idx),
                             "label acc": label_acc, "eps dd": res.epsilon_data_dependent,
                             "eps released": rel.epsilon_released,
                             "eps di": res.epsilon_data_independent, "semi": semi,
                             "student acc": out.test_accuracy, "student s": time.perf_counter() - t0})
                print(rows[-1], flush=True)
    table(rows, f"3. Student accuracy against epsilon (delta {args.delta:g}; {args.student_model}, "
                f"{args.student_epochs} epochs)")
    best = [r for r in rows if r["eps dd"] <= 2.0 and r["student acc"] is not None]
    if best:
        top = max(best, key=lambda r: r["student acc"])
        print(f"\nBest student at data-dependent epsilon <= 2: {top['student acc']:.4f} "
              f"({top['aggregator']}, {top['answered']} labels, eps {top['eps dd']:.3f}, released {top['eps released']:.3f})")


if __name__ == "__main__":
    main()
