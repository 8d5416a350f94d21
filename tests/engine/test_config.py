"""RunConfig: validation messages name the field, the value and the allowed range; TOML round trip."""

from pathlib import Path

import pytest

from engine.config import RunConfig, collect_errors, config_fields
from engine.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def test_toml_round_trip_keeps_every_field(tmp_path):
    config = RunConfig(name="a", noise_multiplier=1.3, epochs=3, optimizer="adam", epsilon_budget=4.0, seed=7)
    path = tmp_path / "run.toml"
    config.save_toml(path)
    assert RunConfig.load_toml(path) == config


def test_config_hash_is_stable_and_ignores_the_name():
    a = RunConfig(name="a", noise_multiplier=1.1)
    assert a.config_hash() == RunConfig(name="b", noise_multiplier=1.1).config_hash()
    assert a.config_hash() != RunConfig(name="a", noise_multiplier=1.2).config_hash()
    shuffled = dict(reversed(list(a.to_dict().items())))
    assert RunConfig.from_dict(shuffled).config_hash() == a.config_hash()


@pytest.mark.parametrize(
    "values, field, words",
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier", ["-1", "> 0"]),
        ({"noise_multiplier": 1.0, "clipping_norm": 0.0}, "clipping_norm", ["0", "> 0"]),
        ({"noise_multiplier": 1.0, "delta": 1.0}, "delta", ["1", "< 1"]),
        ({"noise_multiplier": 1.0, "epochs": 0}, "epochs", ["0", ">= 1"]),
        ({"noise_multiplier": 1.0, "epochs": 2.5}, "epochs", ["2.5", "whole number"]),
        ({"noise_multiplier": 1.0, "optimizer": "adagrad"}, "optimizer", ["adagrad", "'sgd'"]),
        ({"noise_multiplier": 1.0, "device": "tpu"}, "device", ["tpu", "'cuda'"]),
        ({"noise_multiplier": 1.0, "learning_rate": float("nan")}, "learning_rate", ["nan"]),
        ({}, "noise_multiplier", ["noise multiplier or a target epsilon"]),
        ({"noise_multiplier": 1.0, "target_epsilon": 2.0}, "target_epsilon", ["not both"]),
        ({"target_epsilon": 5.0, "epsilon_budget": 3.0}, "target_epsilon", ["exceeds the epsilon budget 3"]),
        ({"noise_multiplier": 1.0, "target_attack_tpr": 0.05}, "target_attack_tpr", ["only one of"]),
        ({"target_attack_tpr": 0.005}, "target_attack_tpr", ["0.005", "not above the attack FPR 0.01"]),
        ({"target_attack_tpr": 1.0}, "target_attack_tpr", ["1", "< 1"]),
        ({"target_attack_tpr": 0.05, "normalization": "dp"}, "target_attack_tpr", ["feature statistics"]),
    ],
)
def test_invalid_values_are_refused_with_field_value_and_range(values, field, words):
    with pytest.raises(ConfigError) as info:
        RunConfig(**values)
    assert info.value.field == field
    text = str(info.value)
    assert text.startswith(field + ":")
    for word in words:
        assert word in text


def test_unknown_key_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"noise_multiplier": 1.0, "epoch": 3})
    assert info.value.field == "epoch"
    assert "epochs" in info.value.hint


def test_bad_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("epochs = = 3\n")
    with pytest.raises(ConfigError, match="bad.toml is not valid TOML"):
        RunConfig.load_toml(path)


def test_a_key_set_twice_is_named(tmp_path):
    """tomllib says only "Cannot overwrite a value (at line 3, column 25)"."""
    path = tmp_path / "twice.toml"
    path.write_text('noise_multiplier = 1.0\nepochs = 2\nnoise_multiplier = 2.0\n')
    with pytest.raises(ConfigError, match=r"twice.toml is not valid TOML: 'noise_multiplier' is set twice \(again at "
                                          r"line 3\); keep one"):
        RunConfig.load_toml(path)


def test_toml_integers_are_accepted_for_number_fields():
    config = RunConfig.from_dict({"noise_multiplier": 1, "learning_rate": 2})
    assert config.noise_multiplier == 1.0 and isinstance(config.learning_rate, float)


def test_whole_floats_are_accepted_for_whole_number_fields():
    """expected_batch_size = 64.0 was refused as "64 is not a whole number"."""
    config = RunConfig.from_dict({"noise_multiplier": 1.0, "expected_batch_size": 64.0, "epochs": 3.0})
    assert config.expected_batch_size == 64 and isinstance(config.epochs, int)
    with pytest.raises(ConfigError, match=r"^expected_batch_size: 64.5 is not a whole number"):
        RunConfig.from_dict({"noise_multiplier": 1.0, "expected_batch_size": 64.5})


def test_delta_of_one_over_n_or_more_is_refused_with_the_reason():
    config = RunConfig(noise_multiplier=1.0, delta=1e-3)
    config.check_against_dataset(999)  # 1e-3 < 1/999
    with pytest.raises(ConfigError) as info:
        config.check_against_dataset(1000)
    assert info.value.field == "delta"
    assert "1/N" in str(info.value) and "N = 1000" in str(info.value)
    assert "releasing one person's example" in info.value.hint


def test_non_private_baseline_needs_no_noise_and_ignores_delta_rule():
    config = RunConfig(mechanism="none", delta=0.5, expected_batch_size=5)
    config.check_against_dataset(10)


def test_batch_larger_than_dataset_is_refused():
    with pytest.raises(ConfigError, match="expected_batch_size"):
        RunConfig(noise_multiplier=1.0, expected_batch_size=500).check_against_dataset(100)


def test_steps_are_epochs_times_n_over_batch_rounded_up():
    config = RunConfig(noise_multiplier=1.0, epochs=3, expected_batch_size=256)
    assert config.steps_for(60000) == 704  # ceil(3 * 60000 / 256) = ceil(703.125)
    assert config.sample_rate_for(60000) == pytest.approx(256 / 60000)


def test_collect_errors_reports_every_bad_field_at_once():
    errors = collect_errors({"epochs": 0, "learning_rate": -1.0, "mechanism": "dpsgd"})
    assert {e.field for e in errors} == {"epochs", "learning_rate"}


def test_every_field_has_a_spec_with_help_text():
    for name, default, spec in config_fields():
        assert spec.label and spec.help, name
        if spec.choices:
            assert default in spec.choices, name


RUN_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.toml") if not p.name.startswith("study-"))


@pytest.mark.parametrize("path", RUN_EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_is_valid(path):
    RunConfig.load_toml(path)


def test_a_study_file_given_as_a_run_says_to_use_dpw_study():
    with pytest.raises(ConfigError, match="tuning study") as caught:
        RunConfig.load_toml(EXAMPLES / "study-digits.toml")
    assert "dpw study" in caught.value.hint


def test_fields_used_follow_the_mechanism_and_the_pate_aggregator():
    from engine.config import fields_used

    dpsgd = fields_used("dpsgd")
    assert "clipping_norm" in dpsgd and "noise_multiplier" in dpsgd and "num_teachers" not in dpsgd
    gnmax = fields_used("pate", "gnmax")
    assert "gnmax_sigma" in gnmax and "threshold" not in gnmax and "clipping_norm" not in gnmax
    confident = fields_used("pate", "confident")
    assert {"threshold", "sigma1", "sigma2"} <= set(confident) and "laplace_scale" not in confident
    assert "seed" in dpsgd and "seed" in confident  # fields of every mechanism


def test_a_config_that_is_not_utf8_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml is not UTF-8 text \(byte 0xe9") as caught:
        RunConfig.load_toml(path)
    assert "UTF-8" in caught.value.hint


def test_config_hash_leaves_out_where_files_are_and_settings_at_their_defaults():
    """Moving the data folder does not change what a run computes, and a setting added later at its
    default (e.g. audit_canaries = 0) leaves the hash of configs written before it unchanged."""
    a = RunConfig(name="a", noise_multiplier=1.1)
    assert RunConfig(name="a", noise_multiplier=1.1, data_dir="/elsewhere").config_hash() == a.config_hash()
    assert RunConfig(name="a", noise_multiplier=1.1, audit_canaries=0).config_hash() == a.config_hash()
    assert RunConfig(name="a", noise_multiplier=1.1, audit_canaries=10).config_hash() != a.config_hash()


def test_relative_paths_in_a_config_file_are_the_files_folders(tmp_path, monkeypatch):
    """A config beside its CSV runs from any working folder, and the run stores absolute paths; a
    registered dataset's name stays a name even where a folder of that name is beside the file; a
    path that exists only from the working folder is kept as given."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    (project / "mnist").mkdir()
    elsewhere.mkdir()
    (project / "data" / "cohort.csv").write_text("x,label\n1,0\n")
    (project / "a.toml").write_text('dataset = "data/cohort.csv"\ndata_dir = "files"\nmechanism = "none"\n')
    (project / "b.toml").write_text('dataset = "mnist"\nmechanism = "none"\n')
    (project / "c.toml").write_text('dataset = "cwd.csv"\nmechanism = "none"\n')
    monkeypatch.chdir(elsewhere)
    a = RunConfig.load_toml(project / "a.toml")
    assert a.dataset == str(project / "data" / "cohort.csv") and a.data_dir == str(project / "files")
    assert RunConfig.load_toml(project / "b.toml").dataset == "mnist"
    assert RunConfig.load_toml(project / "c.toml").dataset == "cwd.csv"
    assert RunConfig.from_dict({"dataset": "data/cohort.csv", "mechanism": "none"}).dataset == "data/cohort.csv"  # no file, no folder


def test_errors_spell_values_as_a_config_file_does():
    """true, not Python's True; a whole number in full, not 9.22337e+18 on both sides of the range."""
    with pytest.raises(ConfigError, match=r"^epochs: true is not a whole number"):
        RunConfig(mechanism="none", epochs=True)
    with pytest.raises(ConfigError, match=r"^name: 1979-05-27 is not text"):  # a TOML date: was datetime.date(...)
        RunConfig.from_dict({"mechanism": "none", "name": __import__("datetime").date(1979, 5, 27)})
    with pytest.raises(ConfigError, match=r"seed: 9223372036854775808 is out of range; allowed: a whole number >= 0 "
                                          r"and <= 9223372036854775807"):
        RunConfig(mechanism="none", seed=2**63)
