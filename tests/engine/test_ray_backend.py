"""PATE teachers on Ray (engine.pate.ray_backend): the same teachers as the local backend, a whole
PATE run with teachers_backend = "ray", stopping, and the one-line error without Ray.

A local Ray with 2 CPUs is started once for the module; the tests skip only when ray is not
importable (install the dev or cluster extra)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.errors import ConfigError
from engine.pate.ray_backend import RaySession, import_ray, train_teachers_on_ray
from engine.pate.run import prepare_pate
from engine.pate.shards import partition
from engine.precheck import check_before_storing
from engine.pate.teachers import build_teachers, train_teachers, vote_counts
from engine.runs import train_subset

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[dev]' (or the cluster extra)")


@pytest.fixture(scope="module")
def session():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the Ray workers (one CPU each), so both backends compute alike
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RaySession()
    ray.shutdown()
    torch.set_num_threads(threads)


def _digits():
    data = load_dataset("digits", seed=0)
    return data.x_train, data.y_train, data.x_test


# Picklable by reference in the workers (a function of this test module would not be importable there).
_sgd = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def test_ray_teachers_equal_local_teachers_for_the_same_seed(session):
    x, y, x_query = _digits()
    shards = partition(x, 7, seed=3, labels=y)
    kwargs = dict(epochs=3, batch_size=16, make_optimizer=_sgd, seed=11, group_size=3, model_name="digits_cnn")
    local = train_teachers(build_teachers("digits_cnn", input_shape=(1, 8, 8), num_classes=10, num_teachers=7,
                                          seed=5), x, y, shards, **kwargs)
    on_ray = train_teachers_on_ray(build_teachers("digits_cnn", input_shape=(1, 8, 8), num_classes=10,
                                                  num_teachers=7, seed=5), x, y, shards, session=session, **kwargs)
    assert on_ray.num_teachers == local.num_teachers == 7 and on_ray.group_sizes == [3, 3, 1]
    assert on_ray.epochs_done == 3 and on_ray.num_classes == 10
    for k in range(7):  # every teacher's weights, fetched back from the object store
        remote, here = on_ray.member_state_dict(k), local.member_state_dict(k)
        assert remote.keys() == here.keys()
        for name in here:
            torch.testing.assert_close(remote[name], here[name], rtol=1e-5, atol=1e-6)
    assert on_ray.train_loss == pytest.approx(local.train_loss, rel=1e-5)
    votes_ray = vote_counts(on_ray.predict(x_query), 10)
    votes_local = vote_counts(local.predict(x_query), 10)
    assert np.array_equal(votes_ray, votes_local)
    assert votes_ray.sum(axis=1).tolist() == [7] * len(x_query)


def test_ray_teachers_on_memory_mapped_images_equal_local_teachers_in_memory(session, tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = rng.integers(0, 90, (300, 1, 8, 8), dtype=np.uint8)
    for k in range(3):
        x[y == k, 0, 2 * k : 2 * k + 2, :] = 250
    (tmp_path / "arrays").mkdir()
    np.save(tmp_path / "arrays" / "x.npy", x)
    np.save(tmp_path / "arrays" / "y.npy", y)
    np.savez(tmp_path / "same.npz", x=x, y=y)
    mapped, in_memory = load_dataset(tmp_path / "arrays"), load_dataset(tmp_path / "same.npz")
    assert not isinstance(mapped.x_train, torch.Tensor)  # read on demand: shards are gathered a group at a time
    shards = partition(mapped.x_train, 5, seed=1, labels=mapped.y_train)
    kwargs = dict(epochs=2, batch_size=8, make_optimizer=_sgd, seed=3, group_size=2)

    def teachers():
        return build_teachers("digits_cnn", input_shape=(1, 8, 8), num_classes=3, num_teachers=5, seed=2)

    on_ray = train_teachers_on_ray(teachers(), mapped.x_train, mapped.y_train, shards, session=session, **kwargs)
    local = train_teachers(teachers(), in_memory.x_train, in_memory.y_train, shards, **kwargs)
    for k in range(5):
        for name, value in local.member_state_dict(k).items():
            torch.testing.assert_close(on_ray.member_state_dict(k)[name], value, rtol=1e-5, atol=1e-6)
    assert np.array_equal(vote_counts(on_ray.predict(in_memory.x_test), 3),
                          vote_counts(local.predict(mapped.x_test[0 : mapped.num_test]), 3))


def test_ray_teachers_with_unequal_and_empty_shards_equal_local_teachers(session):
    """A teacher with no example is trained as nothing (initial weights) and votes, on Ray as locally."""
    x, y, x_query = _digits()
    shards = partition(x, 4, seed=3, labels=y)
    shards = [shards[0], np.array([], np.int64), shards[2], np.array([], np.int64)]
    kwargs = dict(epochs=2, batch_size=16, make_optimizer=_sgd, seed=11, group_size=2)

    def teachers():
        return build_teachers("logistic", input_shape=(1, 8, 8), num_classes=10, num_teachers=4, seed=5)

    local = train_teachers(teachers(), x, y, shards, **kwargs)
    on_ray = train_teachers_on_ray(teachers(), x, y, shards, session=session, **kwargs)
    assert on_ray.shard_sizes.tolist() == local.shard_sizes.tolist() == [len(shards[0]), 0, len(shards[2]), 0]
    initial = teachers()
    for k in range(4):
        for name, value in local.member_state_dict(k).items():
            torch.testing.assert_close(on_ray.member_state_dict(k)[name], value, rtol=1e-5, atol=1e-6)
            if k in (1, 3):
                assert torch.equal(value, initial[k].state_dict()[name])
    assert np.array_equal(vote_counts(on_ray.predict(x_query), 10), vote_counts(local.predict(x_query), 10))


def test_a_changed_seed_changes_the_ray_teachers(session):
    x, y, _ = _digits()
    shards = partition(len(x), 4, seed=3)
    runs = [train_teachers_on_ray(build_teachers("logistic", input_shape=(1, 8, 8), num_classes=10, num_teachers=4,
                                                 seed=5), x, y, shards, epochs=1, batch_size=16, make_optimizer=_sgd,
                                  seed=seed, group_size=2, session=session) for seed in (1, 1, 2)]
    weights = [r.member_state_dict(3)["1.weight"] for r in runs]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_stopping_cancels_the_ray_tasks_and_keeps_fewer_teachers(session):
    x, y, _ = _digits()
    shards = partition(len(x), 8, seed=0)
    teachers = train_teachers_on_ray(build_teachers("digits_cnn", input_shape=(1, 8, 8), num_classes=10,
                                                    num_teachers=8, seed=0), x, y, shards, epochs=400, batch_size=8,
                                     make_optimizer=_sgd, seed=0, group_size=1, session=session,
                                     should_stop=lambda: True)
    assert teachers.num_teachers < 8


def test_a_pate_run_on_ray_votes_like_the_local_backend(session, mnist_dir: Path):
    values = dict(dataset="mnist", data_dir=str(mnist_dir.parent), mechanism="pate", num_teachers=10,
                  teacher_model="mlp", teacher_epochs=2, teacher_batch_size=32, optimizer="adam", learning_rate=0.003,
                  aggregator="gnmax", gnmax_sigma=2.0, num_queries=150, model="mlp", student_epochs=1, delta=1e-5,
                  seed=4, device="cpu")
    data = load_dataset("mnist", data_dir=mnist_dir.parent)
    data = train_subset(data, 2000, seed=0)
    histograms, ensemble_accuracy, events = {}, {}, []
    for backend in ("local", "ray"):
        config = RunConfig(teachers_backend=backend, **values)
        run = prepare_pate(config, data, emit=lambda kind, **payload: events.append((backend, kind, payload)))
        run.vote_sink = lambda rows: None
        result = run.train()
        assert result.stop_reason == "completed" and result.queries_processed == 150
        histograms[backend] = [row["histogram"] for row in result.vote_rows]
        ensemble_accuracy[backend] = result.ensemble_accuracy
        assert result.student is not None and result.student.steps > 0
    # The votes are the same; the aggregation noise (drawn on the driver, secret) is not shipped:
    # PrivateRandomness refuses to be pickled, so a task that carried it could not have run.
    assert histograms["ray"] == histograms["local"]
    assert ensemble_accuracy["ray"] == ensemble_accuracy["local"] > 0.5
    losses = {b: [p["value"] for k, kind, p in events if k == b and kind == "metric"
                  and p["name"] == "teacher_train_loss"] for b in ("local", "ray")}
    assert len(losses["ray"]) == len(losses["local"]) > 0
    assert ray.is_initialized()  # a Ray the run did not start is left running


def test_ray_backend_without_ray_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is not installed
    with pytest.raises(ConfigError) as info:
        import_ray()
    assert str(info.value) == "teachers_backend: is 'ray' but Ray is not installed"
    assert "dp-workbench[cluster]" in info.value.hint and "\n" not in info.value.hint
    # The check before a run is stored (dpw run, the window's form) says the same, naming the field.
    config = RunConfig(dataset="digits", mechanism="pate", num_teachers=10, teacher_epochs=1, num_queries=20,
                       threshold=8.0, teachers_backend="ray", delta=1e-4)
    with pytest.raises(ConfigError) as info:
        check_before_storing(config)
    assert info.value.field == "teachers_backend" and "dp-workbench[cluster]" in info.value.hint
