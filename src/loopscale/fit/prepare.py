"""A sweep fitted the way ``loopscale fit`` and ``loopscale demo`` fit it: the library's use case.

``fit_sweep(path_or_table, ...)`` reads the runs, applies what the sweep's spec says (its ``[fit]`` table:
the objective and Huber delta), averages seeds when asked, adds the loop-of-one control refits, keeps the
r values asked for, builds the architecture template the frontier is drawn at, and calls ``fit_runs``.
:func:`prepare_fit` is the same without the fit, for callers that show progress or hints in between
(the CLI). Both commands are thin: they call this and print.

The spec is read as data (``spec.toml`` beside the runs, or the path given): ``fit`` does not import the
sweep package (which builds on ``fit`` to plan widths).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopscale.errors import ConfigError
from loopscale.fit.settings import FitSettings, FitTable

#: ``r1_from`` that means: every variant the sweep spec runs at r = 1 only (a loop-of-one control).
CONTROLS_FROM_SPEC = "spec"


@dataclass
class PreparedFit:
    """The table and the settings ``fit_runs`` gets, and notes worth a line to the user."""

    table: Any  # a fit.table.RunsTable
    settings: FitSettings
    spec_path: Path | None = None
    notes: list[str] = field(default_factory=list)


def fit_sweep(runs: Any, *, progress: Callable[[str], None] | None = None, **options: Any) -> Any:
    """Fit a sweep (a runs table or sweep dir, several of them, a ``RunsTable`` or a DataFrame); returns a
    ``FitResult``.

    ``options`` are :func:`prepare_fit`'s (``spec``, ``seed_means``, ``r1_from``, ``only_r``,
    ``template_overrides``) and any ``FitSettings`` field, which overrides the spec's and the paper's default."""
    from loopscale.fit.pipeline import fit_runs

    prepared = prepare_fit(runs, **options)
    return fit_runs(prepared.table, prepared.settings, progress)


def prepare_fit(
    runs: Any,
    *,
    spec: str | Path | None = None,
    seed_means: bool = False,
    r1_from: str | Sequence[str] | None = None,
    only_r: Sequence[int] = (),
    template_overrides: Sequence[str] = (),
    **settings: Any,
) -> PreparedFit:
    """The table and settings of a fit, as ``fit_sweep`` runs it (see the module docstring).

    ``spec``: the sweep's spec.toml or its folder (default: the one beside ``runs``, if any); ``r1_from``: a
    control variant whose r = 1 runs every variant is also fitted against (``V@CONTROL``), several, or
    ``CONTROLS_FROM_SPEC``; ``only_r``: fit only these r (without 1: a looped-only fit, reference min(r)).
    Settings left out (``loss``, ``delta`` given as None, too) come from the spec's ``[fit]`` table, else the
    paper's defaults (``FitSettings``)."""
    from loopscale.config import validate
    from loopscale.fit.table import as_runs, load_runs, template_from_table

    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(FitSettings)})
    if unknown:
        raise TypeError(f"unknown fit setting(s): {', '.join(unknown)}")
    table = load_runs(list(runs)) if _many(runs) else as_runs(runs)
    spec_path = _spec_path(spec, runs if _many(runs) or isinstance(runs, str | Path) else table)
    notes: list[str] = []
    raw = _read_spec(spec_path, named=spec is not None, notes=notes)
    fit_table = validate(FitTable, raw.get("fit") or {}, source=str(spec_path), prefix="fit") if raw else FitTable()
    for key in ("loss", "delta"):
        if settings.get(key) is None:
            settings[key] = getattr(fit_table, key)
            if key in (raw.get("fit") or {}):
                notes.append(f"using [fit] {key} = {settings[key]} from {spec_path}")
    if seed_means:
        table = table.seed_means()
    for control in _controls(r1_from, raw):
        if (table.df["variant"] == control).any() or r1_from != CONTROLS_FROM_SPEC:
            table = table.with_r1_control(control)
    if only_r:
        table = select_r(table, list(only_r), table.source)
        if 1 not in only_r:
            settings.setdefault("reference_r", min(only_r))
    settings.setdefault(
        "template", template_with(template_from_table(table.df), list(template_overrides), source="--set")
    )
    return PreparedFit(table, FitSettings(**settings), spec_path, notes)


def template_with(base: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """The architecture template (a [model] table without width and r), with ``--set`` overrides, validated."""
    from loopscale.config import ModelConfig, apply_overrides, validate

    data = apply_overrides({"model": dict(base)}, overrides)
    model = {k: v for k, v in data["model"].items() if k not in ("s", "d_model", "r")}
    head = int(model.get("head_dim", 128))
    validate(ModelConfig, {**model, "d_model": head, "r": 1}, source=source, prefix="model")
    return model


def select_r(table: Any, only_r: list[int], source: str) -> Any:
    """The table restricted to the given r values (phi needs at least two of them)."""
    present = sorted(int(r) for r in table.df["r"].unique())
    missing = sorted(set(only_r) - set(present))
    if missing:
        raise ConfigError("--r", f"no runs with r = {missing} in {source}; the table has r = {present}", value=only_r)
    if len(set(only_r)) < 2:
        raise ConfigError("--r", "phi needs runs at two or more values of r", value=only_r)
    return dataclasses.replace(table, df=table.df[table.df["r"].isin(only_r)].reset_index(drop=True))


def _many(runs: Any) -> bool:
    return isinstance(runs, list | tuple)


def _spec_path(spec: str | Path | None, runs: Any) -> Path | None:
    if spec is not None:  # a spec.toml, a sweep dir, or a runs table inside one
        p = Path(spec)
        return p / "spec.toml" if p.is_dir() else (p if p.suffix == ".toml" else p.parent / "spec.toml")
    from loopscale.fit.table import RunsTable

    first = runs[0] if _many(runs) and runs else runs
    if isinstance(first, RunsTable):  # where it was read from, when that is a path
        first = first.source
    if not isinstance(first, str | Path) or not Path(first).exists():
        return None
    folder = Path(first) if Path(first).is_dir() else Path(first).parent
    return folder / "spec.toml"


def _read_spec(path: Path | None, *, named: bool, notes: list[str]) -> dict[str, Any]:
    """The spec's TOML as data; {} when there is none. A spec that was named and cannot be read is a one-line
    error; one found beside the runs that cannot be read is a note (the runs still fit, with the paper's
    defaults, and the note says so)."""
    if path is None or (not named and not path.exists()):
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        why = f"cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        if named:
            raise ConfigError("spec", why, source=str(path)) from None
        notes.append(f"{path} {why}: fitting with the paper's [fit] defaults")
        return {}
    return data if isinstance(data, dict) else {}


def _controls(r1_from: str | Sequence[str] | None, raw: dict[str, Any]) -> list[str]:
    """The control variants to refit against: named, or (``CONTROLS_FROM_SPEC``) the spec's r = [1] variants."""
    if r1_from is None:
        return []
    if r1_from != CONTROLS_FROM_SPEC:
        return [r1_from] if isinstance(r1_from, str) else list(r1_from)
    sweep = raw.get("sweep")
    variants = sweep.get("variants") if isinstance(sweep, dict) else None
    if not isinstance(variants, dict):
        return []
    return [name for name, v in variants.items() if isinstance(v, dict) and v.get("r") == [1]]
