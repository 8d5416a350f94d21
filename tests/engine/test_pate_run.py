"""PATE runs end to end on real MNIST: the runner process fills the votes table, accounts privacy
per query, stops at the budget, saves only the student; and the example configs run shortened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import RunConfig
from engine.events import decode
from engine.privacy import pate as analysis
from engine.runner import execute
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "resources" / "examples"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_pate(mnist_dir: Path, **changes) -> dict:
    """20 small teachers on 4,000 training images, 300 queries: a few seconds."""
    values = dict(
        name="pate-small",
        dataset="mnist",
        data_dir=str(mnist_dir.parent),
        mechanism="pate",
        train_subset=4000,
        num_teachers=20,
        teacher_model="mlp",
        teacher_epochs=8,
        teacher_batch_size=32,
        optimizer="adam",
        learning_rate=0.003,
        aggregator="confident",
        threshold=13.0,
        sigma1=4.0,
        sigma2=2.0,
        num_queries=300,
        model="mlp",
        student_epochs=5,
        delta=1e-5,
        seed=1,
    )
    values.update(changes)
    return values


def test_real_mnist_pate_run_through_the_runner_fills_the_votes_table(tmp_path, mnist_dir):
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**small_pate(mnist_dir)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "engine.runner", str(run_id), "--db", str(store.path)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    events = [e for e in map(decode, proc.stdout.splitlines()) if e]
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["mechanism"] == "pate" and run["stop_reason"] == "completed"

    votes = store.votes(run_id)
    assert [v["query_index"] for v in votes] == list(range(300))
    assert all(sum(v["histogram"]) == 20 and len(v["histogram"]) == 10 for v in votes)
    assert all((v["label"] is None) == (not v["answered"]) for v in votes)
    after = np.array([v["epsilon_after"] for v in votes])
    assert np.all(np.diff(after) >= -1e-12)
    assert np.allclose(np.cumsum([v["epsilon_cost"] for v in votes]), after)
    answered = np.array([v["answered"] for v in votes])
    assert 0 < answered.sum() < 300

    # The stored votes reproduce the run's epsilon with the pure analysis.
    hist = np.array([v["histogram"] for v in votes])
    res = analysis.pate_epsilon(votes=hist, mechanism="confident", threshold=13.0, sigma1=4.0, sigma2=2.0,
                                answered=answered, delta=1e-5)
    assert run["summary"]["epsilon_data_dependent"] == pytest.approx(res.epsilon_data_dependent, rel=1e-9)
    assert after[-1] == pytest.approx(res.epsilon_data_dependent, rel=1e-9)
    # The run's epsilon is its guarantee, the data-independent bound (the release is an estimate).
    assert run["epsilon"] == run["summary"]["epsilon_data_independent"]
    assert run["accountant"] == "pate-di" and run["steps_done"] == 300

    batches = [e for e in events if e["type"] == "vote_batch"]
    assert sum(b["count"] for b in batches) == 300 and len(batches) == 3
    assert sum(b["answered"] for b in batches) == answered.sum()
    assert sum(b["rejected"] for b in batches) == 300 - answered.sum()
    privacy = store.privacy(run_id)
    assert {p["accountant"] for p in privacy} == {"pate-dd", "pate-di", "pate-released"}
    assert [p["step"] for p in privacy if p["accountant"] == "pate-dd"] == [100, 200, 300]
    teacher_acc = store.metrics(run_id, "teacher_accuracy")
    assert len(teacher_acc) == 20 and all(0.5 < m["value"] <= 1 for m in teacher_acc)

    summary = run["summary"]
    assert summary["answered"] == answered.sum() and summary["queries"] == 300
    assert summary["epsilon_data_dependent"] <= summary["epsilon_data_independent"]
    assert summary["epsilon_released"] > 0 and summary["release"]["conditions_hold"] in (True, False)
    # The student learned (chance is 0.1): about 215 noisy labels and 5 epochs give 0.47-0.69 over 13
    # runs, and the aggregation noise is secret, so the bound leaves room for its spread.
    assert run["accuracy"] == summary["test_accuracy"] > 0.3

    # Only the student leaves the engine.
    arts = store.artifacts(run_id)
    assert [a["kind"] for a in arts] == ["model"]
    files = list(Path(arts[0]["path"]).parent.iterdir())
    assert [f.name for f in files] == ["model.pt"]
    saved = torch.load(arts[0]["path"], weights_only=False)
    assert saved["model"] == "mlp" and saved["config"]["mechanism"] == "pate"
    assert not any("teacher" in json.dumps(e) and e["type"] == "artifact" for e in events)


def test_budget_stops_answering_before_the_query_that_would_exceed_it(tmp_path, mnist_dir):
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**small_pate(mnist_dir, epsilon_budget=15.0, teacher_epochs=3,
                                                     student_epochs=2, pate_budget_on="data-dependent")))
    status = execute(store, run_id, stream=open(os.devnull, "w"))
    run = store.get_run(run_id)
    assert status == "finished" and run["stop_reason"] == "budget"
    votes = store.votes(run_id)
    assert 0 < len(votes) < 300 and run["steps_done"] == len(votes)
    dd = run["summary"]["epsilon_data_dependent"]
    assert dd <= 15.0 and votes[-1]["epsilon_after"] == pytest.approx(dd)
    warnings = [e for e in store.events(run_id) if e["type"] == "warning"]
    assert any(f"stopped before query {len(votes) + 1}" in w["message"] for w in warnings)


def test_budget_on_the_data_independent_epsilon_is_the_default_and_stops_sooner(tmp_path, mnist_dir):
    # Where the teachers stop must not depend on the private votes unless the user asks for it.
    assert RunConfig(mechanism="pate").pate_budget_on == "data-independent"
    done = {}
    for on in ("data-independent", "data-dependent"):
        store = Store(tmp_path / f"{on}.sqlite")
        run_id = store.create_run(RunConfig(**small_pate(mnist_dir, epsilon_budget=15.0, teacher_epochs=3,
                                                         student_epochs=1, pate_budget_on=on)))
        assert execute(store, run_id, stream=open(os.devnull, "w")) == "finished"
        run = store.get_run(run_id)
        assert run["stop_reason"] == "budget"
        di = store.privacy(run_id, "pate-di")[-1]["epsilon"]
        done[on] = (run["steps_done"], run["summary"]["epsilon_data_dependent"], di)
    queries, dd, di = done["data-independent"]
    assert di <= 15.0 and dd <= di  # every reported epsilon is within the budget
    assert done["data-dependent"][0] > queries and done["data-dependent"][1] <= 15.0


def test_votes_are_stored_batch_by_batch_while_the_run_goes_on(tmp_path, mnist_dir):
    # A window reading the store sees every released batch as soon as its vote_batch event arrives.
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**small_pate(mnist_dir, teacher_epochs=2, student_epochs=1)))
    seen = []

    class Watch:
        def write(self, line: str) -> None:
            event = decode(line)
            if event and event["type"] == "vote_batch":
                stored = store.votes(run_id)
                seen.append((event["first_query"] + event["count"], len(stored), store.get_run(run_id)["status"]))

        def flush(self) -> None:
            pass

    assert execute(store, run_id, stream=Watch()) == "finished"
    assert [s[0] for s in seen] == [100, 200, 300]
    assert all(done == stored and status == "running" for done, stored, status in seen)
    assert [v["query_index"] for v in store.votes(run_id)] == list(range(300))  # each query once


def test_stopping_during_teacher_training_saves_nothing(tmp_path, mnist_dir):
    from engine.runs import prepare

    config = RunConfig(**small_pate(mnist_dir, teacher_epochs=50))
    prepared = prepare(config)
    calls = iter(range(10_000))
    result = prepared.train(should_stop=lambda: next(calls) > 20)
    assert result.stop_reason == "stopped" and result.queries_processed == 0 and not result.vote_rows
    assert prepared.run_fields(result)["steps_done"] == 0


@pytest.mark.parametrize("example", ["pate-mnist-quick.toml", "pate-mnist.toml"])
def test_example_configs_run_shortened(tmp_path, mnist_dir, example):
    config = RunConfig.load_toml(EXAMPLES / example)
    assert config.mechanism == "pate"
    short = config.replace(data_dir=str(mnist_dir.parent), train_subset=2000, num_teachers=10,
                           teacher_model="logistic", teacher_epochs=1, num_queries=50,
                           threshold=min(config.threshold, 8.0), model="logistic", student_epochs=1,
                           semi_supervised=False, epsilon_budget=None)
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(short)
    assert execute(store, run_id, stream=open(os.devnull, "w")) == "finished"
    assert store.table_counts(run_id)["votes"] == 50


def test_release_parameters_come_from_public_settings_unless_asked_otherwise():
    from engine.errors import ConfigError
    from engine.pate.run import release_parameters
    from engine.privacy import pate_smooth

    config = RunConfig(mechanism="pate", num_teachers=50, threshold=40.0, sigma1=30.0, sigma2=8.0, num_queries=450)
    expected = pate_smooth.data_independent_parameters(mechanism="confident", num_teachers=50, num_queries=450,
                                                       num_classes=10, delta=config.delta, threshold=40.0,
                                                       sigma1=30.0, sigma2=8.0)
    assert release_parameters(config, 10) == {"order": expected.order, "beta": expected.beta,
                                              "sigma_ss": expected.sigma_ss}
    fixed_order = release_parameters(config.replace(release_order=12.0), 10)
    assert fixed_order["order"] == 12.0 and fixed_order["beta"] < 1 / 24
    assert release_parameters(config.replace(release_parameters="data-dependent"), 10) == {}
    assert release_parameters(config.replace(release_parameters="data-dependent", release_sigma=5.0), 10) == {
        "sigma_ss": 5.0}
    assert release_parameters(config.replace(aggregator="lnmax"), 10) == {}
    with pytest.raises(ConfigError, match="release_beta"):
        RunConfig(mechanism="pate", release_order=20.0, release_beta=0.03)
    with pytest.raises(ConfigError, match="release_beta"):
        release_parameters(config.replace(release_beta=0.4), 10)


def test_a_release_at_an_order_where_its_conditions_fail_is_not_published(tmp_path, mnist_dir):
    """release_order 8 with sigma2 2: C5-C6, on which the release's local-sensitivity bound rests, fail
    there, so the released estimate is kept as a diagnostic and not shown."""
    from engine.privacy.pate_smooth import check_conditions
    from engine.publication import publishable_epsilon

    assert not all(check_conditions(sigma=2.0, num_classes=10, order=8.0))
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**small_pate(mnist_dir, teacher_epochs=2, student_epochs=1, num_queries=100,
                                                     release_order=8.0)))
    assert execute(store, run_id, stream=open(os.devnull, "w")) == "finished"
    run = store.get_run(run_id)
    summary = run["summary"]
    assert summary["release"]["conditions_hold"] is False and summary["epsilon_released"] is None
    eps = publishable_epsilon(run)
    assert eps.value == pytest.approx(summary["epsilon_data_independent"]) and eps.accountant == "pate-di"
    assert run["epsilon"] == pytest.approx(summary["epsilon_data_independent"])
    assert not store.privacy(run_id, "pate-released")  # no released value in the ledger
    warnings = [e["message"] for e in store.events(run_id) if e["type"] == "warning"]
    assert any("no estimate of the data-dependent epsilon is shown" in w for w in warnings)


def test_a_test_split_sorted_by_class_gives_every_class_to_the_pool_and_the_held_out_part(tmp_path):
    """An image folder lists its files class by class, so its test split is sorted by class. Taken
    in that order, the pool (and so the first queries) held only the first classes and the held-out
    part only the last: the student scored 0% on 8 held-out images of a class it never saw. Now such
    a split is shuffled with the seed; the standard test files keep their published order."""
    from PIL import Image

    from engine.audit_run import _held_out_rows
    from engine.pate.shards import AS_STORED, SHUFFLED, public_order_for
    from engine.runs import prepare

    rng = np.random.default_rng(0)
    for label in range(3):
        folder = tmp_path / "pictures" / f"class_{label}"
        folder.mkdir(parents=True)
        for i in range(60):
            Image.fromarray(rng.integers(0, 256, (6, 6), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    config = RunConfig(dataset=str(tmp_path / "pictures"), mechanism="pate", num_teachers=3, teacher_model="mlp",
                       model="mlp", aggregator="gnmax", gnmax_sigma=2.0, num_queries=6, delta=1e-4, seed=4)
    events = []
    run = prepare(config, emit=lambda kind, **fields: events.append(dict(fields, type=kind)))
    assert set(run.data.y_test.tolist()) == {0, 1, 2} and run.data.y_test.tolist() == sorted(run.data.y_test.tolist())
    # In file order the six queries were all class 0 and the 4 held-out images all class 2.
    assert len(set(run.y_pool[:6].tolist())) > 1 and len(set(run.y_holdout.tolist())) > 1
    assert set(run.y_pool.tolist()) == {0, 1, 2}
    assert len(run.y_pool) + len(run.y_holdout) == run.data.num_test
    plan = next(e for e in events if e["type"] == "plan")
    assert plan["public_order"] == SHUFFLED

    class Recorded:  # the audit finds the very held-out rows the run used, from its plan event
        def plan_event(self, _):
            return plan

    held_out = _held_out_rows(Recorded(), {"id": 1}, run.data.num_test, config.seed)
    assert torch.equal(run.data.y_test[held_out], run.y_holdout)
    assert public_order_for("mnist") == public_order_for("CIFAR-10") == AS_STORED
    assert public_order_for("digits") == public_order_for(str(tmp_path / "pictures")) == SHUFFLED


def test_a_release_tuned_on_the_votes_is_not_used(tmp_path, mnist_dir):
    """release_parameters = "data-dependent" picks the release's order, beta and sigma by looking at the
    votes: its estimate does not cover that choice, so it is not shown."""
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**small_pate(mnist_dir, teacher_epochs=3, student_epochs=1,
                                                     release_parameters="data-dependent")))
    assert execute(store, run_id, stream=open(os.devnull, "w")) == "finished"
    run = store.get_run(run_id)
    summary = run["summary"]
    assert summary["release"]["parameters_from_data"] is True and summary["epsilon_released"] is None
    assert run["accountant"] == "pate-di" and run["epsilon"] == summary["epsilon_data_independent"]
    assert store.privacy(run_id, "pate-released") == []
    warnings = [e["message"] for e in store.events(run_id) if e["type"] == "warning"]
    assert any("chosen from the votes" in w and "it is not shown" in w for w in warnings)
