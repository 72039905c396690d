"""A looped technique from the user's own file (issue 33, items 1-2): named from the config, counted by its
module tree and the flop counter (checked against what it declares), trained, resumed, and refused in one
line when it breaks the contract."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import TINY_DATA, TINY_MODEL
from loopscale import accounting, technique
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import LoopedLM
from test_flops import counted_train_flops_per_token

HERE = Path(__file__).parent
FIX = str(HERE / "technique_fixtures.py")
EXAMPLE = str(HERE.parent / "src" / "loopscale" / "examples" / "gated_loop.py")
SHAPE = {"d_model": 32, "head_dim": 16, "L_eff": 12, "seq_len": 32, "vocab_size": 256}


def cfg(technique: str, r: int = 4, **kw: object) -> ModelConfig:
    return ModelConfig(**SHAPE, r=r, technique=technique, **kw)


@pytest.mark.parametrize("name", ["LinearAgain", "Adapter", "LastOnlyGrad"])
def test_a_techniques_accounting_matches_its_parameters_and_the_flop_counter(name: str) -> None:
    c = cfg(f"{FIX}:{name}")
    counts = LoopedLM(c).count_params()
    a = accounting.account(c)
    assert (a.N_once, a.N_rec, a.N_total) == (counts["N_once"], counts["N_rec"], counts["N_total"])
    assert counted_train_flops_per_token(c) == pytest.approx(
        accounting.train_flops_per_token(c, norm_scales=False), rel=1e-9
    )


def test_a_technique_rewriting_a_builtin_has_the_builtins_accounting_and_trains_to_the_same_bits(
    tmp_path: Path,
) -> None:
    from loopscale.train import load_train_config, train

    assert accounting.account(cfg(f"{FIX}:LinearAgain")) == accounting.account(ModelConfig(**SHAPE, r=4))
    assert accounting.train_flops_per_token(cfg(f"{FIX}:LastOnlyGrad")) == accounting.train_flops_per_token(
        ModelConfig(**SHAPE, r=4, bptt_k=1)
    )
    base = [f"model.{k}={v}" for k, v in TINY_MODEL.items()] + [
        "model.r=2",
        "run.steps=6",
        "run.batch_size=8",
        "run.threads=1",
        "run.val_tokens=4096",
        "run.min_steps=5",
        "optim.transfer=false",
    ]
    base += [
        f"data.real_text_bytes={TINY_DATA['real_text_bytes']}",
        "data.world.n_entities=60",
        "data.world.n_unseen_entities=20",
        "data.world.eval_per_task=20",
    ]
    builtin = train(load_train_config(None, base), tmp_path / "builtin", progress=False)
    own = train(
        load_train_config(None, [*base, f'model.technique="{FIX}:LinearAgain"']), tmp_path / "own", progress=False
    )
    assert own.val_loss == builtin.val_loss and own.N_rec == builtin.N_rec
    assert own.technique.endswith("LinearAgain") and len(own.technique_sha256) == 64
    assert own.injection is None and builtin.injection == "linear" and "technique" not in builtin


def test_the_shipped_example_declares_what_it_measures_and_runs_its_gates_in_the_scalar_group() -> None:
    c = cfg(f"{EXAMPLE}:GatedLoop", r=2)
    model = LoopedLM(c)
    groups = model.param_groups()
    assert any(p is model.inject.weight for p in groups["matrix"])
    assert any(p is model.inject.gate for p in groups["scalar"])
    assert accounting.N_rec(c) == accounting.N_rec(ModelConfig(**SHAPE, r=2)) + 2 * 32  # a gate per recurrence
    x = torch.randint(0, 256, (1, 32))
    model(x, r=1)
    with pytest.raises(ConfigError, match="cannot run 3 recurrences"):
        model(x, r=3)
    from loopscale.examples.gated_loop import GatedLoop

    for name in ("gated_loop", "loopscale.examples.gated_loop:GatedLoop"):  # registered like a built-in; module
        assert type(LoopedLM(cfg(name, r=2)).inject) is GatedLoop
    assert technique.registered()["gated_loop"] == "loopscale.examples.gated_loop:GatedLoop"


@pytest.mark.parametrize(
    ("technique", "options", "field", "says"),
    [
        ("no_such_module_xyz:Thing", {}, "model.technique", "cannot import 'no_such_module_xyz'"),
        ("examples/missing.py:Thing", {}, "model.technique", "does the file exist?"),
        ("just_a_name", {}, "model.technique", "no technique registered as 'just_a_name' (entry-point group"),
        ("not a-name", {}, "model.technique", "expected 'module:Class'"),
        (f"{FIX}:Nope", {}, "model.technique", "has no 'Nope'"),
        (f"{FIX}:NotATechnique", {}, "model.technique", "not a subclass of loopscale.technique.Technique"),
        (f"{FIX}:WrongShape", {}, "model.technique", "input(i, e, state) must return a tensor of the stream's shape"),
        (f"{FIX}:OverDeclared", {}, "model.technique", "declares params_rec = 1024 but measures 2048"),
        (f"{FIX}:BadPlacement", {}, "model.technique", "must be 'once' or 'recurrence'"),
        (f"{FIX}:Adapter", {"rank": 4, "colour": "red"}, "model.technique_options", "refused them"),
    ],
)
def test_a_technique_that_breaks_the_contract_fails_before_training_in_one_line(
    technique: str, options: dict, field: str, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        LoopedLM(cfg(technique, technique_options=options))
    assert err.value.field == field and says in str(err.value) and "\n" not in str(err.value)


def test_a_module_that_raises_on_import_is_named_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('half-written')\n")
    with pytest.raises(ConfigError, match=r"cannot import .*broken.py.*RuntimeError: half-written"):
        accounting.account(cfg(f"{bad}:Thing"))


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"r": 1}, "technique: needs a loop"),
        ({"bptt_k": 1}, "bptt_k: a technique says which recurrences are back-propagated itself"),
        ({"technique": None, "technique_options": {"rank": 2}}, "technique_options: options without a model.technique"),
    ],
)
def test_a_technique_with_a_config_it_cannot_honour_is_refused_by_the_config(kw: dict, says: str) -> None:
    from loopscale.config import validate

    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, {**SHAPE, "technique": f"{FIX}:LinearAgain", "r": 4, **kw})
    assert says in str(err.value)


def test_an_export_of_a_technique_run_is_refused_in_one_line(tmp_path: Path) -> None:
    import tomli_w
    from safetensors.torch import save_file

    from loopscale.train.settings import TrainConfig

    run = tmp_path / "run"
    run.mkdir()
    from loopscale.export import export_hf

    tc = TrainConfig(model=cfg(f"{FIX}:LinearAgain", r=2).model_dump())
    (run / "config.toml").write_text(tomli_w.dumps(tc.model_dump(mode="json", exclude_none=True)))
    save_file({k: v.contiguous() for k, v in LoopedLM(tc.model).state_dict().items()}, run / "model.safetensors")
    with pytest.raises(ConfigError, match="cannot carry it, so it is not exported"):
        export_hf(run, tmp_path / "hf")


def _tiny_run_config(tmp_path: Path, technique: str, steps: int, ckpt_every: int) -> Path:
    import tomli_w

    doc = {
        "model": {**TINY_MODEL, "r": 2, "technique": technique},
        "data": TINY_DATA,
        "optim": {"transfer": False},
        "run": {
            "steps": steps,
            "batch_size": 8,
            "threads": 1,
            "val_tokens": 4096,
            "min_steps": 5,
            "log_every": 1,
            "ckpt_every": ckpt_every,
        },
    }
    path = tmp_path / "technique.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def test_a_technique_run_killed_mid_way_resumes_to_the_same_bits_and_refuses_edited_code(tmp_path: Path) -> None:
    import shutil
    import signal

    from loopscale.train import load_train_config, train
    from test_train import _cli, _wait_for

    own = tmp_path / "gated_loop.py"
    shutil.copy(EXAMPLE, own)
    path = _tiny_run_config(tmp_path, f"{own}:GatedLoop", steps=30, ckpt_every=5)
    straight = train(load_train_config(path), tmp_path / "straight", progress=False)
    proc = _cli(["train", str(path), "--out", str(tmp_path / "killed"), "--no-progress"])
    _wait_for(tmp_path / "killed" / "ckpt.pt", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "result.json").exists()
    own.write_text(own.read_text().replace("gate_init: float = 2.0", "gate_init: float = 3.0"))
    with pytest.raises(ConfigError, match=r"the code of .*GatedLoop changed since .*killed began"):
        train(load_train_config(path), tmp_path / "killed", progress=False)
    own.write_text(own.read_text().replace("gate_init: float = 3.0", "gate_init: float = 2.0"))
    resumed = train(load_train_config(path), tmp_path / "killed", progress=False)
    assert resumed.val_loss == straight.val_loss and resumed.technique_sha256 == straight.technique_sha256


def test_a_tiny_sweep_of_the_example_beside_the_baseline_is_trained_collected_and_fitted_to_a_delta_phi(
    tmp_path: Path,
) -> None:
    from conftest import tiny_sweep_spec
    from loopscale.fit import FitSettings, fit_runs, load_runs
    from loopscale.fit.table import template_from_table
    from loopscale.sweep import prepare, run_sweep, runs_table, spec_from_dict, write_table

    doc = tiny_sweep_spec({"ckpt_every": 0})
    doc["sweep"]["variants"] = {"gated": {"model": {"technique": f"{EXAMPLE}:GatedLoop"}}}
    spec = spec_from_dict(doc, source="tiny.toml")
    store = prepare(spec, tmp_path / "sw")
    summary = run_sweep(spec, store, progress=False, slots=1)
    assert summary.count("done") == 12, summary.outcomes  # 8 baseline runs + the variant's 4 at r = 2
    df, _ = runs_table(store)
    gated = df[df["variant"] == "gated"]
    linear = df[(df["variant"] == "baseline") & (df["r"] == 2)]
    assert len(gated) == 4 and sorted(gated["N_rec"] - 2 * gated["d_model"]) == sorted(linear["N_rec"])  # + r d
    write_table(df, tmp_path / "runs.csv")
    table = load_runs(tmp_path / "runs.csv")
    fit = fit_runs(
        table,
        FitSettings(
            restarts=20,
            bootstrap=20,
            lr_draws=100,
            checks=False,
            per_r=False,
            law_variants=(),
            template=template_from_table(table.df),
        ),
    )
    (d,) = fit.delta_phi
    assert d.variant == "gated" and d.reference == "baseline"
    assert d.inference is not None and "delta_phi=0" in d.inference.tests
    assert d.shared is not None and (d.shared.assumption or "").startswith("the variant shares E, A")
    assert d.shared.phi_variant is not None


def test_eval_skips_a_test_time_r_the_technique_cannot_run_before_loading_any_weights() -> None:
    from loopscale.eval.runs import r_values_for

    rs, notes = r_values_for(cfg("gated_loop", r=2), [1, 4, 8])
    assert rs == [1, 2] and [n.split(":")[0] for n in notes] == ["r=4", "r=8"]
    assert "gated_loop cannot run 4 recurrences (trained with 2)" in notes[0]
    rs, notes = r_values_for(ModelConfig(**SHAPE, r=2, injection="hyperconnect"), [1, 4])
    assert rs == [1, 2] and "hyperconnect has lane scalars" in notes[0]
    assert r_values_for(ModelConfig(**SHAPE, r=2), [1, 4, 8]) == ([1, 2, 4, 8], [])


def test_a_refused_technique_writes_no_run_dir_so_the_fixed_config_trains_there(tmp_path: Path) -> None:
    from loopscale.train import load_train_config, train

    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="no technique registered as 'nope'"):
        train(load_train_config(_tiny_run_config(tmp_path, "nope", steps=6, ckpt_every=5)), out, progress=False)
    assert not out.exists()
    result = train(
        load_train_config(_tiny_run_config(tmp_path, "gated_loop", steps=6, ckpt_every=5)), out, progress=False
    )
    assert result.status == "ok" and result.technique == "gated_loop"
