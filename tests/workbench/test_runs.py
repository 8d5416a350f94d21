"""Real runs through the window: start, follow, stop, a killed runner, reopening the store."""

from __future__ import annotations

import os
import signal

from PySide6.QtCore import QPoint, Qt

from engine.store import Store
from workbench.main_window import MainWindow
from workbench.runs_model import COLUMNS

RUN_TIMEOUT_MS = 120_000
STATUS_COLUMN = [key for key, _ in COLUMNS].index("status")


def fill(window: MainWindow, **values) -> None:
    form = window.form
    for name, value in values.items():
        form.set_value(name, str(value))


def quick_digits(window: MainWindow, name: str, epochs: int = 2) -> None:
    fill(window, name=name, dataset="digits", model="auto", mechanism="dpsgd", noise_multiplier=1.0, target_epsilon="",
         expected_batch_size=64, epochs=epochs, learning_rate=0.5, delta=1e-4, evaluations_per_epoch=2)


def list_status(window: MainWindow, run_id: int) -> str:
    row = window.runs_model.row_of(run_id)
    return window.runs_model.index(row, STATUS_COLUMN).data()


def start(window: MainWindow, qtbot) -> int:
    assert window.form.start_button.isEnabled(), window.form.summary.text()
    before = set(window.run_data)
    window.act_start.trigger()
    (run_id,) = set(window.run_data) - before
    return run_id


def test_a_real_run_streams_curves_and_finishes(window, qtbot, db_path):
    quick_digits(window, "digits-quick")
    run_id = start(window, qtbot)
    assert window.tabs.currentWidget() is window.dashboard
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    data = window.run_data[run_id]
    assert data.status == "finished", [m.text for m in data.messages]
    assert len(data.metrics["train_loss"]) > 10
    assert len(data.metrics["test_accuracy"]) >= 2
    assert len(data.privacy["rdp"]) > 10
    # the dashboard drew them (10 Hz timer)
    qtbot.waitUntil(lambda: window.dashboard.curves["train_loss"].xData is not None
                    and len(window.dashboard.curves["train_loss"].xData) == len(data.metrics["train_loss"]),
                    timeout=5000)
    assert window.dashboard.budget_label.text().startswith("ε ")
    assert "pld" in window.dashboard.budget_label.text()
    qtbot.waitUntil(lambda: list_status(window, run_id) == "finished", timeout=10000)
    assert Store(db_path).get_run(run_id)["status"] == "finished"


def test_stop_mid_run_leaves_a_stopped_run(window, qtbot, db_path):
    quick_digits(window, "digits-long", epochs=400)
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: len(window.run_data[run_id].metrics.get("train_loss", ())) > 5, timeout=RUN_TIMEOUT_MS)
    window.select_run(run_id)
    window.act_stop.trigger()
    qtbot.waitUntil(lambda: not window.client.is_active(run_id), timeout=RUN_TIMEOUT_MS)
    assert Store(db_path).get_run(run_id)["status"] == "stopped"
    qtbot.waitUntil(lambda: list_status(window, run_id) == "stopped", timeout=10000)


def test_a_stopped_run_is_continued_from_its_checkpoint_to_its_end(window, qtbot, db_path):
    """Run ▸ Continue run: a new run from the stopped run's last checkpoint, trained to the end; the
    stopped run can then not be continued a second time."""
    quick_digits(window, "digits-continued", epochs=12)
    window.form.set_value("membership_audit", "False")  # not what is tested here: a few seconds a run
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: len(window.run_data[run_id].metrics.get("test_accuracy", ())) >= 2,
                    timeout=RUN_TIMEOUT_MS)
    window.select_run(run_id)
    window.act_stop.trigger()
    qtbot.waitUntil(lambda: not window.client.is_active(run_id), timeout=RUN_TIMEOUT_MS)
    window.refresh_runs()
    window.select_run(run_id)
    qtbot.waitUntil(window.act_continue.isEnabled, timeout=10000)
    assert window.act_continue.toolTip().startswith("Continue the selected stopped or failed run")
    stopped = Store(db_path).get_run(run_id)
    assert stopped["config"]["membership_audit"] is False
    before = set(window.run_data)
    window.act_continue.trigger()
    (second,) = set(window.run_data) - before
    qtbot.waitUntil(lambda: window.run_data[second].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[second].status == "finished", [m.text for m in window.run_data[second].messages]
    run = Store(db_path).get_run(second)
    assert (run["resumed_from"], run["steps_resumed"]) == (run_id, stopped["steps_done"])
    assert run["steps_done"] == run["steps_planned"] and run["epsilon"] > stopped["epsilon"]
    window.refresh_runs()
    window.select_run(second)
    shown = dict(window.runs_panel.config.rows_text())
    assert shown["Continues"] == f"run {run_id} from step {stopped['steps_done']} (ε covers both)"
    qtbot.waitUntil(lambda: f"continues run {run_id} from step {stopped['steps_done']}"
                    in window.dashboard.title.text(), timeout=5000)
    qtbot.waitUntil(lambda: not window.client.is_active(second), timeout=30000)  # its runner has exited
    assert not window.act_continue.isEnabled()  # a finished run: the greyed-out action says why
    assert window.act_continue.toolTip() == (f"Cannot continue: run {second} is finished: only a stopped or "
                                             "failed run is continued") == window.act_continue.statusTip()
    window.select_run(run_id)
    assert not window.act_continue.isEnabled()  # continued already, and the panel says by which run
    assert f"already continued by run {second} (finished)" in window.act_continue.toolTip()
    assert dict(window.runs_panel.config.rows_text())["Continued by"] == f"run {second} (finished)"


def test_a_killed_runner_is_reported_and_the_window_keeps_working(window, qtbot, db_path):
    quick_digits(window, "digits-killed", epochs=400)
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: len(window.run_data[run_id].metrics.get("train_loss", ())) > 5, timeout=RUN_TIMEOUT_MS)
    window.client.kill(run_id)
    qtbot.waitUntil(lambda: not window.client.is_active(run_id), timeout=30000)
    row = Store(db_path).get_run(run_id)
    assert row["status"] == "failed"
    assert "killed" in row["error"]
    data = window.run_data[run_id]
    assert data.status == "failed"
    assert any(m.level == "error" for m in data.messages)
    assert "failed" in window.statusBar().currentMessage()
    window.select_run(run_id)
    qtbot.waitUntil(lambda: window.dashboard.messages.isVisibleTo(window.dashboard), timeout=5000)
    assert "killed" in window.dashboard.messages.label.text()
    # everything up to the kill is kept and shown
    assert len(data.metrics["train_loss"]) > 5
    # the window still works: another run starts and finishes
    quick_digits(window, "digits-after", epochs=1)
    second = start(window, qtbot)
    qtbot.waitUntil(lambda: window.run_data[second].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[second].status == "finished"


def test_a_runner_on_standby_takes_the_next_run_and_another_waits_after_it(window, qtbot, db_path):
    """The window keeps one runner loaded (torch and the engine imported) for the next Start."""
    client = window.client
    client.keep_standby()
    standby = client.standby
    qtbot.waitUntil(lambda: standby.state() == standby.ProcessState.Running, timeout=10000)
    first_pid = standby.processId()
    quick_digits(window, "digits-standby", epochs=1)
    run_id = start(window, qtbot)
    assert client.jobs[run_id].process is standby and client.standby is None  # none loads beside a run
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[run_id].status == "finished" and Store(db_path).get_run(run_id)["status"] == "finished"
    qtbot.waitUntil(lambda: client.standby is not None, timeout=10000)  # the next one, once the run ended
    waiting = client.standby
    qtbot.waitUntil(lambda: waiting.state() == waiting.ProcessState.Running, timeout=10000)
    assert waiting.processId() != first_pid
    # one that dies waiting is not replaced; the next run starts a runner of its own
    os.kill(waiting.processId(), signal.SIGKILL)
    qtbot.waitUntil(lambda: client.standby is None, timeout=10000)
    quick_digits(window, "digits-own-runner", epochs=1)
    second = start(window, qtbot)
    qtbot.waitUntil(lambda: window.run_data[second].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[second].status == "finished" and client.standby is None


def test_a_standby_runner_is_not_handed_a_run_after_the_runners_variables_changed_and_ends_with_the_window(
        window, qtbot, db_path):
    client = window.client
    client.keep_standby()
    old = client.standby
    qtbot.waitUntil(lambda: old.state() == old.ProcessState.Running, timeout=10000)
    old_pid = old.processId()
    client.environment["DPW_TEST_MARK"] = "1"  # loaded with other variables: ended, not used
    quick_digits(window, "digits-new-variables", epochs=1)
    run_id = start(window, qtbot)
    assert client.jobs[run_id].process is not old
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[run_id].status == "finished"
    assert not pid_alive(old_pid)
    qtbot.waitUntil(lambda: client.standby is not None, timeout=10000)
    waiting = client.standby
    qtbot.waitUntil(lambda: waiting.state() == waiting.ProcessState.Running, timeout=10000)
    pid = waiting.processId()
    client.shutdown()
    assert client.standby is None and not pid_alive(pid)
    assert [r["id"] for r in Store(db_path).list_runs()] == [run_id]  # the standby stored nothing


def test_the_runner_on_standby_says_what_the_engine_offers_and_another_process_answers_when_it_cannot(
        window, qtbot, db_path):
    """The window asks the runner it keeps loaded for the next run what the engine offers (device,
    datasets, models): asked as it starts, it answers once loaded and stays on standby for the run, so
    no process of its own imports torch for it. One that ends before answering leaves the question to
    the pre-run check's helper."""
    client = window.client
    client.keep_standby()
    standby = client.standby
    with qtbot.waitSignal(window.probe.ready, timeout=60_000) as answered:
        window.probe.start()  # written while it still imports: read once it has loaded
    offered = answered.args[0]
    assert offered["device"] in ("cpu", "cuda") and "digits" in {d["name"] for d in offered["datasets"]}
    assert window.device_label.text().startswith(f"Engine device: {offered['device']}")
    assert client.standby is standby and standby.state() == standby.ProcessState.Running
    assert window.precheck._process is None  # the helper was not started for it
    quick_digits(window, "digits-after-probe", epochs=1)  # the runner that answered trains the next run
    run_id = start(window, qtbot)
    assert client.jobs[run_id].process is standby
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    assert window.run_data[run_id].status == "finished"

    # Killed before it answers: the helper answers instead.
    qtbot.waitUntil(lambda: client.standby is not None, timeout=10000)
    dying = client.standby
    qtbot.waitUntil(lambda: dying.state() == dying.ProcessState.Running, timeout=10000)
    window.probe.result = None
    with qtbot.waitSignal(window.probe.ready, timeout=120_000) as answered:
        assert client.ask_capabilities()
        os.kill(dying.processId(), signal.SIGKILL)
    assert answered.args[0]["device"] == offered["device"] and window.precheck._process is not None
    assert client.standby is None


def test_an_engine_that_cannot_start_is_said_in_the_status_bar(window, qtbot, monkeypatch):
    """No interpreter to start the runner on standby nor the check's helper with: the probe ends with
    'Engine: not available' and why, instead of 'checking…' for ever."""
    import sys

    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    window.client.keep_standby()
    with qtbot.waitSignal(window.probe.failed, timeout=30_000):
        window.probe.start()
    assert window.device_label.text().startswith("Engine: not available (")
    assert window.client.standby is None and window.probe.result is None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_config_whose_data_is_missing_is_refused_before_a_run_is_stored(window, qtbot, db_path, tmp_path):
    missing = tmp_path / "nowhere.csv"
    fill(window, name="bad-file", dataset=str(missing), mechanism="dpsgd", noise_multiplier=1.0, target_epsilon="")
    assert window.form.start_button.isEnabled(), window.form.summary.text()
    window.act_start.trigger()  # `dpw run`'s checks run first: nothing is stored, the reason is shown
    assert window.run_data == {} and Store(db_path).list_runs() == []
    assert "file not found" in window.statusBar().currentMessage()
    assert window.tabs.currentWidget() is window.form


def test_reopening_shows_past_runs_with_their_curves(window, qtbot, db_path):
    quick_digits(window, "digits-replay", epochs=1)
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    live = window.run_data[run_id]
    window.close()

    again = MainWindow(db_path, probe=False)
    qtbot.addWidget(again)
    again.show()
    assert again.runs_model.row_of(run_id) is not None
    assert list_status(again, run_id) == "finished"
    again.select_run(run_id)
    replay = again.dashboard.data
    assert replay is not None and replay.run_id == run_id and replay.status == "finished"
    for name in ("train_loss", "test_accuracy"):
        assert list(replay.metrics[name].y) == list(live.metrics[name].y)
    assert list(replay.privacy["rdp"].y) == list(live.privacy["rdp"].y)
    again.dashboard.refresh()
    assert len(again.dashboard.curves["train_loss"].xData) == len(live.metrics["train_loss"])
    # the form came back as it was left
    assert again.form.texts()["name"] == "digits-replay"
    # compare two runs side by side
    quick_digits(again, "digits-replay-2", epochs=1)
    again.form.set_value("noise_multiplier", "2.0")
    second = start(again, qtbot)
    qtbot.waitUntil(lambda: again.run_data[second].finished, timeout=RUN_TIMEOUT_MS)
    again.select_runs([run_id, second])
    again.act_compare.trigger()
    assert again.tabs.currentWidget() is again.compare
    assert again.compare.run_ids == sorted([run_id, second], reverse=True) or set(again.compare.run_ids) == {run_id, second}
    assert "noise_multiplier" in again.compare.differing
    again.client.shutdown()


def test_layout_and_last_config_are_remembered(window, qtbot, db_path):
    window.resize(700, 500)
    window.form.set_value("name", "remember-me")
    window.form.set_value("mechanism", "pate")
    window.tabs.setCurrentWidget(window.compare)
    window.close()
    again = MainWindow(db_path, probe=False)
    qtbot.addWidget(again)
    again.show()
    assert (again.size().width(), again.size().height()) == (700, 500)
    assert again.tabs.currentWidget() is again.compare
    assert again.form.texts()["name"] == "remember-me"
    assert again.form.fields["num_teachers"].widget.isVisibleTo(again.form)


def test_a_run_started_elsewhere_is_followed_from_the_store(window, qtbot, db_path):
    import signal
    import subprocess
    import sys

    from engine.config import RunConfig

    store = Store(db_path)
    config = RunConfig(name="from-cli", dataset="digits", mechanism="dpsgd", noise_multiplier=1.0,
                       expected_batch_size=64, epochs=400, learning_rate=0.5, delta=1e-4)
    run_id = store.create_run(config)
    proc = subprocess.Popen([sys.executable, "-m", "engine.runner", str(run_id), "--db", str(db_path)],
                            stdout=subprocess.DEVNULL)
    try:
        qtbot.waitUntil(lambda: store.get_run(run_id)["status"] == "running", timeout=RUN_TIMEOUT_MS)
        window.refresh_runs()
        window.select_run(run_id)
        qtbot.waitUntil(lambda: window.dashboard.data is not None and window.dashboard.data.run_id == run_id
                        and len(window.dashboard.data.metrics.get("train_loss", ())) > 20, timeout=RUN_TIMEOUT_MS)
        first = len(window.dashboard.data.metrics["train_loss"])
        qtbot.waitUntil(lambda: len(window.dashboard.data.metrics["train_loss"]) > first, timeout=30000)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    qtbot.waitUntil(lambda: window.dashboard.data.status == "stopped", timeout=10000)


def test_runs_wait_in_a_queue_one_at_a_time(window, qtbot, db_path):
    quick_digits(window, "queued-a", epochs=1)
    first = start(window, qtbot)
    quick_digits(window, "queued-b", epochs=1)
    second = start(window, qtbot)
    assert second in window.client.queue and first in window.client.jobs
    assert window.queue_label.text() == "1 running, 1 queued"
    assert window.run_data[second].status == "queued"  # waiting; the first one's runner exists
    assert window.run_data[first].status in ("starting", "running", "finished")
    qtbot.waitUntil(lambda: window.run_data[second].finished, timeout=RUN_TIMEOUT_MS)
    store = Store(db_path)
    a, b = store.get_run(first), store.get_run(second)
    assert a["status"] == b["status"] == "finished"
    assert b["started"] >= a["finished"]


def test_a_run_stopped_while_its_runner_starts_is_stopped_not_failed(window, qtbot, db_path):
    """Stop reached the runner before Python had set up its handler: the run was marked failed, "the
    runner process was killed or crashed before it reported an end"."""
    quick_digits(window, "stopped-at-once", epochs=50)
    run_id = start(window, qtbot)
    window.client.stop(run_id)  # the runner is still starting
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    row = Store(db_path).get_run(run_id)
    assert (row["status"], row["stop_reason"], row["error"]) == ("stopped", "stopped", None)
    assert not row["steps_done"] and window.run_data[run_id].status == "stopped"
    assert "failed" not in window.statusBar().currentMessage()


def test_stopping_a_queued_run_says_it_never_started(window, qtbot, db_path):
    """The status bar said "Stopping run 10 after its current step…" for a run that never started."""
    quick_digits(window, "queue-long", epochs=400)
    running = start(window, qtbot)
    quick_digits(window, "queue-waiting", epochs=1)
    queued = start(window, qtbot)
    window.select_run(queued)
    window.act_stop.trigger()
    assert window.statusBar().currentMessage() == (f"Run {queued} taken off the queue before it started: no step "
                                                   "taken, no privacy spent")
    assert Store(db_path).get_run(queued)["status"] == "stopped"
    window.select_run(running)
    window.act_stop.trigger()
    assert window.statusBar().currentMessage() == f"Stopping run {running} after its current step…"
    qtbot.waitUntil(lambda: not window.client.is_active(running), timeout=RUN_TIMEOUT_MS)


def test_deleting_runs_refuses_a_running_one_and_removes_the_others(window, qtbot, db_path, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    told, asked = [], []
    monkeypatch.setattr(QMessageBox, "information", lambda *a: told.append(a[2]))
    monkeypatch.setattr(QMessageBox, "question", lambda *a: asked.append(a[2]) or QMessageBox.StandardButton.Yes)
    quick_digits(window, "to-delete-running", epochs=400)
    running = start(window, qtbot)
    quick_digits(window, "to-delete-queued", epochs=1)
    queued = start(window, qtbot)
    qtbot.waitUntil(lambda: len(window.run_data[running].metrics.get("train_loss", ())) > 5, timeout=RUN_TIMEOUT_MS)

    window.select_runs([running])
    assert not window.act_delete.isEnabled()
    assert window.delete_selected() == [] and "is running" in told[0]
    assert Store(db_path).get_run(running)["status"] == "running"

    window.select_runs([queued])  # waiting in the queue: dropped from it, then deleted
    assert window.act_delete.isEnabled()
    window.act_delete.trigger()
    assert "Delete run" in asked[0] and "to-delete-queued" in asked[0]
    assert queued not in window.client.queue and window.runs_model.row_of(queued) is None
    store = Store(db_path)
    assert [r["id"] for r in store.deleted_runs()] == [queued]

    window.select_runs([running])
    window.act_stop.trigger()
    qtbot.waitUntil(lambda: not window.client.is_active(running), timeout=RUN_TIMEOUT_MS)
    artifacts = db_path.parent / "artifacts" / f"run-{running}"
    window.select_runs([running])
    assert window.delete_selected(confirm=False) == [running]
    assert store.list_runs() == [] and not artifacts.exists()
    assert window.dashboard.data is None and window.runs_model.rows == []
    assert {r["id"] for r in store.deleted_runs()} == {running, queued}
    assert window.act_delete.shortcutContext() == Qt.ShortcutContext.WidgetShortcut  # Delete in a field edits it


def test_a_run_deleted_elsewhere_leaves_the_window(window, qtbot, db_path):
    quick_digits(window, "deleted-elsewhere", epochs=1)
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    window.select_runs([run_id])
    assert window.dashboard.data is not None
    Store(db_path).delete_run(run_id)  # as `dpw delete` does from another process, maybe before the
    qtbot.waitUntil(lambda: not window.client.is_active(run_id), timeout=RUN_TIMEOUT_MS)  # runner exits
    window.refresh_runs()
    assert window.runs_model.row_of(run_id) is None
    assert window.dashboard.data is None and run_id not in window.run_data


def past_runs(window: MainWindow) -> dict[str, int]:
    """Three ended runs and a queued one, written through the window's store helper."""
    from engine.config import RunConfig

    made = {}
    for name, dataset, status, epsilon, accuracy, reason in (
            ("alpha-digits", "digits", "finished", 10.0, 0.91, "completed"),
            ("beta-mnist", "mnist", "finished", 2.0, 0.95, "budget"),
            ("gamma-digits", "digits", "failed", None, None, None),
            ("delta-mnist", "mnist", "stopped", 9.5, 0.5, "stopped")):
        run_id = window.store.create_run(RunConfig(name=name, dataset=dataset, mechanism="dpsgd",
                                                   noise_multiplier=1.0, delta=1e-5, reproducible_noise=False))
        fields = dict(status=status, epsilon=epsilon, accuracy=accuracy, stop_reason=reason, delta=1e-5,
                      accountant="pld", epsilon_budget=10.0, steps_done=0 if status == "failed" else 85,
                      steps_planned=169)
        if status != "failed":
            fields.update(started="2026-11-24T04:30:00+00:00", finished="2026-11-24T04:31:05+00:00")
        window.store.update_run(run_id, **fields)
        made[name] = run_id
    window.refresh_runs()
    return made


def shown_names(window: MainWindow) -> list[str]:
    return [window.runs_model.run_at(r)["name"] for r in range(window.runs_model.rowCount())]


def column(key: str) -> int:
    return [k for k, _ in COLUMNS].index(key)


def test_clicking_a_header_sorts_numbers_as_numbers(window, qtbot):
    past_runs(window)
    header = window.runs_view.horizontalHeader()
    # newest first by default
    assert shown_names(window) == ["delta-mnist", "gamma-digits", "beta-mnist", "alpha-digits"]
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton,
                     pos=header.rect().topLeft() + QPoint(header.sectionViewportPosition(column("epsilon")) + 5, 5))
    epsilons = [window.runs_model.run_at(r)["epsilon"] for r in range(window.runs_model.rowCount())]
    assert epsilons == [2.0, 9.5, 10.0, None]  # as text it would be "10" < "2" < "9.5"; empty last
    window.runs_view.sortByColumn(column("epsilon"), Qt.SortOrder.DescendingOrder)
    assert shown_names(window)[:3] == ["alpha-digits", "delta-mnist", "beta-mnist"]


def test_sort_order_show_deleted_log_scale_and_selected_run_are_remembered(window, qtbot, db_path):
    made = past_runs(window)
    window.runs_view.sortByColumn(column("epsilon"), Qt.SortOrder.DescendingOrder)
    window.runs_panel.show_deleted.setChecked(True)
    window.audit.log_fpr.setChecked(not window.audit.log_fpr.isChecked())
    log = window.audit.log_fpr.isChecked()
    window.select_run(made["beta-mnist"])
    window.close()
    again = MainWindow(db_path, probe=False)
    qtbot.addWidget(again)
    again.show()
    assert shown_names(again)[:3] == ["alpha-digits", "delta-mnist", "beta-mnist"]
    assert again.runs_view.horizontalHeader().sortIndicatorSection() == column("epsilon")
    assert again.runs_panel.show_deleted.isChecked() and again.audit.log_fpr.isChecked() == log
    assert again.current_run_id == made["beta-mnist"]
    again.close()


def test_a_store_opened_with_nothing_remembered_shows_its_newest_listed_run(qtbot, db_path):
    """`dpw run`, then `dpw gui`: the window opens on that run, not on an empty dashboard; a deleted
    run (not listed) is passed over."""
    from engine.config import RunConfig
    from engine.store import Store

    store = Store(db_path)
    ids = [store.create_run(RunConfig(name=f"cli-{k}", dataset="digits", noise_multiplier=1.0)) for k in range(3)]
    store.delete_run(ids[2])
    store.close()
    window = MainWindow(db_path, probe=False)
    qtbot.addWidget(window)
    window.show()
    assert window.current_run_id == ids[1]
    assert window.dashboard.title.text().startswith("Run 2")
    window.close()


def test_the_search_box_filters_by_name_dataset_mechanism_and_status(window, qtbot):
    past_runs(window)
    search = window.runs_panel.search
    qtbot.keyClicks(search, "mnist")
    assert sorted(shown_names(window)) == ["beta-mnist", "delta-mnist"]
    search.setText("digits failed")
    assert shown_names(window) == ["gamma-digits"]
    window.select_run(window.runs_model.run_at(0)["id"])
    assert window.current_run_id == window.runs_model.run_at(0)["id"]
    search.setText("dpsgd")
    assert len(shown_names(window)) == 4
    search.clear()
    assert len(shown_names(window)) == 4


def test_list_shows_delta_budget_duration_and_stop_reason(window):
    made = past_runs(window)
    model = window.runs_model
    row = model.row_of(made["beta-mnist"])
    cells = {key: model.index(row, column(key)).data() for key, _ in COLUMNS}
    assert cells["epsilon"] == "2" and cells["delta"] == "1e-05" and cells["epsilon_budget"] == "10"
    assert cells["duration"] == "1 min 05 s" and cells["stop_reason"] == "ε budget"
    assert cells["started"].startswith("2026-")
    tip = model.index(row, column("epsilon")).data(Qt.ItemDataRole.ToolTipRole)
    assert "δ = 1e-05" in tip and "pld" in tip
    failed = model.row_of(made["gamma-digits"])
    assert model.index(failed, column("started")).data() == ""  # never started: no start time
    assert model.index(failed, column("stop_reason")).data() == "error"


def test_export_report_and_set_up_again_follow_the_selection(window):
    made = past_runs(window)
    assert not window.act_reuse.isEnabled() and not window.act_export.isEnabled()
    window.select_run(made["gamma-digits"])
    assert window.act_reuse.isEnabled()
    assert not window.act_export.isEnabled() and not window.act_report.isEnabled()  # failed: no model
    window.select_run(made["beta-mnist"])
    assert window.act_export.isEnabled() and window.act_report.isEnabled()


def test_config_panel_shows_the_selected_runs_results_and_config(window):
    made = past_runs(window)
    window.select_run(made["delta-mnist"])
    rows = dict(window.runs_panel.config.rows_text())
    assert rows["ε (publishable)"] == "9.5" and rows["δ"] == "1e-05" and rows["Accountant"] == "pld"
    assert rows["Stopped by"] == "stop request"
    assert rows["dataset"] == "mnist" and rows["noise_multiplier"] == "1.0"
    assert window.runs_panel.config.run_id == made["delta-mnist"]


def answer_close_dialog(qtbot, button_text: str) -> list[str]:
    """Click `button_text` in the close-with-runs dialog once it shows; returns its text when seen."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    seen: list[str] = []

    def click() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(50, click)
            return
        seen.append(box.text() + "\n" + box.informativeText())
        next(b for b in box.buttons() if b.text() == button_text).click()

    QTimer.singleShot(50, click)
    return seen


def test_closing_with_a_running_run_asks_and_cancel_keeps_the_window(window, qtbot, db_path):
    quick_digits(window, "digits-close-cancel", epochs=400)
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: len(window.run_data[run_id].metrics.get("train_loss", ())) > 3, timeout=RUN_TIMEOUT_MS)
    seen = answer_close_dialog(qtbot, "Cancel")
    window.act_quit.trigger()  # as a person quits (Ctrl+Q); the close button asks the same
    assert seen and "digits-close-cancel" in seen[0]
    assert window.isVisible() and window.client.is_active(run_id)
    seen = answer_close_dialog(qtbot, "Stop runs and close")
    window.act_quit.trigger()
    assert not window.isVisible()
    assert Store(db_path).get_run(run_id)["status"] == "stopped"


def test_a_run_kept_running_after_closing_is_stopped_from_a_reopened_window(window, qtbot, db_path):
    import os
    import signal

    quick_digits(window, "digits-background", epochs=400)
    run_id = start(window, qtbot)
    qtbot.waitUntil(lambda: len(window.run_data[run_id].metrics.get("train_loss", ())) > 3, timeout=RUN_TIMEOUT_MS)
    answer_close_dialog(qtbot, "Keep running in background")
    window.act_quit.trigger()
    assert not window.isVisible()
    store = Store(db_path)
    row = store.get_run(run_id)
    try:
        assert row["status"] == "running"
        steps = row["steps_done"] or 0
        qtbot.waitUntil(lambda: (store.get_run(run_id)["steps_done"] or 0) > steps, timeout=30000)  # it goes on

        again = MainWindow(db_path, probe=False)
        qtbot.addWidget(again)
        again.show()
        again.select_run(run_id)
        assert again.act_stop.isEnabled() and not again.act_delete.isEnabled()
        again.act_stop.trigger()
        qtbot.waitUntil(lambda: store.get_run(run_id)["status"] == "stopped", timeout=RUN_TIMEOUT_MS)
        again.refresh_runs()
        assert list_status(again, run_id) == "stopped"
    finally:
        if store.get_run(run_id)["status"] == "running":
            os.kill(row["pid"], signal.SIGTERM)


def test_a_relative_store_path_names_one_file_for_the_window_its_helpers_and_its_runners(qtbot, tmp_path, monkeypatch):
    """`dpw gui --db runs.sqlite` from a project folder: the store helper (started in the install folder),
    the runners and the saved model all use the project folder's file; a run started there finishes."""
    from pathlib import Path

    from workbench.app import create_app

    repo = Path(__file__).resolve().parents[2]
    before = (repo / "runs.sqlite").exists()
    monkeypatch.chdir(tmp_path)
    create_app()
    window = MainWindow("runs.sqlite", probe=False)
    qtbot.addWidget(window)
    window.show()
    try:
        quick_digits(window, "relative-store")
        run_id = start(window, qtbot)
        qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
        row = Store(tmp_path / "runs.sqlite").get_run(run_id)
        assert row["status"] == "finished", row.get("error")
        model = Path(Store(tmp_path / "runs.sqlite").artifacts(run_id)[0]["path"])
        assert model.is_absolute() and model.is_relative_to(tmp_path)
        assert (repo / "runs.sqlite").exists() == before  # no second store in the install folder
    finally:
        window.client.shutdown(timeout_ms=10000)
        window.close()


def test_a_value_that_arrives_in_place_widens_its_column(window):
    """A running run's ε arrives after its row: the column grows to show it (it stayed '0…')."""
    from engine.config import RunConfig

    run_id = window.store.create_run(RunConfig(name="x", dataset="digits", noise_multiplier=1.0))
    window.store.update_run(run_id, status="running", started="2026-11-28T10:00:00+00:00")
    window.refresh_runs()
    header = window.runs_view.horizontalHeader()
    before = header.sectionSize(column("epsilon"))
    window.store.update_run(run_id, epsilon=0.23456, delta=1e-5, accountant="pld")
    window.refresh_runs()
    assert header.sectionSize(column("epsilon")) > before
    needed = window.runs_view.sizeHintForColumn(column("epsilon"))
    assert header.sectionSize(column("epsilon")) >= needed


def test_the_close_dialog_names_a_finished_run_whose_audit_still_runs():
    """The list said "finished" (the store records it before the membership audit) while the close
    dialog said "Running: 1 (dpsgd-mnist-quick)"."""
    from workbench.closing import active_run_label

    assert active_run_label({"id": 1, "name": "mnist", "status": "running"}) == "1 (mnist)"
    assert active_run_label({"id": 1, "name": "mnist", "status": "finished"}) == (
        "1 (mnist; trained, its membership audit still running)")
