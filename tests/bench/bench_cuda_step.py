"""Where a DP-SGD step's time goes on a GPU, and what CUDA graphs buy (a script, not a test).

For the MNIST CNN at batch 256, 1024 and 4096 (one fixed batch, no Poisson sampling): ms per step,
kernels per step and the time the GPU is busy (torch.profiler) for non-private SGD, the engine's
DP-SGD step (clipped sum, noise, update) run eagerly, the clipped sum alone, and the same with the
clipped sum captured once in a CUDA graph and replayed; and the largest relative difference between
the replayed and the eager sums. A step much longer than its GPU-busy time is bound by launching
kernels from Python, which a graph removes. On a GPU:

    python tests/bench/bench_cuda_step.py
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.dpsgd.fast_layers import accelerate_model  # noqa: E402
from engine.dpsgd.per_sample import per_example_gradients  # noqa: E402
from engine.models import build_model  # noqa: E402

DEVICE = "cuda"
NOISE_MULTIPLIER = 1.1
CLIPPING_NORM = 1.0


def ms_per_call(fn, calls: int = 60) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def device_time(event) -> float:
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)


def kernels_and_busy_ms(fn, calls: int = 10) -> tuple[float, float]:
    """Kernels launched and GPU-busy milliseconds per call (torch.profiler)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages()
               if str(getattr(e, "device_type", "")).endswith("CUDA") and device_time(e) > 0]
    return sum(e.count for e in kernels) / calls, sum(device_time(e) for e in kernels) / calls / 1e3


def modes_at(batch: int) -> tuple[dict, float]:
    """The timed callables at one batch size, and the replayed sum's largest relative error."""
    torch.manual_seed(0)
    model = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10).to(DEVICE).train()
    model = accelerate_model(model)
    x = torch.randn(batch, 1, 28, 28, device=DEVICE)
    y = torch.randint(0, 10, (batch,), device=DEVICE)
    strategy = per_example_gradients(model)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    noise = torch.Generator(device=DEVICE).manual_seed(1)

    def clipped_sum():
        return strategy.clipped_sum(x, y, CLIPPING_NORM)

    def update(losses, summed) -> float:
        std = NOISE_MULTIPLIER * CLIPPING_NORM
        draws = [torch.randn(s.shape, generator=noise, device=DEVICE) for s in summed]
        grads = torch._foreach_add(summed, draws, alpha=std)
        torch._foreach_div_(grads, batch)
        for p, g in zip(params, grads):
            p.grad = g
        optimizer.step()
        return float(losses.sum())

    def eager_step() -> float:
        losses, summed, _ = clipped_sum()
        return update(losses, summed)

    def non_private_step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            clipped_sum()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = clipped_sum()

    def graphed_step() -> float:
        graph.replay()
        return update(replayed[0], replayed[1])

    _, eager_sum, _ = clipped_sum()
    eager_sum = [t.clone() for t in eager_sum]
    graph.replay()
    error = max(float((a - b).norm() / b.norm()) for a, b in zip(replayed[1], eager_sum))
    modes = {"non-private step": non_private_step, "DP-SGD step, eager": eager_step,
             "clipped sum, eager": clipped_sum, "DP-SGD step, graph": graphed_step,
             "clipped sum, graph": graph.replay}
    return modes, error


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; MNIST CNN, random inputs")
    for batch in (256, 1024, 4096):
        modes, error = modes_at(batch)
        print(f"batch {batch}: replayed sum against eager, largest relative error {error:.1e}")
        for name, fn in modes.items():
            ms = ms_per_call(fn)
            kernels, busy = kernels_and_busy_ms(fn)
            print(f"  {name:20s} {ms:7.3f} ms  {batch / ms * 1e3:10.0f} samples/s  "
                  f"{kernels:5.0f} kernels  GPU busy {busy:6.3f} ms")


if __name__ == "__main__":
    main()
