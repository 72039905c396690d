"""On a tiny trained checkpoint: the knowledge axis measures memorisation, sweeps are evaluated at their
compute-optimal runs into the axes table, and the CLI evaluates one model at several r."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from loopscale.cli import run_app
from loopscale.errors import ConfigError
from loopscale.eval import evaluate_path, evaluate_run, find_runs
from loopscale.train import load_train_config, train

# Knowledge-heavy and small: 10 people, each in ~150 biographies and Q&A documents of the training
# stream (the world is 90 % of it, all knowledge); 10 matched people never appear.
KNOWLEDGE_RUN = [
    "model.d_model=64",
    "model.head_dim=16",
    "model.L_eff=6",
    "model.n_prelude=1",
    "model.n_coda=1",
    "model.seq_len=96",
    "model.vocab_size=257",
    "model.r=2",
    "data.real_text_bytes=20000",
    "data.world_share=0.9",
    "data.world.n_entities=10",
    "data.world.n_unseen_entities=10",
    "data.world.eval_per_task=40",
    "data.world.mix.reading=0",
    "data.world.mix.math=0",
    "data.world.mix.reasoning=0",
    "data.world.mix.symbolic=0",
    "run.steps=120",
    "run.batch_size=8",
    "run.threads=1",
    "run.val_tokens=4096",
    "run.min_steps=5",
    "optim.transfer=false",
]
FAST = ["bio_qa,bio_qa_unseen,dyck"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("knowledge") / "run"
    res = train(load_train_config(None, KNOWLEDGE_RUN), d, progress=False)
    assert res.status == "ok"
    return d


def test_closed_book_loss_on_seen_facts_is_lower_than_on_matched_unseen_facts(run_dir: Path) -> None:
    [res], notes = evaluate_run(run_dir, "bio_qa,bio_qa_unseen", use_cache=False)
    seen, unseen = res.task("bio_qa"), res.task("bio_qa_unseen")
    assert seen.n_items == unseen.n_items == 40 and not notes
    assert res.knowledge_gap() == pytest.approx(unseen.loss - seen.loss)
    assert unseen.loss - seen.loss > 0.3, (seen.loss, unseen.loss)
    assert seen.accuracy > unseen.accuracy + 0.2, (seen.accuracy, unseen.accuracy)
    # item by item: the same question (attribute and wording) about a seen vs an unseen person
    wins = [s.loss < u.loss for s, u in zip(res.items["bio_qa"], res.items["bio_qa_unseen"], strict=True)]
    assert sum(wins) >= 0.7 * len(wins)
    assert res.axes()["knowledge"]["loss"] == seen.loss  # the control is not part of the axis


def _fake_sweep(root: Path, run_dir: Path) -> Path:
    """Copies of the trained run posing as a sweep: two runs in one (C, r) cell, another budget, a
    variant, a diverged run and a finished run without weights."""
    base = json.loads((run_dir / "result.json").read_text())
    cells = {
        "C1e12/d64_a": {"C": 1e12, "val_loss": 2.9},
        "C1e12/d64_b": {"C": 1.0000001e12, "val_loss": 2.8},  # same cell (C rounds to 3 digits): the best
        "C3e12/d64": {"C": 3e12, "val_loss": 2.7},
        "C3e12/d96": {"C": 3e12, "val_loss": None, "status": "diverged"},
        "C3e12/d32": {"C": 3e12, "val_loss": 2.5, "weights": False},
        "runs/C1e+12_r2_d64_tbptt_s0": {"C": 1e12, "val_loss": 3.0},  # grid coordinates in sweep.json
    }
    for name, over in cells.items():
        d = root / name
        d.mkdir(parents=True)
        shutil.copy(run_dir / "config.toml", d / "config.toml")
        if over.pop("weights", True):
            shutil.copy(run_dir / "model.safetensors", d / "model.safetensors")
        (d / "result.json").write_text(json.dumps({**base, **over}))
    (root / "runs/C1e+12_r2_d64_tbptt_s0/sweep.json").write_text(
        json.dumps(
            {"run_id": "C1e+12_r2_d64_tbptt_s0", "variant": "tbptt", "seed": 0, "C": 1e12, "r": 2, "d_model": 64}
        )
    )
    return root


def test_sweep_evaluation_picks_the_best_run_per_cell_and_writes_the_axes_table(run_dir: Path, tmp_path: Path) -> None:
    sweep = _fake_sweep(tmp_path / "sweep", run_dir)
    chosen, notes = find_runs(sweep)
    assert [r.run_id for r in chosen] == ["C1e12/d64_b", "C3e12/d64", "C1e+12_r2_d64_tbptt_s0"]
    assert sorted(notes) == ["C3e12/d32: no model.safetensors, skipped", "C3e12/d96: status diverged, skipped"]
    assert len(find_runs(sweep, all_runs=True)[0]) == 4

    out = evaluate_path(sweep, FAST, r_values=[4], limit=5)
    with open(sweep / "axes.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [
        "run_id",
        "run_dir",
        "variant",
        "seed",
        "C",
        "r",
        "r_eval",
        "d_model",
        "val_loss",
        "axis",
        "task",
        "loss",
        "loss_per_byte",
        "accuracy",
        "n_items",
        "n_tokens",
        "shots",
    ]
    best = ("C1e12/d64_b", "C3e12/d64", "C1e+12_r2_d64_tbptt_s0")
    assert {(r["run_id"], r["r_eval"]) for r in rows} == {(run, r) for run in best for r in ("2", "4")}
    tasks = [r for r in rows if r["run_id"] == "C3e12/d64" and r["r_eval"] == "2"]
    # scored tasks only: the control (bio_qa_unseen) and the aggregates are in the summary
    assert [(r["axis"], r["task"], r["n_items"]) for r in tasks] == [
        ("knowledge", "bio_qa", "5"),
        ("symbolic", "dyck", "5"),
    ]
    assert {(r["variant"], r["seed"]) for r in rows} == {("baseline", ""), ("tbptt", "0")}
    with open(sweep / "axes_summary.csv") as fh:
        summary = list(csv.DictReader(fh))
    assert len(summary) == 6
    assert {"loss_knowledge", "acc_symbolic", "loss_overall", "loss_bio_qa_unseen", "knowledge_gap"} <= set(summary[0])
    s0 = summary[0]
    assert float(s0["knowledge_gap"]) == pytest.approx(float(s0["loss_bio_qa_unseen"]) - float(s0["loss_knowledge"]))
    # copies of one model: the same scores in every cell
    assert len({round(float(s["loss_knowledge"]), 9) for s in summary if s["r_eval"] == "2"}) == 1
    assert out.summary_csv == sweep / "axes_summary.csv"
    assert list((sweep / "C3e12/d64" / "eval").glob("*.json"))  # per-run caches


def test_extra_r_values_go_only_to_the_runs_picked(run_dir: Path, tmp_path: Path) -> None:
    """`loopscale demo` runs test-time r on its top budget only (r_eval = 16 costs ~16/r times as much)."""
    sweep = _fake_sweep(tmp_path / "sweep", run_dir)
    out = evaluate_path(sweep, "dyck", r_values=[1, 3], r_values_where=lambda ref: ref.C == 3e12, limit=2)
    got = {(row["run_id"], row["r_eval"]) for row in out.rows}
    assert got == {
        ("C1e12/d64_b", 2),
        ("C1e+12_r2_d64_tbptt_s0", 2),
        ("C3e12/d64", 1),
        ("C3e12/d64", 2),
        ("C3e12/d64", 3),
    }


def test_cached_results_are_reused_on_a_second_run(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import loopscale.eval.runs as runs

    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    first = evaluate_path(d, FAST, limit=3)

    def boom(*a, **k):
        raise AssertionError("evaluated again instead of reading the cache")

    monkeypatch.setattr(runs, "evaluate", boom)
    again = evaluate_path(d, FAST, limit=3)
    assert again.summary == first.summary
    with pytest.raises(AssertionError, match="evaluated again"):
        evaluate_path(d, FAST, limit=3, use_cache=False)


def test_cli_evaluates_one_checkpoint_at_several_r(run_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = run_app(
        [
            "eval",
            str(run_dir / "model.safetensors"),
            "--tasks",
            "bio_qa,dyck",
            "--r",
            "1,4",
            "--r",
            "4",
            "--limit",
            "4",
            "--out",
            str(out),
            "--force",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "loss r=1" in text and "loss r=2" in text and "loss r=4" in text and "mean of axes" in text
    with open(out / "axes.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["r_eval"], r["task"]) for r in rows) == [(r, t) for r in "124" for t in ("bio_qa", "dyck")]
    with open(out / "axes_summary.csv") as fh:
        overall = {r["r_eval"]: float(r["loss_overall"]) for r in csv.DictReader(fh)}
    assert len(overall) == 3 and all(v > 0 for v in overall.values())
    assert run_app(["eval", str(run_dir), "--tasks", "bio_qa", "--limit", "2", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["r_eval"] == 2


def test_cli_errors_are_one_line(run_dir: Path, tmp_path: Path, capsys) -> None:
    assert run_app(["eval", str(run_dir), "--tasks", "bio_qa,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --tasks: unknown task 'nope'") and "\n" not in err
    assert run_app(["eval", str(run_dir), "--tasks", "lambada", "--data-dir", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # stage lines (loading the model) may come first
    assert lines[-1].startswith(f"error: lambada: missing {tmp_path}/lambada/lambada_test.jsonl: download")
    assert sum(ln.startswith("error:") for ln in lines) == 1
    assert run_app(["eval", str(tmp_path)]) == 2
    assert "no run dirs (*/result.json) below this folder" in capsys.readouterr().err
    assert run_app(["eval", str(run_dir), "--r", "two"]) == 2
    assert "--r: expected whole numbers" in capsys.readouterr().err
    assert run_app(["eval", str(run_dir), "--tasks", "dyck", "--shots", "dyk=2"]) == 2
    assert "--shots: task 'dyk' is not among the evaluated tasks" in capsys.readouterr().err
    assert run_app(["eval", "--list"]) == 0
    assert "bigbench_dyck_languages" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="r: must be a positive number"):
        evaluate_run(run_dir, "dyck", r_values=[0])


def test_eval_holds_the_runs_lock_and_a_read_only_run_is_evaluated_without_a_cache(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval wrote its cache into a run dir without a lock (a run being trained again could be scored half-made),
    and could not evaluate a read-only run dir at all (issue 29)."""
    import socket
    import subprocess
    import sys

    from loopscale import locks

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("eval"))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / locks.LOCK).write_text(
            json.dumps(
                {
                    "pid": holder.pid,
                    "host": socket.gethostname(),
                    "time": 0,
                    "start": locks.start_time(holder.pid),
                    "boot_id": locks.boot_id(),
                    "executor": "local",
                }
            )
        )
        with pytest.raises(ConfigError, match=f"in use by another process.*pid {holder.pid}"):
            evaluate_run(run, "dyck", limit=4)
        assert not (run / "eval").exists()
    finally:
        holder.kill()
        holder.wait()
    [res], _ = evaluate_run(run, "dyck", limit=4)  # the holder is gone: its lock is stale
    assert len(list((run / "eval").glob("*.json"))) == 1 and not (run / locks.LOCK).exists()

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(run / "lock.json"))

    monkeypatch.setattr(locks, "acquire", read_only)
    shutil.rmtree(run / "eval")
    [again], notes = evaluate_run(run, "dyck", limit=4)
    assert again.task("dyck").loss == res.task("dyck").loss and not (run / "eval").exists()
    assert any("cannot write its eval cache (Permission denied); evaluated without one" in n for n in notes)
