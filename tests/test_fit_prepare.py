"""The fit's use case (``fit_sweep`` / ``prepare_fit``): spec defaults, controls, r selection, each default once;
and the typed result ``fit_runs`` returns, part by part."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from loopscale.errors import ConfigError
from loopscale.fit import FitResult, FitSettings, fit_runs, fit_sweep, load_fit, prepare_fit, write_fit
from loopscale.fit.prepare import CONTROLS_FROM_SPEC
from loopscale.fit.result import Checks, Inference, Optima, SubFit
from loopscale.fit.synthetic import synthetic_runs

FAST = {"restarts": 20, "bootstrap": 0, "lr_draws": 0, "checks": False, "per_r": False, "law_variants": ()}


def _sweep(tmp_path: Path, spec: str) -> Path:
    """A sweep folder: runs.csv (a baseline and an r = 1 control) beside a spec.toml."""
    base = synthetic_runs(0.5, seed=3)
    ctrl = base[base["r"] == 1].assign(variant="loop1", val_loss=lambda d: d["val_loss"] + 0.01)
    df = pd.concat([base, ctrl], ignore_index=True)
    df["run_id"] = [f"run{i}" for i in range(len(df))]
    df.to_csv(tmp_path / "runs.csv", index=False)
    (tmp_path / "spec.toml").write_text(spec, encoding="utf-8")
    return tmp_path / "runs.csv"


SPEC = """
[sweep]
name = "t"
budgets = [1e18]
r = [1, 2]

[sweep.variants.loop1]
model = { r1_looped = true }
r = [1]
r1 = "own"

[fit]
delta = 0.02
"""


def test_the_specs_fit_table_sets_the_defaults_and_a_flag_overrides_it(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SPEC)
    p = prepare_fit(runs, **FAST)
    assert (p.settings.loss, p.settings.delta) == ("huber", 0.02)
    assert p.notes == [f"using [fit] delta = 0.02 from {tmp_path / 'spec.toml'}"]
    q = prepare_fit(runs, delta=0.5, **FAST)
    assert q.settings.delta == 0.5 and q.notes == []
    none = prepare_fit(runs, delta=None, **FAST)  # None, as the CLI passes an unset flag: the spec's
    assert none.settings.delta == 0.02


def test_a_bad_fit_table_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SPEC.replace("delta = 0.02", "delta = -1"))
    with pytest.raises(ConfigError) as err:
        prepare_fit(runs, **FAST)
    msg = str(err.value)
    assert "fit.delta" in msg and "spec.toml" in msg and "\n" not in msg


def test_a_named_spec_that_cannot_be_read_is_one_line_and_a_broken_one_beside_the_runs_a_note(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SPEC)
    with pytest.raises(ConfigError) as err:
        prepare_fit(runs, spec=tmp_path / "nope.toml", **FAST)
    assert "nope.toml" in str(err.value) and "cannot be read" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "spec.toml").write_text("[fit\ndelta = 0.02", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot be read"):
        prepare_fit(runs, spec=tmp_path, **FAST)
    p = prepare_fit(runs, **FAST)  # found beside the runs, not named: fit with the defaults, and say so
    assert p.settings.delta == FitSettings().delta
    assert len(p.notes) == 1 and "cannot be read" in p.notes[0] and "defaults" in p.notes[0]


def test_a_loaded_table_finds_the_spec_beside_the_file_it_came_from(tmp_path: Path) -> None:
    from loopscale.fit import load_runs

    runs = _sweep(tmp_path, SPEC)
    assert prepare_fit(load_runs(runs), **FAST).settings.delta == 0.02
    assert prepare_fit(synthetic_runs(0.5, seed=1), **FAST).spec_path is None  # a DataFrame: no file, no spec


def test_without_a_spec_the_papers_defaults_hold(tmp_path: Path) -> None:
    df = synthetic_runs(0.5, seed=1)
    df.to_csv(tmp_path / "runs.csv", index=False)
    p = prepare_fit(tmp_path / "runs.csv", **FAST)
    paper = FitSettings()
    assert (p.settings.loss, p.settings.delta, p.spec_path) == (paper.loss, paper.delta, tmp_path / "spec.toml")


def test_controls_from_the_spec_add_the_refits_the_demo_fits(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SPEC)
    p = prepare_fit(runs, r1_from=CONTROLS_FROM_SPEC, **FAST)
    assert set(p.table.df["variant"]) == {"baseline", "loop1", "baseline@loop1"}
    assert set(prepare_fit(runs, **FAST).table.df["variant"]) == {"baseline", "loop1"}
    with pytest.raises(ConfigError, match="--r1-from"):
        prepare_fit(runs, r1_from="nope", **FAST)


def test_only_r_without_1_declares_the_smallest_r_the_reference(tmp_path: Path) -> None:
    df = synthetic_runs(0.5, seed=2)
    df.to_csv(tmp_path / "runs.csv", index=False)
    p = prepare_fit(tmp_path / "runs.csv", only_r=[2, 4, 8], **FAST)
    assert p.settings.reference_r == 2 and sorted(set(p.table.df["r"])) == [2, 4, 8]
    assert prepare_fit(tmp_path / "runs.csv", only_r=[1, 4], **FAST).settings.reference_r is None
    with pytest.raises(ConfigError, match="--r"):
        prepare_fit(tmp_path / "runs.csv", only_r=[4], **FAST)
    with pytest.raises(TypeError, match="unknown fit setting"):
        prepare_fit(tmp_path / "runs.csv", restart=3)


def test_fit_sweep_is_prepare_then_fit_runs(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SPEC)
    a = fit_sweep(runs, r1_from=CONTROLS_FROM_SPEC, **FAST)
    p = prepare_fit(runs, r1_from=CONTROLS_FROM_SPEC, **FAST)
    b = fit_runs(p.table, p.settings)
    assert isinstance(a, FitResult) and isinstance(a.settings, FitSettings) and a.settings.delta == 0.02
    for v in a.variants:
        assert a.variant(v).params.as_dict() == b.variant(v).params.as_dict()


def test_each_default_is_written_once() -> None:
    """The CLI's flags, the spec's [fit] table and FitSettings show the same defaults (fit.settings)."""
    from loopscale.cli.fit import DEFAULTS
    from loopscale.fit.paper import PAPER_BOOTSTRAP, PAPER_HUBER_DELTA, PAPER_LOSS, PAPER_RESTARTS
    from loopscale.fit.settings import FitTable

    s = FitSettings()
    assert (s.loss, s.delta, s.restarts, s.bootstrap) == (
        PAPER_LOSS,
        PAPER_HUBER_DELTA,
        PAPER_RESTARTS,
        PAPER_BOOTSTRAP,
    )
    assert (FitTable().loss, FitTable().delta) == (s.loss, s.delta)
    same = [f.name for f in dataclasses.fields(FitSettings) if f.name not in ("template", "law_variants")]
    assert {k: getattr(DEFAULTS, k) for k in same} == {k: getattr(s, k) for k in same}


def test_fit_runs_returns_typed_parts_that_round_trip_through_the_fit_file(tmp_path: Path) -> None:
    res = fit_runs(
        synthetic_runs(0.5, seed=4),
        FitSettings(restarts=30, bootstrap=20, lr_draws=100, checks=True, checks_restarts=20, law_variants=()),
    )
    assert isinstance(res, FitResult)
    v = res.variant()
    assert isinstance(v.restricted["phi=0"], SubFit) and v.restricted["phi=0"].held_out is not None
    assert isinstance(v.per_r["1"], SubFit) and isinstance(v.optima, Optima) and v.optima.frontier
    assert isinstance(v.checks, Checks) and isinstance(v.inference, Inference) and "phi=0" in v.inference.tests
    assert v.bootstrap.data_rule_draws.keys() == {"no_r1", "missing_r"}
    # a part's fit-file dict holds the keys set, nothing else
    assert v.restricted["phi=0"].to_dict()["r2"] == v.restricted["phi=0"].r2
    assert set(v.checks.to_dict()) == {"extrapolation", "leave_one_r_out", "half_split", "held_out"}
    assert "compare" not in res.to_dict() and res.compare is None
    back = load_fit(write_fit(tmp_path / "fit.json", res))
    assert back.variant().params.as_dict() == pytest.approx(v.params.as_dict())
    assert back.variant().restricted["phi=1"].r2 == pytest.approx(v.restricted["phi=1"].r2)
    assert back.variant().inference.phi.ci == pytest.approx(v.inference.phi.ci)  # type: ignore[union-attr]
