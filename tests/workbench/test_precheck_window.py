"""Starting a run from the window runs `dpw run`'s checks first: a config that cannot train is one
line in the form and leaves no run in the store."""

from __future__ import annotations

import pytest

from engine.store import Store
from workbench.setup_form import INVALID_MARK


def _store_ids(window) -> list[int]:
    return [row["id"] for row in Store(window.store.path, readonly=True).list_runs()]


def _problems(window) -> list[str]:
    return [window.form.problems.item(i).text() for i in range(window.form.problems.count())]


def test_missing_data_is_reported_at_start_and_leaves_no_failed_run(window, tmp_path):
    for name, value in dict(name="no-data", dataset="mnist", data_dir=str(tmp_path / "empty"), noise_multiplier="1.1",
                            epochs="1", target_epsilon="").items():
        window.form.set_value(name, value)
    assert window.form.valid, window.form.summary.text()
    assert window.start_run(window.form.config()) is None
    assert window.run_data == {} and window.runs_model.rows == []
    assert _store_ids(window) == []
    assert "dataset files not found" in window.form.summary.text()
    assert any("dataset files not found" in line for line in _problems(window))
    assert window.tabs.currentWidget() is window.form
    assert "Traceback" not in window.form.summary.toolTip()
    # The next edit clears it; a config that works then starts.
    window.form.set_value("data_dir", "")
    window.form.set_value("dataset", "digits")
    window.form.set_value("delta", "1e-4")
    assert "not found" not in window.form.summary.text()


def test_delta_against_the_real_data_is_marked_at_its_field(window, tmp_path):
    table = tmp_path / "small.csv"
    table.write_text("a,b,label\n" + "".join(f"{i % 7},{(3 * i) % 5},{i % 2}\n" for i in range(60)))
    for name, value in dict(name="small-csv", dataset=str(table), noise_multiplier="1.0", target_epsilon="",
                            delta="0.05", expected_batch_size="8", epochs="1", model="auto").items():
        window.form.set_value(name, value)
    assert window.form.valid, window.form.summary.text()  # N is known only once the file is read
    assert window.start_run(window.form.config()) is None
    assert _store_ids(window) == []
    delta = window.form.fields["delta"]
    assert delta.mark.text() == INVALID_MARK and "1/N" in delta.message
    assert _problems(window)[0].startswith(f"{INVALID_MARK} Delta (delta):")


def test_a_valid_config_is_checked_then_started(window, qtbot):
    for name, value in dict(name="digits-ok", dataset="digits", noise_multiplier="1.0", target_epsilon="",
                            delta="1e-4", expected_batch_size="64", epochs="1", model="auto").items():
        window.form.set_value(name, value)
    run_id = window.start_run(window.form.config())
    assert run_id is not None and run_id in window.run_data
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=120_000)
    assert _store_ids(window) == [run_id]
    # The next check on the same data is told what its runs trained on (the same fingerprint is
    # the same bytes: an image folder among them is hashed, not checked again).
    fingerprint = Store(window.store.path, readonly=True).get_run(run_id)["dataset_fingerprint"]
    qtbot.waitUntil(lambda: window._checked_fingerprints("digits") == {fingerprint}, timeout=10_000)
    asked = []
    ask = window.precheck._ask
    window.precheck._ask = lambda request: asked.append(request) or ask(request)
    window.form.set_value("delta", "0.5")
    assert window.start_run(window.form.config()) is None  # delta >= 1/N: refused by the check
    assert asked[-1]["checked_before"] == [fingerprint] and _store_ids(window) == [run_id]


def test_an_image_folder_with_a_broken_file_is_one_line_before_any_run(window, tmp_path):
    """The broken file was found by the training step that drew it: a failed run that had spent privacy.
    Now the check before storing finds it, and the form names the file."""
    import numpy as np
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / "pictures" / label).mkdir(parents=True)
        for i in range(30):
            Image.fromarray(np.full((8, 8), 40 * i % 256, np.uint8)).save(tmp_path / "pictures" / label / f"{i}.png")
    broken = tmp_path / "pictures" / "dog" / "17.png"
    broken.write_bytes(b"\x89PNG truncated")
    for name, value in dict(name="pictures", dataset=str(tmp_path / "pictures"), noise_multiplier="1.0",
                            target_epsilon="", delta="1e-3", expected_batch_size="8", epochs="1",
                            model="auto").items():
        window.form.set_value(name, value)
    assert window.start_run(window.form.config()) is None
    assert _store_ids(window) == []
    assert any(f"{broken}: cannot be read as an image" in line for line in _problems(window)), _problems(window)


def test_the_privacy_cost_of_a_folder_dataset_is_previewed_from_its_real_size(window, qtbot, tmp_path):
    """For a file or folder dataset the preview said the cost was known only once a run had loaded it.
    Now the pre-run check helper reads the data's size (off the GUI thread): the preview states ε for
    the real N, delta >= 1/N is marked at its field before Start, and unreadable data is said at once."""
    import numpy as np
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / "pictures" / label).mkdir(parents=True)
        for i in range(30):
            Image.fromarray(np.full((8, 8), 40 * i % 256, np.uint8)).save(tmp_path / "pictures" / label / f"{i}.png")
    for name, value in dict(name="pictures", noise_multiplier="1.0", target_epsilon="", delta="1e-3",
                            expected_batch_size="8", epochs="1", model="auto", test_fraction="0.2").items():
        window.form.set_value(name, value)
    window.form.set_value("dataset", str(tmp_path / "pictures"))
    preview = window.form.preview_label
    from engine.datasets import load_dataset

    n = load_dataset(tmp_path / "pictures", test_fraction=0.2).num_train  # 60 images, about 12 held out
    qtbot.waitUntil(lambda: f"N {n}," in preview.text(), timeout=60_000)
    assert "ε = " in preview.text() and f"sampling rate q = {8 / n:.4g}" in preview.text(), preview.text()
    window.form.set_value("delta", "0.05")  # not below 1/N
    delta = window.form.fields["delta"]
    assert delta.mark.text() == INVALID_MARK and "1/N" in delta.message
    window.form.set_value("delta", "1e-3")
    (tmp_path / "pictures" / "dog" / "3.png").write_bytes(b"not an image")
    window.form.set_value("test_fraction", "0.25")  # another size: read again, and refused
    qtbot.waitUntil(lambda: "Cannot read the dataset" in preview.text(), timeout=60_000)
    assert "3.png: cannot be read as an image" in preview.text()


def test_a_csv_with_a_test_file_chosen_by_its_button_previews_every_row_as_training(window, qtbot, tmp_path,
                                                                                     monkeypatch):
    """The held-out examples in a file of their own (test_data): its File… button opens beside the
    dataset, and the preview's N is every row of the dataset (none drawn for testing)."""
    from PySide6.QtWidgets import QFileDialog, QPushButton

    rows = lambda r: "a,b,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in r)  # noqa: E731
    (tmp_path / "train.csv").write_text(rows(range(50)))
    (tmp_path / "held_out.csv").write_text(rows(range(50, 70)))
    for name, value in dict(name="table", noise_multiplier="1.0", target_epsilon="", delta="1e-3",
                            expected_batch_size="5", epochs="1", model="auto").items():
        window.form.set_value(name, value)
    window.form.set_value("dataset", str(tmp_path / "train.csv"))
    preview = window.form.preview_label
    qtbot.waitUntil(lambda: "N " in preview.text() and "N 50," not in preview.text(), timeout=60_000)  # drawn
    opened = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda parent, title, start, filter: (
        opened.append(start), (str(tmp_path / "held_out.csv"), filter))[1])
    window.form.findChild(QPushButton, "chooseTestDataFile").click()
    assert opened == [str(tmp_path)] and window.form.state.texts["test_data"] == str(tmp_path / "held_out.csv")
    qtbot.waitUntil(lambda: "N 50," in preview.text(), timeout=60_000)
    assert not window.form.fields["test_fraction"].widget.isVisibleTo(window.form)
    assert window.form.config().test_data == str(tmp_path / "held_out.csv")


def test_without_a_runner_on_standby_the_check_helper_says_what_the_engine_offers_and_a_close_ends_it(qtbot):
    """With no runner on standby to ask, the window asks the check's helper what the engine offers
    (device, datasets, models); that helper then checks the first run without importing again.
    Closing the window while the helper still imports ends it instead of waiting for it."""
    from engine.config import RunConfig
    from workbench.engine_client import EngineClient
    from workbench.precheck_client import PrecheckClient
    from workbench.probe import EngineProbe

    runners = EngineClient(store=None)  # keeps no runner on standby
    client = PrecheckClient()
    probe = EngineProbe(runners, client)
    with qtbot.waitSignal(probe.ready, timeout=120_000) as answered:
        probe.start()
    offered = answered.args[0]
    assert offered == probe.result and offered["device"] in ("cpu", "cuda")
    assert {"digits", "mnist", "breast-cancer"} <= {d["name"] for d in offered["datasets"]}
    digits = next(d for d in offered["datasets"] if d["name"] == "digits")
    assert digits["input_shape"] == [1, 8, 8] and "digits_cnn" in digits["models"]
    helper = client._process
    config = RunConfig(name="warm", dataset="digits", noise_multiplier=1.0, delta=1e-4)
    assert client.check(config) is None and client._process is helper  # the probe's helper answered
    client.close()
    assert helper.poll() is not None

    closing = PrecheckClient()
    cut_short = EngineProbe(runners, closing)
    cut_short.start()
    qtbot.waitUntil(lambda: closing._starting is not None, timeout=30_000)
    starting = closing._starting
    with qtbot.waitSignal(cut_short.failed, timeout=30_000) as failed:
        closing.close()  # while it imports
    assert starting.wait(timeout=30) is not None and closing._process is None
    assert "pre-run check" in failed.args[0] and cut_short.result is None  # said to a closed window: unseen


def checks_by_the_helper(window) -> list[str]:
    """The names of the configs the pre-run check's helper is asked to check from now on."""
    checks: list[str] = []
    check = window.precheck.check
    window.precheck.check = lambda config, **kwargs: checks.append(config.name) or check(config, **kwargs)
    return checks


def runner_on_standby(window, qtbot):
    """The window's runner on standby, loaded (as once the engine probe answered)."""
    window.client.keep_standby()
    standby = window.client.standby
    qtbot.waitUntil(lambda: standby.state() == standby.ProcessState.Running, timeout=20_000)
    return standby

def test_a_runner_on_standby_checks_the_run_it_will_train(window, qtbot, tmp_path):
    """With a runner on standby, Start has it check the config: a config it refuses is marked at its field
    as the helper's check marks it (no run stored; the runner stays on standby for the next Start), and
    a config it passes is trained by that runner from what it prepared in checking (the data read and the
    noise calibrated once). The check's helper is not asked (it reads a CSV's size for the preview)."""
    checks = checks_by_the_helper(window)
    client, standby = window.client, runner_on_standby(window, qtbot)
    table = tmp_path / "small.csv"
    table.write_text("a,b,label\n" + "".join(f"{i % 7},{(3 * i) % 5},{i % 2}\n" for i in range(60)))
    for name, value in dict(name="small-csv", dataset=str(table), noise_multiplier="1.0", target_epsilon="",
                            delta="0.05", expected_batch_size="8", epochs="1", model="auto").items():
        window.form.set_value(name, value)
    assert window.start_run(window.form.config()) is None
    assert _store_ids(window) == [] and "1/N" in window.form.fields["delta"].message
    assert client.standby is standby and standby.state() == standby.ProcessState.Running

    for name, value in dict(name="digits-checked-ahead", dataset="digits", noise_multiplier="", target_epsilon="2",
                            delta="1e-4", expected_batch_size="64", epochs="1").items():
        window.form.set_value(name, value)
    run_id = window.start_run(window.form.config())
    assert run_id is not None and client.jobs[run_id].process is standby
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=120_000)
    assert window.run_data[run_id].status == "finished"
    events = Store(window.store.path, readonly=True).events(run_id)
    assert [e["type"] for e in events].count("plan") == 1
    assert not any(e["type"] == "progress" and e.get("phase") == "calibrating" for e in events)
    assert checks == []


def test_a_runner_on_standby_that_dies_before_it_answers_leaves_the_check_to_the_helper(window, qtbot):
    import os
    import signal
    import time

    checks = checks_by_the_helper(window)
    standby = runner_on_standby(window, qtbot)
    for name, value in dict(name="digits-standby-died", dataset="digits", noise_multiplier="1.0", target_epsilon="",
                            delta="1e-4", expected_batch_size="64", epochs="1", model="auto").items():
        window.form.set_value(name, value)
    os.kill(standby.processId(), signal.SIGKILL)
    time.sleep(0.2)  # dead; the window has not been told yet
    run_id = window.start_run(window.form.config())
    assert run_id is not None and checks == ["digits-standby-died"], window.statusBar().currentMessage()
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=120_000)
    assert window.run_data[run_id].status == "finished" and _store_ids(window) == [run_id]


def test_a_window_closed_while_its_runner_on_standby_checks_stores_nothing_and_ends_it(window, qtbot, mnist_dir):
    from PySide6.QtCore import QTimer

    standby = runner_on_standby(window, qtbot)
    pid = standby.processId()
    for name, value in dict(name="mnist-closed", dataset="mnist", noise_multiplier="1.0", target_epsilon="",
                            delta="1e-5", epochs="1", model="mlp").items():
        window.form.set_value(name, value)
    QTimer.singleShot(0, window.close)  # the first thing the window does while it waits for the answer
    assert window.start_run(window.form.config()) is None
    assert _store_ids(window) == [] and window.client.standby is None
    import os

    with pytest.raises(ProcessLookupError):  # ended with the window, not left checking
        os.kill(pid, 0)
