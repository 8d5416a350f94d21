"""The window never trains or imports torch itself; its model layer works without Qt."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})


def test_the_window_process_does_not_import_torch(tmp_path):
    out = run_python(f"""
        import sys
        from workbench.settings import use_folder
        use_folder({str(tmp_path)!r})
        from workbench.app import create_app
        from workbench.main_window import MainWindow
        app = create_app()
        w = MainWindow({str(tmp_path / 'runs.sqlite')!r}, probe=False)
        w.show(); app.processEvents()
        w.form.set_value("noise_multiplier", "1.1")
        print("torch" in sys.modules)
        w.close()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_form_state_and_run_data_need_no_qt():
    out = run_python("""
        import sys
        import workbench.form_state, workbench.run_data
        print(any(name.startswith("PySide6") for name in sys.modules))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_status_bar_names_the_engine_device(window, qtbot):
    window.probe.start()
    qtbot.waitUntil(lambda: window.probe.result is not None, timeout=60000)
    expected = window.probe.result["device"]
    assert window.device_label.text().startswith(f"Engine device: {expected}")
    # the dataset list comes from the engine's registry
    combo = window.form.fields["dataset"].editor
    assert "breast-cancer" in [combo.itemText(i) for i in range(combo.count())]


def test_no_display_gets_a_clear_message_instead_of_a_qt_abort(tmp_path):
    import os
    import subprocess
    import sys

    from workbench.app import display_problem

    assert display_problem({"DISPLAY": ":0"}) is None
    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}) is None
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "gui", "--db", str(tmp_path / "runs.sqlite")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "no display" in proc.stderr and "xvfb-run dpw gui" in proc.stderr


def test_missing_x11_libraries_are_named_with_their_debian_packages_before_qt_aborts():
    from workbench.app import XCB_LIBRARIES, missing_xcb_libraries

    none_found = missing_xcb_libraries({"DISPLAY": ":0"}, find=lambda name: None)
    assert none_found == list(XCB_LIBRARIES.values()) and "libxcb-cursor0" in none_found
    only_cursor = missing_xcb_libraries({"DISPLAY": ":0"}, find=lambda name: None if name == "xcb-cursor" else name)
    assert only_cursor == ["libxcb-cursor0"]
    for env in ({"QT_QPA_PLATFORM": "offscreen"}, {"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}):
        assert missing_xcb_libraries(env, find=lambda name: None) == []
    # every package the README's apt-get line installs is found on this machine
    assert missing_xcb_libraries({"DISPLAY": ":0"}) == []
