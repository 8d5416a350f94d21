"""Menus and keyboard shortcuts of the main window."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QMenu


def test_shortcuts_are_in_the_menus_and_work(window, qtbot):
    menus = {a.text().replace("&", ""): a for m in window.menuBar().findChildren(QMenu) for a in m.actions()}
    expected = {"Start run": "Ctrl+Return", "Stop run": "Ctrl+.", "Compare selected runs": "Ctrl+K",
                "New run": "Ctrl+N", "Audit": "Ctrl+4", "Study…": "Ctrl+T"}
    for text, shortcut in expected.items():
        assert menus[text].shortcut().toString() == shortcut
    started = []
    window.form.start_requested.disconnect()
    window.form.start_requested.connect(started.append)
    window.form.set_value("noise_multiplier", "1.1")
    editor = window.form.fields["name"].editor
    editor.setFocus()
    QTest.keyClick(editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert len(started) == 1 and started[0].noise_multiplier == 1.1
    QTest.keyClick(window.runs_view, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.compare
    QTest.keyClick(window.runs_view, Qt.Key.Key_4, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.audit
    QTest.keyClick(window.runs_view, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.form


def test_export_shortcut_works_while_a_text_field_has_the_focus(window, qtbot):
    """Ctrl+E is "end of line" in a text field on X11: the field took it and Export never opened."""
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QKeySequence
    from PySide6.QtWidgets import QLineEdit

    class X11LineEdit(QLineEdit):  # a text field with X11's key bindings, whatever platform the test runs on
        def event(self, event):
            if event.type() == QEvent.Type.ShortcutOverride and QKeySequence(event.keyCombination()) == "Ctrl+E":
                event.accept()  # "end of line": the field wants the key itself
                return True
            return super().event(event)

    window.act_export.setEnabled(True)  # as for a selected finished run
    exported = []
    window.act_export.triggered.disconnect()
    window.act_export.triggered.connect(lambda _=False: exported.append(True))
    editor = X11LineEdit(window.form)
    editor.show()
    editor.setFocus()
    QTest.keyClick(editor, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert exported == [True]


def test_start_is_disabled_in_the_menu_while_the_form_is_invalid(window):
    window.form.set_value("noise_multiplier", "1.1")
    assert window.act_start.isEnabled()
    window.form.set_value("delta", "2")
    assert not window.act_start.isEnabled()


def test_a_first_start_offers_the_quick_example_ready_to_run(window):
    # No remembered config: the form holds the quick example that runs here, valid, so Start is enabled.
    from engine.config import RunConfig
    from workbench.first_start import first_config

    example = RunConfig.load_toml(first_config())
    assert window.form.valid, window.form.summary.text()
    assert window.form.config().config_hash() == example.config_hash()


def test_the_window_title_names_the_store_and_the_application_once(window, db_path):
    # Qt appends the application display name to the title it shows; the window adds only the store.
    assert window.windowTitle() == str(db_path)
    assert "DP Workbench" not in window.windowTitle()
