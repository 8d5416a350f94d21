"""Declared classes (`classes`, engine.declared_classes): the model's outputs fixed from public
knowledge, so that an example whose class no other example has does not change the model's shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.declared_classes import parse_classes
from engine.errors import ConfigError, DataError
from engine.report import caveats, classes_caveat


def _csv(path: Path, labels: list[str]) -> Path:
    path.write_text("a,b,label\n" + "".join(f"{i},{(i * 7) % 13},{label}\n" for i, label in enumerate(labels)))
    return path


LABELS = ["cat", "dog"] * 40 + ["fox"]  # one fox


def test_classes_are_parsed_in_output_order_and_bad_lists_are_refused_naming_the_field():
    assert parse_classes(None) is None and parse_classes("  ") is None
    assert parse_classes(" healthy, flu ,other") == ("healthy", "flu", "other")
    for bad, words in (("a,,b", "empty class name"), ("a, b, a", "'a' more than once"), ("a", "one class")):
        with pytest.raises(ConfigError, match=words) as caught:
            parse_classes(bad)
        assert caught.value.field == "classes"
    with pytest.raises(ConfigError) as caught:
        RunConfig(dataset="x.csv", noise_multiplier=1.0, classes="only")
    assert caught.value.field == "classes"


def test_declared_classes_give_the_model_one_output_each_in_their_order(tmp_path):
    data = load_dataset(str(_csv(tmp_path / "pets.csv", LABELS)), classes="fox, dog, cat, owl")
    assert data.class_names == ("fox", "dog", "cat", "owl") and data.num_classes == 4
    found = load_dataset(str(tmp_path / "pets.csv"))  # classes from the labels: sorted names
    assert found.class_names == ("cat", "dog", "fox")
    recode = torch.tensor([2, 1, 0])  # cat -> 2, dog -> 1, fox -> 0
    assert torch.equal(data.y_train, recode[found.y_train]) and torch.equal(data.y_test, recode[found.y_test])
    config = RunConfig(dataset=str(tmp_path / "pets.csv"), noise_multiplier=1.0, epochs=1, model="mlp",
                       expected_batch_size=16, classes="fox, dog, cat, owl", feature_bounds="*=0:100")
    from engine.runs import prepare

    run = prepare(config)
    assert run.model(run.data.x_train[:3]).shape == (3, 4)


def test_an_example_of_a_class_no_other_example_has_changes_the_model_only_without_declared_classes(tmp_path):
    with_fox, without_fox = _csv(tmp_path / "with.csv", LABELS), _csv(tmp_path / "without.csv", LABELS[:-1])
    assert load_dataset(str(with_fox)).num_classes != load_dataset(str(without_fox)).num_classes  # 3 vs 2 outputs
    declared = [load_dataset(str(p), classes="cat, dog, fox") for p in (with_fox, without_fox)]
    assert declared[0].class_names == declared[1].class_names and declared[0].num_classes == declared[1].num_classes


def test_a_label_outside_the_declared_classes_and_classes_for_a_registered_dataset_are_refused(tmp_path):
    path = _csv(tmp_path / "pets.csv", LABELS)
    with pytest.raises(DataError, match=r"pets.csv: label 'fox' is not among the declared classes \(cat, dog\); "
                                        r"add it to classes or correct the data"):
        load_dataset(str(path), classes="cat, dog")
    with pytest.raises(ConfigError, match="digits has its own published classes") as caught:
        load_dataset("digits", classes="a, b")
    assert caught.value.field == "classes"


def test_the_report_says_when_the_set_of_classes_came_from_the_data():
    run = {"id": 1, "mechanism": "dpsgd", "status": "finished", "epsilon": 2.0, "delta": 1e-5, "accountant": "pld",
           "dataset": "pets.csv", "config": {}, "summary": {}}
    said = classes_caveat(run)
    assert said is not None and said.startswith("Treated as public: the set of classes") and said in caveats(run, {})
    assert classes_caveat({**run, "config": {"classes": "cat, dog, fox"}}) is None
    assert classes_caveat({**run, "dataset": "digits"}) is None and classes_caveat({**run, "dataset": "MNIST"}) is None
