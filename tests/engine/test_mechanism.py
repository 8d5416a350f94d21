"""DP-SGD's privacy mechanisms, tested statistically: sampling rate, clipping bound, noise scale.

Each statistical test uses a fixed seed and a tolerance of about 5 standard errors, so it is
deterministic yet fails for a wrong rate or scale of a few percent.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from engine.dpsgd import mechanism
from engine.dpsgd.per_sample import per_example_gradients
from engine.dpsgd.trainer import DPSGDStep


def test_poisson_batches_include_each_example_with_probability_q():
    n, q, draws = 2000, 0.03, 3000
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(n)
    sizes = []
    for _ in range(draws):
        idx = mechanism.poisson_sample(n, q, gen)
        counts[idx] += 1
        sizes.append(idx.numel())
    sizes = np.array(sizes)
    # Batch size ~ Binomial(n, q): mean n*q, variance n*q*(1-q) — it varies, it is not fixed.
    se_mean = math.sqrt(n * q * (1 - q) / draws)
    assert abs(sizes.mean() - n * q) < 5 * se_mean
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.1)
    # Each example's inclusion count ~ Binomial(draws, q): a chi-square test of the counts.
    expected = draws * q
    chi2 = float(((counts - expected) ** 2 / (expected * (1 - q))).sum())
    assert stats.chi2.sf(chi2, df=n) > 1e-4
    # Indices are distinct within a batch.
    idx = mechanism.poisson_sample(n, 0.5, gen)
    assert idx.unique().numel() == idx.numel()


def test_wrong_rate_would_be_detected():
    """The sampling test above has the power to see a 5% error in q."""
    n, q, draws = 2000, 0.03, 3000
    gen = torch.Generator().manual_seed(1)
    sizes = np.array([mechanism.poisson_sample(n, q * 1.05, gen).numel() for _ in range(draws)])
    assert abs(sizes.mean() - n * q) > 5 * math.sqrt(n * q * (1 - q) / draws)


@pytest.mark.parametrize("sigma, clip", [(1.1, 1.0), (0.5, 3.0), (4.0, 0.1)])
def test_noise_has_standard_deviation_sigma_times_c(sigma, clip):
    gen = torch.Generator().manual_seed(2)
    zeros = [torch.zeros(400, 500), torch.zeros(100_000)]
    noisy = mechanism.add_gaussian_noise(zeros, noise_multiplier=sigma, clipping_norm=clip, generator=gen)
    sample = torch.cat([t.flatten() for t in noisy]).double().numpy()
    k = sample.size
    std = sample.std()
    # The sample std has standard error about std / sqrt(2k).
    assert abs(std - sigma * clip) < 5 * sigma * clip / math.sqrt(2 * k)
    assert abs(sample.mean()) < 5 * sigma * clip / math.sqrt(k)
    assert stats.kstest(sample[:20_000] / (sigma * clip), "norm").pvalue > 1e-3


def test_noise_is_fresh_on_every_call():
    gen = torch.Generator().manual_seed(3)
    a = mechanism.add_gaussian_noise([torch.zeros(1000)], noise_multiplier=1.0, clipping_norm=1.0, generator=gen)
    b = mechanism.add_gaussian_noise([torch.zeros(1000)], noise_multiplier=1.0, clipping_norm=1.0, generator=gen)
    assert abs(float(torch.corrcoef(torch.stack([a[0], b[0]]))[0, 1])) < 0.15


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, 2, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def test_every_clipped_per_example_gradient_has_norm_at_most_c():
    model = small_cnn()
    x = torch.randn(64, 1, 8, 8) * 5
    y = torch.randint(0, 3, (64,))
    _, grads = per_example_gradients(model)(x, y)
    norms = mechanism.per_example_norms(grads)
    for clip in (0.01, 0.5, 1e3):
        factors = mechanism.clip_factors(norms, clip)
        clipped_norms = mechanism.per_example_norms([g * factors.view(-1, *[1] * (g.dim() - 1)) for g in grads])
        assert bool((clipped_norms <= clip).all())
        small = norms < clip
        assert torch.allclose(clipped_norms[small], norms[small], rtol=1e-5)  # small ones untouched


def test_dpsgd_step_gradient_is_clipped_sum_plus_noise_over_expected_batch():
    """p.grad = (sum_i clip(g_i) + N(0, sigma^2 C^2)) / expected_batch, with noise drawn once per step."""
    x = torch.randn(40, 1, 8, 8)
    y = torch.randint(0, 3, (40,))
    clip, sigma, expected = 0.3, 0.7, 50

    reference = small_cnn()
    loop_sum = [torch.zeros_like(p) for p in reference.parameters()]
    for i in range(40):
        reference.zero_grad()
        nn.functional.cross_entropy(reference(x[i : i + 1]), y[i : i + 1]).backward()
        g = [p.grad.clone() for p in reference.parameters()]
        norm = math.sqrt(sum(float((t**2).sum()) for t in g))
        factor = min(1.0, clip / (norm + mechanism.NORM_EPS))
        for s, t in zip(loop_sum, g):
            s += factor * t
    noise_gen = torch.Generator().manual_seed(9)
    noise = [sigma * clip * torch.randn(p.shape, generator=noise_gen) for p in reference.parameters()]

    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: keep weights, inspect p.grad
    step = DPSGDStep(model, optimizer, clipping_norm=clip, noise_multiplier=sigma, expected_batch_size=expected,
                     max_physical_batch_size=16, noise_generator=torch.Generator().manual_seed(9))
    step(x, y)
    for p, s, z in zip(model.parameters(), loop_sum, noise):
        assert torch.allclose(p.grad, (s + z) / expected, atol=1e-6)


def test_empty_poisson_batch_still_adds_noise_and_steps():
    model = small_cnn()
    before = [p.detach().clone() for p in model.parameters()]
    step = DPSGDStep(model, torch.optim.SGD(model.parameters(), lr=1.0), clipping_norm=1.0, noise_multiplier=1.0,
                     expected_batch_size=10, max_physical_batch_size=8, noise_generator=torch.Generator().manual_seed(0))
    loss = step(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))
    assert loss == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
