"""Sweep specs and the planner: presets, run ids, shared r = 1 runs, variants, width rules, one-line errors."""

import copy
import math
from pathlib import Path

import pytest

from conftest import TINY_DATA, TINY_MODEL
from loopscale import accounting, grids
from loopscale.errors import ConfigError
from loopscale.sweep import load_spec, make_plan, prepare, spec_from_dict
from loopscale.sweep.calibrate import Calibration
from loopscale.sweep.spec import plan_order


def tiny_spec(**sweep) -> dict:
    model = {k: v for k, v in TINY_MODEL.items() if k != "d_model"}
    spec = {
        "sweep": {
            "name": "tiny",
            "budgets": [4e9, 8e9],
            "r": [1, 2],
            "widths": {"4e9": [16, 32], "8e9": [16, 32]},
            **sweep,
        },
        "train": {
            "model": model,
            "data": copy.deepcopy(TINY_DATA),
            "optim": {"transfer": False},
            "run": {"batch_size": 8, "threads": 1, "val_tokens": 4096, "min_steps": 5, "log_every": 5},
        },
    }
    return spec


def test_paper_preset_plans_116_baseline_runs_plus_the_probes_looped_runs_on_their_own_grids() -> None:
    spec = load_spec("paper")
    runs = spec.runs()
    base = [rs for rs in runs if rs.variant == "baseline"]
    assert len(base) == 116 and len(runs) == 116 + 34 * 3 + 30 * 3
    assert sorted((rs.C, rs.d_model // 64, rs.r) for rs in base) == sorted(grids.paper_grid())
    assert {rs.variant for rs in runs if rs.r == 1} == {"baseline"}  # the probes reuse the r = 1 runs
    looped = next(rs for rs in base if rs.r == 4).config.model
    assert (looped.head_dim, looped.L_eff, looped.n_prelude, looped.n_coda, looped.seq_len, looped.vocab_size) == (
        128,
        20,
        2,
        2,
        2048,
        32001,
    )
    run = base[0].config.run
    assert run.batch_size * looped.seq_len == 2**18 and run.dtype == "bfloat16"
    assert base[0].config.optim.name == "muonh"
    plan = make_plan(spec, flops_per_s=3e14)
    assert not any(r.warnings for r in plan.rows)
    assert plan.by_variant() == {"baseline": 116, "truncated_bptt": 102, "hyperconnect": 90}


def test_paper_preset_builds_r1_as_the_papers_loop_of_one_0_20_0_with_passthrough() -> None:
    r1 = [rs.config.model for rs in load_spec("paper").runs() if rs.r == 1]
    assert len(r1) == 29 and {m.layout for m in r1} == {"0+20x1+0"}
    assert all(m.injection == "passthrough" and m.r1_looped and m.is_looped for m in r1)
    assert all({k: getattr(m, k) for k in grids.PAPER_R1_MODEL} == grids.PAPER_R1_MODEL for m in r1)


@pytest.mark.parametrize("probe", ["truncated_bptt", "hyperconnect"])
def test_paper_probe_grids_in_grids_py_equal_what_the_paper_preset_expands_to(probe: str) -> None:
    runs = [rs for rs in load_spec("paper").runs() if rs.variant == probe]
    assert sorted((rs.C, rs.d_model // 64, rs.r) for rs in runs) == sorted(grids.probe_grid(probe))
    per_r = 34 if probe == "truncated_bptt" else 30
    assert all(sum(rs.r == r for rs in runs) == per_r for r in (2, 4, 8))
    for c in grids.PAPER_BUDGETS:  # every baseline width, plus the probe's extra ones
        widths = {rs.d_model // 64 for rs in runs if c == rs.C}
        assert widths == set(grids.PAPER_WIDTHS[c]) | set(grids.PAPER_PROBE_WIDTHS[probe].get(c, ()))


def test_truncated_bptt_probe_adds_one_wider_width_at_every_budget_from_1e18() -> None:
    runs = load_spec("paper").runs(["truncated_bptt"])
    count = {c: sum(rs.variant == "truncated_bptt" and c == rs.C for rs in runs) for c in grids.PAPER_BUDGETS}
    assert count == {4.64e17: 4 * 3, 1e18: 6 * 3, 2.15e18: 6 * 3, 4.64e18: 7 * 3, 1e19: 6 * 3, 2.15e19: 5 * 3}
    widest = {c: max(rs.d_model // 64 for rs in runs if c == rs.C and rs.r == 8) for c in grids.PAPER_BUDGETS}
    assert widest == {4.64e17: 12, 1e18: 16, 2.15e18: 18, 4.64e18: 22, 1e19: 28, 2.15e19: 40}
    assert sum(rs.r == 1 for rs in runs) == 29  # the shared r = 1 runs keep the baseline's widths


def test_cpu_presets_set_no_r1_model_and_no_variant_widths() -> None:
    for preset in ("demo", "quick", "study"):
        spec = load_spec(preset)
        assert not spec.r1_model and not spec.variant_widths, preset
        assert {rs.config.model.layout for rs in spec.runs() if rs.variant == "baseline" and rs.r == 1} == {
            "12 unique"
        }, preset


def test_demo_preset_is_a_cpu_grid_that_plans_without_refused_runs() -> None:
    spec = load_spec("demo")
    assert spec.r == [1, 2, 4, 8] and len(spec.budgets) >= 3
    m = spec.runs()[0].config.model
    assert (m.head_dim, m.L_eff, m.n_prelude, m.n_coda) == (16, 12, 2, 2) and m.seq_len <= 256
    assert all(2 <= len(spec.widths[(c, 1)]) <= 4 for c in spec.budgets)
    assert spec.variants["loop1"].r == [1] and spec.variants["loop1"].model == {"r1_looped": True}
    plan = make_plan(spec)
    assert not any(w.startswith("refused") for r in plan.rows for w in r.warnings)
    assert 1e13 < plan.total_flops < 1e14


def test_probes_preset_runs_each_recipe_on_the_baselines_cells_and_one_seed_at_a_time_is_a_whole_grid() -> None:
    spec = load_spec("probes")
    assert spec.seeds == list(range(8)) and spec.budgets == [b / 2 for b in load_spec("demo").budgets]
    assert {rs.config.model.technique for rs in spec.runs() if rs.variant == "gated"} == {
        "loopscale.examples.gated_loop:GatedLoop"
    }
    cells = {
        v: {(rs.C, rs.r, rs.d_model, rs.seed) for rs in spec.runs() if rs.variant == v} for v in spec.variant_names
    }
    looped = {cell for cell in cells["baseline"] if cell[1] > 1}
    assert all(cells[v] == looped for v in ("truncated_bptt", "hyperconnect", "gated"))
    assert cells["loop1"] == {cell for cell in cells["baseline"] if cell[1] == 1}
    plan = make_plan(spec)
    assert not any(w.startswith("refused") for r in plan.rows for w in r.warnings)
    assert plan.total_flops < 2e14  # docs/cpu-scale.md: 44 min on 2 cores
    one = spec.runs(seeds=[1])
    assert {rs.seed for rs in one} == {1} and len(one) * 8 == len(spec.runs())
    assert {(rs.variant, rs.r) for rs in spec.runs(["gated"], seeds=[0])} == {("baseline", 1)} | {
        ("gated", r) for r in (2, 4, 8)
    }
    with pytest.raises(ConfigError, match=r"--seed.*not in sweep.seeds = \[0, 1, 2, 3, 4, 5, 6, 7\]"):
        spec.runs(seeds=[9])


def test_study_preset_plans_longer_runs_with_loop_of_one_controls() -> None:
    from loopscale.demo import PRESETS

    spec = load_spec(PRESETS["study"])
    assert min(spec.budgets) > max(load_spec("demo").budgets) / 2 and spec.variants["loop1"].r == [1]
    plan = make_plan(spec)
    assert not any(w.startswith("refused") for r in plan.rows for w in r.warnings)
    assert spec.seeds == [0, 1] and spec.seed_data
    assert plan.by_variant() == {"baseline": 64, "loop1": 16} and 1e14 < plan.total_flops < 2e14


def test_run_ids_are_stable_and_readable() -> None:
    spec = spec_from_dict(tiny_spec(seeds=[0, 3]))
    ids = [rs.run_id for rs in spec.runs()]
    assert ids[:2] == ["C4e+09_r1_d16_baseline_s0", "C4e+09_r1_d16_baseline_s3"]
    assert len(ids) == 2 * 2 * 2 * 2 == len(set(ids))
    assert ids == [rs.run_id for rs in spec_from_dict(tiny_spec(seeds=[0, 3])).runs()]


def test_plan_accounting_equals_the_accounting_module() -> None:
    spec = spec_from_dict(tiny_spec())
    for row in make_plan(spec).rows:
        m = row.run.config.model
        assert (m.r, m.width, m.seq_len) == (row.run.r, row.run.d_model, 64)
        assert row.N_once == accounting.N_once(m) and row.N_rec == accounting.N_rec(m)
        assert row.steps == accounting.steps_for_budget(m, row.run.C, 8 * 64)
        assert row.flops == row.steps * 8 * 64 * accounting.train_flops_per_token(m)


def test_r1_runs_are_shared_across_variants_and_bptt_half_is_ceil_r_over_2() -> None:
    spec = tiny_spec(r=[1, 2, 4], widths={"4e9": [16], "8e9": [16]})
    spec["train"]["model"]["L_eff"] = 6  # 1 + 4 + 1: r in {1, 2, 4}
    spec["sweep"]["variants"] = {
        "tbptt": {"model": {"bptt_k": "half"}},
        "hc": {"model": {"injection": "hyperconnect"}, "r": [4]},
        "own": {"optim": {"lr_scale": 0.5}, "r1": "own"},
    }
    runs = spec_from_dict(spec).runs()
    by = {(rs.variant, rs.C, rs.r): rs for rs in runs}
    assert {v for v, _c, r in by if r == 1} == {"baseline", "own"}
    assert by[("tbptt", 4e9, 2)].config.model.bptt_k == 1 and by[("tbptt", 4e9, 4)].config.model.bptt_k == 2
    assert by[("baseline", 4e9, 4)].config.model.bptt_k is None
    assert [r for v, c, r in by if v == "hc" and c == 4e9] == [4]
    assert by[("own", 4e9, 1)].config.optim.lr_scale == 0.5
    only = spec_from_dict(spec).runs(["tbptt"])
    assert {(rs.variant, rs.r) for rs in only} == {("baseline", 1), ("tbptt", 2), ("tbptt", 4)}


def _probe_spec(**variant) -> dict:
    return tiny_spec(r=[1, 2], variants={"x": {"model": {"bptt_k": "half"}, **variant}})


def _widths(spec, variant: str) -> dict[tuple[float, int], list[int]]:
    out: dict[tuple[float, int], list[int]] = {}
    for rs in spec.runs():
        if rs.variant == variant:
            out.setdefault((rs.C, rs.r), []).append(rs.d_model)
    return out


def test_widths_add_extends_a_variants_looped_runs_and_shared_r1_runs_keep_the_baselines() -> None:
    spec = spec_from_dict(_probe_spec(widths_add={"8e9": [48]}))
    assert _widths(spec, "x") == {(4e9, 2): [16, 32], (8e9, 2): [16, 32, 48]}
    assert _widths(spec, "baseline") == {(c, r): [16, 32] for c in (4e9, 8e9) for r in (1, 2)}
    assert spec.runs(["x"])[-1].run_id == "C8e+09_r2_d48_x_s0"


def test_widths_add_keeps_the_ids_and_configs_of_every_run_that_existed_before() -> None:
    before = {rs.run_id: rs.config for rs in spec_from_dict(_probe_spec()).runs()}
    after = {rs.run_id: rs.config for rs in spec_from_dict(_probe_spec(widths_add={"8e9": [48]})).runs()}
    assert set(after) - set(before) == {"C8e+09_r2_d48_x_s0"} and all(after[k] == v for k, v in before.items())


def test_variant_widths_replace_a_budget_for_all_its_r_or_per_r() -> None:
    spec = spec_from_dict(_probe_spec(widths={"4e9": [48, 64]}))
    assert _widths(spec, "x") == {(4e9, 2): [48, 64], (8e9, 2): [16, 32]}
    data = tiny_spec(
        r=[1, 2, 4],
        widths={"4e9": [16], "8e9": [16]},
        variants={
            "x": {"model": {"bptt_k": "half"}, "widths": {"8e9": {"r4": [32]}}, "widths_add": {"4e9": {"r2": [32]}}}
        },
    )
    data["train"]["model"]["L_eff"] = 6
    assert _widths(spec_from_dict(data), "x") == {(4e9, 2): [16, 32], (4e9, 4): [16], (8e9, 2): [16], (8e9, 4): [32]}


def test_widths_are_in_the_sweeps_unit_s_when_it_says_so() -> None:
    data = _probe_spec(widths_add={"8e9": [1]})
    data["sweep"]["widths"] = {"unit": "s", "4e9": [1], "8e9": [2]}
    assert _widths(spec_from_dict(data), "x") == {(4e9, 2): [64], (8e9, 2): [64, 128]}


def test_a_variant_that_owns_its_r1_runs_gets_its_widths_at_r1_too() -> None:
    spec = spec_from_dict(_probe_spec(r1="own", optim={"lr_scale": 0.5}, widths_add={"4e9": [48]}))
    assert _widths(spec, "x")[(4e9, 1)] == [16, 32, 48] and _widths(spec, "baseline")[(4e9, 1)] == [16, 32]


def test_widths_add_on_top_of_a_width_rule_keeps_the_rules_widths_once_and_spec_toml_writes_them_out(
    tmp_path: Path,
) -> None:
    data = load_spec("paper").raw
    data["sweep"]["widths"] = {"rule": "around_optimum", "k": 2, "unit": "s", "step": 2}
    ruled = spec_from_dict(data)
    chosen = {c: [d // 64 for d in ruled.widths[(c, 2)]] for c in ruled.budgets}
    data["sweep"]["variants"]["hyperconnect"]["widths_add"]["1e19"] = [chosen[1e19][0], 40]  # one the rule chose
    spec = spec_from_dict(data)
    hc = {
        c: sorted({rs.d_model // 64 for rs in spec.runs() if rs.variant == "hyperconnect" and c == rs.C})
        for c in spec.budgets
    }
    assert hc[1e19] == sorted({*chosen[1e19], 40}) and hc[2.15e18] == sorted({*chosen[2.15e18], 18})
    store = prepare(spec, tmp_path / "sw")
    assert "widths_add" not in store.spec_path.read_text()
    assert [(rs.run_id, rs.config) for rs in load_spec(store.root).runs()] == [
        (rs.run_id, rs.config) for rs in spec.runs()
    ]


def test_r1_model_builds_every_r1_run_that_a_recipe_owns_and_no_looped_run() -> None:
    loop_of_one = {"n_prelude": 0, "n_coda": 0, "injection": "passthrough", "r1_looped": True}
    data = tiny_spec(
        r1_model=loop_of_one,
        variants={
            "x": {"model": {"bptt_k": "half"}},
            "own": {"optim": {"lr_scale": 0.5}, "r1": "own"},
            "lin": {"model": {"injection": "linear"}, "r": [1], "r1": "own"},
        },
    )
    layouts = {(rs.variant, rs.r): rs.config.model.layout for rs in spec_from_dict(data).runs()}
    assert layouts == {
        ("baseline", 1): "0+6x1+0",
        ("baseline", 2): "1+2x2+1",
        ("x", 2): "1+2x2+1",
        ("own", 1): "0+6x1+0",
        ("own", 2): "1+2x2+1",
        ("lin", 1): "0+6x1+0",
    }
    lin = next(rs for rs in spec_from_dict(data).runs() if rs.variant == "lin").config.model
    assert lin.injection == "linear"  # a variant's own model keys win over r1_model at its r = 1 runs


def test_seeds_set_run_seed_and_with_seed_data_also_data_seed() -> None:
    runs = spec_from_dict(tiny_spec(seeds=[0, 7])).runs()
    assert {(rs.seed, rs.config.run.seed, rs.config.data.seed) for rs in runs} == {(0, 0, 0), (7, 7, 0)}
    runs = spec_from_dict(tiny_spec(seeds=[0, 7], seed_data=True)).runs()
    assert {(rs.seed, rs.config.run.seed, rs.config.data.seed) for rs in runs} == {(0, 0, 0), (7, 7, 7)}


def test_width_rule_around_optimum_gives_k_head_multiples_around_the_paper_laws_optimum() -> None:
    from loopscale.fit import JointLaw, law_frontier
    from loopscale.fit.paper import PAPER_COEFFICIENTS

    data = load_spec("paper").raw
    data["sweep"]["widths"] = {"rule": "around_optimum", "k": 4, "unit": "s", "step": 2}
    data["sweep"].pop("variants")
    spec = spec_from_dict(data)
    theta = JointLaw.from_params(**PAPER_COEFFICIENTS).theta_
    template = next(rs for rs in spec.runs() if rs.r > 1).config.model.model_dump(exclude={"d_model", "s", "r"})
    for c in spec.budgets:
        ds = spec.widths[(c, 1)]
        assert len(ds) == 4 and all(d % 128 == 0 for d in ds) and all(spec.widths[(c, r)] == ds for r in spec.r)
        centre = math.exp(sum(math.log(law_frontier(theta, template, [c], r)["d"][0]) for r in spec.r) / 4)
        assert ds[0] < centre < ds[-1]
    assert "widths resolved from the rule" in spec.resolved_text()


def test_resolved_spec_in_the_sweep_dir_reloads_to_the_same_runs(tmp_path: Path) -> None:
    spec = spec_from_dict(tiny_spec(widths={"4e9": {"r1": [16], "r2": [16, 32]}, "8e9": [16, 32]}))
    store = prepare(spec, tmp_path / "sw")
    again = load_spec(store.root)
    assert [(rs.run_id, rs.config) for rs in again.runs()] == [(rs.run_id, rs.config) for rs in spec.runs()]
    assert [rs.run_id for rs in store.planned(plan_order(store.root))] == [rs.run_id for rs in spec.runs()]


def _with(path: str, value, **extra) -> dict:
    spec = tiny_spec(**extra)
    node = spec
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return spec


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (_with("sweep.budgets", []), r"sweep\.budgets: is empty"),
        (_with("sweep.r", []), r"sweep\.r: is empty"),
        (_with("sweep.widths", {"4e9": [], "8e9": [16]}), r"sweep\.widths\.4e9: is empty"),
        (
            _with("sweep.widths", {"4e9": [24], "8e9": [16]}),
            r"width d_model=24 does not divide into heads of "
            r"head_dim=16",
        ),
        (_with("sweep.widths", {"4e9": [16, 16], "8e9": [16]}), r"sweep\.widths\.4e9: duplicate width"),
        (_with("sweep.budgets", [4e9, 4e9]), r"sweep\.budgets: duplicate value"),
        (_with("sweep.widths", {"4e9": [16]}), r"sweep\.widths\.8e\+09: missing"),
        (_with("sweep.widths", {"4e9": [16], "8e9": [16], "1e9": [16]}), r"sweep\.widths\.1e9: not one of"),
        (_with("sweep.r", [1, 3]), r"sweep\.r: must divide the recurrent depth"),
        (_with("sweep.epochs", 3), r"sweep\.epochs: unknown key"),
        (_with("train.run.steps", 100), r"train\.run\.steps: is set by the sweep"),
        (_with("train.model.d_model", 64), r"train\.model\.d_model: is set by the sweep"),
        (_with("sweep.variants", {"baseline": {}}), r"'baseline' is the implicit recipe"),
        (
            _with("sweep.variants", {"same": {"r1": "own"}}),
            r"duplicate runs: C4e\+09_r1_d16_same_s0 trains the "
            r"same config as C4e\+09_r1_d16_baseline_s0",
        ),
        (
            _with("sweep.variants", {"x": {"model": {"bptt_k": 5}}}),
            r"\[run C4e\+09_r2_d16_x_s0\]: model\.bptt_k: "
            r"must be at most r=2",
        ),
        (_with("train.model.head_dim", 0), r"bad\.toml: train\.model\.head_dim: .*greater than 0"),
        (_with("train.optim.momentum", 2), r"bad\.toml: train\.optim\.momentum: "),
        (_probe_spec(widths_add={"1e9": [48]}), r"sweep\.variants\.x\.widths_add\.1e9: not one of sweep\.budgets"),
        (_probe_spec(widths_add={"big": [48]}), r"sweep\.variants\.x\.widths_add\.big: keys are budgets"),
        (_probe_spec(widths_add={"4e9": [0]}), r"sweep\.variants\.x\.widths_add\.4e9: widths are positive"),
        (_probe_spec(widths_add={"4e9": [48, 48]}), r"sweep\.variants\.x\.widths_add\.4e9: duplicate width"),
        (_probe_spec(widths_add={"4e9": [32]}), r"sweep\.variants\.x\.widths_add\.4e9: already in sweep\.widths"),
        (_probe_spec(widths_add={"4e9": []}), r"sweep\.variants\.x\.widths_add\.4e9: is empty"),
        (
            _probe_spec(widths_add={"4e9": [40]}),
            r"sweep\.variants\.x\.widths_add\.4e9: width d_model=40 does "
            r"not divide into heads",
        ),
        (
            _probe_spec(widths_add={"4e9": [48]}, widths={"4e9": [16]}),
            r"sweep\.variants\.x\.widths_add\.4e9: "
            r"this budget is also in widths",
        ),
        (_probe_spec(widths={"4e9": [16], "4.0e9": [32]}), r"sweep\.variants\.x\.widths\.4\.0e9: the same budget"),
        (
            _probe_spec(widths={"4e9": {"r1": [48]}}),
            r"sweep\.variants\.x\.widths\.4e9\.r1: expected keys "
            r"\['r2'\].*shared r = 1 runs keep the baseline's widths",
        ),
        (_probe_spec(widths_add=[48]), r"sweep\.variants\.x\.widths_add: .*dictionary"),
        (_with("sweep.r1_model", {"r": 1}), r"sweep\.r1_model\.r: is set by the sweep"),
        (_with("sweep.r1_model", {"d_model": 64}), r"sweep\.r1_model\.d_model: is set by the sweep"),
        (_with("sweep.r1_model", {"n_prelud": 0}), r"sweep\.r1_model\.n_prelud: unknown key"),
        (_with("sweep.r1_model", {"n_prelude": 3, "n_coda": 3}), r"sweep\.r1_model\.L_eff: must exceed"),
        (_with("sweep.r1_model", {"bptt_k": 2}), r"sweep\.r1_model\.bptt_k: must be at most r=1"),
        (_with("sweep.r1_model", {"r1_looped": True}, r=[2]), r"sweep\.r1_model: sweep\.r = \[2\] has no r = 1"),
    ],
)
def test_invalid_specs_give_one_line_errors_naming_the_field(spec: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        spec_from_dict(spec, source="bad.toml")
    assert "\n" not in str(info.value) and str(info.value).startswith("bad.toml")


def test_cli_plan_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    from loopscale.cli import run_app

    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nname = "x"\nbudgets = []\nr = [1]\n[sweep.widths]\n')
    assert run_app(["sweep", "plan", str(bad), "--no-calibrate"]) == 2


def test_plan_warns_about_refused_short_runs_and_tokens_per_param() -> None:
    spec = tiny_spec(checks={"max_tokens_per_param": 2.0})
    spec["train"]["run"]["min_steps"] = 30
    rows = {r.run.run_id: r for r in make_plan(spec_from_dict(spec)).rows}
    short = rows["C4e+09_r1_d32_baseline_s0"]
    assert short.steps < 30 and short.warnings[0].startswith("refused: 12 steps < run.min_steps=30")
    assert any("tokens/param" in w and "too long" in w for w in rows["C8e+09_r2_d16_baseline_s0"].warnings)


def test_calibration_times_each_shape_once_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.sweep import calibrate

    calls = []
    real = calibrate.measure

    def counting(cfg, rows, **kw):
        calls.append((cfg.model.r, cfg.model.width))
        return real(cfg, rows, steps=1)

    monkeypatch.setattr(calibrate, "measure", counting)
    spec = spec_from_dict(tiny_spec())
    # solo runs (packs are timed as packs too: tests/test_pack.py)
    plan = make_plan(spec, calibration=Calibration(tmp_path / "calibration.json"), pack="off")
    assert sorted(calls) == [(1, 16), (1, 32), (2, 16), (2, 32)]
    assert all(r.est_s > 0 and r.est_kind == "measured" for r in plan.rows) and plan.total_s > 0
    make_plan(spec, calibration=Calibration(tmp_path / "calibration.json"), pack="off")
    assert len(calls) == 4


def test_width_rule_can_centre_on_a_fit_file(tmp_path: Path) -> None:
    from loopscale.fit import FitSettings, fit_runs, load_runs, synthetic_runs, write_fit

    synthetic_runs(sigma=0.002).to_csv(tmp_path / "runs.csv", index=False)
    fit = fit_runs(
        load_runs(tmp_path / "runs.csv"),
        FitSettings(restarts=40, bootstrap=0, lr_draws=200, restricted=(), per_r=False, checks=False),
    )
    write_fit(tmp_path / "fit.json", fit)
    data = load_spec("paper").raw
    data["sweep"].pop("variants")
    rule = {"rule": "around_optimum", "k": 3, "unit": "s", "step": 2}
    data["sweep"]["widths"] = {**rule, "coefficients": "fit.json"}
    from_fit = spec_from_dict(data, base_dir=tmp_path)
    data["sweep"]["widths"] = rule
    from_paper = spec_from_dict(data)
    shift = [
        abs(a - b)
        for c in from_fit.budgets
        for a, b in zip(from_fit.widths[(c, 1)], from_paper.widths[(c, 1)], strict=True)
    ]
    assert max(shift) <= 128  # the fitted law is the paper's law up to noise: at most one step apart
    data["sweep"]["widths"] = {**rule, "coefficients": "missing.json"}
    with pytest.raises(ConfigError, match=r"sweep\.widths\.coefficients: expected 'paper' or a fit file"):
        spec_from_dict(data, base_dir=tmp_path)


def test_fit_table_sets_the_demo_fit_and_rejects_bad_values() -> None:
    assert spec_from_dict(tiny_spec()).fit.delta == 1e-3  # the paper's fit by default
    spec = spec_from_dict({**tiny_spec(), "fit": {"loss": "mse", "delta": 0.02}})
    assert (spec.fit.loss, spec.fit.delta) == ("mse", 0.02) and "[fit]" in spec.resolved_text()
    with pytest.raises(ConfigError, match=r"fit.delta"):
        spec_from_dict({**tiny_spec(), "fit": {"delta": 0}})
    with pytest.raises(ConfigError, match=r"fit.los"):
        spec_from_dict({**tiny_spec(), "fit": {"los": "mse"}})
    with pytest.raises(ConfigError, match=r"unknown table; expected .*\[slurm\], \[fit\]"):
        spec_from_dict({**tiny_spec(), "fitting": {}})
    for preset in ("quick", "demo", "study"):  # the CPU presets fit at their noise scale (docs/cpu-scale.md)
        assert load_spec(preset).fit.delta == 0.02, preset


def test_the_plan_spreads_the_runs_over_the_cpu_slots_timed_at_a_slots_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopscale.sweep import calibrate
    from loopscale.sweep.plan import makespan

    assert makespan([4, 3, 3, 2], 2) == 6 and makespan([4, 3, 3, 2], 1) == 12 and makespan([5, 1, 1], 3) == 5
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(4)), raising=False)  # a 4-core machine
    spec = spec_from_dict(tiny_spec())  # run.threads = 1: 4 slots by default
    serial = make_plan(spec, flops_per_s=1e10, slots=1, pack="off")
    parallel = make_plan(spec, flops_per_s=1e10, pack="off")
    assert (serial.slots, parallel.slots) == (1, 4) and serial.total_s == parallel.total_s == serial.wall_s
    est = [r.est_s for r in parallel.rows]
    assert parallel.wall_s == pytest.approx(makespan(est, 4) + calibrate.SLOT_START_S)
    assert parallel.wall_s - calibrate.SLOT_START_S < serial.total_s / 2

    threads = []
    monkeypatch.setattr(calibrate, "measure", lambda cfg, rows, **kw: threads.append(kw["threads"]) or (0.01, 0.01))
    data = tiny_spec()
    del data["train"]["run"]["threads"]
    unset = spec_from_dict(data)  # no run.threads: each slot's share of the cores
    cal = Calibration(tmp_path / "calibration.json")
    plan = make_plan(unset, calibration=cal, slots=2, pack="off")
    assert plan.slots == 2 and set(threads) == {2} and len(threads) == 4
    # 1 thread: timed again
    make_plan(unset, calibration=Calibration(tmp_path / "calibration.json"), slots=4, pack="off")
    assert threads[4:] == [1] * 4
