"""The setup form is generated from config_fields and validates with the engine's rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit, QPushButton

from engine.config import RunConfig, config_fields
from workbench.form_state import FormState
from workbench.setup_form import INVALID_MARK, SetupForm


def _problems(form) -> list[str]:
    return [form.problems.item(i).text() for i in range(form.problems.count())]


@pytest.fixture
def form(qtbot):
    widget = SetupForm()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def test_every_field_of_the_mechanism_has_a_widget_with_its_spec(form):
    for mechanism in ("dpsgd", "pate", "none"):
        form.set_value("mechanism", mechanism)
        visible = set(form.state.visible())
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
            student = name == "model" and mechanism == "pate"
            assert field.label.text() == ("Student model" if student else spec.label)


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
    field = form.fields["delta"]
    assert "delta" in field.message and "2" in field.message
    assert field.mark.text() == INVALID_MARK and field.message in field.mark.toolTip()
    assert field.editor.property("invalid") is True
    assert "delta" in form.summary.text()
    assert any("Delta (delta)" in line for line in _problems(form))
    form.set_value("delta", "1e-5")
    assert form.start_button.isEnabled()
    assert form.fields["delta"].mark.text() == "" and form.fields["delta"].message == ""


def test_negative_clipping_norm_and_text_in_a_number_are_refused(form):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("clipping_norm", "-1")
    assert not form.start_button.isEnabled()
    assert "out of range" in form.fields["clipping_norm"].message
    form.set_value("clipping_norm", "abc")
    assert "'abc' is not a number" in form.fields["clipping_norm"].message


def test_a_decimal_comma_in_a_whole_number_is_refused_not_read_as_thousands(form):
    """Epochs "1,5" trained 15 epochs (the comma was dropped) while "1.5" was refused."""
    form.set_value("noise_multiplier", "1.1")
    form.set_value("epochs", "1,5")
    assert not form.start_button.isEnabled()
    assert "'1,5' is not a whole number" in form.fields["epochs"].message
    form.set_value("epochs", "1,000")  # a thousands separator is read as one
    form.set_value("train_subset", "60,000")
    assert form.state.config().epochs == 1000 and form.state.config().train_subset == 60000
    form.set_value("train_subset", "6,00")
    assert "'6,00' is not" in form.fields["train_subset"].message


def test_a_test_fraction_that_leaves_no_training_example_is_marked_and_start_does_nothing(form, qtbot):
    """test_fraction 1 gave N = 0: every keystroke raised ZeroDivisionError in the 1/N check, the form
    still said "Every setting is valid", and Start raised an unhandled ConfigError."""
    form.set_value("dataset", "digits")
    form.set_value("noise_multiplier", "1.1")
    for text in ("1", "1.0"):
        form.set_value("test_fraction", text)
        assert not form.start_button.isEnabled() and "out of range" in form.fields["test_fraction"].message
        with qtbot.assertNotEmitted(form.start_requested):
            form.request_start()
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="test_fraction: leaves no training example"):
        RunConfig(dataset="digits", noise_multiplier=1.0).check_against_dataset(0, 1797)


def test_cross_field_rule_is_shown_at_its_field(form):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("target_epsilon", "3")
    assert not form.start_button.isEnabled()
    assert "not both" in form.fields["target_epsilon"].message


def test_delta_must_be_below_one_over_n_of_the_dataset(form):
    form.set_value("dataset", "breast-cancer")
    form.set_value("noise_multiplier", "1.0")
    form.set_value("delta", "0.01")
    assert not form.start_button.isEnabled()
    assert "1/N" in form.fields["delta"].message


def test_cost_preview_computes_epsilon_off_the_gui_thread(form, qtbot):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("epochs", "1")
    qtbot.waitUntil(lambda: "ε =" in form.preview_label.text(), timeout=20000)
    assert "steps" in form.preview_label.text() and form.preview_label.isEnabled()
    before = form.preview_label.text()
    form.set_value("epochs", "2")
    assert not form.preview_label.isEnabled()  # the old estimate stays, greyed out, until the new one
    qtbot.waitUntil(lambda: form.preview_label.text() != before, timeout=20000)
    assert form.preview_label.isEnabled()
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
    # The fits come from the engine's registry (what the window's engine probe reports).
    from engine.capabilities import engine_capabilities

    registry = engine_capabilities()
    form.set_model_fits({d["name"]: (tuple(d["input_shape"]), d["models"]) for d in registry["datasets"]
                         if d["models"] is not None})
    form.set_value("noise_multiplier", "1.1")
    form.set_value("dataset", "digits")
    form.set_value("model", "mnist_cnn")
    assert not form.start_button.isEnabled()
    text = form.fields["model"].message
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


def _geometry(form) -> dict[str, tuple]:
    """Where every shown field's input sits in the form, and its size."""
    return {name: (f.editor.mapTo(form, f.editor.rect().topLeft()).toTuple(), f.editor.size().toTuple())
            for name, f in form.fields.items() if f.widget.isVisibleTo(form)}


def test_fields_do_not_move_when_errors_appear(form, qtbot):
    form.resize(1100, 900)
    form.set_value("noise_multiplier", "1.1")
    qtbot.waitUntil(lambda: "ε =" in form.preview_label.text(), timeout=20000)
    before = _geometry(form)
    form.set_value("clipping_norm", "abc")
    form.set_value("delta", "0.5")
    form.set_value("epochs", "0")
    qtbot.wait(50)
    assert not form.valid
    assert _geometry(form) == before
    form.set_value("mechanism", "pate")
    form.set_value("sigma1", "abc")
    qtbot.wait(50)
    pate_before = _geometry(form)
    form.set_value("num_teachers", "1")
    form.set_value("threshold", "-3")
    qtbot.wait(50)
    assert _geometry(form) == pate_before


def test_every_invalid_field_is_marked_at_once_including_delta_against_one_over_n(form):
    form.set_value("mechanism", "pate")
    form.set_value("sigma1", "abc")
    form.set_value("delta", "0.5")
    assert set(form.errors) >= {"sigma1", "delta"}
    assert form.fields["sigma1"].mark.text() == INVALID_MARK
    assert "1/N" in form.fields["delta"].message and form.fields["delta"].mark.text() == INVALID_MARK
    lines = _problems(form)
    assert any(line.startswith(f"{INVALID_MARK} Sigma") for line in lines) and any("1/N" in line for line in lines)
    form.set_value("num_teachers", "abc")
    assert {"sigma1", "delta", "num_teachers"} <= set(form.errors)
    assert form.summary.text().startswith("Cannot start (3 settings to fix, listed above): ")
    form.resize(600, 700)
    assert form.summary.width() <= form.width()  # a long message is cut short with '…', never widens the form


def test_delta_against_one_over_n_is_checked_next_to_a_cross_field_error():
    state = FormState()
    state.set_text("noise_multiplier", "1.1")
    state.set_text("target_epsilon", "3")  # not both
    state.set_text("delta", "0.001")
    errors = state.errors(state.data_size())
    assert "not both" in errors["target_epsilon"].message and "1/N" in errors["delta"].message


def test_a_problem_in_the_list_takes_the_focus_to_its_field(form, qtbot):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("epochs", "0")
    item = form.problems.item(0)
    assert item.data(Qt.ItemDataRole.UserRole) == "epochs"
    form.problems.itemClicked.emit(item)
    qtbot.waitUntil(lambda: form.fields["epochs"].editor.hasFocus(), timeout=2000)


def test_fields_the_optimizer_and_dataset_do_not_use_are_hidden(form):
    shown = lambda name: form.fields[name].widget.isVisibleTo(form)  # noqa: E731
    form.set_value("optimizer", "adam")
    assert not shown("momentum")
    form.set_value("optimizer", "momentum")
    assert shown("momentum")
    form.set_value("dataset", "mnist")
    assert not shown("test_fraction") and not shown("label_column") and not shown("classes")
    form.set_value("dataset", "fmnist")  # an alias of a registered dataset with its own test split
    assert not shown("test_fraction") and not shown("classes")
    assert not shown("normalization") and not shown("feature_bounds")  # images: fixed constants
    form.set_value("dataset", "digits")
    assert shown("test_fraction") and not shown("label_column") and not shown("classes")
    assert not shown("test_data") and not shown("normalization")
    form.set_value("dataset", "/data/patients.csv")
    assert shown("test_fraction") and shown("label_column") and shown("classes") and shown("test_data")
    assert shown("normalization") and shown("feature_bounds")
    form.set_value("test_data", "/data/held_out.csv")  # the held-out examples given: none are drawn
    assert not shown("test_fraction") and shown("test_data")
    assert form.findChild(QPushButton, "chooseTestDataFile").isVisibleTo(form)
    form.set_value("target_attack_tpr", "")
    assert not shown("target_attack_fpr")  # the FPR of a target attack TPR: none set
    form.set_value("target_attack_tpr", "0.05")
    assert shown("target_attack_fpr")
    form.set_value("audit_canaries", "0")
    assert not shown("audit_canary_kind")
    form.set_value("audit_canaries", "100")
    assert shown("audit_canary_kind")


def test_a_hidden_momentum_that_does_not_parse_does_not_block_adam(form):
    form.set_value("noise_multiplier", "1.1")
    form.set_value("optimizer", "momentum")
    form.set_value("momentum", "abc")
    assert not form.valid
    form.set_value("optimizer", "adam")
    assert form.valid and form.config().optimizer == "adam"


def test_unit_labels_are_never_narrower_than_their_text(form):
    form.resize(700, 700)  # narrow: the fields are squeezed, the units must not be
    form.set_value("epsilon_budget", "3")
    units = {name: f.unit for name, f in form.fields.items() if f.unit is not None and f.widget.isVisibleTo(form)}
    assert {"target_epsilon", "delta", "epsilon_budget"} <= set(units)
    for name, unit in units.items():
        ink = unit.fontMetrics().boundingRect(unit.text()).width()
        assert unit.width() >= unit.sizeHint().width() >= ink, name
        assert unit.isEnabled(), name  # drawn in the normal text colour, not greyed out


def test_the_first_preview_never_asks_to_fix_settings_when_none_is_marked(qtbot):
    form = SetupForm()
    qtbot.addWidget(form)
    assert not form.valid  # the bare defaults need a noise multiplier or a target
    form.load_config(RunConfig.load_toml("resources/examples/dpsgd-mnist-quick.toml"))
    assert form.valid
    assert "Fix the settings" not in form.preview_label.text()
    assert form.preview_label.text() == "Estimating the privacy cost…"
    qtbot.waitUntil(lambda: "ε =" in form.preview_label.text(), timeout=20000)
    form.set_value("delta", "abc")
    assert "Fix the settings" in form.preview_label.text()


def test_a_dataset_folder_is_chosen_by_its_own_button_not_as_the_data_directory(form, tmp_path, monkeypatch):
    """An image folder or an x.npy/y.npy folder is a dataset: its Folder… button sets `dataset`. Before,
    only a .csv/.npz file could be chosen there, and the only folder button set `data_dir` (where the
    registered datasets' files are), which a newcomer with a folder of images pressed instead."""
    from PySide6.QtWidgets import QFileDialog, QPushButton

    pictures = tmp_path / "pictures"
    (pictures / "cat").mkdir(parents=True)
    opened = []
    monkeypatch.setattr(QFileDialog, "getExistingDirectory",
                        lambda parent, title, start: (opened.append(start), str(pictures))[1])
    form.findChild(QPushButton, "chooseDataFolder").click()
    assert form.state.texts["dataset"] == str(pictures) and form.state.texts["data_dir"] == ""
    assert opened == [str(Path.home())]
    form.findChild(QPushButton, "chooseDataFolder").click()  # the next chooser opens beside the last choice
    assert opened[-1] == str(tmp_path)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda parent, title, start: str(tmp_path / "data"))
    form.findChild(QPushButton, "chooseDataDir").click()
    assert form.state.texts["data_dir"] == str(tmp_path / "data") and form.state.texts["dataset"] == str(pictures)


def test_a_typed_dataset_path_is_read_once_it_stops_changing(form, qtbot, tmp_path):
    """Each folder on the way to the path exists while it is typed: only the last one is read (the
    real reader is the pre-run check helper, see test_precheck_window; here a recording stand-in)."""
    (tmp_path / "a" / "b" / "pictures").mkdir(parents=True)
    read = []
    form.size_lookup = lambda config: (read.append(config.dataset), (100, 25))[1]
    for name, value in dict(noise_multiplier="1.0", target_epsilon="", delta="1e-3", expected_batch_size="10",
                            epochs="1", model="auto").items():
        form.set_value(name, value)
    for part in (tmp_path, tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "pictures"):
        form.set_value("dataset", str(part))
    qtbot.waitUntil(lambda: "N 100," in form.preview_label.text(), timeout=20_000)
    assert read == [str(tmp_path / "a" / "b" / "pictures")]
    form.set_value("epochs", "2")  # a setting that does not change N: no new read
    qtbot.waitUntil(lambda: "20 steps" in form.preview_label.text(), timeout=20_000)
    assert len(read) == 1


def test_a_narrow_form_puts_the_privacy_column_under_the_others_not_off_the_edge(form, qtbot):
    """At 800x600 the Privacy column (mechanism, δ, budget, the cost preview) sat behind a horizontal
    scroll bar, only "Mech", "Delta" and "Epsil" showing."""
    from PySide6.QtWidgets import QApplication

    privacy, run = form.groups["privacy"][0], form.groups["run"][0]

    def placed(width: int) -> tuple[int, int]:
        form.resize(width, 600)
        for _ in range(3):
            QApplication.processEvents()
        return privacy.mapTo(form, privacy.rect().topLeft()).x(), privacy.mapTo(form, privacy.rect().topRight()).x()

    left, right = placed(1400)
    assert left > run.width() and right < 1400  # side by side
    left, right = placed(500)
    assert left < 20 and right < 500  # under the run settings, whole
    assert privacy.mapTo(form, privacy.rect().topLeft()).y() > run.mapTo(form, run.rect().bottomLeft()).y()


def test_the_test_images_of_an_image_folder_are_chosen_beside_it(form, tmp_path, monkeypatch):
    """An image folder's test images given apart (test_data): its Folder… button opens beside the
    dataset, and test_fraction is hidden once they are given."""
    from PySide6.QtWidgets import QFileDialog

    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "test" / "cat").mkdir(parents=True)
    form.set_value("dataset", str(tmp_path / "train"))
    assert form.fields["test_data"].widget.isVisibleTo(form) and form.fields["test_fraction"].widget.isVisibleTo(form)
    opened = []
    monkeypatch.setattr(QFileDialog, "getExistingDirectory",
                        lambda parent, title, start: (opened.append(start), str(tmp_path / "test"))[1])
    form.findChild(QPushButton, "chooseTestDataFolder").click()
    assert opened == [str(tmp_path)] and form.state.texts["test_data"] == str(tmp_path / "test")
    assert not form.fields["test_fraction"].widget.isVisibleTo(form)


@pytest.mark.parametrize("name, value, other_dataset, unset", [
    ("test_data", "/data/held_out.csv", "digits", None),  # a registered dataset refuses test data given apart
    ("normalization", "exact", "mnist", "bounds"),  # images are scaled by fixed constants: 'exact' is refused
])
def test_a_setting_left_behind_by_a_change_of_dataset_does_not_block_start(form, name, value, other_dataset, unset):
    """A setting chosen for a CSV, then the dataset switched to one that hides it and whose config refuses
    it: the form leaves it unset instead of blocking Start unseen, and keeps the text for a switch back."""
    for field, text in dict(noise_multiplier="1.0", target_epsilon="", delta="1e-5").items():
        form.set_value(field, text)
    form.set_value("dataset", "/data/patients.csv")
    form.set_value(name, value)
    assert getattr(form.config(), name) == value
    form.set_value("dataset", other_dataset)
    assert form.valid and getattr(form.config(), name) == unset
    form.set_value("dataset", "/data/patients.csv")  # back: the text was kept
    assert getattr(form.config(), name) == value
