"""engine.privacy.group against hand-computed values of the group bound (k eps, k e^((k-1) eps) delta)."""

from __future__ import annotations

import pytest

from engine.privacy.group import group_bound


@pytest.mark.parametrize("k,epsilon,delta", [
    # epsilon 2.6809, delta 1e-5: e^2.6809 = 14.5982, e^5.3618 = 213.108, e^10.7236 = 45415.0
    (2, 5.3618, 2.91964e-4),
    (3, 8.0427, 6.39325e-3),
    (5, 13.4045, 2.27076),
])
def test_group_bound_of_a_run_at_epsilon_2_68(k, epsilon, delta):
    bound = group_bound(epsilon=2.6809, delta=1e-5, group_size=k)
    assert bound.group_size == k
    assert bound.epsilon == pytest.approx(epsilon, rel=1e-12)
    assert bound.delta == pytest.approx(delta, rel=1e-5)
    assert bound.vacuous is (k == 5)  # delta 2.27 >= 1 bounds nothing


def test_group_bound_of_one_example_is_the_guarantee_itself_and_three_at_epsilon_1():
    assert group_bound(epsilon=1.0, delta=1e-6, group_size=1).delta == 1e-6
    three = group_bound(epsilon=1.0, delta=1e-6, group_size=3)
    assert (three.epsilon, three.delta) == (3.0, pytest.approx(2.21672e-5, rel=1e-5))  # 3 e^2 1e-6
    assert not three.vacuous


def test_a_huge_epsilon_gives_an_infinite_delta_not_an_overflow():
    bound = group_bound(epsilon=500.0, delta=1e-5, group_size=5)
    assert bound.delta == float("inf") and bound.vacuous


@pytest.mark.parametrize("k", [0, -1, 2.5])
def test_group_size_must_be_a_whole_number_of_examples(k):
    with pytest.raises(ValueError, match="group_size"):
        group_bound(epsilon=1.0, delta=1e-5, group_size=k)
