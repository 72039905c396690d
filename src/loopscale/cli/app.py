"""The `loopscale` Typer application and its error handling.

Command modules register on ``app`` (or add a sub-app); heavy imports (torch, scipy) stay inside
the command functions so `loopscale --help` and `loopscale fit` start fast.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from loopscale.errors import LoopscaleError

app = typer.Typer(
    name="loopscale",
    help="How much is one recurrence worth? Train looped LMs on an iso-depth grid, fit phi, plan, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Tables stay readable when piped (rich falls back to 80 columns without a terminal).
_width = None if sys.stdout.isatty() else 200
console = Console(width=_width)
err_console = Console(stderr=True, width=_width)
_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for user errors.")) -> None:
    _state["debug"] = debug


def run_app(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and exit status 2."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        app(args=argv, standalone_mode=False)
    except LoopscaleError as err:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {err}", markup=True, highlight=False, soft_wrap=True)
        return int(getattr(err, "exit_code", 2))
    except KeyboardInterrupt:
        err_console.print("interrupted; rerun the same command to resume")
        return 130
    except SystemExit as exc:  # typer's own exits (--help, usage errors)
        return int(exc.code or 0)
    except Exception as exc:  # click usage errors raised in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return exc.exit_code
        if isinstance(exc, click.exceptions.Abort):
            return 1
        raise
    return 0
