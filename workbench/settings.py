"""Where the window remembers things between sessions (QSettings): geometry, layout, last config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

ORGANIZATION = "dp-workbench"
APPLICATION = "workbench"


def use_folder(folder: str | Path) -> None:
    """Keep settings as an INI file under `folder` (tests and benchmarks use a temporary one)."""
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(folder))


class Settings:
    """Typed access to the few things the window keeps."""

    def __init__(self) -> None:
        # The format is explicit: QSettings(org, app) alone would ignore use_folder().
        self.q = QSettings(QSettings.defaultFormat(), QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)

    def bytes(self, key: str) -> QByteArray | None:
        value = self.q.value(key)
        return value if isinstance(value, QByteArray) and not value.isEmpty() else None

    def set_bytes(self, key: str, value: QByteArray) -> None:
        self.q.setValue(key, value)

    def json(self, key: str, default: Any = None) -> Any:
        text = self.q.value(key)
        if not isinstance(text, str) or not text:
            return default
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return default

    def set_json(self, key: str, value: Any) -> None:
        self.q.setValue(key, json.dumps(value))

    def text(self, key: str, default: str = "") -> str:
        value = self.q.value(key)
        return value if isinstance(value, str) else default

    def set_text(self, key: str, value: str) -> None:
        self.q.setValue(key, value)

    def sync(self) -> None:
        self.q.sync()
