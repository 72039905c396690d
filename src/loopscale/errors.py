"""User-facing errors: one line naming the file, the field, the bad value and what is expected.

The CLI prints ``str(err)`` for these and exits with status 2; ``--debug`` shows the traceback.
Anything else escaping to the CLI is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, so a message says ``nan`` and ``3``, not ``np.float64(nan)``."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


class LoopscaleError(Exception):
    """An error caused by the user's input, not by loopscale."""


class ConfigError(LoopscaleError, ValueError):
    """A bad value in a config, a table or a spec."""

    def __init__(
        self,
        field: str,
        message: str,
        *,
        value: Any = ...,
        source: str | None = None,
    ) -> None:
        self.field = field
        self.message = message
        self.value = value
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        where = f"{self.source}: " if self.source else ""
        got = "" if self.value is ... else f" (got {_plain(self.value)!r})"
        return f"{where}{self.field}: {self.message}{got}"

    def with_source(self, source: str) -> ConfigError:
        return ConfigError(self.field, self.message, value=self.value, source=source)


def from_pydantic(
    err: Exception,
    source: str | None = None,
    prefix: str = "",
    known: Callable[[tuple[Any, ...]], list[str]] | None = None,
) -> ConfigError:
    """Turn the first error of a pydantic ValidationError into a one-line ConfigError.

    An unknown key is reported before a missing one (``sweep.budget`` is a typo of ``budgets``, not a
    table missing ``budgets``), with the closest known key when ``known(parent loc)`` gives the candidates.
    """
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return ConfigError(prefix or "config", str(err), source=source)
    ranked = sorted(errors(), key=lambda e: e.get("type") != "extra_forbidden")
    first = ranked[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
    field = ".".join(p for p in (prefix, loc) if p) or "config"
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown key" + _did_you_mean(first.get("loc", ()), known)
    msg = msg.removeprefix("Value error, ")
    value = first.get("input", ...)
    if isinstance(value, dict) or first.get("type") == "missing":
        value = ...
    more = len(errors()) - 1
    if more:
        msg += f" [+{more} more error{'s' if more > 1 else ''}]"
    return ConfigError(field, msg, value=value, source=source)


def _did_you_mean(loc: tuple[Any, ...], known: Callable[[tuple[Any, ...]], list[str]] | None) -> str:
    if not loc or known is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), known(tuple(loc[:-1])), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
