"""DP-SGD's privacy mechanisms, tested statistically: sampling rate, clipping bound, noise scale.

Each statistical test uses a fixed seed (or a fixed key for the hardened SecureGenerator) and a
tolerance of about 5 standard errors, so it is deterministic yet fails for a wrong rate or scale of a
few percent. Both noise samplers ("standard": a torch generator; "hardened": a SecureGenerator) are tested.
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
from engine.randomness import SecureGenerator


def generator_for(sampler: str, seed: int):
    """A fixed-seed generator of the kind each noise sampler uses."""
    if sampler == "hardened":
        return SecureGenerator(seed.to_bytes(32, "little"))
    return torch.Generator().manual_seed(seed)


SAMPLERS = ["standard", "hardened"]


@pytest.mark.parametrize("q", [0.0, 1e-12, 1e-5, 1e-4, 256 / 60_000, 0.03, 1 / 3, 0.1, 0.999999, 1.0])
def test_inclusion_probability_is_never_above_q(q):
    """threshold / 2^62 <= q < (threshold + 1) / 2^62, in exact rational arithmetic; the float32 rule
    (rand < q, probability ceil(q * 2^24) / 2^24) breaks that bound wherever q is not on its grid."""
    from fractions import Fraction

    threshold = mechanism.inclusion_threshold(q)
    rate = Fraction(threshold, 2**mechanism.SAMPLING_BITS)
    assert rate <= Fraction(q) < rate + Fraction(1, 2**mechanism.SAMPLING_BITS)
    float32_rate = Fraction(math.ceil(Fraction(q) * 2**24), 2**24)
    if Fraction(q) * 2**24 != int(Fraction(q) * 2**24):
        assert float32_rate - Fraction(q) > Fraction(1, 2**mechanism.SAMPLING_BITS)


def test_sample_rate_outside_0_1_is_refused():
    with pytest.raises(ValueError):
        mechanism.inclusion_threshold(1.0000001)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_rate_below_the_float32_grid_is_never_rounded_up(sampler):
    """q = 1e-12: the float32 rule includes an example with probability 2^-24 (about 4 of 2^26 draws);
    the exact rule with probability 1e-12 (about 7e-5 of them)."""
    q, n = 1e-12, 2**26
    gen = generator_for(sampler, 4)
    included = sum(int(mechanism.poisson_sample(n // 8, q, gen).numel()) for _ in range(8))
    assert included == 0
    float32 = torch.Generator().manual_seed(4)
    assert sum(int((torch.rand(n // 8, generator=float32) < q).sum()) for _ in range(8)) > 0


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_poisson_batches_include_each_example_with_probability_q(sampler):
    n, q, draws = 2000, 0.03, 3000
    gen = generator_for(sampler, 0)
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


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("sigma, clip", [(1.1, 1.0), (0.5, 3.0), (4.0, 0.1)])
def test_noise_has_standard_deviation_sigma_times_c(sampler, sigma, clip):
    gen = generator_for(sampler, 2)
    zeros = [torch.zeros(400, 500), torch.zeros(100_000)]
    noisy = mechanism.add_gaussian_noise(zeros, noise_multiplier=sigma, clipping_norm=clip, generator=gen)
    assert all(t.dtype == torch.float32 and t.shape == z.shape for t, z in zip(noisy, zeros))
    sample = torch.cat([t.flatten() for t in noisy]).double().numpy()
    k = sample.size
    std = sample.std()
    # The sample std has standard error about std / sqrt(2k).
    assert abs(std - sigma * clip) < 5 * sigma * clip / math.sqrt(2 * k)
    assert abs(sample.mean()) < 5 * sigma * clip / math.sqrt(k)
    # sum(x^2) / (sigma C)^2 ~ chi-square(k) (float32 rounding is far below this test's resolution).
    p = stats.chi2.cdf(float((sample**2).sum()) / (sigma * clip) ** 2, df=k)
    assert 1e-6 < p < 1 - 1e-6
    assert stats.kstest(sample[:20_000] / (sigma * clip), "norm").pvalue > 1e-3


def test_a_wrong_noise_scale_would_be_detected():
    """The chi-square bound above rejects noise 1% too small."""
    gen = generator_for("hardened", 5)
    sample = gen.normal(0.0, 0.99, size=140_000)
    assert stats.chi2.cdf(float((sample**2).sum()), df=sample.size) < 1e-6


def test_hardened_noise_is_gaussian_in_its_tails():
    """KS on 200,000 values and the tail frequencies beyond 3 and 4 standard deviations."""
    x = generator_for("hardened", 6).standard_normal(200_000)
    assert stats.kstest(x, "norm").pvalue > 1e-3
    for z in (3.0, 4.0):
        expected = 2 * stats.norm.sf(z) * x.size
        assert abs(int((abs(x) > z).sum()) - expected) < 5 * math.sqrt(expected) + 1


def test_hardened_noise_is_added_in_float64_and_rounded_once():
    """summed + noise computed in float64, then rounded to the gradient's dtype: the result equals
    round(summed_64 + noise_64) with the same key, not summed_32 + round(noise)."""
    summed = [torch.full((1000,), 0.1, dtype=torch.float32)]
    out = mechanism.add_gaussian_noise(summed, noise_multiplier=1.0, clipping_norm=1e-6,
                                       generator=SecureGenerator(b"r" * 32))
    noise = SecureGenerator(b"r" * 32).normal(0.0, 1e-6, (1000,))
    expected = (summed[0].double() + torch.from_numpy(noise)).float()
    assert torch.equal(out[0], expected)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_noise_is_fresh_on_every_call(sampler):
    gen = generator_for(sampler, 3)
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
