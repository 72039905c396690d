"""The paper's grids as data (baseline, the two probes, the r = 1 layout) and `loopscale info --grid paper`."""

import json

import pytest

from loopscale import grids
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError


def test_probe_grids_are_looped_only_with_34_and_30_runs_per_r() -> None:
    for probe, per_r in (("truncated_bptt", 34), ("hyperconnect", 30)):
        g = grids.probe_grid(probe)
        assert len(g) == 3 * per_r and {r for _, _, r in g} == {2, 4, 8}
        assert all(sum(r == rr for _, _, r in g) == per_r for rr in (2, 4, 8))


def test_probe_widths_are_the_baselines_plus_the_probes_wider_ones() -> None:
    tb = grids.probe_widths("truncated_bptt")
    assert tb[4.64e17] == grids.PAPER_WIDTHS[4.64e17]  # 4.64e17 stayed bracketed by the baseline grid
    assert tb[1e18] == (6, 8, 10, 12, 14, 16) and tb[2.15e19] == (18, 24, 28, 34, 40)
    hc = grids.probe_widths("hyperconnect")
    assert hc[2.15e18] == (8, 10, 12, 14, 16, 18)
    assert all(hc[c] == grids.PAPER_WIDTHS[c] for c in grids.PAPER_BUDGETS if c != 2.15e18)


def test_unknown_probe_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"probe: unknown; expected one of \['hyperconnect', 'truncated_bptt'\]"):
        grids.probe_grid("hyper")


def test_paper_model_builds_r1_as_a_loop_of_one_and_looped_runs_as_2_k_2() -> None:
    assert ModelConfig(**grids.paper_model(10, 1)).layout == "0+20x1+0"  # type: ignore[arg-type]
    assert ModelConfig(**grids.paper_model(10, 4)).layout == "2+4x4+2"  # type: ignore[arg-type]
    assert len(grids.paper_grid()) == 116


def test_info_grid_paper_prints_each_probes_added_widths_and_runs_per_recipe(capsys: pytest.CaptureFixture) -> None:
    from loopscale.cli import run_app

    assert run_app(["info", "--grid", "paper"]) == 0
    out = capsys.readouterr().out
    probes = {line.split()[1]: line for line in out.splitlines() if "bptt" in line or "hyperconnect" in line}
    assert "+16" in probes["truncated_bptt"] and "+40" in probes["truncated_bptt"]
    assert "102 (34 per r)" in probes["truncated_bptt"] and "90 (30 per r)" in probes["hyperconnect"]
    assert "+18" in probes["hyperconnect"] and "116 (29 per r)" in out and "0+20x1+0" in out


def test_info_grid_paper_json_is_still_one_row_per_baseline_run(capsys: pytest.CaptureFixture) -> None:
    from loopscale.cli import run_app

    assert run_app(["info", "--grid", "paper", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 116 and {r["layout"] for r in rows if r["r"] == 1} == {"0+20x1+0"}
