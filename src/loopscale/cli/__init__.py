"""`loopscale` command line. Each sub-module registers its commands on the shared app."""

from __future__ import annotations

import sys

from loopscale.cli import info  # noqa: F401  (registers commands)
from loopscale.cli.app import app, run_app

__all__ = ["app", "main"]


def main() -> None:
    sys.exit(run_app())
