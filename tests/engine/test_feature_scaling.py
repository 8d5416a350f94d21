"""Table normalization: declared bounds by default (nothing about the data released), a DP estimate
counted in the run's epsilon, or exact statistics; the exported model applies the same transform."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.errors import ConfigError
from engine.feature_scaling import FeatureBounds, parse_feature_bounds
from engine.privacy import dpsgd_epsilon
from engine.runs import prepare

TABLE_RUN = dict(name="t", dataset="breast-cancer", model="logistic", mechanism="dpsgd", noise_multiplier=1.0,
                 delta=1e-4, expected_batch_size=64, epochs=3, learning_rate=1.0, device="cpu")


def test_feature_bounds_text_is_parsed_into_named_and_default_ranges():
    bounds = parse_feature_bounds("age=0:120; income = -1e3:1e6 ; *=-5:5")
    assert bounds == FeatureBounds((("age", 0.0, 120.0), ("income", -1e3, 1e6)), (-5.0, 5.0))
    low, high = bounds.for_features(("income", "height", "age"))
    assert low.tolist() == [-1e3, -5.0, 0.0] and high.tolist() == [1e6, 5.0, 120.0]
    assert parse_feature_bounds("0:1") == FeatureBounds((), (0.0, 1.0))
    assert parse_feature_bounds(None) == FeatureBounds() == parse_feature_bounds("  ")


@pytest.mark.parametrize("text,message", [
    ("0:1:2", "is not a range low:high"),
    ("a=5:1", "low < high"),
    ("a=0:1; a=2:3", "names feature 'a' twice"),
    ("a=0:1; 0:1", "mixes a bare low:high"),
    ("=0:1", "no feature name"),
    ("x=0:inf", "finite"),
])
def test_bad_feature_bounds_are_one_line_naming_the_field(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        RunConfig(**TABLE_RUN, feature_bounds=text)
    assert str(info.value).startswith("feature_bounds:")


def test_unknown_feature_names_in_bounds_are_refused_with_the_names_found(tmp_path: Path):
    path = tmp_path / "d.csv"
    path.write_text("age,weight,label\n" + "".join(f"{20 + i},{60 + i},{i % 2}\n" for i in range(20)))
    with pytest.raises(ConfigError, match=r"feature_bounds: names feature\(s\) 'height' that the data does not have"):
        load_dataset(str(path), feature_bounds="height=0:3")


def test_config_defaults_to_bounds_and_keeps_dp_for_dpsgd():
    assert RunConfig(**TABLE_RUN).normalization == "bounds"
    with pytest.raises(ConfigError, match="normalization: 'dp' is accounted for DP-SGD runs only"):
        RunConfig(**{**TABLE_RUN, "mechanism": "pate", "noise_multiplier": None}, normalization="dp")
    with pytest.raises(ConfigError, match="normalization"):
        RunConfig(**TABLE_RUN, normalization="standardize")


def test_bounds_reveal_nothing_of_the_rows(tmp_path: Path):
    """Two files with different rows give the same shipped transform under declared bounds, while
    exact statistics differ; values outside the bounds are clipped."""
    rng = np.random.default_rng(0)
    shipped = []
    for k, scale in enumerate((1.0, 30.0)):
        path = tmp_path / f"d{k}.csv"
        x = rng.normal(0, scale, size=(60, 2))
        path.write_text("a,b,label\n" + "".join(f"{u},{v},{i % 2}\n" for i, (u, v) in enumerate(x)))
        bounded = load_dataset(str(path), feature_bounds="*=-10:10")
        exact = load_dataset(str(path), normalization="exact")
        shipped.append((bounded.normalization, exact.normalization))
        assert bounded.x_train.abs().max() <= 1.0
    assert shipped[0][0] == shipped[1][0]
    assert shipped[0][1] != shipped[1][1]


def test_dp_normalization_needs_a_range_for_every_feature(tmp_path: Path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n" + "".join(f"{i},{2 * i},{i % 2}\n" for i in range(40)))
    with pytest.raises(ConfigError, match=r"feature_bounds: normalization 'dp' needs a range for every feature; none for 'b'"):
        load_dataset(str(path), normalization="dp", feature_bounds="a=0:40", statistics_noise_multiplier=1.0,
                     rng=np.random.default_rng(0))


def test_dp_statistics_are_noisy_estimates_of_the_exact_ones(tmp_path: Path):
    rng = np.random.default_rng(3)
    path = tmp_path / "d.csv"
    x = rng.normal([2.0, -1.0], [1.0, 0.5], size=(20_000, 2))
    path.write_text("a,b,label\n" + "".join(f"{u:.5f},{v:.5f},{i % 2}\n" for i, (u, v) in enumerate(x)))
    exact = load_dataset(str(path), normalization="exact", feature_bounds="*=-6:6")
    dp = load_dataset(str(path), normalization="dp", feature_bounds="*=-6:6", statistics_noise_multiplier=2.0,
                      rng=np.random.default_rng(0))
    assert dp.normalization["noise_multiplier"] == 2.0 and "differentially private" in dp.normalization["source"]
    # Noise on the mean: 2 * sqrt(2 * 2) / 16,000 train rows, in units of the half-range 6.
    np.testing.assert_allclose(dp.normalization["mean"], exact.normalization["mean"], atol=6 * 5 * 4 / 16_000)
    np.testing.assert_allclose(dp.normalization["std"], exact.normalization["std"], rtol=0.05)
    assert dp.normalization["mean"] != exact.normalization["mean"]


def _run(**changes):
    events = []
    prepared = prepare(RunConfig(**{**TABLE_RUN, **changes}), emit=lambda kind, **p: events.append((kind, p)))
    result = prepared.train()
    plan = next(p for kind, p in events if kind == "plan")
    last = [p for kind, p in events if kind == "privacy"][-1]
    return prepared, result, plan, last


def test_a_run_with_dp_statistics_reports_an_epsilon_that_includes_them():
    prepared, result, plan, last = _run(normalization="dp", normalization_noise_multiplier=5.0)
    steps = result.steps_done
    q = plan["sample_rate"]
    expected = dpsgd_epsilon(sample_rate=q, noise_multiplier=1.0, steps=steps, delta=1e-4,
                             statistics_noise_multiplier=5.0)
    training_only = dpsgd_epsilon(sample_rate=q, noise_multiplier=1.0, steps=steps, delta=1e-4, accountant="rdp")
    assert plan["accountant"] == "rdp" and plan["normalization"]["noise_multiplier"] == 5.0
    assert result.epsilon == expected and last["epsilon"] == expected.value and last["accountant"] == "rdp"
    assert expected.value > training_only.value


def test_a_run_with_declared_bounds_keeps_the_tight_accountant():
    prepared, result, plan, last = _run()
    assert plan["accountant"] == "pld" and last["accountant"] == "pld"
    assert "independent of the data" in plan["normalization"]["source"]
    assert result.test_accuracy > 0.7  # the majority class is 63%; noise is secret, so leave room


def test_table_statistics_of_a_registered_image_dataset_are_refused_from_the_config():
    """Refused before any file is read (MNIST's files may be missing); once they were refused only
    after the data had loaded."""
    for normalization in ("dp", "exact"):
        for dataset in ("digits", "mnist", "CIFAR10"):
            with pytest.raises(ConfigError, match=f"normalization: '{normalization}' computes statistics of tables"):
                RunConfig(**{**TABLE_RUN, "dataset": dataset, "model": "auto"}, normalization=normalization)


def test_table_statistics_of_images_loaded_from_a_file_are_refused(tmp_path: Path):
    path = tmp_path / "pictures.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((40, 1, 8, 8), dtype=np.float32), y=np.arange(40) % 2)
    with pytest.raises(ConfigError, match="normalization: 'exact' computes statistics of tables; .* image dataset"):
        prepare(RunConfig(**{**TABLE_RUN, "dataset": str(path), "model": "auto", "mechanism": "none"},
                          normalization="exact"))


def test_the_table_scaling_settings_are_not_in_effect_for_a_registered_image_dataset():
    from engine.settings_in_effect import TABLE_SCALING, settings_in_effect, settings_without_effect, why_without_effect

    for dataset in ("mnist", "digits"):
        assert not set(TABLE_SCALING) & set(settings_in_effect({"dataset": dataset, "normalization": "dp"}))
    assert {"normalization", "feature_bounds"} <= set(settings_in_effect({"dataset": "a.csv"}))
    values = {"dataset": "mnist", "feature_bounds": "0:1"}
    assert settings_without_effect(values) == ["feature_bounds"]
    assert why_without_effect("feature_bounds", values) == "mnist is an image dataset, scaled by fixed constants"


def test_the_exported_transform_clips_like_the_engine(tmp_path: Path):
    from engine.export import RawInputModel

    data = load_dataset("breast-cancer")
    model = torch.nn.Linear(30, 2)
    norm = data.normalization
    wrapped = RawInputModel(model, norm["mean"], norm["std"], (30,), norm["low"], norm["high"]).eval()
    raw = torch.tensor(np.random.default_rng(0).uniform(-1e4, 1e4, size=(16, 30)), dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(wrapped(raw), model(data.normalize(raw)), atol=1e-5)
        assert data.normalize(raw).abs().max() <= 1.0 + 1e-6
