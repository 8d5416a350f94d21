"""How fast the privacy math answers: the figures the window and the trainer rely on.

Targets: the live per-step epsilon for 10,000 steps in under a second; one PLD epsilon of the MNIST
setting in about a second; calibration and budget searches in a few seconds. Each row is the best of
several repeats (these machines are noisy; timings are never asserted in tests).

    python tests/bench/bench_privacy.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

from engine.privacy import (
    LiveAccountant,
    calibrate_noise_multiplier,
    dpsgd_epsilon,
    epsilon_curve,
    max_steps_within_budget,
)

MNIST_Q = 256 / 60_000


def live_steps(n: int) -> None:
    acc = LiveAccountant(sample_rate=MNIST_Q, noise_multiplier=1.1, delta=1e-5)
    for _ in range(n):
        acc.step()
        acc.epsilon()


CASES = {
    "live accountant: 10,000 x (step + epsilon)": lambda: live_steps(10_000),
    "epsilon_curve, 10,000 steps (rdp)": lambda: epsilon_curve(
        sample_rate=MNIST_Q, noise_multiplier=1.1, steps=10_000, delta=1e-5
    ),
    "pld epsilon, MNIST setting, 14,063 steps": lambda: dpsgd_epsilon(
        sample_rate=MNIST_Q, noise_multiplier=1.1, steps=14_063, delta=1e-5, accountant="pld"
    ),
    "max steps within budget 3.0 (pld)": lambda: max_steps_within_budget(
        sample_rate=MNIST_Q, noise_multiplier=1.1, delta=1e-5, budget=3.0
    ),
    "calibrate noise to epsilon 3, 9,375 steps (pld)": lambda: calibrate_noise_multiplier(
        sample_rate=MNIST_Q, steps=9_375, target_epsilon=3.0, delta=1e-5, accountant="pld"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':<52} {'best (s)':>10} {'median (s)':>11}")
    for name, case in CASES.items():
        case()  # warm imports and caches
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            case()
            times.append(time.perf_counter() - start)
        times.sort()
        print(f"{name:<52} {times[0]:>10.3f} {times[len(times) // 2]:>11.3f}")


if __name__ == "__main__":
    main()
