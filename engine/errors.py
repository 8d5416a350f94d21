"""User-facing errors: each names what is wrong, the value, what is allowed and what to do."""

from __future__ import annotations


class DPWError(Exception):
    """Base class for errors that are shown to a person as one line, never as a traceback."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    @property
    def message(self) -> str:
        return str(self.args[0])


class ConfigError(DPWError):
    """A run setting is invalid. `field` is the setting's name as it appears in the config file."""

    def __init__(self, field: str, message: str, *, hint: str | None = None):
        super().__init__(f"{field}: {message}", hint=hint)
        self.field = field


class DataError(DPWError):
    """A dataset cannot be found, read or used (missing files, corrupt file, wrong shapes)."""


class ModelError(DPWError):
    """A model cannot be built or cannot be trained with differential privacy."""


class BudgetError(DPWError):
    """The requested training cannot fit in the privacy budget."""
