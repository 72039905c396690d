"""The `loopscale` Typer application and its error handling.

Command modules register on ``app`` (or add a sub-app); heavy imports (torch, scipy) stay inside
the command functions so `loopscale --help` and `loopscale fit` start fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.markup import escape

from loopscale.console import console, err_console  # noqa: F401  (commands import them from here)
from loopscale.errors import LoopscaleError

app = typer.Typer(
    name="loopscale",
    help="How much is one recurrence worth? Train looped LMs on an iso-depth grid, fit phi, plan, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for user errors.")) -> None:
    _state["debug"] = debug


def _click_modules() -> list[Any]:
    """The click exception modules in use: typer >= 0.12 bundles its own click (``typer._click``),
    whose exceptions are not subclasses of the standalone click's; handle both."""
    import importlib

    mods = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            continue
    return mods


def _click_types(name: str) -> tuple[type, ...]:
    return tuple(getattr(m, name) for m in _click_modules() if hasattr(m, name))


def _usage_hint(exc: Exception) -> str:
    """``usage: loopscale train [OPTIONS] [CONFIG] (loopscale train --help)`` for a click usage error."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return "see loopscale --help"
    usage = " ".join(ctx.get_usage().split())
    usage = usage.removeprefix("Usage: ").removeprefix("usage: ")
    return f"usage: {usage}  (more: {ctx.command_path} --help)"


def _show_click_error(exc: Exception) -> int:
    """One line naming the problem, plus a usage hint; exit status 2 for usage errors (as click's own)."""
    if isinstance(exc, _click_types("NoArgsIsHelpError")):
        exc.show()  # type: ignore[attr-defined]  # the help text itself
        return 2
    msg = " ".join(str(exc.format_message()).split()) or type(exc).__name__  # type: ignore[attr-defined]
    err_console.print(f"[bold red]error:[/] {escape(msg)}", markup=True, highlight=False, soft_wrap=True)
    if isinstance(exc, _click_types("UsageError")):
        err_console.print(_usage_hint(exc), highlight=False, soft_wrap=True, style="dim")
        return 2
    return int(getattr(exc, "exit_code", 1) or 1)


def _caused_by_interrupt(exc: BaseException) -> bool:
    """True when a KeyboardInterrupt sits in the exception's cause/context chain.

    A SIGINT that lands while a pybind11 extension initialises (scipy.optimize's HiGHS, on first fit) is
    re-raised by the import machinery as ``ImportError: initialization failed`` whose cause is the interrupt.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def run_app(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and exit status 2."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        code = app(args=argv, standalone_mode=False)
    except LoopscaleError as err:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", markup=True, highlight=False, soft_wrap=True)
        return int(getattr(err, "exit_code", 2))
    except KeyboardInterrupt:
        err_console.print("interrupted; rerun the same command to resume")
        return 130
    except OSError as exc:  # the file system said no (a file where a folder must be, read-only, full): one line
        if debug or exc.filename is None:
            raise
        where = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 else "")
        err_console.print(
            f"[bold red]error:[/] {escape(where)}: {escape(exc.strerror or type(exc).__name__)}",
            markup=True,
            highlight=False,
            soft_wrap=True,
        )
        return 1
    except SystemExit as exc:  # typer's own exits (--help)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # click usage errors raised in non-standalone mode (typer's click or click)
        if _caused_by_interrupt(exc):  # a Ctrl-C inside an extension module's import surfaces as ImportError
            err_console.print("interrupted; rerun the same command to resume")
            return 130
        if isinstance(exc, _click_types("ClickException")):
            return _show_click_error(exc)
        if isinstance(exc, _click_types("Abort")):
            return 1
        raise
    # Not standalone, typer returns the code of an Exit instead of raising it, and turns a KeyboardInterrupt
    # that no command caught into Exit(130): a Ctrl-C in fit, report, export or collect must not exit 0.
    # (Commands return None.)
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        if code == 130:
            err_console.print("interrupted")
        return code
    return 0
