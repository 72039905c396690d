"""`loopscale` command line. Each sub-module registers its commands on the shared app."""

from __future__ import annotations

import sys

import loopscale.cli.data  # (registers commands)
import loopscale.cli.demo
import loopscale.cli.design
import loopscale.cli.eval
import loopscale.cli.export
import loopscale.cli.fit
import loopscale.cli.lm_eval
import loopscale.cli.report
import loopscale.cli.sample
import loopscale.cli.sweep
import loopscale.cli.tokenizer
import loopscale.cli.train  # noqa: F401  (registers commands)
from loopscale.cli import info  # noqa: F401  (registers commands)
from loopscale.cli.app import app, run_app

__all__ = ["app", "main"]


def main() -> None:
    try:
        code = run_app()
    except KeyboardInterrupt:  # a second Ctrl-C while the first one was being reported
        code = 130
    if code == 130:
        _exit_130_whatever_comes()
    sys.exit(code)


def _exit_130_whatever_comes() -> None:
    """Interrupted: the command has stopped; make the process's status 130, as run_app said.

    CPython remembers a KeyboardInterrupt raised inside any ``exec``/``eval`` of a string (dataclasses and named
    tuples build their methods so, during a lazy import) and, under ``python -m loopscale``, then ends the process
    by SIGINT (status -2) whatever status it exits with; every such ``exec`` clears that memory first, so an
    empty one does here. A second Ctrl-C from now on ends it with 130 too (``signals.exit_at_once_on_ctrl_c``)."""
    from loopscale.signals import exit_at_once_on_ctrl_c

    exec("")  # clears the flag (CPython: run_eval_code_obj)
    exit_at_once_on_ctrl_c(130)
