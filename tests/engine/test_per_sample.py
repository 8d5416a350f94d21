"""Per-example gradients equal a loop of single-example backward passes, for every strategy.

The reference is the definition: for each example alone, backward of its loss and read p.grad.
Clipping is checked against the clip-then-sum of those reference gradients, and the clipped
gradients' norms against C, through the strategy's own `clipped_sum`.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.dpsgd import mechanism, per_sample
from engine.dpsgd.fast_layers import FastMaxPool2d, accelerate_model
from engine.dpsgd.per_sample import LayerwiseGradients, VmapGradients, per_example_gradients
from engine.models import build_model

ATOL = 1e-5
RTOL = 1e-4

# padding="same" with an even kernel (asymmetric padding, tested on purpose) makes torch warn.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")


def loop_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(losses, per-parameter (B, *shape) gradients) from one backward pass per example."""
    params = [p for p in model.parameters() if p.requires_grad]
    losses, grads = [], [[] for _ in params]
    for i in range(x.shape[0]):
        loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        for acc, p, g in zip(grads, params, torch.autograd.grad(loss, params, allow_unused=True)):
            acc.append(torch.zeros_like(p) if g is None else g)
        losses.append(loss.detach())
    return torch.stack(losses), [torch.stack(g) for g in grads]


def loop_clipped_sum(grads: list[torch.Tensor], clip: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    batch = grads[0].shape[0]
    norms = torch.stack([torch.sqrt(sum((g[i].double() ** 2).sum() for g in grads)) for i in range(batch)])
    summed = [torch.zeros(g.shape[1:], dtype=torch.float64) for g in grads]
    for i in range(batch):
        factor = min(1.0, clip / (float(norms[i]) + mechanism.NORM_EPS))
        for s, g in zip(summed, grads):
            s += factor * g[i].double()
    return summed, norms


def assert_close_list(got: list[torch.Tensor], want: list[torch.Tensor], atol=ATOL, rtol=RTOL) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"parameter {i}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=rtol, msg=lambda m: f"parameter {i}: {m}")


def mnist_cnn() -> nn.Module:
    torch.manual_seed(0)
    return build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10)


class ConvVariants(nn.Module):
    """Conv2d with padding/stride/dilation/bias=False/'same'/asymmetric variants, then Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 5, kernel_size=3, stride=2, padding=1)
        self.c2 = nn.Conv2d(5, 6, kernel_size=(3, 2), stride=(1, 2), padding=(2, 0), dilation=(2, 1), bias=False)
        self.c3 = nn.Conv2d(6, 4, kernel_size=4, padding="same", dilation=1)
        self.c4 = nn.Conv2d(4, 4, kernel_size=3, padding="valid", stride=(2, 1), dilation=(1, 2))
        self.c5 = nn.Conv2d(4, 3, kernel_size=1)
        self.fc = nn.LazyLinear(7)

    def forward(self, x):
        x = torch.tanh(self.c1(x))
        x = torch.tanh(self.c2(x))
        x = torch.tanh(self.c3(x))
        x = torch.tanh(self.c4(x))
        x = torch.tanh(self.c5(x))
        return self.fc(x.flatten(1))


def conv_variants() -> nn.Module:
    torch.manual_seed(1)
    model = ConvVariants()
    model(torch.zeros(1, 3, 21, 29))  # materialise the lazy layer
    return model


class SequenceModel(nn.Module):
    """Linear on (B, T, F) inputs, LayerNorm, and a mean over T."""

    def __init__(self, features=6, hidden=9, steps=5, classes=4):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.wide = nn.Linear(hidden, 40)  # out*in > T*(out+in): the Gram path
        self.out = nn.Linear(40, classes, bias=False)

    def forward(self, x):
        h = self.norm(torch.tanh(self.inp(x)))
        return self.out(torch.tanh(self.wide(h))).mean(1)


def sequence_model() -> nn.Module:
    torch.manual_seed(2)
    return SequenceModel()


def group_norm_cnn() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.Tanh(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.Tanh(), nn.Flatten(), nn.Linear(8 * 4 * 4, 5),
    )


class Unsupported(nn.Module):
    """A parameter outside the supported layers: only the vmap strategy can handle it."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5, -0.5, 2.0]))
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(torch.tanh(x * self.scale))


CASES = {
    "mnist_cnn": (mnist_cnn, (12, 1, 28, 28), 10),
    "conv_variants": (conv_variants, (9, 3, 21, 29), 7),
    "sequence": (sequence_model, (10, 5, 6), 4),
    "group_norm_cnn": (group_norm_cnn, (8, 3, 8, 8), 5),
}


def case_data(shape, classes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 2
    y = torch.randint(0, classes, (shape[0],), generator=gen)
    return x, y


def strategies(model):
    return {"layerwise": LayerwiseGradients(model), "vmap": VmapGradients(model)}


@pytest.mark.parametrize("name", list(CASES))
def test_layerwise_is_chosen_for_supported_models(name):
    build = CASES[name][0]
    assert isinstance(per_example_gradients(build()), LayerwiseGradients)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("name", list(CASES))
def test_per_example_gradients_equal_loop_of_single_backward_passes(name, channels_last):
    build, shape, classes = CASES[name]
    model = build()
    x, y = case_data(shape, classes)
    if channels_last and x.dim() == 4:
        model = accelerate_model(model)
        x = x.contiguous(memory_format=torch.channels_last)
    want_losses, want = loop_gradients(model, x, y)
    for label, strategy in strategies(model).items():
        losses, grads = strategy(x, y)
        torch.testing.assert_close(losses, want_losses, atol=ATOL, rtol=RTOL, msg=lambda m: f"{label}: {m}")
        assert_close_list(grads, want)
        strategy.close()


@pytest.mark.parametrize("clip", [1e-3, 0.5, 1e4])
@pytest.mark.parametrize("name", list(CASES))
def test_clipped_sum_equals_loop_clip_then_sum(name, clip):
    build, shape, classes = CASES[name]
    model = build()
    x, y = case_data(shape, classes, seed=1)
    _, grads = loop_gradients(model, x, y)
    want_sum, want_norms = loop_clipped_sum(grads, clip)
    for label, strategy in strategies(model).items():
        losses, summed, norms = strategy.clipped_sum(x, y, clip)
        assert losses.shape == (shape[0],)
        torch.testing.assert_close(norms.double(), want_norms, atol=ATOL, rtol=RTOL, msg=lambda m: f"{label}: {m}")
        # Sums of up to B gradients of norm <= clip: tolerance relative to clip * B.
        assert_close_list(summed, want_sum, atol=ATOL * max(1.0, min(clip, float(want_norms.max()))), rtol=RTOL)


@pytest.mark.parametrize("name", list(CASES))
def test_every_clipped_gradient_has_norm_at_most_c_through_the_strategy(name):
    """One example at a time through clipped_sum: its 'sum' is its clipped gradient."""
    build, shape, classes = CASES[name]
    model = build()
    x, y = case_data(shape, classes, seed=2)
    x = x * 10  # large gradients, so clipping binds
    strategy = per_example_gradients(model)
    clip = 0.05
    bound = 0
    for i in range(x.shape[0]):
        _, summed, norms = strategy.clipped_sum(x[i : i + 1], y[i : i + 1], clip)
        clipped_norm = math.sqrt(sum(float((s.double() ** 2).sum()) for s in summed))
        assert clipped_norm <= clip * (1 + 1e-6), (i, clipped_norm)
        if float(norms[0]) > clip:
            bound += 1
            assert clipped_norm == pytest.approx(clip, rel=1e-4)
        else:
            assert clipped_norm == pytest.approx(float(norms[0]), rel=1e-4)
    assert bound > 0, "no example had a gradient larger than C: the test did not exercise clipping"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name", list(CASES))
def test_an_example_whose_gradient_is_not_finite_adds_nothing_to_the_clipped_sum(name, bad):
    """Sensitivity C needs every example's share to have norm <= C: an example whose loss or gradient is
    NaN or infinite (bad data, overflow) had a NaN clip factor and made the whole sum NaN. It is left out:
    the sum is the sum without it, and its norm says it was not finite."""
    build, shape, classes = CASES[name]
    model = build()
    x, y = case_data(shape, classes, seed=3)
    x_bad = x.clone()
    x_bad[2] = bad
    kept = torch.ones(shape[0], dtype=torch.bool)
    kept[2] = False
    for label, strategy in strategies(model).items():
        _, want, _ = strategy.clipped_sum(x[kept], y[kept], 0.5)
        _, summed, norms = strategy.clipped_sum(x_bad, y, 0.5)
        assert not math.isfinite(float(norms[2])), label
        assert all(torch.isfinite(s).all() for s in summed), label
        assert_close_list(summed, want)
        strategy.close()


@pytest.mark.parametrize("plan", ["grouped", "patches", "patches_cl"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_every_conv_method_matches_loop_on_every_conv_variant(plan, channels_last, monkeypatch):
    """Whatever method the shape rule picks, each is exact for padding/stride/dilation/no bias."""
    monkeypatch.setattr(per_sample, "_choose_conv_plan", lambda layer, a, g: plan)
    model = conv_variants()
    x, y = case_data(CASES["conv_variants"][1], 7, seed=4)
    if channels_last:
        model = accelerate_model(model)
        x = x.contiguous(memory_format=torch.channels_last)
    _, want = loop_gradients(model, x, y)
    strategy = LayerwiseGradients(model)
    assert_close_list(strategy(x, y)[1], want)
    want_sum, want_norms = loop_clipped_sum(want, 0.1)
    _, summed, norms = strategy.clipped_sum(x, y, 0.1)
    torch.testing.assert_close(norms.double(), want_norms, atol=ATOL, rtol=RTOL)
    assert_close_list(summed, want_sum)
    assert set(strategy._conv_plans.values()) == {plan}


def test_norms_returned_by_clipped_sum_equal_per_example_norms():
    model = mnist_cnn()
    x, y = case_data((20, 1, 28, 28), 10, seed=3)
    _, grads = loop_gradients(model, x, y)
    want = mechanism.per_example_norms(grads)
    _, _, norms = LayerwiseGradients(model).clipped_sum(x, y, 1.0)
    torch.testing.assert_close(norms, want, atol=1e-6, rtol=1e-5)


def test_vmap_fallback_for_parameters_outside_supported_layers():
    torch.manual_seed(4)
    model = Unsupported()
    strategy = per_example_gradients(model)
    assert isinstance(strategy, VmapGradients)
    x, y = case_data((7, 3), 4)
    _, want = loop_gradients(model, x, y)
    _, grads = strategy(x, y)
    assert_close_list(grads, want)


def test_group_norm_model_via_vmap_fallback_matches_loop():
    model = group_norm_cnn()
    x, y = case_data((6, 3, 8, 8), 5, seed=5)
    _, want = loop_gradients(model, x, y)
    _, grads = VmapGradients(model)(x, y)
    assert_close_list(grads, want)


def test_frozen_parameters_are_left_out():
    model = mnist_cnn()
    model[0].weight.requires_grad_(False)
    model[7].bias.requires_grad_(False)
    x, y = case_data((5, 1, 28, 28), 10, seed=6)
    _, want = loop_gradients(model, x, y)
    strategy = per_example_gradients(model)
    assert isinstance(strategy, LayerwiseGradients)
    _, grads = strategy(x, y)
    assert len(grads) == len(want) == 6
    assert_close_list(grads, want)


def test_layer_used_twice_sums_both_uses_per_example():
    torch.manual_seed(7)
    shared = nn.Linear(4, 4)
    head = nn.Linear(4, 3)
    model = nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), head)
    x, y = case_data((6, 4), 3, seed=7)
    _, grads = loop_gradients(model, x, y)
    want_sum, want_norms = loop_clipped_sum(grads, 0.3)
    strategy = per_example_gradients(model)
    assert_close_list(strategy(x, y)[1], grads)
    _, summed, norms = strategy.clipped_sum(x, y, 0.3)
    torch.testing.assert_close(norms.double(), want_norms, atol=ATOL, rtol=RTOL)
    assert_close_list(summed, want_sum)


@pytest.mark.parametrize("batch", [0, 1])
def test_tiny_batches(batch):
    model = accelerate_model(mnist_cnn())
    x, y = case_data((batch, 1, 28, 28), 10, seed=10)
    strategy = LayerwiseGradients(model)
    strategy.clipped_sum(torch.randn(4, 1, 28, 28), torch.zeros(4, dtype=torch.long), 1.0)  # plans cached
    losses, summed, norms = strategy.clipped_sum(x, y, 1.0)
    assert losses.shape == norms.shape == (batch,)
    assert [s.shape for s in summed] == [p.shape for p in model.parameters()]
    if batch == 0:
        assert all(float(s.abs().sum()) == 0.0 for s in summed)
    else:
        _, want = loop_gradients(model, x, y)
        assert_close_list(strategy(x, y)[1], want)


def test_hooks_record_nothing_outside_the_strategy_and_close_removes_them():
    model = mnist_cnn()
    strategy = LayerwiseGradients(model)
    with torch.no_grad():
        model(torch.zeros(3, 1, 28, 28))
    assert not strategy._records
    strategy.close()
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("shape,kernel,stride", [
    ((4, 3, 14, 14), 2, 1), ((4, 5, 5, 5), 2, 1), ((3, 2, 9, 8), 3, 1), ((3, 2, 10, 12), 2, 2),
    ((2, 3, 11, 9), 3, 2), ((2, 4, 7, 7), (2, 3), (1, 2)),
])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_fast_max_pool_equals_max_pool_forward_and_backward(shape, kernel, stride, channels_last):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)  # continuous values: no ties
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    reference = nn.MaxPool2d(kernel, stride)
    fast = FastMaxPool2d(kernel, stride)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_a, out_b = reference(xa), fast(xb)
    assert torch.equal(out_a, out_b)
    g = torch.randn(out_a.shape, generator=gen, dtype=torch.float64)
    (grad_a,) = torch.autograd.grad(out_a, xa, g)
    (grad_b,) = torch.autograd.grad(out_b, xb, g)
    torch.testing.assert_close(grad_a, grad_b, atol=1e-12, rtol=0)


def test_fast_max_pool_routes_ties_like_max_pool():
    """Integer-valued inputs have many ties: both send the gradient to the same element."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randint(0, 3, (3, 8, 10, 9), generator=gen).double()
    for kernel, stride in [(2, 1), (3, 1), (2, 2), (3, 2)]:
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_a, out_b = nn.MaxPool2d(kernel, stride)(xa), FastMaxPool2d(kernel, stride)(xb)
        g = torch.randn(out_a.shape, generator=gen, dtype=torch.float64)
        (grad_a,) = torch.autograd.grad(out_a, xa, g)
        (grad_b,) = torch.autograd.grad(out_b, xb, g)
        assert torch.equal(out_a, out_b)
        torch.testing.assert_close(grad_a, grad_b, atol=1e-12, rtol=0)


def test_accelerate_model_keeps_parameters_and_function():
    model = mnist_cnn()
    before = [p for p in model.parameters()]
    x, _ = case_data((6, 1, 28, 28), 10)
    with torch.no_grad():
        want = model(x)
    fast = accelerate_model(model)
    assert [p for p in fast.parameters()] == before  # same Parameter objects: optimizers stay valid
    assert any(isinstance(m, FastMaxPool2d) for m in fast.modules())
    with torch.no_grad():
        got = fast(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
