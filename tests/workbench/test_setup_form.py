"""The setup form is generated from config_fields and validates with the engine's rules."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit

from engine.config import RunConfig, config_fields
from workbench.form_state import FormState, visible_fields
from workbench.setup_form import SetupForm


@pytest.fixture
def form(qtbot):
    widget = SetupForm()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def test_every_field_of_the_mechanism_has_a_widget_with_its_spec(form):
    for mechanism in ("dpsgd", "pate", "none"):
        form.set_value("mechanism", mechanism)
        visible = set(visible_fields(mechanism, form.state.texts["aggregator"]))
        for name, _, spec in config_fields():
            field = form.fields[name]
            assert field.widget.isVisibleTo(form) == (name in visible), (mechanism, name)
            if spec.kind is bool:
                assert isinstance(field.editor, QCheckBox)
            elif spec.choices:
                assert isinstance(field.editor, QComboBox)
                assert [field.editor.itemText(i) for i in range(field.editor.count())] == list(spec.choices)
            else:
                assert isinstance(field.editor, (QLineEdit, QComboBox))
            # bounds and help come from the FieldSpec
            assert spec.allowed() in field.editor.toolTip()
            assert field.label.text() == spec.label


def test_mechanism_switch_shows_only_its_fields(form):
    form.set_value("mechanism", "pate")
    assert form.fields["num_teachers"].widget.isVisibleTo(form)
    assert not form.fields["noise_multiplier"].widget.isVisibleTo(form)
    form.set_value("mechanism", "dpsgd")
    assert not form.fields["num_teachers"].widget.isVisibleTo(form)
    assert form.fields["noise_multiplier"].widget.isVisibleTo(form)


def test_invalid_delta_disables_start_with_the_reason_at_the_field(form):
    form.set_value("noise_multiplier", "1.1")
    assert form.start_button.isEnabled()
    form.set_value("delta", "2")
    assert not form.start_button.isEnabled()
    error = form.fields["delta"].error
    assert error.isVisibleTo(form)
    assert "delta" in error.text() and "2" in error.text()
    assert form.fields["delta"].editor.property("invalid") is True
    assert "delta" in form.summary.text()
    form.set_value("delta", "1e-5")
    assert form.start_button.isEnabled()
    assert not form.fields["delta"].error.isVisibleTo(form)


def test_negative_clipping_norm_and_text_in_a_number_are_refused(form):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("clipping_norm", "-1")
    assert not form.start_button.isEnabled()
    assert "out of range" in form.fields["clipping_norm"].error.text()
    form.set_value("clipping_norm", "abc")
    assert "'abc' is not a number" in form.fields["clipping_norm"].error.text()


def test_cross_field_rule_is_shown_at_its_field(form):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("target_epsilon", "3")
    assert not form.start_button.isEnabled()
    assert "not both" in form.fields["target_epsilon"].error.text()


def test_delta_must_be_below_one_over_n_of_the_dataset(form):
    form.set_value("dataset", "breast-cancer")
    form.set_value("noise_multiplier", "1.0")
    form.set_value("delta", "0.01")
    assert not form.start_button.isEnabled()
    assert "1/N" in form.fields["delta"].error.text()


def test_cost_preview_computes_epsilon_off_the_gui_thread(form, qtbot):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("epochs", "1")
    qtbot.waitUntil(lambda: "ε =" in form.preview_label.text(), timeout=20000)
    assert "steps" in form.preview_label.text()
    form.set_value("noise_multiplier", "")
    form.set_value("target_epsilon", "3")
    qtbot.waitUntil(lambda: "Noise multiplier σ" in form.preview_label.text(), timeout=20000)


def test_cost_preview_states_the_attack_bound_a_target_attack_tpr_calls_for(form, qtbot):
    form.set_value("noise_multiplier", "")
    form.set_value("epochs", "1")
    form.set_value("target_attack_tpr", "0.05")
    qtbot.waitUntil(lambda: "membership attack at TPR ≤ 0.05 at FPR 0.01" in form.preview_label.text(), timeout=20000)
    assert "Noise multiplier σ" in form.preview_label.text()


def test_form_round_trips_a_toml_config(form, tmp_path):
    config = RunConfig.load_toml("resources/examples/pate-mnist-quick.toml")
    form.load_config(config)
    assert form.valid
    assert form.config() == config
    path = tmp_path / "again.toml"
    form.config().save_toml(path)
    assert RunConfig.load_toml(path) == config


def test_form_state_keeps_hidden_invalid_fields_out_of_the_way():
    state = FormState()
    state.set_text("noise_multiplier", "1.1")
    state.set_text("mechanism", "pate")
    state.set_text("noise_multiplier", "nonsense")  # a DP-SGD field, hidden for PATE
    assert "noise_multiplier" not in state.errors()
    assert state.config().mechanism == "pate"


def test_a_model_that_does_not_fit_the_dataset_is_marked_at_its_field(form):
    # The fits come from the engine's registry (what `python -m workbench.probe` reports).
    from workbench.probe import probe

    registry = probe()
    form.set_model_fits({d["name"]: (tuple(d["input_shape"]), d["models"]) for d in registry["datasets"]
                         if d["models"] is not None})
    form.set_value("noise_multiplier", "1.1")
    form.set_value("dataset", "digits")
    form.set_value("model", "mnist_cnn")
    assert not form.start_button.isEnabled()
    text = form.fields["model"].error.text()
    assert "'mnist_cnn' does not fit 'digits'" in text and "(1, 8, 8)" in text
    assert "digits_cnn" in form.fields["model"].editor.toolTip() + text
    form.set_value("model", "auto")
    assert form.start_button.isEnabled()
    form.set_value("mechanism", "pate")
    form.set_value("teacher_model", "cifar_cnn")
    assert "teacher_model" in form.errors and "does not fit" in form.errors["teacher_model"].message


def test_only_the_chosen_aggregators_noise_settings_are_shown(form):
    form.set_value("mechanism", "pate")
    shown = lambda name: form.fields[name].widget.isVisibleTo(form)  # noqa: E731
    form.set_value("aggregator", "gnmax")
    assert shown("gnmax_sigma") and not shown("threshold") and not shown("laplace_scale")
    form.set_value("aggregator", "confident")
    assert shown("threshold") and shown("sigma1") and shown("sigma2") and not shown("gnmax_sigma")
    form.set_value("aggregator", "lnmax")
    assert shown("laplace_scale") and not shown("sigma2")
