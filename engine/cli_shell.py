"""What every `dpw` command shares: one-line errors (never a traceback for the user's situation),
the --db option and the store it opens, strict JSON output."""

from __future__ import annotations

import inspect
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Callable

import click

from engine import rounding
from engine.errors import DPWError, explain


class UserError(click.ClickException):
    """One line and exit status 1, never a traceback."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class Interrupted(UserError):
    """Ctrl-C: one line, and the shell's exit status for SIGINT (128 + 2). It exits at once: an interrupt
    that landed inside an extension's import (torch) can leave the interpreter to end itself by SIGINT
    at shutdown, whatever status it was given. Nothing is stored yet when this is raised."""

    exit_code = 130

    def show(self, file: Any = None) -> None:
        super().show(file)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(self.exit_code)


def person_watches() -> bool:
    """Whether stderr is a terminal a person watches, not a pipe or file whose reader expects only the
    command's output and errors."""
    return sys.stderr.isatty()


def say_on_terminal(text: str) -> None:
    """A line of progress on stderr where a person watches it (person_watches), never into a pipe or file."""
    if person_watches():
        click.echo(text, err=True)


def fail(exc: DPWError) -> UserError:
    return UserError(exc.message + (f" — {exc.hint}" if exc.hint else ""))


STORE_PATH = "dpw.store_path"  # ctx.meta key: the store a command opened, for its error messages


class DPWGroup(click.Group):
    """Turns DPWError (and bad numbers) from any command into a one-line message, and so the user's
    situation met as an OSError or SQLite error (full disk, damaged or locked store, a path under a
    file); anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DPWError as exc:
            raise fail(exc) from None
        except (OSError, sqlite3.Error) as exc:
            message, hint, is_bug = explain(exc, store_path=ctx.meta.get(STORE_PATH))
            if is_bug:
                raise
            raise UserError(message + (f" — {hint}" if hint else "")) from None
        except KeyboardInterrupt:
            # Before a runner exists (loading torch, checking the data): a run being trained is
            # stopped through StopRequests instead, with its privacy recorded.
            raise Interrupted("interrupted (Ctrl-C) before any training started") from None


RUN_REFERENCE = ("RUN is a run's id, its name (the newest run of that name), or the newest run counted "
                 "back: -1 the newest, -2 the one before.")


class RunCommand(click.Command):
    """A command that takes runs (RUN): a run counted back from the newest (`dpw show -1`) is read as a
    run, not as an unknown option -1; any other unknown option is still refused as one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["context_settings"] = {**(kwargs.get("context_settings") or {}), "ignore_unknown_options": True}
        if kwargs.get("help"):
            kwargs["help"] = inspect.cleandoc(kwargs["help"]) + "\n\n" + RUN_REFERENCE
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from engine.store import COUNTED_BACK

        dashes = args.index("--") if "--" in args else len(args)
        taken = {a for a in args[:dashes] if COUNTED_BACK.fullmatch(a)} | set(args[dashes + 1:])
        taking = {name for param in self.get_params(ctx) if isinstance(param, click.Option)
                  and not param.is_flag and not param.count for name in param.opts}
        taken |= {value for option, value in zip(args[:dashes], args[1:dashes]) if option in taking}
        try:
            rest = super().parse_args(ctx, list(args))  # the parser empties the list it is given
        except click.UsageError:  # an unknown option taken as an extra argument is named as what it is
            self._refuse_unknown(ctx, args[:dashes], taken)
            raise
        for param in self.params:
            if isinstance(param, click.Argument):
                value = ctx.params.get(param.name)
                self._refuse_unknown(ctx, value if isinstance(value, tuple) else (value,), taken)
        return rest

    def _refuse_unknown(self, ctx: click.Context, given: Any, taken: set[str]) -> None:
        known = {name for param in self.get_params(ctx) for name in (*param.opts, *param.secondary_opts)}
        for token in given:
            if (isinstance(token, str) and token[:1] == "-" and len(token) > 1 and token not in taken
                    and token.split("=", 1)[0] not in known):
                raise click.NoSuchOption(token, ctx=ctx)


db_option = click.option(
    "--db",
    "db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Run store (SQLite). Default: $DPW_DB, else runs.sqlite in the per-user data folder.",
)


def open_store(db: Path | None, *, create: bool = False):
    """The store at --db (or the default); only the commands that store runs (`create`) make a new one:
    a command that reads, given a path where no store is, says so instead of creating an empty one
    (and the folders above it) at a mistyped path."""
    from engine.store import Store, check_store_path, default_db_path, empty_file_problem

    path = db or default_db_path()
    context = click.get_current_context(silent=True)
    if context is not None:
        context.meta[STORE_PATH] = path
    # A folder, a path under a file, another kind of file: said as such by check_store_path. False:
    # no file there, or an empty one.
    if not create and not check_store_path(path):
        raise empty_file_problem(path.absolute()) or UserError(
            f"no store at {path.absolute()}: no run was stored there — check the --db path (or $DPW_DB); dpw run "
            "creates the store with its first run")
    return Store(path)


def open_store_after_check(db: Path | None, check: Callable[[frozenset[str]], Any], *, dataset: str):
    """The store a new run goes into, once `check(checked_before)` has passed (checked_before: the
    fingerprints of `dataset` that the store's runs checked). A store already there is checked
    writable first, so it says so before the data loads; where no store is yet, only the folder is
    checked first and the file is created after the check, so a config that cannot train leaves
    nothing behind."""
    from engine.store import check_creatable, check_store_path, default_db_path

    path = db or default_db_path()
    if check_store_path(path):
        store = open_store(db, create=True)
        store.check_writable()
        check(store.checked_fingerprints(dataset))
        return store
    check_creatable(path)
    check(frozenset())
    store = open_store(db, create=True)
    store.check_writable()
    return store




def epsilon_text(value: float) -> str:
    """An epsilon as every command prints it: 4 decimals, or 4 significant digits when large (4e301 was
    printed in 302 digits), the last rounded up (engine.rounding)."""
    return rounding.up(value, ".4f" if value < 1e6 else ".4g")


def echo_json(value: Any, **dumps: Any) -> None:
    """Print `value` as strict JSON: an infinite epsilon as "Infinity" (engine.events' encoding, as in the
    event stream), never the bare Infinity that JSON parsers refuse."""
    from engine.events import to_json_safe

    click.echo(json.dumps(to_json_safe(value), allow_nan=False, **dumps))
