"""Runs side by side (engine.run_comparison): the settings each run read, what differs, and `dpw compare`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from engine.cli import cli
from engine.config import RunConfig
from engine.run_comparison import NOT_USED, compare_runs, differing_keys, relevant_settings
from engine.store import Store


def test_a_comparison_shows_only_the_settings_each_run_read():
    dpsgd = relevant_settings(RunConfig(mechanism="dpsgd", noise_multiplier=1.1).to_dict())
    pate = relevant_settings(RunConfig(mechanism="pate").to_dict())
    assert "noise_multiplier" in dpsgd and "threshold" not in dpsgd and "num_teachers" not in dpsgd
    assert "threshold" in pate and "clipping_norm" not in pate and "gnmax_sigma" not in pate  # confident
    assert "schema_version" not in dpsgd and "name" not in dpsgd  # the name heads the run's column
    assert "test_fraction" not in dpsgd and "normalization" not in dpsgd  # MNIST: a test split, images
    # A PATE-only setting is not a difference from a DP-SGD run, which does not use it (shown as unused).
    assert "mechanism" in differing_keys([dpsgd, pate]) and "threshold" not in differing_keys([dpsgd, pate])


def finished(store: Store, name: str, **settings) -> int:
    run_id = store.create_run(RunConfig(name=name, dataset="digits", delta=1e-5, **settings))
    store.update_run(run_id, status="finished", epsilon=2.31141, delta=1e-5, accountant="pld", accuracy=0.9123,
                     steps_done=40, steps_planned=40)
    return run_id


def test_differences_come_first_and_a_setting_a_run_does_not_read_is_marked():
    store_rows = [dict(id=1, name="a", status="finished", mechanism="dpsgd", dataset="digits",
                       config=RunConfig(name="a", dataset="digits", noise_multiplier=1.0, optimizer="sgd").to_dict()),
                  dict(id=2, name="b", status="finished", mechanism="dpsgd", dataset="digits",
                       config=RunConfig(name="b", dataset="digits", noise_multiplier=1.0, optimizer="momentum",
                                        momentum=0.8).to_dict())]
    comparison = compare_runs(store_rows)
    assert comparison.differ == {"optimizer"}  # momentum: read by one run only, not a difference
    assert comparison.settings[0] == "optimizer" and "momentum" in comparison.settings
    assert [comparison.setting_text("momentum", j) for j in (0, 1)] == [NOT_USED, "0.8"]
    assert comparison.setting_text("epsilon_budget", 0) == "unset"


def test_dpw_compare_prints_results_then_the_settings_that_differ(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    first = finished(store, "lr 1", noise_multiplier=1.0, learning_rate=1.0)
    finished(store, "lr 2", noise_multiplier=1.0, learning_rate=2.0)  # the newest: -1
    db = ["--db", str(store.path)]
    shown = CliRunner().invoke(cli, ["compare", str(first), "-1", *db])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].split() == ["1:", "lr", "1", "2:", "lr", "2"]
    assert ["ε", "(publishable)", "2.312", "2.312"] == next(line.split() for line in lines if line.startswith("ε"))
    assert ["learning_rate", "1.0", "2.0"] in [line.split() for line in lines]
    assert not any(line.startswith("seed") for line in lines)  # shared: only with --all
    assert "note:" not in shown.output  # one dataset, one mechanism
    everything = CliRunner().invoke(cli, ["compare", "1", "2", "--all", *db]).output
    assert ["seed", "0", "0"] in [line.split() for line in everything.splitlines()]
    as_json = json.loads(CliRunner().invoke(cli, ["compare", "1", "2", "--json", *db]).output)
    assert as_json["differ"] == ["learning_rate"]
    assert [run["results"]["epsilon"] for run in as_json["runs"]] == ["2.312", "2.312"]
    assert as_json["runs"][1]["settings"]["learning_rate"] == 2.0


def test_dpw_compare_says_when_runs_span_datasets_or_mechanisms(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    finished(store, "digits", noise_multiplier=1.0)
    other = store.create_run(RunConfig(name="cancer", dataset="breast-cancer", mechanism="none", delta=1e-5))
    store.update_run(other, status="finished", accuracy=0.95)
    shown = CliRunner().invoke(cli, ["compare", "1", "2", "--db", str(store.path)])
    assert shown.exit_code == 0, shown.output
    assert ("note: accuracy is comparable on one dataset and ε within one mechanism; these runs span "
            "digits · DP-SGD: 1; breast-cancer · non-private: 2") in shown.output
    missing = CliRunner().invoke(cli, ["compare", "1", "9", "--db", str(store.path)])
    assert missing.exit_code == 1 and missing.output.startswith("error: no run with id 9")
