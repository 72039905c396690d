"""`loopscale export --format hf`: the folder loads in transformers without loopscale's code, gives loopscale's
logits over the real vocabulary (plain r = 1, linear injection, hyperconnect; test-time r too), and runs in
lm-eval as ``--model hf`` with the numbers of loopscale's own adapter."""

import ast
import json
import shutil
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import TINY_MODEL
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.model import LoopedLM
from loopscale.train import load_train_config
from loopscale.train.checkpoint import CONFIG, load_model, save_weights

transformers = pytest.importorskip("transformers")
TASK_DIR = Path(__file__).parent / "data" / "lm_eval"
TEXTS = ["Question: In what year was Ada Abbot born?\nAnswer: 1950", "héllo wörld"]


def _run(root: Path, *sets: str) -> Path:
    """A run dir as the trainer leaves it, every weight perturbed (the injection away from [I | 0])."""
    cfg = load_train_config(None, [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()] + list(sets))
    torch.manual_seed(0)
    model = LoopedLM(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    d = root / "_".join(s.split("=")[1].strip('"') for s in sets)
    d.mkdir()
    (d / CONFIG).write_text(tomli_w.dumps(cfg.as_toml_dict()))
    save_weights(d, model)
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from loopscale.export import export_hf

    root = tmp_path_factory.mktemp("export")
    out = {
        "plain": _run(root, "model.r=1"),
        "linear": _run(root, "model.r=2"),
        "hyperconnect": _run(root, "model.r=2", 'model.injection="hyperconnect"'),
    }
    for d in out.values():
        export_hf(d, d / "hf")
    return out


def _ids() -> torch.Tensor:
    tok = ByteTokenizer()
    rows = [[tok.bos_id, *tok.encode(t)] for t in TEXTS]
    n = min(map(len, rows))
    return torch.tensor([row[:n] for row in rows])


@pytest.mark.parametrize("kind", ["plain", "linear", "hyperconnect"])
def test_hf_logits_match_loopscale(runs: dict[str, Path], kind: str) -> None:
    from safetensors.torch import load_file

    hf = transformers.AutoModelForCausalLM.from_pretrained(runs[kind] / "hf", trust_remote_code=True).eval()
    ours, _ = load_model(runs[kind])
    ids = _ids()
    with torch.no_grad():
        theirs, mine = hf(ids).logits, ours(ids)
        assert theirs.shape == mine.shape == (*ids.shape, 257)  # the real vocabulary, not the padded 320
        assert (theirs - mine).abs().max().item() < 1e-5
        if kind == "linear":  # test-time recurrences: a forward kwarg or the config
            assert (hf(ids, r=3).logits - ours(ids, r=3)).abs().max().item() < 1e-5
            hf.config.num_recur = 4
            assert (hf(ids).logits - ours(ids, r=4)).abs().max().item() < 1e-5
            out = hf.generate(ids[:1, :5], max_new_tokens=6, do_sample=False, r=3)
            assert out[0, 5:].tolist() == ours.generate(ids[:1, :5], 6, r=3)[0].tolist()
    weights = load_file(runs[kind] / "hf" / "model.safetensors")
    assert weights["embed.weight"].shape[0] == weights["head.weight"].shape[0] == 257
    if kind == "plain":
        with pytest.raises(ValueError, match="plain stack"):
            hf(ids, r=2)


def test_hf_left_padding_gives_the_unpadded_logits(runs: dict[str, Path]) -> None:
    hf = transformers.AutoModelForCausalLM.from_pretrained(runs["linear"] / "hf", trust_remote_code=True).eval()
    ids = _ids()
    short = ids[1:, :6]
    padded = torch.cat([torch.full((1, 4), 256), short], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(short)], dim=1)
    with torch.no_grad():
        diff = hf(padded, attention_mask=mask).logits[:, 4:] - hf(short).logits
    assert diff.abs().max().item() < 1e-5


def test_hf_folder_holds_tokenizer_card_and_standalone_code(runs: dict[str, Path]) -> None:
    out = runs["linear"] / "hf"
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert tok.bos_token == "<|bos|>" and tok.bos_token_id == 256
    assert tok(TEXTS[1]).input_ids == [256, *ByteTokenizer().encode(TEXTS[1])]  # BOS declared and prepended
    assert tok.decode(tok(TEXTS[1]).input_ids, skip_special_tokens=True) == TEXTS[1]
    card = (out / "README.md").read_text()
    assert "training r | 2" in card and "trust_remote_code=True" in card and "2604.21106" in card
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 257
    tree = ast.parse((out / "modeling_loopscale.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "typing", "torch", "transformers"}  # loads where loopscale is not installed


def test_export_cli_refuses_a_non_empty_folder_then_overwrites(runs: dict[str, Path]) -> None:
    from loopscale.cli import run_app

    out = runs["plain"] / "hf"
    assert run_app(["export", str(runs["plain"]), str(out)]) == 2
    assert run_app(["export", str(runs["plain"]), str(out), "--format", "gguf"]) == 2
    assert run_app(["export", str(runs["plain"]), str(out), "--overwrite"]) == 0


def test_export_overwrite_replaces_a_symlink_instead_of_writing_through_it(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """`export --overwrite` with OUT/modeling_loopscale.py a symlink wrote the link's target outside OUT
    (shutil.copyfile follows links; issue 29). Every file now goes through a temporary file and a rename."""
    from loopscale.cli import run_app

    out = tmp_path / "hf"
    out.mkdir()
    victims = {}
    for name in ("modeling_loopscale.py", "model.safetensors", "loopscale_config.toml", "config.json"):
        victims[name] = tmp_path / f"victim_{name}"
        victims[name].write_text("keep me")
        (out / name).symlink_to(victims[name])
    assert run_app(["export", str(runs["plain"]), str(out), "--overwrite"]) == 0
    for name, victim in victims.items():
        assert victim.read_text() == "keep me", name  # the target outside OUT is untouched
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0


def test_lm_eval_hf_model_on_the_export_matches_the_loopscale_adapter(runs: dict[str, Path], monkeypatch) -> None:
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    import loopscale.eval.harness  # noqa: F401  (registers "loopscale")

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = ["loopscale_toy_ll", "loopscale_toy_mc", "loopscale_toy_gen"]
    run = runs["linear"]

    def evaluate(model: str, args: str) -> dict:
        out = lm_eval.simple_evaluate(
            model=model,
            model_args=args,
            tasks=tasks,
            log_samples=True,
            bootstrap_iters=0,
            task_manager=TaskManager(include_path=str(TASK_DIR), include_defaults=False),
        )
        return {t: [s["resps"][0][0] for s in sorted(out["samples"][t], key=lambda s: s["doc_id"])] for t in tasks}

    # max_length beyond T = 64: the toy's longest context is scored whole by both (no truncation rules to match)
    hf = evaluate("hf", f"pretrained={run / 'hf'},trust_remote_code=True,device=cpu,batch_size=1,max_length=256")
    ours = evaluate("loopscale", f"pretrained={run},batch_size=1,max_length=256")
    for t in ("loopscale_toy_ll", "loopscale_toy_mc"):
        assert [ll for ll, _ in hf[t]] == pytest.approx([ll for ll, _ in ours[t]], abs=1e-4)
        assert [g for _, g in hf[t]] == [g for _, g in ours[t]]
    assert hf["loopscale_toy_gen"] == ours["loopscale_toy_gen"]


def test_export_refuses_a_run_being_trained_and_a_folder_another_export_holds(
    runs: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """`export` took no lock: it could read a run a trainer was rewriting, and two exports into one OUT
    interleaved their files (issue 29, item 1)."""
    import subprocess
    import sys

    from loopscale import locks
    from loopscale.cli import run_app

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        info = {"pid": holder.pid, "start": locks.start_time(holder.pid), "boot_id": locks.boot_id()}
        run = tmp_path / "run"
        shutil.copytree(runs["plain"], run, ignore=shutil.ignore_patterns("hf"))
        (run / locks.LOCK).write_text(json.dumps({**locks.holder(), **info, "executor": "loopscale train"}))
        capsys.readouterr()
        assert run_app(["export", str(run), str(tmp_path / "a")]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "is being written now" in err and f"pid {holder.pid}" in err and not (tmp_path / "a").exists()
        (run / locks.LOCK).write_text(json.dumps({**locks.holder(), **info, "executor": "loopscale eval"}))
        assert run_app(["export", str(run), str(tmp_path / "a")]) == 0  # an evaluation only adds its cache
        out = tmp_path / "b"
        out.mkdir()
        (out / locks.LOCK).write_text(json.dumps({**locks.holder(), **info, "executor": "loopscale export"}))
        assert run_app(["export", str(run), str(out)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "a second export would mix with it" in err and list(out.iterdir()) == [out / locks.LOCK]
    finally:
        holder.kill()
        holder.wait()
    assert run_app(["export", str(run), str(out)]) == 0  # its holder is gone: the stale lock is taken over
    assert not (out / locks.LOCK).exists() and (out / "model.safetensors").exists()
