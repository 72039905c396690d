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
    sys.exit(run_app())
