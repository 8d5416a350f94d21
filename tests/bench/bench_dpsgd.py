"""Training throughput of DP-SGD on MNIST: this engine against Opacus and non-private SGD.

Not a test (CI does not run it). Usage:

    python tests/bench/bench_dpsgd.py [--data-dir ../shared/data] [--device cpu|cuda]
                                      [--batch 256] [--steps 100] [--extra]
    python tests/bench/bench_dpsgd.py --device cuda --batches 256,1024,4096   # the GPU table (issue 17)

Modes, all on the same model (registry "mnist_cnn", same initial weights), the same data and
the same Poisson-sampled batches (expected size --batch), noise multiplier 1.1, clipping norm 1.0:

  (a)  non-private SGD: a plain torch loop (mean loss, backward, SGD step) on the model as built
  (a') the engine's NonPrivateStep on the model after engine.dpsgd.fast_layers.accelerate_model
  (b)  the engine's DPSGDStep (clip, sum, noise, scale, step) on the accelerated model, noise
       sampler "standard" (a secret torch generator)
  (bh) the same with noise sampler "hardened": noise from a SecureGenerator (SHAKE-256 CSPRNG, sum
       of four float64 Gaussians per coordinate, rounded once), and the Poisson sampling of the
       batches from the CSPRNG too (timed inside the step, as a run does it)
  (bg) [GPU] the same as (b) with cuda_graphs = true: the clipped sum replayed from CUDA graphs
       (engine.dpsgd.cuda_graphs), batches padded to a few sizes
  (b0) [--extra] the engine's DPSGDStep on the model as built (what accelerate_model buys)
  (c)  Opacus: PrivacyEngine.make_private(poisson_sampling=True, default "hooks" grad sampler);
       its model and DPOptimizer are fed the same batches as the others (Opacus's own data
       loader is not timed, nor is any mode's accountant: the step's compute is compared)
  (cg) Opacus ghost clipping: make_private(..., criterion=CrossEntropyLoss(), grad_sample_mode="ghost"),
       whose wrapped criterion runs the two backward passes of fast gradient clipping (Opacus >= 1.5)

The modes run interleaved, in rounds of a few steps each with the order rotated every round, so
noise from other processes on the machine hits all of them alike; samples/s is the median over
rounds, and each ratio is the median over rounds of the per-round ratio (with its min-max); the
best round of each mode is printed too, as the estimate least disturbed by other processes.
Peak memory: each mode runs again alone in a fresh subprocess (peak RSS of that process during
the steps above its RSS before them on CPU; torch.cuda.max_memory_allocated on GPU).

With --batches B1,B2,... one table instead: for each expected batch size, (a), (b), (c) and (cg)
(and (bg) on a GPU) timed in interleaved rounds as above, and for each engine mode the ratios
to the best Opacus (per round, against the faster of (c) and (cg) in that round) and to (a), each
marked against issue 17's targets: >= 2x Opacus and >= 0.5x non-private at every batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from engine.datasets import load_dataset  # noqa: E402
from engine.dpsgd import mechanism  # noqa: E402
from engine.dpsgd.fast_layers import accelerate_model  # noqa: E402
from engine.dpsgd.trainer import DPSGDStep, NonPrivateStep  # noqa: E402
from engine.models import build_model  # noqa: E402
from engine.randomness import PrivateRandomness  # noqa: E402

NOISE_MULTIPLIER = 1.1
CLIPPING_NORM = 1.0
LEARNING_RATE = 0.1
STEPS_PER_ROUND = 2  # short rounds: a burst of load from other processes hits all modes alike
WARMUP_STEPS = 5
# Issue 17's targets for the GPU table (--batches): engine DP-SGD against the best Opacus mode and
# against non-private training, at every batch size.
TARGET_VS_OPACUS = 2.0
TARGET_VS_NON_PRIVATE = 0.5

MODES = {
    "a": "(a)  non-private SGD, plain torch",
    "a'": "(a') engine non-private step",
    "b": "(b)  engine DP-SGD",
    "bh": "(bh) engine DP-SGD, hardened noise sampler",
    "bg": "(bg) engine DP-SGD, clipped sum replayed from CUDA graphs (cuda_graphs = true)",
    "b0": "(b0) engine DP-SGD, model not accelerated",
    "c": "(c)  Opacus DP-SGD",
    "cg": "(cg) Opacus DP-SGD, ghost clipping",
}

Step = Callable[[torch.Tensor, torch.Tensor], object]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"),
                        help="folder holding mnist/ (default: ../shared/data beside the repository)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=256, help="expected (Poisson) batch size")
    parser.add_argument("--batches", type=_batch_list, default=None,
                        help="comma-separated expected batch sizes (e.g. 256,1024,4096): one table of "
                             "(a), (b), (c), (cg) per batch size with the issue's targets; replaces --batch")
    parser.add_argument("--steps", type=int, default=100,
                        help=f"timed steps per mode (in rounds of {STEPS_PER_ROUND})")
    parser.add_argument("--max-physical", type=int, default=None,
                        help="engine DP-SGD physical chunk limit (default: 4x batch, i.e. no chunking)")
    parser.add_argument("--extra", action="store_true", help="also time (b0), DP-SGD without accelerate_model")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-mode memory subprocesses")
    parser.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)  # internal: one mode alone
    return parser.parse_args(argv)


def _batch_list(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive batch sizes; write e.g. 256,1024,4096")
    return sizes


def load_data(args) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset("mnist", data_dir=args.data_dir)
    return data.x_train.to(args.device), data.y_train.to(args.device)


def fresh_model(initial: dict[str, torch.Tensor], device: str) -> nn.Module:
    model = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10)
    model.load_state_dict(initial)
    return model.to(device).train()


def make_step(mode: str, initial: dict, args, n_train: int) -> Step:
    """The callable that takes one training step on a batch, for one mode."""
    device = args.device
    model = fresh_model(initial, device)
    max_physical = args.max_physical or 4 * args.batch
    if mode == "a":
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

        def plain(x, y):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        return plain
    if mode == "a'":
        model = accelerate_model(model)
        return NonPrivateStep(model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE))
    if mode in ("b", "b0", "bh", "bg"):
        if mode != "b0":
            model = accelerate_model(model)
        randomness = PrivateRandomness(noise_sampler="hardened" if mode == "bh" else "standard")
        step = DPSGDStep(
            model,
            torch.optim.SGD(model.parameters(), lr=LEARNING_RATE),
            clipping_norm=CLIPPING_NORM,
            noise_multiplier=NOISE_MULTIPLIER,
            expected_batch_size=args.batch,
            max_physical_batch_size=max_physical,
            noise_generator=randomness.torch_generator("dpsgd_noise", device),
            cuda_graphs=mode == "bg",
        )
        if mode != "bh":
            return step
        # Hardened sampling costs a CSPRNG draw per training example and step: time it with the step
        # (a fresh draw whose batch is discarded; the fed batch keeps every mode on the same data).
        sampler = randomness.torch_generator("poisson_sampling", device)

        def hardened_step(x, y):
            mechanism.poisson_sample(n_train, args.batch / n_train, sampler, device)
            return step(x, y)

        return hardened_step
    if mode in ("c", "cg"):
        from opacus import PrivacyEngine

        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        # make_private takes its sample rate from the loader: 1 / len(loader) ~ batch / N.
        dataset = torch.utils.data.TensorDataset(torch.zeros(n_train, 1), torch.zeros(n_train))
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch)
        common = dict(module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=NOISE_MULTIPLIER,
                      max_grad_norm=CLIPPING_NORM, poisson_sampling=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="rdp")
            if mode == "c":
                dp_model, dp_optimizer, _ = engine.make_private(grad_sample_mode="hooks", **common)
                criterion = F.cross_entropy
            else:
                # Ghost clipping: the wrapped criterion's loss.backward() runs both backward passes
                # (per-example norms, then the clipped, reweighted gradient).
                dp_model, dp_optimizer, criterion, _ = engine.make_private(
                    grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss(), **common)

        def opacus_step(x, y):
            dp_optimizer.zero_grad(set_to_none=True)
            criterion(dp_model(x), y).backward()
            dp_optimizer.step()

        return opacus_step
    raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def poisson_batches(x, y, count: int, sample_rate: float, gen: torch.Generator) -> list:
    out = []
    for _ in range(count):
        idx = mechanism.poisson_sample(x.shape[0], sample_rate, gen)
        out.append((x[idx], y[idx]))
    return out


def run_steps(step: Step, batches: list, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    for xb, yb in batches:
        step(xb, yb)
    sync(device)
    return time.perf_counter() - t0


def time_modes(modes: list[str], args, x, y, initial) -> dict[str, dict]:
    """Interleaved rounds; per mode: per-round samples/s."""
    n = x.shape[0]
    q = args.batch / n
    gen = torch.Generator(device=args.device).manual_seed(0)
    steps = {m: make_step(m, initial, args, n) for m in modes}
    warm = poisson_batches(x, y, WARMUP_STEPS, q, gen)
    for m in modes:
        run_steps(steps[m], warm, args.device)
    rounds = max(1, -(-args.steps // STEPS_PER_ROUND))
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        batches = poisson_batches(x, y, STEPS_PER_ROUND, q, gen)
        samples = sum(int(xb.shape[0]) for xb, _ in batches)
        order = modes[r % len(modes):] + modes[: r % len(modes)]
        for m in order:
            rates[m].append(samples / run_steps(steps[m], batches, args.device))
    return rates


# ------------------------------------------------------------------------------------------------
# Memory: one mode alone in a fresh process
# ------------------------------------------------------------------------------------------------


def _rss_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def memory_probe(args) -> None:
    """Run one mode alone and print its peak memory as JSON (called in a subprocess)."""
    import resource

    torch.manual_seed(0)
    x, y = load_data(args)
    initial = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10).state_dict()
    step = make_step(args.memory_probe, initial, args, x.shape[0])
    gen = torch.Generator(device=args.device).manual_seed(0)
    batches = poisson_batches(x, y, 10, args.batch / x.shape[0], gen)
    run_steps(step, batches[:2], args.device)
    result: dict[str, float | None] = {}
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run_steps(step, batches[2:], args.device)
        peak = torch.cuda.max_memory_allocated()
        result = {"peak_mib": peak / 2**20, "delta_mib": (peak - before) / 2**20}
    else:
        before = _rss_kib("VmRSS")
        try:  # reset the process's peak RSS (VmHWM) so it covers the steps only
            Path("/proc/self/clear_refs").write_text("5")
            reset = True
        except OSError:
            reset = False
        run_steps(step, batches[2:], args.device)
        peak = _rss_kib("VmHWM") if reset else None
        if peak is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result = {"peak_mib": peak / 1024, "delta_mib": (peak - before) / 1024 if before and reset else None}
    print(json.dumps(result))


def measure_memory(mode: str, args) -> dict | None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", mode, "--device", args.device,
           "--batch", str(args.batch), "--data-dir", args.data_dir]
    if args.max_physical:
        cmd += ["--max-physical", str(args.max_physical)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        print(f"memory probe for {mode} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_text(info: dict | None) -> str:
    if not info:
        return "-"
    delta = info.get("delta_mib")
    extra = f" (+{delta:.0f} in steps)" if delta is not None else ""
    return f"{info['peak_mib']:.0f} MiB{extra}"


# ------------------------------------------------------------------------------------------------
# The table over batch sizes (--batches): issue 17's GPU benchmark
# ------------------------------------------------------------------------------------------------


def per_round_ratios(numerator: list[float], denominator: list[float]) -> list[float]:
    return sorted(a / b for a, b in zip(numerator, denominator))


def ratio_text(per_round: list[float]) -> str:
    return f"{statistics.median(per_round):5.2f}x [{per_round[0]:.2f}-{per_round[-1]:.2f}]"


def met(value: float, target: float) -> str:
    return "met" if value >= target else "NOT met"


def batch_table(args) -> int:
    """Time (a), (b), (c), (cg) (and (bg) on a GPU) at each batch size of --batches and print one table
    with the targets."""
    print(describe_machine(args))
    print(f"MNIST, mnist_cnn, noise multiplier {NOISE_MULTIPLIER}, clipping norm {CLIPPING_NORM}; per batch size "
          f"{args.steps} timed steps per mode in interleaved rounds of {STEPS_PER_ROUND} (+{WARMUP_STEPS} warm-up); "
          f"samples/s: median over rounds; ratios: median over rounds [min-max]")
    torch.manual_seed(0)
    x, y = load_data(args)
    initial = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10).state_dict()
    engine_modes = ["b", "bg"] if args.device == "cuda" else ["b"]
    modes = ["a", *engine_modes, "c", "cg"]
    rows = []
    for batch in args.batches:
        at = argparse.Namespace(**{**vars(args), "batch": batch})
        load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        rates = time_modes(modes, at, x, y, initial)
        load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        best_opacus = [max(c, g) for c, g in zip(rates["c"], rates["cg"])]  # the faster Opacus mode, per round
        rows.append({
            "batch": batch,
            "rates": {m: statistics.median(rates[m]) for m in modes},
            "vs_opacus": {m: per_round_ratios(rates[m], best_opacus) for m in engine_modes},
            "vs_non_private": {m: per_round_ratios(rates[m], rates["a"]) for m in engine_modes},
            "faster_opacus": max(("c", "cg"), key=lambda m: statistics.median(rates[m])),
            "load": (load_before, load_after),
            "memory": {m: (None if args.no_memory else measure_memory(m, at)) for m in modes},
        })
        print(f"  batch {batch}: done", flush=True)

    names = {"a": "(a) non-private", "b": "(b) engine DP-SGD", "bg": "(bg) engine graphs", "c": "(c) Opacus hooks",
             "cg": "(cg) Opacus ghost"}
    header = f"{'batch':>6s} | " + " | ".join(f"{names[m]:>18s}" for m in modes)
    print()
    print("samples/s")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['batch']:6d} | " + " | ".join(f"{row['rates'][m]:18.0f}" for m in modes))
    header = (f"{'batch':>6s} | {'engine mode':>18s} | {'vs best Opacus':>19s} | {'vs (a) non-private':>19s} | "
              f"{'>= 2x Opacus':>12s} | {'>= 0.5x non-private':>19s}")
    print()
    print("ratios")
    print(header)
    print("-" * len(header))
    for row in rows:
        for m in engine_modes:
            vs_opacus = statistics.median(row["vs_opacus"][m])
            vs_a = statistics.median(row["vs_non_private"][m])
            print(f"{row['batch']:6d} | {names[m]:>18s} | {ratio_text(row['vs_opacus'][m]):>19s} | "
                  f"{ratio_text(row['vs_non_private'][m]):>19s} | {met(vs_opacus, TARGET_VS_OPACUS):>12s} | "
                  f"{met(vs_a, TARGET_VS_NON_PRIVATE):>19s}")
    print()
    print("faster Opacus mode by median: " + ", ".join(f"batch {r['batch']} {names[r['faster_opacus']]}" for r in rows))
    if not args.no_memory:
        print("peak memory per mode (alone in a fresh process): " + "; ".join(
            f"batch {r['batch']}: " + ", ".join(f"{m} {memory_text(r['memory'][m])}" for m in modes)
            for r in rows))
    if rows[0]["load"][0] is not None:
        print("1-minute load average before/after each batch size: "
              + ", ".join(f"{r['batch']}: {r['load'][0]:.2f}/{r['load'][1]:.2f}" for r in rows)
              + f" (on {os.cpu_count()} cores)")
    for m in engine_modes:
        all_met = all(statistics.median(r["vs_opacus"][m]) >= TARGET_VS_OPACUS
                      and statistics.median(r["vs_non_private"][m]) >= TARGET_VS_NON_PRIVATE for r in rows)
        print(f"targets for {names[m]}: >= {TARGET_VS_OPACUS:g}x best Opacus and >= {TARGET_VS_NON_PRIVATE:g}x (a) "
              f"at every batch size: {'met' if all_met else 'NOT met'}")
    return 0


# ------------------------------------------------------------------------------------------------


def describe_machine(args) -> str:
    lines = [
        f"torch {torch.__version__}, python {platform.python_version()}, "
        f"threads {torch.get_num_threads()} (cpu count {os.cpu_count()})",
    ]
    if args.device == "cuda":
        lines.append(f"device cuda: {torch.cuda.get_device_name()}")
    else:
        cpu = platform.processor() or ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        lines.append(f"device cpu: {cpu}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    # Known, harmless warnings of the modes being timed (Opacus's hooks; a float() of a loss).
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True to a scalar")
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message="Optimal order is the")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA GPU is available here; use --device cpu", file=sys.stderr)
        return 2
    if args.memory_probe:
        memory_probe(args)
        return 0
    if args.batches:
        return batch_table(args)
    modes = ["a", "a'", "b", "bh", "c"] + (["b0"] if args.extra else [])
    print(describe_machine(args))
    print(f"MNIST, mnist_cnn, Poisson batches of expected size {args.batch}, noise multiplier "
          f"{NOISE_MULTIPLIER}, clipping norm {CLIPPING_NORM}, {args.steps} timed steps per mode "
          f"in rounds of {STEPS_PER_ROUND} (+{WARMUP_STEPS} warm-up)")
    torch.manual_seed(0)
    x, y = load_data(args)
    initial = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10).state_dict()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    rates = time_modes(modes, args, x, y, initial)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    memory = {m: (None if args.no_memory else measure_memory(m, args)) for m in modes}

    def ratio(m: str, ref: str) -> str:
        per_round = sorted(a / b for a, b in zip(rates[m], rates[ref]))
        med = statistics.median(per_round)
        return f"{med:5.2f}x [{per_round[0]:.2f}-{per_round[-1]:.2f}]"

    def mem(m: str) -> str:
        return memory_text(memory[m])

    header = f"{'mode':44s} | {'samples/s':>9s} | {'vs Opacus (c)':>19s} | {'vs non-private (a)':>19s} | peak memory"
    print()
    print(header)
    print("-" * len(header))
    for m in modes:
        rate = statistics.median(rates[m])
        print(f"{MODES[m]:44s} | {rate:9.0f} | {ratio(m, 'c'):>19s} | {ratio(m, 'a'):>19s} | {mem(m)}")
    best = {m: max(rates[m]) for m in modes}
    print()
    print("best round per mode (closest to an idle machine): "
          + ", ".join(f"{m} {best[m]:.0f}/s" for m in modes)
          + f"; (b)/(c) {best['b'] / best['c']:.2f}x, (b)/(a) {best['b'] / best['a']:.2f}x")
    b_vs_c = statistics.median(a / b for a, b in zip(rates["b"], rates["c"]))
    b_vs_a = statistics.median(a / b for a, b in zip(rates["b"], rates["a"]))
    print()
    if load_before is not None:
        print(f"1-minute load average before/after timing: {load_before:.2f} / {load_after:.2f} "
              f"(on {os.cpu_count()} cores; more than the cores means other processes competed)")
    print(f"requirement (b) >= 2x (c): {b_vs_c:.2f}x  {'PASS' if b_vs_c >= 2.0 else 'FAIL'}")
    print(f"requirement (b) >= 0.7x (a): {b_vs_a:.2f}x  {'PASS' if b_vs_a >= 0.7 else 'FAIL'}")
    bh_vs_b = statistics.median(a / b for a, b in zip(rates["bh"], rates["b"]))
    print(f"cost of the hardened noise sampler: (bh) runs at {bh_vs_b:.2f}x of (b)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
