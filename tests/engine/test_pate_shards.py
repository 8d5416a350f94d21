"""PATE shards: each example's teacher is a keyed hash of the example itself, so adding or removing one
example changes exactly one teacher's shard (by that example), whatever the kind of input; shards of
any size, empty ones included, train and vote; a teacher's training does not depend on the other
shards of its stacked group."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from engine.array_data import MappedRows, NpyRows, open_npy
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.pate.run import prepare_pate
from engine.pate.member_adam import MemberAdam, for_members
from engine.pate.shards import expected_empty_shards, partition, shard_matrix, teacher_of
from engine.pate.teachers import (
    build_teachers, epoch_order, teacher_generator, train_group, train_teachers, vote_counts,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n: int = 600, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 4, 4, generator=g), torch.randint(0, 5, (n,), generator=g)
    x[17], y[17] = x[3], y[3]  # a duplicate example
    return x, y


def _owners(shards: list[np.ndarray], ids: np.ndarray) -> dict[int, int]:
    """{example id: teacher} for shards of indices into `ids`."""
    return {int(ids[i]): k for k, shard in enumerate(shards) for i in shard}


def _shard_sets(shards: list[np.ndarray], ids: np.ndarray) -> list[frozenset[int]]:
    return [frozenset(ids[s].tolist()) for s in shards]


def _check_one_shard_changes(before: list[frozenset[int]], after: list[frozenset[int]], example: int) -> None:
    changed = [k for k, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) == 1
    k = changed[0]
    assert before[k] ^ after[k] == {example}


# ---- one example changes one shard -------------------------------------------------------------------


@pytest.mark.parametrize("removed", [0, 599, 250, 3, 17])  # first, last, middle, both copies of a duplicate
def test_removing_one_example_changes_only_its_own_teachers_shard(removed):
    x, y = _data()
    ids = np.arange(len(x))
    full = partition(x, 13, seed=42, labels=y)
    keep = ids[ids != removed]
    smaller = partition(x[keep], 13, seed=42, labels=y[keep])
    owners_full, owners_smaller = _owners(full, ids), _owners(smaller, keep)
    assert all(owners_smaller[i] == owners_full[i] for i in keep)  # every other example keeps its teacher
    _check_one_shard_changes(_shard_sets(full, ids), _shard_sets(smaller, keep), removed)


def test_duplicates_share_a_teacher():
    x, y = _data()
    owner = teacher_of(x, 13, seed=42, labels=y)
    assert owner[3] == owner[17]


@pytest.mark.parametrize("position", [0, 300, 600])
def test_adding_one_example_changes_only_the_shard_it_joins(position):
    x, y = _data()
    g = torch.Generator().manual_seed(9)
    new_x, new_y = torch.randn(1, 1, 4, 4, generator=g), torch.tensor([2])
    x2 = torch.cat([x[:position], new_x, x[position:]])
    y2 = torch.cat([y[:position], new_y, y[position:]])
    ids = np.arange(len(x))
    ids2 = np.concatenate([ids[:position], [-1], ids[position:]])  # -1: the new example
    before, after = partition(x, 13, seed=42, labels=y), partition(x2, 13, seed=42, labels=y2)
    owners_before, owners_after = _owners(before, ids), _owners(after, ids2)
    assert all(owners_after[i] == owners_before[i] for i in ids)
    _check_one_shard_changes(_shard_sets(before, ids), _shard_sets(after, ids2), -1)


def test_the_order_of_the_examples_does_not_matter():
    x, y = _data()
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    owner, owner_permuted = teacher_of(x, 13, seed=42, labels=y), teacher_of(x[perm], 13, seed=42, labels=y[perm])
    assert np.array_equal(owner[perm.numpy()], owner_permuted)


def test_the_same_seed_gives_the_same_shards_and_another_seed_other_shards():
    x, y = _data()
    a, b, c = (partition(x, 13, seed=s, labels=y) for s in (5, 5, 6))
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))
    # the label is part of the example
    assert not np.array_equal(teacher_of(x, 13, seed=5, labels=y), teacher_of(x, 13, seed=5, labels=(y + 1) % 5))


@pytest.mark.parametrize("n, k", [(60000, 250), (1003, 10), (7, 7), (3, 5)])
def test_shards_are_disjoint_complete_and_sorted(n, k):
    shards = partition(n, k, seed=3)
    assert len(shards) == k
    together = np.concatenate(shards)
    assert len(together) == n and np.array_equal(np.sort(together), np.arange(n))  # each example exactly once
    assert all(np.all(np.diff(s) > 0) for s in shards)


def test_shard_sizes_are_binomial_around_n_over_t():
    n, k = 30000, 60
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    sizes = np.array([len(s) for s in partition(x, k, seed=11, labels=torch.zeros(n, dtype=torch.long))])
    # each size is Binomial(n, 1/k); with all k at once (Bonferroni) outside these bounds w.p. <= 1e-6
    low, high = stats.binom.ppf([0.5e-6 / k, 1 - 0.5e-6 / k], n, 1 / k)
    assert sizes.sum() == n and low <= sizes.min() and sizes.max() <= high
    # and spread like a binomial, not like an equal split: chi-square test of uniform assignment
    assert stats.chisquare(sizes).pvalue > 1e-6


def test_expected_empty_shards_depends_on_n_and_t_only():
    assert expected_empty_shards(1438, 40) < 1e-6
    assert expected_empty_shards(100, 100) == pytest.approx(100 * 0.99 ** 100)
    assert expected_empty_shards(5, 1) == 0.0


# ---- inputs read on demand ---------------------------------------------------------------------------


def test_memory_mapped_rows_are_identified_by_their_bytes(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (400, 1, 6, 6), dtype=np.uint8)
    y = rng.integers(0, 3, 400)
    np.save(tmp_path / "x.npy", x)
    source = NpyRows(open_npy(tmp_path / "x.npy"), name="x")
    rows = rng.permutation(400)[:300]  # a training split: a subset of the file's rows, in any order
    owner = teacher_of(MappedRows(source, rows), 7, seed=1, labels=y[rows])
    keep = np.delete(np.arange(300), 123)
    assert np.array_equal(teacher_of(MappedRows(source, rows[keep]), 7, seed=1, labels=y[rows][keep]), owner[keep])
    # the raw stored row with its label: the same identity as those bytes held in memory
    assert np.array_equal(owner, teacher_of(x[rows], 7, seed=1, labels=y[rows]))


def test_an_image_folder_identifies_each_file_by_its_path_without_reading_it(tmp_path):
    from PIL import Image

    from engine.image_folder import ImageFileRows

    files = []
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(30):
            path = tmp_path / c / f"{i:03d}.png"
            Image.fromarray(np.full((4, 4), i * 8 + (c == "dog"), np.uint8)).save(path)
            files.append(path)
    source = ImageFileRows(files, name="folder")
    source.read = None  # the assignment must not decode any image
    y = np.array([0] * 30 + [1] * 30)
    owner = teacher_of(MappedRows(source), 4, seed=2, labels=y)
    keep = np.delete(np.arange(60), [0, 45])
    assert np.array_equal(teacher_of(MappedRows(source, keep), 4, seed=2, labels=y[keep]), owner[keep])
    # the path relative to the folder: the same folder elsewhere gives the same teachers
    moved = ImageFileRows([Path("/elsewhere") / p.parent.name / p.name for p in files[:1]] + files[1:], name="f")
    moved.read = None
    assert np.array_equal(teacher_of(MappedRows(moved), 4, seed=2, labels=y), owner)


# ---- shards of any size train and vote -----------------------------------------------------------------


_momentum = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def test_an_empty_shard_is_padded_and_its_teacher_votes_untrained():
    index, lengths = shard_matrix([np.array([], np.int64), np.array([4, 9])])
    assert lengths.tolist() == [0, 2] and index.shape == (2, 2)
    empty_only, empty_lengths = shard_matrix([np.array([], np.int64)] * 3)
    assert empty_only.shape == (3, 0) and empty_lengths.tolist() == [0, 0, 0]

    x, y = _data(40)
    shards = [np.arange(0, 25), np.array([], np.int64), np.arange(25, 40), np.array([], np.int64)]
    initial = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5, num_teachers=4, seed=3)
    for group_size in (4, 1):  # empty shards among others, and groups of nothing but an empty shard
        models = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5, num_teachers=4, seed=3)
        teachers = train_teachers(models, x, y, shards, epochs=3, batch_size=8, make_optimizer=_momentum, seed=0,
                                  group_size=group_size)
        assert teachers.shard_sizes.tolist() == [25, 0, 15, 0] and teachers.epochs_done == 3
        for k in (1, 3):  # an empty shard's teacher keeps its initial weights
            for name, value in initial[k].state_dict().items():
                assert torch.equal(teachers.member_state_dict(k)[name], value)
        assert not torch.equal(teachers.member_state_dict(0)["1.weight"], initial[0].state_dict()["1.weight"])
        votes = vote_counts(teachers.predict(x[:11]), 5)
        assert votes.shape == (11, 5) and np.all(votes.sum(axis=1) == 4)


def _alone(model: torch.nn.Module, x, y, shard: np.ndarray, *, teacher: int, epochs: int, batch_size: int,
           make_optimizer, seed: int) -> dict[str, torch.Tensor]:
    """Teacher `teacher` trained by itself on its shard, the textbook loop, in train_group's order."""
    generator = teacher_generator(seed, teacher)
    optimizer = make_optimizer(list(model.parameters()))
    for _ in range(epochs):
        order = epoch_order(generator, len(shard))
        for s in range(0, len(shard), batch_size):
            rows = torch.as_tensor(shard)[order[s : s + batch_size]]
            optimizer.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_a_teacher_in_a_group_trains_as_it_would_alone_whatever_the_other_shards(optimizer):
    """The stacked group gives teacher k exactly the model the textbook loop gives it on its shard alone:
    the other teachers' shard sizes (how many steps the group takes) do not reach it."""
    make = {"sgd": functools.partial(torch.optim.SGD, lr=0.2), "momentum": _momentum}[optimizer]
    x, y = _data(120)
    shards = [np.arange(0, 10), np.arange(10, 70), np.array([], np.int64), np.arange(70, 93)]
    kwargs = dict(epochs=3, batch_size=8, make_optimizer=make, seed=7)
    models = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5,
                            num_teachers=4, seed=1)
    alone = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5, num_teachers=4, seed=1)
    teachers = train_teachers(models, x, y, shards, group_size=4, **kwargs)
    for k, shard in enumerate(shards):
        expected = _alone(alone[k], x, y, shard, teacher=k, **kwargs)
        for name, value in expected.items():
            torch.testing.assert_close(teachers.member_state_dict(k)[name], value, rtol=1e-5, atol=1e-6)


def test_an_adam_teacher_in_a_group_trains_as_it_would_alone():
    make = functools.partial(torch.optim.Adam, lr=0.01)
    x, y = _data(120)
    shards = [np.arange(0, 10), np.arange(10, 70)]
    kwargs = dict(epochs=3, batch_size=8, make_optimizer=make, seed=7)
    models = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5, num_teachers=2, seed=1)
    alone = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5, num_teachers=2, seed=1)
    teachers = train_teachers(models, x, y, shards, group_size=2, **kwargs)
    expected = _alone(alone[0], x, y, shards[0], teacher=0, **kwargs)
    for name, value in expected.items():
        torch.testing.assert_close(teachers.member_state_dict(0)[name], value, rtol=1e-5, atol=1e-6)


_ADAMS = {
    "adam": functools.partial(torch.optim.Adam, lr=0.01),
    "adam_fused": functools.partial(torch.optim.Adam, lr=0.01, fused=True),  # what engine.pate.run makes
    "adamw": functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("optimizer", sorted(_ADAMS))
@pytest.mark.parametrize("model", ["logistic", "mlp"])
def test_adam_teachers_of_very_unequal_shards_train_as_they_would_alone(optimizer, model):
    """Shards of 3, 107, 0 and 40 examples in one group: each teacher ends as torch's Adam trains it alone
    (to float32 rounding: the stacked forward and backward round differently from a single model's), and
    the empty shard's teacher keeps its initial weights exactly."""
    x, y = _data(150)
    shards = [np.arange(0, 3), np.arange(3, 110), np.array([], np.int64), np.arange(110, 150)]
    kwargs = dict(epochs=3, batch_size=8, make_optimizer=_ADAMS[optimizer], seed=7)
    models = build_teachers(model, input_shape=(1, 4, 4), num_classes=5, num_teachers=4, seed=1)
    alone = build_teachers(model, input_shape=(1, 4, 4), num_classes=5, num_teachers=4, seed=1)
    initial = {name: value.clone() for name, value in alone[2].state_dict().items()}
    teachers = train_teachers(models, x, y, shards, group_size=4, **kwargs)
    for k, shard in enumerate(shards):
        expected = _alone(alone[k], x, y, shard, teacher=k, **kwargs)
        for name, value in expected.items():
            torch.testing.assert_close(teachers.member_state_dict(k)[name], value, rtol=1e-5, atol=1e-6)
    for name, value in initial.items():
        assert torch.equal(teachers.member_state_dict(2)[name], value)


@pytest.mark.parametrize("model, shape", [("mnist_cnn", (1, 28, 28)), ("mlp", (1, 4, 4))])
def test_an_adam_teacher_is_bit_for_bit_the_same_whatever_the_other_shards_of_its_group(model, shape):
    """Teacher 0 (37 examples) beside a shard of 0, 1, 39 or 250 examples: the same weights to the bit,
    though the group takes from 5 to 96 steps (grouped convolutions included)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, *shape, generator=g), torch.randint(0, 5, (300,), generator=g)
    trained = []
    for other in (0, 1, 39, 250):
        shards = [np.arange(0, 37), np.arange(50, 50 + other)]
        models = build_teachers(model, input_shape=shape, num_classes=5, num_teachers=2, seed=1)
        teachers = train_teachers(models, x, y, shards, group_size=2, epochs=2, batch_size=8,
                                  make_optimizer=_ADAMS["adam_fused"], seed=7)
        trained.append(teachers.member_state_dict(0))
    for other in trained[1:]:
        assert all(torch.equal(other[name], value) for name, value in trained[0].items())


# ---- MemberAdam: torch's Adam, one member at a time ------------------------------------------------------


@pytest.mark.parametrize("make", [
    functools.partial(torch.optim.Adam),
    functools.partial(torch.optim.Adam, lr=0.01, weight_decay=0.1),
    functools.partial(torch.optim.Adam, foreach=True),
    functools.partial(torch.optim.Adam, lr=0.05, fused=True),
    functools.partial(torch.optim.Adam, amsgrad=True, maximize=True, betas=(0.8, 0.99), eps=1e-3),
    functools.partial(torch.optim.AdamW),
    functools.partial(torch.optim.AdamW, fused=True, weight_decay=0.3, amsgrad=True),
], ids=["default", "weight_decay", "foreach", "fused", "amsgrad_maximize", "adamw", "adamw_fused_amsgrad"])
def test_member_adam_steps_each_member_bit_for_bit_as_torch_adam_steps_it_alone(make):
    """The same gradients, members stepping on different steps (member 2 never): each member's parameters
    equal, bit for bit, those of torch's optimizer (same settings) on that member alone, and only its own
    steps count in its bias correction."""
    k, steps = 5, 12
    g = torch.Generator().manual_seed(0)
    shapes = [(k, 7, 3), (k, 3), (k, 2, 1, 3, 3)]
    initial = [torch.randn(shape, generator=g) for shape in shapes]
    grads = [[torch.randn(shape, generator=g) for shape in shapes] for _ in range(steps)]
    active = [[j for j in range(k) if j != 2 and torch.rand((), generator=g) < 0.6] for _ in range(steps)]
    stacked = [torch.nn.Parameter(t.clone()) for t in initial]
    optimizer = for_members(make(stacked))
    assert isinstance(optimizer, MemberAdam)
    for t in range(steps):
        for p, grad in zip(stacked, grads[t]):
            p.grad = grad.clone()
        optimizer.step(members=active[t])
    for j in range(k):
        alone = [torch.nn.Parameter(t[j].clone()) for t in initial]
        reference = make(alone)
        for t in range(steps):
            if j in active[t]:
                for p, grad in zip(alone, grads[t]):
                    p.grad = grad[j].clone()
                reference.step()
        assert all(torch.equal(a.detach(), s.detach()[j]) for a, s in zip(alone, stacked))
        assert optimizer.state[stacked[0]]["step"][j] == sum(j in a for a in active)
    assert all(torch.equal(s.detach()[2], t[2]) for s, t in zip(stacked, initial))


def test_only_a_fresh_adam_becomes_member_adam():
    params = [torch.nn.Parameter(torch.zeros(3, 2))]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    assert for_members(sgd) is sgd
    converted = for_members(torch.optim.AdamW(params, lr=0.02, betas=(0.5, 0.6), weight_decay=0.3))
    assert isinstance(converted, MemberAdam)
    group = converted.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"], group["decoupled_weight_decay"]) == \
        (0.02, (0.5, 0.6), 0.3, True)
    used = torch.optim.Adam(params)
    params[0].grad = torch.ones(3, 2)
    used.step()
    assert for_members(used) is used  # its state is torch's; converting it would lose it


def test_a_group_with_only_empty_shards_trains_nothing_and_does_not_fail():
    models = build_teachers("logistic", input_shape=(1, 4, 4), num_classes=5, num_teachers=2, seed=0)
    xs, ys = torch.zeros(2, 0, 1, 4, 4), torch.zeros(2, 0, dtype=torch.long)
    group = train_group(models, xs, ys, np.array([0, 0]), first_teacher=0, epochs=2, batch_size=4,
                        make_optimizer=_momentum, seed=0)
    assert group.epochs_done == 2 and group.loss_sums == [0.0, 0.0]


# ---- a whole run --------------------------------------------------------------------------------------


def test_a_digits_pate_run_with_empty_shards_finishes():
    """Small N/T: some teachers get no example; the plan warns from N and T alone and the run finishes."""
    data = load_dataset("digits", seed=0)
    teachers = data.num_train // 3  # about e^-3 of the teachers get nothing
    config = RunConfig(dataset="digits", mechanism="pate", num_teachers=teachers, teacher_model="logistic",
                       teacher_epochs=2, teacher_batch_size=8, optimizer="sgd", learning_rate=0.1,
                       aggregator="gnmax", gnmax_sigma=2.0, num_queries=60, model="logistic", student_epochs=1,
                       delta=1e-5, seed=3, device="cpu")
    events = []
    run = prepare_pate(config, data, emit=lambda kind, **payload: events.append((kind, payload)))
    assert any(kind == "warning" and "no example at all" in p["message"] for kind, p in events)
    run.vote_sink = lambda rows: None
    result = run.train()
    assert result.stop_reason == "completed" and result.queries_processed == 60
    assert all(sum(json.loads(row["histogram"])) == teachers for row in result.vote_rows)
    sizes = [len(s) for s in partition(data.x_train, teachers, seed=_shard_seed(config), labels=data.y_train)]
    assert min(sizes) == 0 and sum(sizes) == data.num_train


def _shard_seed(config: RunConfig) -> int:
    from engine.pate.run import _seed

    return _seed(config, 1)
