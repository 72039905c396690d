"""`loopscale train` / `info` / `tokenizer train` at the edges a new user meets first: stale run dirs,
one-line errors instead of tracebacks, non-zero exits for runs that did not finish, nothing written on errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomli_w

from conftest import TINY_DATA, TINY_MODEL
from loopscale.cli import run_app
from loopscale.train import load_train_config

TINY = {
    "model": {**TINY_MODEL, "r": 2},
    "data": TINY_DATA,
    "optim": {"transfer": False},
    "run": {"steps": 6, "batch_size": 8, "threads": 1, "val_tokens": 4096, "min_steps": 5, "log_every": 2},
}


def tiny_toml(tmp_path: Path, name: str = "tiny.toml") -> Path:
    p = tmp_path / name
    p.write_text(tomli_w.dumps(TINY))
    return p


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = run_app(["train", *argv] if argv and argv[0].endswith(".toml") else argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def one_line_error(code: int, text: str, expected_code: int = 2) -> str:
    assert code == expected_code, text
    assert "Traceback" not in text
    errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, text
    return errors[0]


# ---- item 3: a run dir belongs to one config ---------------------------------------------------------------------
def test_default_run_dirs_differ_per_config_and_help_shows_the_name(tmp_path, capsys, monkeypatch) -> None:
    from loopscale.train.rundir import default_run_dir

    cfg = tiny_toml(tmp_path)
    a, b = load_train_config(cfg), load_train_config(cfg, ["optim.lr_scale=10"])
    assert default_run_dir(a) != default_run_dir(b)
    assert default_run_dir(a) == default_run_dir(load_train_config(cfg))  # stable: a rerun resumes
    assert re.fullmatch(r"r2-d32-s0-[0-9a-f]{8}", default_run_dir(a).name)
    code, text = cli(["train", "--help"], capsys)
    assert code == 0 and "runs/r<r>-d<d>-s<seed>-<hash>" in text  # whole, not cut at 80 columns

    monkeypatch.chdir(tmp_path)
    assert cli([str(cfg)], capsys)[0] == 0
    assert cli([str(cfg), "--set", "optim.lr_scale=10"], capsys)[0] == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        [default_run_dir(a).name, default_run_dir(b).name]
    )


def test_a_finished_run_dir_refuses_another_config_naming_fields_and_the_way_out(tmp_path, capsys) -> None:
    cfg, out = tiny_toml(tmp_path), tmp_path / "run"
    assert cli([str(cfg), "--out", str(out)], capsys)[0] == 0
    mtime = (out / "result.json").stat().st_mtime_ns
    for sets in (["optim.lr_scale=10"], ["run.steps=8"]):
        line = one_line_error(*cli([str(cfg), "--out", str(out), *[f"--set={s}" for s in sets]], capsys))
        field = sets[0].split("=")[0]
        assert f"{field}: " in line and "--overwrite" in line and "new --out" in line
    assert cli([str(cfg), "--out", str(out)], capsys)[0] == 0  # the same config: its result, not retrained
    assert (out / "result.json").stat().st_mtime_ns == mtime
    code, _ = cli([str(cfg), "--out", str(out), "--set", "optim.lr_scale=2", "--overwrite"], capsys)
    assert code == 0
    assert "lr_scale = 2" in (out / "config.toml").read_text()


def test_an_unfinished_run_dir_of_another_config_is_refused_too(tmp_path, capsys) -> None:
    cfg, out = tiny_toml(tmp_path), tmp_path / "run"
    out.mkdir()
    (out / "config.toml").write_text(tomli_w.dumps(load_train_config(cfg, ["model.r=1"]).as_toml_dict()))
    line = one_line_error(*cli([str(cfg), "--out", str(out)], capsys))
    assert "model.r: 1 -> 2" in line
    assert not (out / "metrics.jsonl").exists()


# ---- item 4: one line, not a traceback -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sets", "expect"),
    [
        (["run.steps=null", "run.budget=inf"], "run.budget: Input should be a finite number"),
        (["run.steps=null", "run.tokens=nan"], "run.tokens: Input should be a finite number"),
        (["model=3"], "model: expected a table"),
        (["run.steps=null", "run.budget=1e30"], "run.budget: gives"),
        (["run.steps=null", "run.budget=1e40"], "beyond any run that could finish"),
        (["run.steps=1000000000000"], "run.steps: gives"),
        (["run.stepz=3"], "run.stepz: unknown key (did you mean 'steps'?)"),
    ],
)
def test_bad_values_are_one_line(tmp_path, capsys, sets, expect) -> None:
    out = tmp_path / "run"
    line = one_line_error(*cli([str(tiny_toml(tmp_path)), "--out", str(out), *[f"--set={s}" for s in sets]], capsys))
    assert expect in line
    assert not out.exists()


def test_a_config_that_is_not_utf8_is_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "latin1.toml"
    bad.write_bytes("[run]\nsteps = 6 # caf\xe9\n".encode("latin-1"))
    line = one_line_error(*cli([str(bad)], capsys))
    assert str(bad) in line and "not UTF-8" in line
    spec = tmp_path / "spec.toml"
    spec.write_bytes(b"[sweep]\nname = '\xff'\n")
    line = one_line_error(*cli(["sweep", "plan", str(spec), "--no-calibrate"], capsys))
    assert str(spec) in line and "not UTF-8" in line


def test_out_naming_a_file_or_an_unwritable_place_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    cfg = tiny_toml(tmp_path)
    line = one_line_error(*cli([str(cfg), "--out", str(cfg)], capsys))
    assert "--out: is an existing file" in line
    line = one_line_error(*cli([str(cfg), "--out", str(cfg / "run")], capsys))
    assert "--out:" in line and "is a file" in line

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)  # root may write anywhere: simulate a read-only place
    line = one_line_error(*cli([str(cfg), "--out", str(tmp_path / "ro" / "run")], capsys))
    assert "--out: cannot write" in line and "Permission denied" in line


# ---- item 5: smaller ----------------------------------------------------------------------------------------------
def test_a_diverged_run_exits_non_zero_and_keeps_its_record(tmp_path, capsys, monkeypatch) -> None:
    import math

    from loopscale.model import LoopedLM

    forward = LoopedLM.forward
    monkeypatch.setattr(
        LoopedLM, "forward", lambda self, idx, targets=None, **kw: forward(self, idx, targets, **kw) * math.nan
    )
    out = tmp_path / "run"
    code, text = cli([str(tiny_toml(tmp_path)), "--out", str(out)], capsys)
    line = one_line_error(code, text, expected_code=1)
    assert "diverged" in line
    import json

    assert json.loads((out / "result.json").read_text())["status"] == "diverged"


def test_a_failed_run_exits_1_not_the_usage_code(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, text = cli([str(tiny_toml(tmp_path)), "--out", str(out), "--set", "run.fail_at_step=2"], capsys)
    line = one_line_error(code, text, expected_code=1)
    assert "injected failure at step 2" in line


def test_a_sweep_budget_typo_is_an_unknown_key_with_a_suggestion(tmp_path, capsys) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text("[sweep]\nname = 'x'\nbudget = [1e9]\nr = [1]\n")
    line = one_line_error(*cli(["sweep", "plan", str(spec), "--no-calibrate"], capsys))
    assert "sweep.budget: unknown key (did you mean 'budgets'?)" in line


def test_tokenizer_train_on_empty_or_tiny_text_is_an_error_and_writes_nothing(tmp_path, capsys) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("ab\n")
    for name in ("empty.txt", "tiny.txt"):
        out = tmp_path / f"{name}.json"
        line = one_line_error(*cli(["tokenizer", "train", str(tmp_path / name), "--out", str(out)], capsys))
        assert "nothing written" in line
        assert not out.exists()


def test_a_data_error_names_the_config_and_writes_no_run_dir(tmp_path, capsys) -> None:
    cfg, out = tiny_toml(tmp_path), tmp_path / "run"
    line = one_line_error(*cli([str(cfg), "--out", str(out), "--set", "data.text_dir='/nonexistent/x'"], capsys))
    assert line.startswith(f"error: {cfg} + --set: data.text_dir")
    line = one_line_error(*cli([str(cfg), "--out", str(out), "--set", "model.vocab_size=200"], capsys))
    assert line.startswith(f"error: {cfg} + --set: model.vocab_size")
    assert not out.exists()


def test_info_and_train_resolve_the_same_config(tmp_path, capsys) -> None:
    import json

    from loopscale.accounting import train_flops_per_token
    from loopscale.cli.info import config_run
    from loopscale.train.settings import describe_length

    partial = tmp_path / "partial.toml"  # a partial [model]: the defaults decide the layout
    partial.write_text("[model]\nr = 2\n[run]\nsteps = 30\n")
    for path in (tiny_toml(tmp_path), partial):
        train_cfg = load_train_config(path)
        assert config_run(path, [], None, None) == train_cfg
        assert run_app(["info", str(path), "--json"]) == 0
        row = json.loads(capsys.readouterr().out)[0]
        length = describe_length(train_cfg)
        assert row["layout"] == train_cfg.model.layout and row["d_model"] == train_cfg.model.width
        assert row["flops_per_token"] == train_flops_per_token(train_cfg.model)
        assert row["steps"] == length["steps"] and row["tokens"] == length["tokens"]


@pytest.mark.parametrize(
    "args",
    [
        ["--budget", "1e18"],
        ["--budget", "1e18", "--set", "model.r=4", "--set", "model.L_eff=20"],
        ["--budget", "3e11", "--tokens-per-step", "2048"],
    ],
)
def test_info_prints_one_step_count_in_its_table_and_its_lr_line(args, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table's steps column unwrapped
    assert run_app(["info", *args]) == 0
    out = capsys.readouterr().out
    table = [int(line.split("│")[-2]) for line in out.splitlines() if line.count("│") > 10]
    lr_line = [int(m.replace(",", "")) for m in re.findall(r"([\d,]+) steps,", out)]
    assert len(table) == 1 and table == lr_line, out


# ---- item 6: progress in a log file -------------------------------------------------------------------------------
PROGRESS = re.compile(r"^step (\d+)/(\d+) \(\d+%\) loss \d+\.\d{4} \| [\d,]+ tok/s \| elapsed \S+ \| ETA \S+$")


def _steps(text: str) -> list[int]:
    return [int(m.group(1)) for m in map(PROGRESS.match, text.splitlines()) if m]


def test_train_prints_progress_lines_when_not_on_a_terminal(tmp_path, capsys) -> None:
    cfg = tiny_toml(tmp_path)
    code, text = cli([str(cfg), "--out", str(tmp_path / "a"), "--set", "run.steps=20"], capsys)
    assert code == 0
    assert _steps(text) == list(range(1, 21)), text  # default: every 5 % of the run
    assert "final evaluation on" in text
    code, text = cli([str(cfg), "--out", str(tmp_path / "b"), "--set", "run.steps=20", "--progress-every", "8"], capsys)
    assert _steps(text) == [8, 16, 20]
    code, text = cli([str(cfg), "--out", str(tmp_path / "c"), "--no-progress"], capsys)
    assert code == 0 and not _steps(text)


def test_eval_of_one_run_reports_its_stages_and_progress_on_stderr(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert cli([str(tiny_toml(tmp_path)), "--out", str(run)], capsys)[0] == 0
    assert run_app(["eval", str(run), "--tasks", "bio_qa,dyck", "--limit", "4", "--batch-size", "2"]) == 0
    err = capsys.readouterr().err
    assert "loading model.safetensors" in err and "prepared bio_qa (4 items)" in err and "prepared dyck" in err
    assert re.search(r"r=2: \d+/\d+ sequences \(100%\)", err)


def test_eval_of_a_truncated_weights_file_is_one_line(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert cli([str(tiny_toml(tmp_path)), "--out", str(run)], capsys)[0] == 0
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = one_line_error(*cli(["eval", str(run), "--tasks", "dyck", "--limit", "2"], capsys))
    assert str(weights) in line and "damaged or truncated" in line


# ---- item 4: --executor slurm when submitit is missing or sbatch refuses -------------------------------------------
def _slurm_spec(tmp_path: Path) -> Path:
    from conftest import tiny_sweep_spec

    spec = {
        **tiny_sweep_spec({"log_every": 5}, budgets=[2e9], r=[1], widths={"2e9": [16]}),
        "slurm": {"partition": "gpu", "flops_per_gpu": 2e6},
    }
    p = tmp_path / "spec.toml"
    p.write_text(tomli_w.dumps(spec))
    return p


def test_slurm_without_submitit_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    import sys

    import loopscale.sweep

    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    monkeypatch.delitem(sys.modules, "loopscale.sweep.slurm", raising=False)
    monkeypatch.delattr(loopscale.sweep, "slurm", raising=False)
    spec = _slurm_spec(tmp_path)
    line = one_line_error(
        *cli(["sweep", "run", str(spec), "--out", str(tmp_path / "sw"), "--executor", "slurm"], capsys)
    )
    assert "--executor: slurm needs submitit" in line


def test_a_refused_slurm_submission_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/bash\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    for tool in ("squeue", "srun"):
        (bin_dir / tool).write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = _slurm_spec(tmp_path)
    code, text = cli(["sweep", "run", str(spec), "--out", str(tmp_path / "sw"), "--executor", "slurm"], capsys)
    line = one_line_error(code, text, expected_code=1)
    assert "slurm: submission failed" in line and "invalid partition specified" in line


def test_the_failure_injection_hook_is_not_part_of_a_runs_identity() -> None:
    from loopscale.train.rundir import config_diff

    a = {"run": {"steps": 6, "fail_at_step": 2}, "optim": {"lr_scale": 1.0}}
    assert config_diff(a, {"run": {"steps": 6}, "optim": {"lr_scale": 1.0}}) == []
    assert config_diff(a, {"run": {"steps": 8}, "optim": {}}) == ["optim.lr_scale: 1.0 -> unset", "run.steps: 6 -> 8"]


@pytest.mark.parametrize(
    ("env", "value", "expected"), [("LOOPSCALE_MALLOC", "off", "'default'"), ("LOOPSCALE_CPU_KERNELS", "no", "'off'")]
)
def test_a_bad_cpu_setting_in_the_environment_is_one_line_and_writes_nothing(
    tmp_path, capsys, monkeypatch, env, value, expected
) -> None:
    from loopscale.model import cpu_kernels

    monkeypatch.setenv(env, value)
    cpu_kernels.reset()
    out = tmp_path / "run"
    try:
        line = one_line_error(*cli([str(tiny_toml(tmp_path)), "--out", str(out)], capsys))
    finally:
        monkeypatch.delenv(env)
        cpu_kernels.reset()
    assert f"environment: {env}" in line and expected in line
    assert not out.exists()


def test_without_a_c_compiler_a_cpu_run_warns_once_and_trains(tmp_path, capsys, monkeypatch) -> None:
    from loopscale.model import cpu_kernels

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    cpu_kernels.reset()
    try:
        code, text = cli([str(tiny_toml(tmp_path)), "--out", str(tmp_path / "run")], capsys)
    finally:
        cpu_kernels.reset()
    assert code == 0, text
    assert text.count("warning: compiled CPU kernels unavailable (no C compiler") == 1
    hardware = json.loads((tmp_path / "run" / "result.json").read_text())["hardware"]
    assert hardware["cpu_kernels"].startswith("unavailable")


@pytest.mark.parametrize("override", ["model.d_model=65536", "run.batch_size=1000000000", "model.L_eff=100000"])
def test_a_run_predicted_to_need_more_memory_than_the_machine_has_is_refused_before_training(
    override: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """These grew to 21-24 GB and were OOM-killed after minutes (issue 29); loopscale.memory predicts the peak,
    so the run is refused at once, naming the field and the predicted figure."""
    cfg = tiny_toml(tmp_path)
    code, text = cli([str(cfg), "--out", str(tmp_path / "run"), "--set", override], capsys)
    line = one_line_error(code, text)
    assert "run.micro_batch" in line and "(predicted, loopscale.memory)" in line and "in all" in line, line
    assert not (tmp_path / "run" / "ckpt.pt").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_more_validation_tokens_than_the_split_holds_is_said_not_capped_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny_toml(tmp_path)
    code, text = cli(
        [str(cfg), "--out", str(tmp_path / "run"), "--set", "run.val_tokens=1000000000000000", "--set", "run.steps=5"],
        capsys,
    )
    assert code == 0, text
    assert "warning: run.val_tokens = 1,000,000,000,000,000 but the validation split holds" in text
