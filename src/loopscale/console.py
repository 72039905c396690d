"""The two rich consoles every command prints through (stdout for results, stderr for progress).

Kept outside ``loopscale.cli`` so that library code (the trainer's progress bar) can print without
importing the command-line application. Tables stay readable when piped (rich falls back to 80 columns
without a terminal). Markup is off by default: paths, run ids and error text hold square brackets
(``spec.toml [run x]``) that rich would eat; the few styled lines pass ``markup=True`` and escape what
they interpolate.
"""

from __future__ import annotations

import sys

from rich.console import Console

_width = None if sys.stdout.isatty() else 200
console = Console(width=_width, markup=False)
err_console = Console(stderr=True, width=_width, markup=False)


def printable(text: str) -> str:
    """``text`` with control characters (an ESC that would drive the terminal, a NUL, a bell) written as
    escapes: a tiny model's byte samples are arbitrary bytes. Newlines and tabs stay."""
    return "".join(
        ch if ch.isprintable() or ch in "\n\t" else ch.encode("unicode_escape").decode("ascii") for ch in text
    )
