"""Tuning studies: their files, how many candidates a private study runs, and the epsilon every view
states for a study's runs (real runs on the bundled digits, real stores, the real `dpw`)."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from engine import rounding
from engine.cli import cli
from engine.config import RunConfig
from engine.errors import ConfigError, DPWError
from engine.export import export_run
from engine.privacy.rdp import DEFAULT_ORDERS, compute_rdp, rdp_to_epsilon
from engine.privacy.tuning import repeat_and_select_rdp, tuning_epsilon
from engine.publication import EXPLORATORY_NOTE, publishable_epsilon, run_epsilon
from engine.report import build_report
from engine.runner import execute
from engine.store import SCHEMA_VERSION, Store
from engine.study import StudyPlan, composition_epsilon, plan_candidates, private_study_epsilon, run_study
from engine.study_config import StudyConfig

REPO = Path(__file__).resolve().parents[2]
TRAIN = 300  # digits training subset: N is public in every plan, so the tests can recompute the epsilon
BASE = {"name": "base", "dataset": "digits", "model": "mlp", "mechanism": "dpsgd", "noise_multiplier": 1.0,
        "clipping_norm": 1.0, "delta": 1e-5, "expected_batch_size": 60, "epochs": 1, "learning_rate": 1.0,
        "evaluations_per_epoch": 1, "train_subset": TRAIN, "seed": 0}


def study(**values) -> StudyConfig:
    """A study of BASE (values set to None are left out of the file)."""
    base = {**BASE, **values.pop("base", {})}
    raw = {"name": "s", "mode": "private", "mean_runs": 3, "space": {"learning_rate": [0.5, 1.0]}, **values}
    return StudyConfig.from_dict({**{k: v for k, v in raw.items() if v is not None}, "base": base})


def launcher(store: Store):
    """Execute each candidate in this process, as the runner does (no progress on the test's output)."""
    return lambda run_id: execute(store, run_id, stream=open(os.devnull, "w"))


def training_rdp(noise_multiplier: float, steps: int = 5) -> np.ndarray:
    return compute_rdp(sample_rate=BASE["expected_batch_size"] / TRAIN, noise_multiplier=noise_multiplier,
                       steps=steps, orders=DEFAULT_ORDERS)


# ---- the study file -------------------------------------------------------------------------------
@pytest.mark.parametrize("values, field, words", [
    ({"mode": "tuning"}, "mode", "is not one of private, composition, exploratory"),
    ({"mean_run": 3}, "mean_run", "did you mean 'mean_runs'"),
    ({"search": "grid"}, "search", "drawn at random"),
    ({"num_candidates": 4}, "num_candidates", "at random"),
    ({"mean_runs": None}, "mean_runs", "needs the mean number"),
    ({"mean_runs": 0.5}, "mean_runs", "out of range"),
    ({"shape": -2}, "shape", "above -1"),
    ({"space": {"momentum": [0.9]}}, "space.momentum", "cannot be searched"),
    ({"space": {"learning_rate": []}}, "space.learning_rate", "non-empty list"),
    ({"space": {"epochs": [1, 0]}}, "space.epochs", "out of range"),
    ({"space": {"noise_multiplier": [1.0], "target_epsilon": [2.0]}}, "space.target_epsilon", "together"),
    ({"base": {"epochs": -1}}, "base.epochs", "out of range"),
    ({"base": {"mechanism": "none"}}, "base.mechanism", "DP-SGD or PATE"),
    ({"base": {"mechanism": "pate"}, "space": {"clipping_norm": [1.0]}}, "space.clipping_norm",
     "cannot be searched with mechanism = 'pate'"),
    ({"space": {"num_teachers": [10]}}, "space.num_teachers", "cannot be searched with mechanism = 'dpsgd'"),
    ({"space": {"seed": [1, 2]}}, "space.seed", "cannot be searched in a study"),
    ({"mode": "composition"}, "mean_runs", "private studies only"),
    ({"mode": "exploratory", "mean_runs": None, "search": "random"}, "num_candidates", "number of runs"),
])
def test_study_file_errors_name_the_field(values, field, words):
    with pytest.raises(ConfigError) as caught:
        study(**values)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ") and words in f"{caught.value} {caught.value.hint}"


def test_a_noise_setting_in_the_space_replaces_the_bases():
    config = study(base={"noise_multiplier": None, "target_epsilon": 3.0}, space={"noise_multiplier": [0.8, 1.2]})
    candidate = config.candidate({"noise_multiplier": 0.8})
    assert candidate.noise_multiplier == 0.8 and candidate.target_epsilon is None
    assert candidate.name == "s (noise_multiplier=0.8)"  # not its place in the study, which would tell K


@pytest.mark.parametrize("values", [{}, {"shape": "poisson"}, {"mode": "composition", "mean_runs": None},
                                    {"mode": "exploratory", "mean_runs": None, "search": "random",
                                     "num_candidates": 3}])
def test_a_study_reads_back_as_the_studies_table_keeps_it(values):
    config = study(**values)
    assert StudyConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_dpw_study_refuses_a_bad_file_in_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\nmode = "private"\nmean_runs = 3\n[base]\ndataset = "digits"\nnoise_multiplier = 1.0'
                    '\n[space]\nlearning_rate = [0.0]\n')
    result = CliRunner().invoke(cli, ["study", str(path), "--db", str(tmp_path / "runs.sqlite")])
    assert result.exit_code == 1
    assert result.output.startswith("error: space.learning_rate: ") and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "runs.sqlite").exists() or not Store(tmp_path / "runs.sqlite").list_studies()


@pytest.mark.parametrize("path", sorted((REPO / "resources" / "examples").glob("study-*.toml")), ids=lambda p: p.name)
def test_every_example_study_is_valid_and_points_nowhere_private(path):
    config = StudyConfig.load_toml(path)
    assert config.name == path.stem
    assert "../shared" not in path.read_text()


# ---- the number of candidates ---------------------------------------------------------------------
def test_a_private_study_draws_its_number_of_runs_from_secret_randomness():
    config = study(mean_runs=8, space={"learning_rate": [0.5, 1.0, 2.0]})
    first = [len(plan_candidates(config).configs) for _ in range(25)]
    second = [len(plan_candidates(config).configs) for _ in range(25)]
    assert first != second  # same config and seed, fresh OS entropy each time
    assert 4 < np.mean(first + second) < 14
    seeded = study(mean_runs=8, space={"learning_rate": [0.5, 1.0, 2.0]}, base={"reproducible_noise": True})
    assert len({len(plan_candidates(seeded).configs) for _ in range(10)}) == 1  # reproducible from the seed
    other_seed = study(mean_runs=8, space={"learning_rate": [0.5, 1.0, 2.0]}, base={"seed": 1})
    assert [len(plan_candidates(other_seed).configs) for _ in range(25)] != first


def test_a_grid_runs_every_combination_and_a_public_random_search_is_reproducible():
    grid = study(mode="composition", mean_runs=None, search="grid",
                 space={"learning_rate": [0.5, 1.0], "clipping_norm": [0.5, 1.0, 2.0]})
    assert len(plan_candidates(grid).settings) == 6
    random = study(mode="exploratory", mean_runs=None, search="random", num_candidates=5)
    assert plan_candidates(random).settings == plan_candidates(random).settings


def test_a_private_study_that_draws_no_candidate_releases_nothing(tmp_path):
    config = study(shape="poisson", mean_runs=1)  # P[K = 0] = 1/e; the empty draw is fixed here
    store = Store(tmp_path / "runs.sqlite")
    result = run_study(config, store, launcher(store), plan=StudyPlan([], []))
    row = store.get_study(result.study_id)
    assert row["status"] == "finished" and row["released_run_id"] is None and row["num_candidates"] == 0
    assert row["epsilon"] == pytest.approx(private_study_epsilon(config, TRAIN).value)
    assert store.list_runs() == []


# ---- the study's epsilon ----------------------------------------------------------------------------
def test_the_private_epsilon_is_tuning_epsilon_when_the_score_costs_nothing():
    config = study(mean_runs=5, shape=0.5, score_noise_multiplier=1e9)
    expected = tuning_epsilon(sample_rate=BASE["expected_batch_size"] / TRAIN, noise_multiplier=1.0, steps=5,
                              delta=1e-5, mean_runs=5, shape=0.5)
    assert private_study_epsilon(config, TRAIN).value == pytest.approx(expected.epsilon.value, rel=1e-9)
    assert expected.epsilon.value > expected.single_run.value


def test_the_private_epsilon_covers_the_noisiest_setting_and_the_score():
    config = study(space={"noise_multiplier": [0.7, 1.5]}, score_noise_multiplier=3.0)
    curve = np.maximum(training_rdp(0.7), training_rdp(1.5)) + DEFAULT_ORDERS / (2 * 3.0**2)
    expected = rdp_to_epsilon(orders=DEFAULT_ORDERS, delta=1e-5, rdp=repeat_and_select_rdp(
        orders=DEFAULT_ORDERS, rdp=curve, mean_runs=3, shape=1.0))
    assert private_study_epsilon(config, TRAIN).value == pytest.approx(expected.value, rel=1e-9)
    stored = StudyConfig.from_dict(json.loads(json.dumps(config.to_dict())))  # as the studies table keeps it
    assert private_study_epsilon(stored, TRAIN).value == pytest.approx(expected.value, rel=1e-12)


@pytest.fixture(scope="module")
def private_study(tmp_path_factory):
    """A private study of two candidates, run for real; K's draw is tested above, so the plan is fixed here."""
    config = study(space={"learning_rate": [0.5, 2.0]}, score_noise_multiplier=2.0)
    store = Store(tmp_path_factory.mktemp("private") / "runs.sqlite")
    settings = [{"learning_rate": 0.5}, {"learning_rate": 2.0}]
    plan = StudyPlan(settings, [config.candidate(s) for s in settings])
    result = run_study(config, store, launcher(store), plan=plan)
    return config, store, result


def test_a_private_study_releases_its_best_candidate_with_the_studys_epsilon(private_study):
    config, store, result = private_study
    assert result.status == "finished" and len(result.run_ids) == 2
    assert result.released_run_id == max(result.scores, key=result.scores.get)
    released = store.get_run(result.released_run_id)
    eps = publishable_epsilon(released)
    assert eps.value == pytest.approx(private_study_epsilon(config, TRAIN).value)
    assert eps.accountant == "rdp-repeat-and-select" and eps.guarantee
    single = run_epsilon(released).value
    assert single is not None and eps.value > single  # never the lone run's
    listed = json.loads(CliRunner().invoke(cli, ["list", "--db", str(store.path), "--json"]).output)
    assert {r["id"]: r["epsilon"] for r in listed}[result.released_run_id] == pytest.approx(eps.value)
    shown = json.loads(CliRunner().invoke(cli, ["show", str(result.released_run_id), "--db", str(store.path),
                                                "--json"]).output)
    assert shown["run"]["epsilon"] == pytest.approx(eps.value)
    report = build_report(store, result.released_run_id, figures=False)
    assert report["guarantee"]["epsilon"] == pytest.approx(eps.value)
    assert "covers the search" in report["guarantee"]["statement"]
    assert "2 runs" not in report["guarantee"]["statement"]  # K is not part of what a private study releases
    assert any("covers the search" in caveat for caveat in report["caveats"])
    from engine.attack_risk import run_attack_risk

    study_risk, lone_risk = run_attack_risk(released), run_attack_risk({**released, "study": None})
    assert study_risk.basis.startswith("private tuning study") and study_risk.publishable_epsilon == eps.value
    assert study_risk.risk.max_advantage > lone_risk.risk.max_advantage  # the lone run's would understate it
    # The membership audit: the study runs it on the run it released; a candidate not released is
    # skipped (its audit would be refused), without a note per candidate.
    from engine.audit_job import MEMBERSHIP_AUDIT_KEY, audit_after_training

    assert MEMBERSHIP_AUDIT_KEY in released["summary"]
    other = next(r for r in result.run_ids if r != result.released_run_id)
    assert audit_after_training(store, other) is None
    assert MEMBERSHIP_AUDIT_KEY not in (store.get_run(other)["summary"] or {})


def test_a_candidate_that_was_not_released_is_never_exported(private_study, tmp_path):
    _, store, result = private_study
    (withheld,) = [r for r in result.run_ids if r != result.released_run_id]
    with pytest.raises(DPWError, match="not released"):
        export_run(store, withheld, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DPWError, match="never exported or reported"):
        build_report(store, withheld, figures=False)
    cli_result = CliRunner().invoke(cli, ["export", str(withheld), "--db", str(store.path), "--out",
                                          str(tmp_path / "out")])
    assert cli_result.exit_code == 1 and cli_result.output.startswith("error: run ")
    assert f"use the released run {result.released_run_id}" in cli_result.output
    assert len(cli_result.output.strip().splitlines()) == 1
    assert publishable_epsilon(store.get_run(withheld)).value is None


def dp_accounting_composition(noise_multipliers, steps: int = 5, delta: float = 1e-5) -> float:
    """The composition of DP-SGD runs on BASE's data by dp-accounting's PLD (connect the dots, an upper
    bound like ours): an independent value for a composition study's epsilon."""
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    q = BASE["expected_batch_size"] / TRAIN
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)), steps) for s in noise_multipliers]))
    return float(accountant.get_epsilon(delta))


def test_a_composition_study_states_the_pld_composition_of_its_runs(tmp_path):
    config = study(mode="composition", mean_runs=None, search="grid", space={"noise_multiplier": [0.8, 1.5]})
    store = Store(tmp_path / "runs.sqlite")
    result = run_study(config, store, launcher(store))
    expected = dp_accounting_composition([0.8, 1.5])
    assert result.epsilon.accountant == "pld-composition"
    assert result.epsilon.value == pytest.approx(expected, rel=1e-4)
    rdp = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=training_rdp(0.8) + training_rdp(1.5), delta=1e-5)
    assert result.epsilon.value < rdp.value  # PLD is the tighter of the two sound compositions
    for run_id in result.run_ids:
        run = store.get_run(run_id)
        assert run["status"] == "finished"
        assert publishable_epsilon(run).value == pytest.approx(result.epsilon.value)
        assert publishable_epsilon(run).value > run_epsilon(run).value


def test_a_composition_study_stopped_early_states_the_steps_its_runs_took(tmp_path):
    """A study whose second run was stopped before its 5 steps stated the composition of both runs'
    planned steps (more than they spent, and not what the ledger said for the same runs)."""
    from engine.runner import StopFlag

    class StopAfter(StopFlag):
        def __init__(self, steps: int):
            super().__init__()
            self.left = steps

        def __call__(self) -> bool:
            self.left -= 1
            return self.left < 0

    config = study(mode="composition", mean_runs=None, search="grid", space={"noise_multiplier": [0.8, 1.5]})
    store = Store(tmp_path / "runs.sqlite")
    stops = iter([StopFlag(), StopAfter(3)])
    result = run_study(config, store, lambda run_id: execute(store, run_id, stream=open(os.devnull, "w"),
                                                             stop=next(stops)))
    first, second = (store.get_run(r)["steps_done"] for r in result.run_ids)
    assert result.status == "stopped" and first == 5 and 0 < second < 5
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    q = BASE["expected_batch_size"] / TRAIN
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    runs = [dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)), steps)
            for s, steps in ((0.8, 5), (1.5, second))]
    accountant.compose(dpa.ComposedDpEvent(runs))
    assert result.epsilon.value == pytest.approx(float(accountant.get_epsilon(1e-5)), rel=1e-4)
    assert result.epsilon.value < dp_accounting_composition([0.8, 1.5])  # what both planned runs would spend
    assert store.get_study(result.study_id)["epsilon"] == pytest.approx(result.epsilon.value)


def test_a_composition_study_is_never_below_a_run_it_releases(tmp_path):
    """A candidate accounted by RDP states a larger epsilon than the PLD of the same steps: the study's
    epsilon, which covers that run among others, must not read below the run's own."""
    config = study(mode="composition", mean_runs=None, search="grid", base={"accountant": "rdp"},
                   space={"learning_rate": [1.0]})
    store = Store(tmp_path / "runs.sqlite")
    result = run_study(config, store, launcher(store))
    run = store.get_run(result.run_ids[0])
    own = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=training_rdp(1.0), delta=1e-5).value
    assert run_epsilon(run).value == pytest.approx(own)
    assert dp_accounting_composition([1.0]) < own  # the PLD alone would read below the run's own
    assert result.epsilon.value == pytest.approx(own)
    assert publishable_epsilon(run).value == pytest.approx(own)


def test_an_exploratory_studys_report_says_the_selection_is_not_covered(tmp_path):
    config = study(mode="exploratory", mean_runs=None, search="grid", space={"learning_rate": [0.5, 2.0]})
    store = Store(tmp_path / "runs.sqlite")
    result = run_study(config, store, launcher(store))
    assert result.epsilon is None and result.released_run_id in result.run_ids
    sentence = EXPLORATORY_NOTE.format(n=2)
    assert sentence == "selected among 2 runs on the same data; the selection is not covered by this epsilon"
    report = build_report(store, result.released_run_id, figures=False)
    assert sentence in report["guarantee"]["statement"]
    assert report["guarantee"]["epsilon"] == pytest.approx(run_epsilon(store.get_run(result.released_run_id)).value)
    shown = CliRunner().invoke(cli, ["show", str(result.released_run_id), "--db", str(store.path)])
    assert sentence in shown.output
    export_run(store, result.released_run_id, tmp_path / "out")
    card = json.loads((tmp_path / "out" / "model_card.json").read_text())
    assert sentence in card["privacy"]["statement"]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads processes' environments from /proc")
def test_dpw_study_runs_its_candidates_in_runner_processes_and_leaves_none_behind(tmp_path):
    """Each candidate's runner is loaded on standby ahead of it; none is left when the study ends, nor
    when its data check refuses it (which, as dpw run's, creates no store)."""
    from test_cli import processes_marked

    marker = f"{uuid.uuid4().hex}"
    env = {**os.environ, "DPW_TEST_MARK": marker}
    path = tmp_path / "study.toml"
    base = "\n".join(f"{k} = {json.dumps(v)}" for k, v in BASE.items())
    path.write_text(f'name = "cli"\nmode = "composition"\n[base]\n{base}\n[space]\nlearning_rate = [1.0, 0.5]\n')
    db = tmp_path / "runs.sqlite"
    dpw = Path(sys.executable).with_name("dpw")
    done = subprocess.run([str(dpw), "study", str(path), "--db", str(db)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    assert "candidate 2: run 2" in done.stderr and "study 1 (cli, composition): finished, 2 runs" in done.stdout
    expected = dp_accounting_composition([1.0, 1.0])  # two runs at noise 1.0 (their learning rates differ)
    runs = [Store(db).get_run(run_id) for run_id in (1, 2)]
    assert [(run["study_id"], run["status"]) for run in runs] == [(1, "finished"), (1, "finished")]
    assert publishable_epsilon(runs[0]).value == pytest.approx(expected, rel=1e-4)
    assert processes_marked(f"DPW_TEST_MARK={marker}") == []
    missing = tmp_path / "missing.toml"
    missing.write_text(path.read_text().replace(f'dataset = "{BASE["dataset"]}"', 'dataset = "nowhere.csv"'))
    refused = subprocess.run([str(dpw), "study", str(missing), "--db", str(tmp_path / "new.sqlite")],
                             capture_output=True, text=True, timeout=600, env=env)
    assert refused.returncode == 1 and "nowhere.csv" in refused.stderr and "Traceback" not in refused.stderr
    assert processes_marked(f"DPW_TEST_MARK={marker}") == []
    assert not (tmp_path / "new.sqlite").exists()  # as dpw run: data that cannot train creates no store


# ---- the store -------------------------------------------------------------------------------------
def test_a_schema_2_store_gains_studies_and_keeps_its_runs(tmp_path):
    from test_store import older_store

    path = tmp_path / "old.sqlite"
    older_store(path, 2, runs=[{"id": 4, "name": "old", "status": "finished", "config": "{}", "epsilon": 1.5,
                                "mechanism": "dpsgd"}])
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    (run,) = store.list_runs()
    assert run["name"] == "old" and run["epsilon"] == 1.5 and run["study_id"] is None and "study" not in run
    study_id = store.create_study(name="new", mode="exploratory", config="{}")
    assert store.get_study(study_id)["status"] == "running"
    raw = sqlite3.connect(path)
    assert raw.execute("select count(*) from runs").fetchone()[0] == 1
    assert math.isclose(raw.execute("select epsilon from runs where id = 4").fetchone()[0], 1.5)


# ---- PATE studies -----------------------------------------------------------------------------------
PATE_BASE = {"name": "pate", "dataset": "digits", "mechanism": "pate", "model": "mlp", "teacher_model": "mlp",
             "num_teachers": 5, "teacher_epochs": 2, "teacher_batch_size": 32, "student_epochs": 2,
             "num_queries": 60, "aggregator": "gnmax", "gnmax_sigma": 20.0, "delta": 1e-5, "seed": 0}


def pate_data_independent_epsilon(configs) -> float:
    """Each run's data-independent RDP from engine.privacy.pate (every query answered), summed."""
    from engine.privacy import pate

    total = 0.0
    for c in configs:
        if c.aggregator == "gnmax":
            per = pate.gnmax_rdp_data_independent(sigma=c.gnmax_sigma, orders=DEFAULT_ORDERS)
        else:
            per = pate.lnmax_rdp_data_independent(laplace_scale=c.laplace_scale, orders=DEFAULT_ORDERS)
        total = total + c.num_queries * per
    return rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=total, delta=1e-5).value


def test_a_pate_study_searches_the_aggregator_and_the_number_of_teachers(tmp_path):
    config = StudyConfig.from_dict({"name": "pate-grid", "mode": "composition", "base": PATE_BASE,
                                    "space": {"aggregator": ["gnmax", "lnmax"], "num_teachers": [4, 6]}})
    plan = plan_candidates(config)
    assert [(c.aggregator, c.num_teachers) for c in plan.configs] == [("gnmax", 4), ("gnmax", 6), ("lnmax", 4),
                                                                      ("lnmax", 6)]
    store = Store(tmp_path / "runs.sqlite")
    small = StudyPlan(plan.settings[1:3], plan.configs[1:3])  # one of each aggregator: the test stays short
    result = run_study(config, store, launcher(store), plan=small)
    runs = [store.get_run(r) for r in result.run_ids]
    assert [r["status"] for r in runs] == ["finished", "finished"]
    assert [r["config"]["num_teachers"] for r in runs] == [6, 4]
    assert result.epsilon.accountant == "rdp-composition"
    assert result.epsilon.value == pytest.approx(pate_data_independent_epsilon(small.configs), rel=1e-9)
    assert all(publishable_epsilon(r).value == pytest.approx(result.epsilon.value) for r in runs)


@pytest.mark.parametrize("noise", [{"aggregator": "lnmax", "laplace_scale": 20.0, "num_queries": 10},
                                   {"aggregator": "gnmax", "gnmax_sigma": 200.0, "num_queries": 10}])
def test_a_pate_study_never_reads_below_the_bound_its_one_run_states(noise):
    """The run states its bound at PATE's orders, the study composes at the RDP accountant's: for few
    queries the two grids differ by 0.3% (lnmax, 10 queries: 1.0005 against 1.0036)."""
    from engine.pate.aggregation import planned_epsilon_data_independent

    config = RunConfig.from_dict({**PATE_BASE, **noise})
    own = planned_epsilon_data_independent(config)
    assert pate_data_independent_epsilon([config]) < own  # the case: the study's own grid reads lower
    assert composition_epsilon([config], 0, config.delta).value == pytest.approx(own, rel=1e-12)
    assert composition_epsilon([config, config], 0, config.delta).value > own


def test_a_private_pate_study_covers_its_noisiest_aggregator_setting():
    config = StudyConfig.from_dict({"name": "pate-private", "mode": "private", "mean_runs": 2, "base": PATE_BASE,
                                    "score_noise_multiplier": 5.0, "space": {"gnmax_sigma": [10.0, 40.0]}})
    from engine.privacy import pate

    worst = 60 * pate.gnmax_rdp_data_independent(sigma=10.0, orders=DEFAULT_ORDERS)
    score = compute_rdp(sample_rate=1.0, noise_multiplier=5.0, steps=1, orders=DEFAULT_ORDERS)
    expected = rdp_to_epsilon(orders=DEFAULT_ORDERS, delta=1e-5, rdp=repeat_and_select_rdp(
        orders=DEFAULT_ORDERS, rdp=worst + score, mean_runs=2, shape=1.0)).value
    assert private_study_epsilon(config, num_train=0).value == pytest.approx(expected, rel=1e-12)
    assert expected > pate_data_independent_epsilon([config.candidate({"gnmax_sigma": 10.0})])


# ---- the plan before a study runs -------------------------------------------------------------------
def test_dpw_study_plan_states_the_epsilon_before_running_and_stores_nothing(tmp_path):
    path = REPO / "resources" / "examples" / "study-digits.toml"
    result = CliRunner().invoke(cli, ["study", str(path), "--plan", "--json", "--db", str(tmp_path / "r.sqlite")])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    config = StudyConfig.load_toml(path)
    assert plan["grid_size"] == 6 and plan["num_runs"]["mean"] == 3 and plan["num_runs"]["median"] == 2
    assert plan["epsilon"] == pytest.approx(private_study_epsilon(config, plan["num_train"]).value)
    assert plan["epsilon"] > plan["single_run_epsilon"]
    assert not (tmp_path / "r.sqlite").exists()
    text = CliRunner().invoke(cli, ["study", str(path), "--plan"]).output
    assert "Study epsilon  4.3" in text and "90% of studies run at most 6" in text


def test_dpw_study_plan_only_hashes_an_image_folder_its_store_has_trained_on(tmp_path, monkeypatch):
    """Sizing the split loads the data: an image folder a run in the store at --db trained on is hashed,
    not checked again (the same fingerprint, the same bytes); without a store there, it is checked and
    no store is made."""
    from PIL import Image

    from engine.config import RunConfig
    from engine.datasets import load_dataset
    from engine.image_folder import ImageFileRows

    for k in range(2):
        (tmp_path / "pics" / f"c{k}").mkdir(parents=True)
        for i in range(12):
            Image.fromarray(np.full((6, 6), 20 * k + i, np.uint8)).save(tmp_path / "pics" / f"c{k}" / f"{i}.png")
    study = tmp_path / "study.toml"
    study.write_text(f'name = "pics"\nmode = "composition"\n[base]\ndataset = "{tmp_path / "pics"}"\n'
                     'model = "mlp"\nmechanism = "dpsgd"\nnoise_multiplier = 1.0\nexpected_batch_size = 4\n'
                     'epochs = 1\ndelta = 1e-3\n[space]\nlearning_rate = [0.5, 1.0]\n')
    parsed = []
    check_file = ImageFileRows._check_file
    monkeypatch.setattr(ImageFileRows, "_check_file",
                        lambda self, path, head, problems: parsed.append(path) or check_file(self, path, head, problems))
    db = tmp_path / "r.sqlite"
    plan = CliRunner().invoke(cli, ["study", str(study), "--plan", "--json", "--db", str(db)])
    assert plan.exit_code == 0, plan.output
    assert len(parsed) == 24 and not db.exists()
    store = Store(db)  # a run on the folder recorded its fingerprint
    run_id = store.create_run(RunConfig(name="done", dataset=str(tmp_path / "pics"), model="mlp", noise_multiplier=1.0))
    store.update_run(run_id, dataset_fingerprint=load_dataset(tmp_path / "pics").fingerprint)
    parsed.clear()
    again = CliRunner().invoke(cli, ["study", str(study), "--plan", "--json", "--db", str(db)])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["epsilon"] == json.loads(plan.output)["epsilon"] and parsed == []


def test_dpw_studies_lists_each_study_with_its_epsilon_and_released_run(tmp_path):
    store = Store(tmp_path / "runs.sqlite")
    empty = CliRunner().invoke(cli, ["studies", "--db", str(store.path)])
    assert empty.exit_code == 0 and empty.output == f"no studies yet in {store.path}\n"
    config = StudyConfig.from_dict({"name": "grid", "mode": "composition", "search": "grid", "base": BASE,
                                    "space": {"learning_rate": [1.0]}})
    result = run_study(config, store, lambda run_id: execute(store, run_id, stream=None))
    listed = CliRunner().invoke(cli, ["studies", "--db", str(store.path)])
    assert listed.exit_code == 0, listed.output
    (row,) = [line.split() for line in listed.output.splitlines()[2:]]
    epsilon = store.get_study(result.study_id)["epsilon"]
    assert row == ["1", "grid", "composition", "digits", "finished", "1", rounding.bound_cell(epsilon, ".4g"),
                   "1e-05", "pld-composition", str(result.released_run_id)]
    as_json = json.loads(CliRunner().invoke(cli, ["studies", "--json", "--db", str(store.path)]).output)
    assert as_json[0]["epsilon"] == epsilon and as_json[0]["config"]["space"] == {"learning_rate": [1.0]}
