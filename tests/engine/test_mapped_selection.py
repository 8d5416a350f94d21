"""Selecting rows keeps data larger than memory mapped (engine.array_data.take_rows): a `--nproc`
rank's shard, a `train_subset` and PATE's public pool and held-out split are views over a memory map
that read nothing until a step asks, and hold exactly the rows the in-memory selection holds."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.array_data import MappedGrid, MappedRows, NpyRows, take_rows
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.dpsgd.distributed import DataParallel
from engine.pate import teachers as pate_teachers
from engine.pate.shards import partition, shard_matrix
from engine.pate.teachers import build_teachers, train_teachers
from engine.runs import prepare, train_subset
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]


def _images(n: int, classes: int = 4, seed: int = 0, size: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Noise images with a bright class-specific band: easy to learn, different in every row."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.integers(0, 80, (n, 1, size, size), dtype=np.uint8)
    for k in range(classes):
        x[y == k, 0, 2 * k : 2 * k + 2, :] = 240
    return x, y


def _mapped_and_in_memory(tmp_path: Path, n: int = 600, n_test: int | None = None) -> tuple[Path, Path]:
    """The same images as a folder of .npy files (memory-mapped) and as an .npz (loaded)."""
    x, y = _images(n)
    folder = tmp_path / "arrays"
    folder.mkdir()
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    arrays = dict(x=x, y=y)
    if n_test is not None:
        arrays.update(zip(("x_test", "y_test"), _images(n_test, seed=1)))
        np.save(folder / "x_test.npy", arrays["x_test"])
        np.save(folder / "y_test.npy", arrays["y_test"])
    np.savez_compressed(tmp_path / "same.npz", **arrays)
    return folder, tmp_path / "same.npz"


def _same_rows(mapped: MappedRows, in_memory: torch.Tensor) -> bool:
    return isinstance(mapped, MappedRows) and torch.equal(mapped[:], in_memory)


def test_take_rows_gives_a_mapped_view_and_indexes_a_tensor_as_before(tmp_path):
    folder, npz = _mapped_and_in_memory(tmp_path, n=200)
    mapped, in_memory = load_dataset(folder, seed=0).x_train, load_dataset(npz, seed=0).x_train
    for rows in (torch.tensor([7, 3, 3, 0, -1]), np.array([5, 1]), slice(10, 50, 3), slice(None), slice(0, 0),
                 torch.arange(len(in_memory)) % 3 == 0):
        view = take_rows(mapped, rows)
        assert isinstance(view, MappedRows), rows
        assert torch.equal(view[:], in_memory[rows]), rows
        assert torch.equal(take_rows(in_memory, rows), in_memory[rows]), rows
    nested = take_rows(take_rows(mapped, slice(20, None)), torch.tensor([4, 0]))  # a view of a view
    assert torch.equal(nested[:], in_memory[[24, 20]])
    with pytest.raises(IndexError):
        take_rows(mapped, torch.tensor([len(in_memory)]))


def test_a_ranks_shard_is_a_mapped_view_over_the_rows_of_the_in_memory_shard(tmp_path):
    folder, npz = _mapped_and_in_memory(tmp_path)
    mapped, in_memory = load_dataset(folder, seed=0), load_dataset(npz, seed=0)
    for rank in range(3):
        a = DataParallel(rank=rank, world_size=3).shard(mapped)
        b = DataParallel(rank=rank, world_size=3).shard(in_memory)
        assert _same_rows(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
        assert _same_rows(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
        assert a.num_test == (in_memory.num_test if rank == 0 else 0)  # only rank 0 evaluates
        assert a.x_train.source is mapped.x_train.source  # the same memory map, nothing copied
    assert sum(DataParallel(rank=r, world_size=3).shard(mapped).num_train for r in range(3)) == mapped.num_train


def test_a_train_subset_is_a_mapped_view_over_the_rows_of_the_in_memory_subset(tmp_path):
    folder, npz = _mapped_and_in_memory(tmp_path)
    mapped = train_subset(load_dataset(folder, seed=0), 150, seed=4)
    in_memory = train_subset(load_dataset(npz, seed=0), 150, seed=4)
    assert mapped.num_train == 150 and _same_rows(mapped.x_train, in_memory.x_train)
    assert torch.equal(mapped.y_train, in_memory.y_train) and mapped.split == in_memory.split
    assert isinstance(mapped.x_test, MappedRows)


def test_dp_sgd_with_a_train_subset_on_mapped_data_trains_the_model_it_trains_in_memory(tmp_path):
    folder, npz = _mapped_and_in_memory(tmp_path, n=700, n_test=100)
    runs = []
    for dataset in (folder, npz):
        config = RunConfig(dataset=str(dataset), mechanism="dpsgd", model="mlp", epochs=2, expected_batch_size=50,
                           noise_multiplier=1.0, clipping_norm=1.0, learning_rate=0.5, delta=1e-4, train_subset=400,
                           reproducible_noise=True, seed=2, device="cpu")
        run = prepare(config)
        runs.append((run, run.train()))
    (mapped, mapped_result), (in_memory, in_memory_result) = runs
    assert isinstance(mapped.data.x_train, MappedRows) and mapped.data.num_train == 400
    for (name, a), (_, b) in zip(mapped.model.state_dict().items(), in_memory.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert mapped_result.test_accuracy == in_memory_result.test_accuracy > 0.8


def test_two_processes_train_on_a_mapped_folder_with_a_train_subset(tmp_path):
    """`dpw run --nproc 2` on x.npy/y.npy: each rank's shard of the subset is read on demand."""
    folder, _ = _mapped_and_in_memory(tmp_path, n=700, n_test=100)
    config = tmp_path / "mapped.toml"
    config.write_text(f"""
name = "mapped"
dataset = "{folder}"
model = "mlp"
mechanism = "dpsgd"
train_subset = 400
noise_multiplier = 1.0
clipping_norm = 1.0
delta = 1e-4
expected_batch_size = 50
epochs = 2
learning_rate = 0.5
seed = 2
device = "cpu"
""")
    db = tmp_path / "runs.sqlite"
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(db), "--json",
                           "--nproc", "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = Store(db).get_run(1)
    assert run["num_train"] == 400 and run["steps_done"] == 16  # 2 epochs x 400 / 50, the whole subset's q
    assert run["summary"]["distributed"] == {"world_size": 2, "noise_added_by": "rank 0",
                                             "parameters_identical": True}
    assert run["accuracy"] > 0.8


def _pate_config(dataset: Path) -> RunConfig:
    return RunConfig(dataset=str(dataset), mechanism="pate", train_subset=500, num_teachers=5, teacher_model="mlp",
                     teacher_epochs=4, teacher_batch_size=16, optimizer="adam", learning_rate=0.01,
                     aggregator="confident", threshold=3.0, sigma1=1.0, sigma2=0.5, num_queries=60,
                     public_pool_size=80, model="mlp", student_epochs=3, delta=1e-4, seed=1,
                     reproducible_noise=True, device="cpu")


def test_pate_on_mapped_data_keeps_pool_and_holdout_mapped_and_trains_what_it_trains_in_memory(tmp_path):
    folder, npz = _mapped_and_in_memory(tmp_path, n=600, n_test=200)
    runs = []
    for dataset in (folder, npz):
        run = prepare(_pate_config(dataset))
        runs.append((run, run.train()))
    (mapped, mapped_result), (in_memory, in_memory_result) = runs
    assert isinstance(mapped.data.x_train, MappedRows) and mapped.data.num_train == 500
    assert _same_rows(mapped.x_pool, in_memory.x_pool) and len(mapped.x_pool) == 80
    assert _same_rows(mapped.x_holdout, in_memory.x_holdout) and len(mapped.x_holdout) == 120
    assert mapped_result.vote_rows == in_memory_result.vote_rows  # the same teachers, votes and answers
    assert sum(row["answered"] for row in mapped_result.vote_rows) > 0
    for (name, a), (_, b) in zip(mapped.model.state_dict().items(), in_memory.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert mapped_result.test_accuracy == in_memory_result.test_accuracy > 0.5


def test_teachers_on_a_group_too_large_to_gather_read_each_batch_and_equal_teachers_in_memory(tmp_path,
                                                                                               monkeypatch):
    folder, npz = _mapped_and_in_memory(tmp_path, n=300)
    mapped, in_memory = load_dataset(folder, seed=0), load_dataset(npz, seed=0)
    shards = partition(mapped.num_train, 4, seed=1)
    reads: list[int] = []

    class CountingRows(NpyRows):  # the real reader, recording how many rows each read asks for
        def read(self, rows):
            reads.append(len(rows))
            return super().read(rows)

    mapped.x_train.source.__class__ = CountingRows
    kwargs = dict(epochs=2, batch_size=8, make_optimizer=functools.partial(torch.optim.SGD, lr=0.1), seed=3,
                  group_size=4)

    def teachers():
        return build_teachers("mlp", input_shape=(1, 10, 10), num_classes=4, num_teachers=4, seed=2)

    monkeypatch.setattr(pate_teachers, "GATHER_BYTES", 0)  # no group fits: every step reads its batch
    on_disk = train_teachers(teachers(), mapped.x_train, mapped.y_train, shards, **kwargs)
    here = train_teachers(teachers(), in_memory.x_train, in_memory.y_train, shards, **kwargs)
    steps = 2 * -(-max(len(s) for s in shards) // 8)
    assert len(reads) == steps + 1 and max(reads) == 4 * 8  # a batch per teacher per step, then x[:1]
    for k in range(4):
        for name, value in here.member_state_dict(k).items():
            assert torch.equal(on_disk.member_state_dict(k)[name], value), (k, name)
    grid = pate_teachers.gather_shards(mapped.x_train, mapped.y_train, shard_matrix(shards)[0])[0]
    assert isinstance(grid, MappedGrid) and grid.shape == (4, max(len(s) for s in shards), 1, 10, 10)
    assert np.array_equal(grid.numpy(), in_memory.x_train[torch.as_tensor(shard_matrix(shards)[0])].numpy())


def test_pate_on_ray_votes_on_mapped_pool_and_holdout_as_the_local_backend(tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[dev]' (or the cluster extra)")
    folder, _ = _mapped_and_in_memory(tmp_path, n=600, n_test=200)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the Ray workers (one CPU each), so both backends compute alike
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        runs = {}
        for backend in ("ray", "local"):
            run = prepare(dataclasses.replace(_pate_config(folder), teachers_backend=backend))
            runs[backend] = (run, run.train())
    finally:
        ray.shutdown()
        torch.set_num_threads(threads)
    (on_ray, ray_result), (local, local_result) = runs["ray"], runs["local"]
    assert isinstance(on_ray.x_pool, MappedRows) and isinstance(on_ray.x_holdout, MappedRows)
    assert [r["histogram"] for r in ray_result.vote_rows] == [r["histogram"] for r in local_result.vote_rows]
    assert ray_result.ensemble_accuracy == local_result.ensemble_accuracy  # voted on the mapped held-out split
    assert ray_result.test_accuracy is not None and ray_result.test_accuracy > 0.5


_PEAK_SCRIPT = r"""
import json, resource, sys
from pathlib import Path
import numpy as np, torch
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.dpsgd.distributed import DataParallel
from engine.runs import prepare, train_subset

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

folder = Path(sys.argv[1])
data = load_dataset(folder, seed=0)
before = peak_mb()
shard = DataParallel(rank=0, world_size=2).shard(data)
subset = train_subset(data, data.num_train // 2, seed=1)
pate = prepare(RunConfig(dataset=str(folder), mechanism="pate", num_teachers=2, num_queries=10, threshold=1.0,
                         sigma1=0.5, sigma2=0.5,
                         train_subset=data.num_train // 2, teacher_model="mlp", model="mlp", device="cpu"))
kept = [shard.x_train, shard.x_test, subset.x_train, pate.data.x_train, pate.x_pool, pate.x_holdout]
print(json.dumps({"grew_mb": peak_mb() - before, "kinds": sorted({type(x).__name__ for x in kept})}))
"""


def test_selecting_rows_of_mapped_data_reads_none_of_them(tmp_path):
    """Peak memory: a shard, a subset and a PATE run's pool over 160 MB of images grow the process's
    peak resident memory by far less than the rows they select (the in-memory way copies 80 MB each)."""
    folder = tmp_path / "big"
    folder.mkdir()
    n = 200_000  # 200k rows of 28x28 uint8: 157 MB
    x = np.lib.format.open_memmap(folder / "x.npy", mode="w+", dtype=np.uint8, shape=(n, 1, 28, 28))
    for start in range(0, n, 50_000):
        x[start : start + 50_000] = np.arange(start, start + 50_000, dtype=np.int64)[:, None, None, None] % 251
    x.flush()
    del x
    np.save(folder / "y.npy", np.arange(n) % 10)
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(folder)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["kinds"] == ["MappedRows"]
    assert result["grew_mb"] < 40, result
