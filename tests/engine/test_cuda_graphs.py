"""DP-SGD's clipped sum padded to bucket sizes and replayed from CUDA graphs (engine.dpsgd.cuda_graphs).

The padding runs everywhere (`capture=False` computes the padded chunk eagerly): a padded chunk's sum
equals the unpadded one's, whatever was in the buffer before. The graphs run on a CUDA GPU only
(`pytest -m cuda`): replayed sums equal eager ones at every bucket, in any order of buckets, and a
DP-SGD step asked for graphs (`cuda_graphs`) takes them on the GPU and not on the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.dpsgd import mechanism
from engine.dpsgd.cuda_graphs import BUCKETS_PER_DOUBLING, GraphedClippedSum
from engine.dpsgd.fast_layers import accelerate_model
from engine.dpsgd.per_sample import LayerwiseGradients, VmapGradients
from engine.dpsgd.trainer import DPSGDStep
from engine.models import build_model

_NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with -m cuda on one)")


def on_cuda(test):
    return pytest.mark.cuda(_NEEDS_GPU(test))


def cnn(device: str = "cpu", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return accelerate_model(build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10).to(device).train())


def batch(n: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=gen).to(device), torch.randint(0, 10, (n,), generator=gen).to(device)


def assert_sums_close(got: list[torch.Tensor], want: list[torch.Tensor], rtol: float = 1e-4) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-6, msg=lambda m: f"parameter {i}: {m}")


def test_buckets_pad_less_than_a_sixteenth_of_a_chunk_and_never_past_the_physical_size():
    padded = GraphedClippedSum(LayerwiseGradients(cnn()), 1.0, max_batch=5000, capture=False)
    sizes = {n: padded.bucket(n) for n in range(1, 5001)}
    assert all(n <= size <= 5000 and (size - n) * BUCKETS_PER_DOUBLING < max(n, BUCKETS_PER_DOUBLING)
               for n, size in sizes.items())
    assert len({sizes[n] for n in range(257, 513)}) == BUCKETS_PER_DOUBLING  # 272, 288, ..., 512
    assert [sizes[n] for n in (1, 16, 17, 256, 257, 4096, 4097, 4999)] == [1, 16, 17, 256, 272, 4096, 4352, 5000]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 40, 64])
def test_padded_clipped_sum_equals_the_unpadded_one(n):
    """Padding rows (weight 0) add nothing: sums, losses and norms are those of the real rows alone,
    also after a larger chunk left its examples in the buffer."""
    strategy = LayerwiseGradients(cnn())
    padded = GraphedClippedSum(strategy, 0.5, max_batch=64, capture=False)
    padded(*batch(64, seed=1))  # the buffer now holds 64 other examples
    x, y = batch(n, seed=2)
    losses, summed, norms = padded(x, y)
    want_losses, want_summed, want_norms = strategy.clipped_sum(x, y, 0.5)
    assert losses.shape == (n,) and norms.shape == (n,)
    torch.testing.assert_close(losses, want_losses)
    torch.testing.assert_close(norms, want_norms)
    assert_sums_close(summed, want_summed)


def test_a_weight_of_zero_leaves_an_example_out_of_the_clipped_sum():
    strategy = LayerwiseGradients(cnn())
    x, y = batch(12, seed=3)
    weights = torch.ones(12)
    weights[[2, 7]] = 0.0
    _, summed, _ = strategy.clipped_sum(x, y, 1.0, weights)
    keep = [i for i in range(12) if i not in (2, 7)]
    _, want, _ = strategy.clipped_sum(x[keep], y[keep], 1.0)
    assert_sums_close(summed, want)
    # the generic path (per-example gradients, then mechanism.clipped_sum) takes the same weights
    _, grads = VmapGradients(cnn())(x, y)
    weighted, _ = mechanism.clipped_sum(grads, 1.0, weights)
    plain, _ = mechanism.clipped_sum([g[keep] for g in grads], 1.0)
    assert_sums_close(weighted, plain)


def test_on_the_cpu_a_dpsgd_step_computes_the_clipped_sum_without_graphs_even_when_asked():
    model = cnn()
    step = DPSGDStep(model, torch.optim.SGD(model.parameters(), lr=0.1), clipping_norm=1.0, noise_multiplier=1.0,
                     expected_batch_size=32, max_physical_batch_size=32, noise_generator=torch.Generator(),
                     cuda_graphs=True)
    assert not isinstance(step.clipped_sum, GraphedClippedSum)


# ------------------------------------------------------------------------------------------------
# On a CUDA GPU
# ------------------------------------------------------------------------------------------------


@on_cuda
def test_graphed_sums_equal_eager_ones_at_every_bucket_in_any_order():
    strategy = LayerwiseGradients(cnn("cuda"))
    graphed = GraphedClippedSum(strategy, 0.5, max_batch=64)
    eager = GraphedClippedSum(strategy, 0.5, max_batch=64, capture=False)
    for n, seed in [(64, 1), (5, 2), (33, 3), (64, 4), (5, 5), (1, 6), (48, 7), (33, 8)]:
        x, y = batch(n, seed, "cuda")
        losses, summed, norms = graphed(x, y)
        got = ([t.clone() for t in summed], losses.clone(), norms.clone())
        want_losses, want_summed, want_norms = eager(x, y)
        assert_sums_close(got[0], want_summed)
        torch.testing.assert_close(got[1], want_losses)
        torch.testing.assert_close(got[2], want_norms)
    assert sorted(graphed._graphs) == sorted({graphed.bucket(n) for n in (64, 5, 33, 1, 48)})


@on_cuda
def test_graphs_see_the_weights_the_optimizer_updated():
    model = cnn("cuda")
    strategy = LayerwiseGradients(model)
    graphed = GraphedClippedSum(strategy, 1.0, max_batch=32)
    x, y = batch(20, seed=9, device="cuda")
    graphed(x, y)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # in place, as every optimizer updates
    _, summed, _ = graphed(x, y)
    _, want, _ = strategy.clipped_sum(x, y, 1.0)
    assert_sums_close(summed, want)


@on_cuda
def test_a_dpsgd_step_on_cuda_replays_graphs_and_matches_the_step_without_them():
    """The same step (weights, batch, noise draws) with and without graphs updates the weights alike;
    batches larger than the physical size run in chunks (full ones and a padded rest)."""
    x, y = batch(150, seed=11, device="cuda")
    results = []
    for graphs in (True, False):
        model = cnn("cuda", seed=4)
        step = DPSGDStep(model, torch.optim.SGD(model.parameters(), lr=0.5), clipping_norm=1.0,
                         noise_multiplier=1.0, expected_batch_size=128, max_physical_batch_size=64,
                         noise_generator=torch.Generator(device="cuda").manual_seed(3), cuda_graphs=graphs)
        assert isinstance(step.clipped_sum, GraphedClippedSum) == graphs
        loss = step(x, y)
        results.append((loss, [p.detach().clone() for p in model.parameters()]))
        step.close()
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert_sums_close(results[0][1], results[1][1], rtol=1e-4)
    want = F.cross_entropy(cnn("cuda", seed=4)(x), y, reduction="sum")
    assert results[0][0] == pytest.approx(float(want), rel=1e-4)
