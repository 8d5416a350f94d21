"""DP-SGD on torch.distributed (engine.dpsgd.distributed, engine.distributed_launch): real processes
talking gloo on the CPU, the noise statistically, the privacy and accuracy against a single-process
run, a killed rank, and the ranks' weights."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from scipy import stats
from torch import nn

from engine.cli import cli
from engine.distributed_launch import Launch, check_distributable
from engine.dpsgd.distributed import DataParallel
from engine.errors import ConfigError, DPWError
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]
DIGITS = """
name = "{name}"
dataset = "digits"
model = "mlp"
mechanism = "dpsgd"
noise_multiplier = 1.0
clipping_norm = 1.0
delta = 1e-5
expected_batch_size = 64
epochs = {epochs}
learning_rate = {learning_rate}
optimizer = "{optimizer}"
evaluations_per_epoch = 1
seed = 0
"""
SIGMA, CLIP, STEPS, WIDTH = 0.8, 2.5, 60, 200  # 12,000 noise coordinates per rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _noise_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One rank: DP-SGD steps of a bias-free linear model on all-zero inputs (every data gradient is 0,
    so the update is the noise alone, times 1 / expected batch size)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from engine.dpsgd.trainer import DPSGDStep
    from engine.randomness import PrivateRandomness

    parallel = DataParallel.from_environment()
    parallel.start()
    model = nn.Linear(WIDTH // 2, 2, bias=False)
    nn.init.zeros_(model.weight)
    step = DPSGDStep(model, torch.optim.SGD(model.parameters(), lr=0.0), clipping_norm=CLIP,
                     noise_multiplier=SIGMA, expected_batch_size=10, max_physical_batch_size=8,
                     noise_generator=PrivateRandomness().torch_generator("dpsgd_noise"), data_parallel=parallel)
    noise, batches = [], []
    for i in range(STEPS):
        size = 3 + rank + i % 4  # batches of different sizes on the two ranks
        step(torch.zeros(size, WIDTH // 2), torch.zeros(size, dtype=torch.long))
        noise.append(model.weight.grad.reshape(-1) * 10)
        batches.append(parallel.last_batch_size)
    digests = parallel.parameters_digest(model)
    parallel.stop()
    torch.save({"noise": torch.stack(noise), "batches": batches, "digests": digests},
               Path(out_dir) / f"rank{rank}.pt")


def test_noise_is_added_once_per_step_with_std_sigma_times_c(tmp_path):
    mp.spawn(_noise_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert torch.equal(ranks[0]["noise"], ranks[1]["noise"])  # every rank applies rank 0's noisy total
    assert ranks[0]["batches"] == [(3 + i % 4) + (4 + i % 4) for i in range(STEPS)]  # global batch sizes
    noise = ranks[0]["noise"].double().numpy().ravel()
    std = SIGMA * CLIP
    # n * s^2 / std^2 ~ chi2(n): twice the noise (added on both ranks) would be a variance of 2 std^2.
    statistic = float(np.sum(noise**2) / std**2)
    assert stats.chi2.ppf(1e-4, noise.size) < statistic < stats.chi2.ppf(1 - 1e-4, noise.size)
    assert stats.kstest(noise / std, "norm").pvalue > 1e-4
    assert abs(noise.std() / std - 1) < 0.03
    assert ranks[0]["digests"][0] == ranks[0]["digests"][1]


def test_each_rank_samples_its_own_disjoint_shard():
    from engine.datasets import load_dataset

    data = load_dataset("digits", seed=0)
    ranks = [DataParallel(rank=r, world_size=3) for r in range(3)]
    shards = [p.shard(data) for p in ranks]
    assert sum(s.num_train for s in shards) == data.num_train
    assert all(p.num_train == data.num_train for p in ranks)  # epochs and q*N count in the whole split
    rows = torch.cat([s.x_train for s in shards]).reshape(data.num_train, -1)
    assert torch.unique(rows, dim=0).shape[0] == torch.unique(data.x_train.reshape(data.num_train, -1), dim=0).shape[0]
    assert shards[0].x_test.shape[0] == data.x_test.shape[0] and shards[1].x_test.shape[0] == 0
    assert len({p.sampling_purpose for p in ranks}) == 3  # independent streams, even with reproducible_noise


def test_launch_flags_are_torchruns_and_mistakes_are_one_line():
    assert "--standalone" in Launch(nproc=2).torchrun_args()
    multi = Launch(nproc=4, nnodes=2, node_rank=1, master_addr="10.0.0.1").torchrun_args()
    assert multi[multi.index("--master-port") + 1] == "29500" and multi[multi.index("--node-rank") + 1] == "1"
    for bad in (Launch(nproc=0), Launch(nnodes=2, node_rank=2, master_addr="h"), Launch(nnodes=2)):
        with pytest.raises(DPWError):
            bad.check()

    class Pate:
        mechanism, audit_canaries = "pate", 0

    with pytest.raises(ConfigError, match="mechanism"):
        check_distributable(Pate())


def _dpw(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=REPO, text=True, **kwargs)


def _config(tmp_path: Path, name: str, epochs: int, optimizer: str = "sgd", learning_rate: float = 1.0) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(DIGITS.format(name=name, epochs=epochs, optimizer=optimizer, learning_rate=learning_rate))
    return str(path)


def test_two_processes_spend_the_single_process_epsilon_and_learn_as_well(tmp_path):
    from engine.config import RunConfig
    from engine.runs import prepare

    db = str(tmp_path / "runs.sqlite")
    config = _config(tmp_path, "digits", epochs=2)
    proc = _dpw("run", config, "--db", db, "--json", "--nproc", "2", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    store = Store(db)
    assert len(store.list_runs()) == 1  # one logical run, one row
    distributed = store.get_run(1)
    single = prepare(RunConfig.load_toml(config))  # the same config in this one process
    result = single.train()
    assert distributed["sample_rate"] == single.plan.sample_rate
    assert distributed["noise_multiplier"] == single.plan.noise_multiplier
    assert distributed["steps_done"] == result.steps_done
    assert (distributed["epsilon"], distributed["delta"], distributed["accountant"]) == (
        result.epsilon.value, result.epsilon.delta, result.epsilon.accountant)
    assert distributed["summary"]["distributed"] == {"world_size": 2, "noise_added_by": "rank 0",
                                                     "parameters_identical": True}
    # Digits, 2 epochs: single-process runs land at 0.85-0.91 from one secret noise draw to the next.
    assert abs(distributed["accuracy"] - result.test_accuracy) < 0.08
    assert distributed["accuracy"] > 0.75
    events = [e["type"] for e in store.events(1)]  # one event stream, written by rank 0 alone
    assert events.count("started") == 1 and events.count("finished") == 1
    assert {row["step"] for row in store.privacy(1)} == set(range(1, result.steps_done + 1))
    shown = CliRunner().invoke(cli, ["show", "1", "--db", db])
    assert "processes      2 (torch.distributed; the noise added once per step, by rank 0)" in shown.output
    from engine.report import build_report

    guarantee = build_report(store, 1, figures=False)["guarantee"]  # the report and the model card say whom it trusts
    assert guarantee["processes"]["count"] == 2 and guarantee["processes"]["noise_added_by"] == "rank 0"
    assert "noise was added once per step in total, by rank 0 alone" in guarantee["statement"]
    assert "all 2 processes and the machines they ran on are trusted" in guarantee["statement"]
    assert "processes" not in build_report(_single_run_store(tmp_path), 1, figures=False)["guarantee"]


def _single_run_store(tmp_path: Path) -> Store:
    """A store with one finished digits run of one process (the report's statement without processes)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_export_report import train_in_store

    store = Store(tmp_path / "single.sqlite")
    train_in_store(store, name="single", dataset="digits", noise_multiplier=1.0, epochs=1, expected_batch_size=64)
    return store


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _open_files(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.add(os.readlink(fd))
        except OSError:
            continue
    return found


def test_a_killed_rank_fails_the_run_with_its_privacy_spent_recorded(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    # momentum: the optimizer has state that a continued run must restore on every rank
    proc = _dpw("run", _config(tmp_path, "long", epochs=6, optimizer="momentum", learning_rate=0.2), "--db", db,
                "--json", "--nproc", "2",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        privacy_events = 0
        while privacy_events < 30:  # past the first evaluation (step 23) and its checkpoint
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            privacy_events += json.loads(line)["type"] == "privacy"
        runners = [p for p in _descendants(proc.pid) if b"engine.runner" in Path(f"/proc/{p}/cmdline").read_bytes()]
        rank0, rank1 = ([p for p in runners if _rank_of(p) == rank] for rank in (0, 1))
        assert len(rank0) == len(rank1) == 1
        assert db in _open_files(rank0[0]) and db not in _open_files(rank1[0])  # only rank 0 holds the store
        os.kill(rank1[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    run = Store(db).get_run(1)
    assert run["status"] == "failed", run
    assert run["epsilon"] is not None and run["epsilon"] > 0  # the ledger kept what the steps spent
    assert run["steps_done"] is None or run["steps_done"] < run["steps_planned"]
    assert "Traceback" not in err.split("error:")[-1]
    # rank 0 kept its checkpoint: the run goes on in two processes again, every rank from the
    # checkpoint's weights, momentum and step (a rank starting elsewhere would end with other weights,
    # or wait for steps the others never take), its epsilon that of all its steps
    from engine import privacy

    resumed = CliRunner().invoke(cli, ["resume", "1", "--db", db, "--nproc", "2"])
    assert resumed.exit_code == 0, resumed.output
    second = Store(db).get_run(2)
    assert second["status"] == "finished" and second["steps_done"] == second["steps_planned"]
    assert second["summary"]["distributed"]["world_size"] == 2
    assert second["summary"]["distributed"]["parameters_identical"] is True
    evaluated = {m["step"] for m in Store(db).metrics(1, "test_accuracy")}  # a checkpoint at each evaluation
    assert second["steps_resumed"] in evaluated and second["steps_resumed"] <= run["steps_done"]
    whole = privacy.dpsgd_epsilon(sample_rate=second["sample_rate"], noise_multiplier=1.0,
                                  steps=second["steps_done"], delta=1e-5)
    assert second["epsilon"] == pytest.approx(whole.value, rel=1e-9)
