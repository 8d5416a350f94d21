"""The private randomness of a run: every draw a privacy proof relies on comes from here.

Two sources, never mixed (ARCHITECTURE.md, "Randomness"):

- `seed` (public, stored, in reports) drives initialisation, splits, shards, augmentation and
  training order; `seeded_torch_generator` and `seeded_int` turn it into generators for those.
- `PrivateRandomness.for_run(config)` is the source of Poisson sampling, DP-SGD noise, PATE
  aggregation noise, smooth-sensitivity release noise, the audit canaries (AUDIT_CANARY_*) and any
  later mechanism's draws. Its root is
  256 bits from `secrets` (the operating system's CSPRNG), held only in this object: never stored,
  logged, emitted, or derivable from anything that is. With `reproducible_noise = true` the root is
  derived from `seed` instead (debugging only: such a run carries no privacy guarantee).

Each purpose ("poisson_sampling", "dpsgd_noise", ...) gets its own stream, spawned from the root
by a `numpy.random.SeedSequence` keyed by the purpose's name and how often it was asked for, so
streams never overlap and a reproducible run draws the same values in the same order.

With `noise_sampler = "hardened"` every private stream is a `SecureGenerator` (SHAKE-256 in
counter mode under a 256-bit key) instead of torch's / numpy's fast generators.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where a torch generator is made: `dpw privacy` stays torch-free
    import torch

ROOT_BITS = 256
PRIVACY_NOISE = ("secret", "seeded")
SEED_DOMAIN = 0x5EED_0F_D9  # separates "seeded from seed" roots from any other use of the seed

# The one-run canary audit's streams (engine.dpsgd.canaries): which canaries are included (the secret
# the audit's p-value rests on), what they are (inputs, labels, gradient directions), and for gradient
# canaries which steps each included one joins (Poisson, like an example).
AUDIT_CANARY_INCLUSION = "audit_canary_inclusion"
AUDIT_CANARY_CONTENT = "audit_canary_content"
AUDIT_CANARY_SAMPLING = "audit_canary_sampling"

_MT19937_WORDS = 624
_CPU_STATE_BYTES = 5056  # torch's CPU generator state: the legacy mt19937 record (see _fill_mt19937)
_MT19937_STATE_OFFSET = 24  # the_initial_seed (8) + left (4) + seeded (4) + next (8), then 624 x uint64


def randomness_summary(config: Any) -> dict[str, str]:
    """What a run's privacy randomness is, for its plan, summary, report and model card."""
    return {
        "privacy_noise": "seeded" if config.reproducible_noise else "secret",
        "noise_sampler": config.noise_sampler,
    }


def _purpose_key(purpose: str) -> int:
    """A stable 64-bit number for a purpose's name (the same on every machine and version)."""
    return int.from_bytes(hashlib.sha256(purpose.encode()).digest()[:8], "little")


def seeded_int(seed: int, purpose: str) -> int:
    """A 64-bit seed for a public, seed-governed use (shuffling, init): never overflows, whatever `seed`."""
    sequence = np.random.SeedSequence([int(seed), _purpose_key(purpose)])
    return int(sequence.generate_state(1, np.uint64)[0])


def seeded_torch_generator(seed: int, purpose: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator for a public, seed-governed use (e.g. the non-private baseline's order)."""
    import torch

    return torch.Generator(device=device).manual_seed(seeded_int(seed, purpose))


class PrivateRandomness:
    """A run's source of private randomness (see the module docstring). Create one per run.

    The constructor draws the secret itself (or derives it from `seed` when `reproducible_noise`):
    there is no way to hand it a root, and it is neither printed nor pickled."""

    def __init__(self, *, noise_sampler: str = "standard", reproducible_noise: bool = False, seed: int = 0):
        if noise_sampler not in ("standard", "hardened"):
            raise ValueError(f"noise_sampler must be 'standard' or 'hardened'; got {noise_sampler!r}")
        self.noise_sampler = noise_sampler
        self.reproducible = bool(reproducible_noise)
        if self.reproducible:
            words = np.random.SeedSequence([int(seed), SEED_DOMAIN]).generate_state(ROOT_BITS // 32, np.uint32)
            self._root = int.from_bytes(words.astype("<u4").tobytes(), "little")
        else:
            self._root = secrets.randbits(ROOT_BITS)
        self._handed_out: dict[str, int] = {}

    @classmethod
    def for_run(cls, config: Any) -> "PrivateRandomness":
        """Secret OS entropy by default; derived from `config.seed` with `reproducible_noise = true`."""
        return cls(noise_sampler=config.noise_sampler, reproducible_noise=config.reproducible_noise, seed=config.seed)

    def __repr__(self) -> str:
        source = "seeded" if self.reproducible else "secret"
        return f"PrivateRandomness({source}, noise_sampler={self.noise_sampler!r})"

    def __getstate__(self):  # a pickled copy would carry the secret to wherever it is written
        raise TypeError("PrivateRandomness holds a run's secret and cannot be pickled")

    # ---- streams -----------------------------------------------------------------------------
    def _stream(self, purpose: str) -> np.random.SeedSequence:
        count = self._handed_out.get(purpose, 0)
        self._handed_out[purpose] = count + 1
        return np.random.SeedSequence(self._root, spawn_key=(_purpose_key(purpose), count))

    def torch_generator(self, purpose: str, device: torch.device | str = "cpu") -> "torch.Generator | SecureGenerator":
        """The stream for `purpose` as a torch generator on `device` (a SecureGenerator when hardened)."""
        import torch

        sequence = self._stream(purpose)
        if self.noise_sampler == "hardened":
            return SecureGenerator(_key_bytes(sequence))
        return _torch_generator_from(sequence, torch.device(device))

    def numpy_generator(self, purpose: str) -> "np.random.Generator | SecureGenerator":
        """The stream for `purpose` as a numpy generator (PCG64, 128-bit state; a SecureGenerator when
        hardened). Both offer `normal`, `laplace`, `standard_normal` and `random`."""
        sequence = self._stream(purpose)
        if self.noise_sampler == "hardened":
            return SecureGenerator(_key_bytes(sequence))
        return np.random.Generator(np.random.PCG64(sequence))


def _key_bytes(sequence: np.random.SeedSequence) -> bytes:
    return sequence.generate_state(ROOT_BITS // 32, np.uint32).astype("<u4").tobytes()


def _torch_generator_from(sequence: np.random.SeedSequence, device: torch.device) -> torch.Generator:
    """A torch generator whose whole state comes from `sequence`, not just a 64-bit seed: on CPU
    the 19,937-bit Mersenne Twister state, on CUDA the Philox seed and offset (126 bits)."""
    import torch

    words = sequence.generate_state(_MT19937_WORDS + 4, np.uint32)
    seed64 = int(words[0]) | int(words[1]) << 32
    generator = torch.Generator(device=device).manual_seed(seed64)
    if device.type == "cpu":
        _fill_mt19937(generator, words[4:])
    else:
        offset = (int(words[2]) | int(words[3]) << 32) & ~3 & (2**62 - 1)  # Philox offsets are multiples of 4
        try:
            generator.set_offset(offset)
        except (RuntimeError, AttributeError):
            pass  # a device without offsets keeps the secret 64-bit seed
    return generator


def _fill_mt19937(generator: torch.Generator, words: np.ndarray) -> None:
    """Overwrite the Mersenne Twister's 624-word state of a CPU generator (and make it twist before its
    first output), so that it is not one of the 2^64 states a seed can reach."""
    import torch

    state = generator.get_state()
    if state.numel() != _CPU_STATE_BYTES:
        return  # another torch layout: keep the secret 64-bit seed
    raw = bytearray(state.numpy().tobytes())
    raw[8:12] = (1).to_bytes(4, "little")  # left = 1: regenerate the state before the next draw
    mt = words.astype("<u8").tobytes()
    raw[_MT19937_STATE_OFFSET : _MT19937_STATE_OFFSET + len(mt)] = mt
    generator.set_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


class SecureGenerator:
    """A cryptographically secure generator: SHAKE-256 (FIPS 202) in counter mode under a 256-bit key.

    Drop-in for the few numpy / torch draws the mechanisms make (`integers62`, `random`,
    `standard_normal`, `normal`, `laplace`). Uniforms carry 53 random bits and are never 0.
    Gaussians are the sum of GAUSSIAN_TERMS independent Box-Muller normals (float64), each with
    variance 1/GAUSSIAN_TERMS (Holohan & Braghin 2021, "Secure random sampling in differential
    privacy"; the approach Opacus' secure mode takes).

    What it defends against: (1) predicting or rebuilding the stream: the output of a fast generator
    (mt19937, PCG64) reveals its state after a few hundred draws, SHAKE-256 does not; (2) the
    floating-point attacks of Mironov 2012 (CCS) and Jin et al. 2022 (IEEE S&P, "Are we there yet?"),
    which read the noise from which floats a single textbook sample can land on: a sum of several
    independent float64 Gaussians, rounded once to the gradient's float32, makes the set of reachable
    noisy values dense around every input, which defeats the published attacks. It is a mitigation, not
    a proof: an exact discrete sampler (Canonne, Kamath & Steinke 2020) would be the provable one.
    What it costs: about 32 bytes of SHAKE-256 output and four logarithms per noise coordinate, on the
    CPU (tests/bench/bench_dpsgd.py measures the throughput).
    """

    GAUSSIAN_TERMS = 4

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("a SecureGenerator needs a key of at least 128 bits")
        self._key = key
        self._counter = 0

    def __repr__(self) -> str:
        return "SecureGenerator(<secret key>)"

    def __getstate__(self):
        raise TypeError("SecureGenerator holds a run's secret and cannot be pickled")

    def bytes(self, count: int) -> bytes:
        block = hashlib.shake_256(self._key + self._counter.to_bytes(16, "little")).digest(count) if count else b""
        self._counter += 1
        return block

    def uint64(self, size: int) -> np.ndarray:
        return np.frombuffer(self.bytes(8 * int(size)), dtype="<u8").astype(np.uint64, copy=False)

    def integers62(self, size: int) -> np.ndarray:
        """Uniform integers in [0, 2^62) (for never-above-q Bernoulli draws), as int64."""
        return (self.uint64(size) >> np.uint64(2)).astype(np.int64)

    def random(self, size: Any = None) -> np.ndarray:
        """Uniforms in (0, 1]: (k + 1) / 2^53 for a uniform 53-bit k."""
        shape = _shape(size)
        k = self.uint64(math.prod(shape)) >> np.uint64(11)
        return ((k.astype(np.float64) + 1.0) * 2.0**-53).reshape(shape)

    def _box_muller(self, count: int) -> np.ndarray:
        pairs = (count + 1) // 2
        u = self.random(2 * pairs)
        radius = np.sqrt(-2.0 * np.log(u[:pairs]))
        angle = (2.0 * math.pi) * u[pairs:]
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]

    def standard_normal(self, size: Any = None) -> np.ndarray | float:
        shape = _shape(size)
        count = math.prod(shape)
        terms = self._box_muller(self.GAUSSIAN_TERMS * count).reshape(self.GAUSSIAN_TERMS, count)
        values = (terms.sum(axis=0) / math.sqrt(self.GAUSSIAN_TERMS)).reshape(shape)
        return float(values) if size is None else values

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> np.ndarray | float:
        values = loc + scale * np.asarray(self.standard_normal(_shape(size)))
        return float(values) if size is None else values

    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> np.ndarray | float:
        """Laplace(loc, scale) as the difference of two independent exponentials."""
        shape = _shape(size)
        count = math.prod(shape)
        u = self.random(2 * count)
        values = (loc + scale * (np.log(u[count:]) - np.log(u[:count]))).reshape(shape)
        return float(values) if size is None else values


def _shape(size: Any) -> tuple[int, ...]:
    if size is None:
        return ()
    if isinstance(size, (int, np.integer)):
        return (int(size),)
    return tuple(int(s) for s in size)
