"""The lm-evaluation-harness adapter: a loopscale run dir runs local harness tasks offline through
lm_eval.simple_evaluate, and every number matches loopscale's own scorer on the same items."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w
import torch

from conftest import TINY_MODEL
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.data.world import EvalItem
from loopscale.errors import ConfigError
from loopscale.eval import evaluate, greedy_generate, score_continuations
from loopscale.eval.benchmarks import TaskData
from loopscale.eval.scoring import score_tokens
from loopscale.eval.tasks import TaskSpec
from loopscale.model import LoopedLM
from loopscale.train import load_train_config
from loopscale.train.checkpoint import CONFIG, save_weights

TASK_DIR = Path(__file__).parent / "data" / "lm_eval"
TOK = ByteTokenizer()
R_EVAL = 3  # test-time recurrence, != the training r = 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir as the trainer leaves it (config.toml + model.safetensors) with a random model whose
    injection is perturbed from [I | 0], so that the number of recurrences matters."""
    cfg = load_train_config(None, [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()] + ["model.r=2"])
    torch.manual_seed(0)
    model = LoopedLM(cfg.model)
    with torch.no_grad():
        model.inject.weight.add_(0.3 * torch.randn_like(model.inject.weight))
    d = tmp_path_factory.mktemp("run")
    (d / CONFIG).write_text(tomli_w.dumps(cfg.as_toml_dict()))
    save_weights(d, model)
    return d


def _toy_rows() -> list[dict]:
    return [json.loads(line) for line in (TASK_DIR / "toy.jsonl").read_text().splitlines() if line]


def test_lm_eval_runs_a_local_task_offline_and_matches_loopscales_scorer(run_dir: Path, monkeypatch) -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import loopscale.eval.harness  # noqa: F401  (registers "loopscale")
    from loopscale.train.checkpoint import load_model

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = ["loopscale_toy_ll", "loopscale_toy_mc", "loopscale_toy_gen", "loopscale_toy_rolling"]
    out = lm_eval.simple_evaluate(
        model="loopscale",
        model_args=f"pretrained={run_dir},r={R_EVAL},batch_size=4",
        tasks=tasks,
        task_manager=TaskManager(include_path=str(TASK_DIR), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    samples = {t: sorted(out["samples"][t], key=lambda s: s["doc_id"]) for t in tasks}
    rows = _toy_rows()
    model, _ = load_model(run_dir)

    # loglikelihood: (-nll, is_greedy) of the gold after BOS + prompt
    ours = score_continuations(model, TOK, [(r["prompt"], r["gold"]) for r in rows], r=R_EVAL)
    theirs = [s["resps"][0][0] for s in samples["loopscale_toy_ll"]]
    assert [ll for ll, _ in theirs] == pytest.approx([-s.nll for s in ours], rel=1e-6)
    assert [g for _, g in theirs] == [s.greedy for s in ours]

    # multiple choice: lm-eval's acc = loopscale's lowest-loss accuracy, item by item
    items = [EvalItem("toy_mc", "symbolic", r["prompt"], r["gold"], tuple(r["choices"])) for r in rows]
    spec = TaskSpec("toy_mc", "symbolic", "world", lambda ctx: TaskData(items, []), accuracy="choice")
    res = evaluate(model, [spec], tokenizer=TOK, r=R_EVAL)
    assert [bool(s["acc"]) for s in samples["loopscale_toy_mc"]] == [s.correct for s in res.items["toy_mc"]]
    assert out["results"]["loopscale_toy_mc"]["acc,none"] == pytest.approx(res.task("toy_mc").accuracy)

    # generate_until: the same greedy text, and the same exact match
    texts = greedy_generate(model, TOK, [r["prompt"] for r in rows], max_new_tokens=12, until=("\n",), r=R_EVAL)
    assert [s["resps"][0][0] for s in samples["loopscale_toy_gen"]] == texts
    assert [bool(s["exact_match"]) for s in samples["loopscale_toy_gen"]] == [
        t.strip() == r["gold"].strip() for t, r in zip(texts, rows, strict=True)
    ]

    # loglikelihood_rolling: BOS, then disjoint windows of seq_len scored tokens, each after the
    # tokens before it that still fit (lm-eval's rolling windows with context_len = 1)
    L = model.cfg.seq_len
    for s, r in zip(samples["loopscale_toy_rolling"], rows, strict=True):
        toks = [TOK.bos_id, *TOK.encode(r["prompt"] + r["gold"])]
        n = len(toks) - 1
        windows, lo = [(toks[: min(L, n) + 1], 1)], L
        while lo < n:
            end = min(lo + L, n)
            seq = toks[end - L : end + 1]
            windows.append((seq, len(seq) - (end - lo)))
            lo = end
        expected = -sum(nll for nll, _ in score_tokens(model, windows, vocab=TOK.vocab_size, r=R_EVAL))
        assert s["resps"][0][0] == pytest.approx(expected, rel=1e-6)
    assert max(len(r["prompt"] + r["gold"]) for r in rows) > 2 * L  # one text needs three windows
    short = rows[2]["prompt"] + rows[2]["gold"]
    assert len(short) < L
    [whole] = score_continuations(model, TOK, [("", short)], r=R_EVAL)
    assert samples["loopscale_toy_rolling"][2]["resps"][0][0] == pytest.approx(-whole.nll, rel=1e-6)


def test_the_adapter_generates_greedily_only_and_needs_a_model() -> None:
    from loopscale.eval.harness import LoopscaleLM

    with pytest.raises(ConfigError, match="pretrained: give a run dir"):
        LoopscaleLM()
    torch.manual_seed(0)
    from loopscale.config import ModelConfig

    lm = LoopscaleLM(model=LoopedLM(ModelConfig(**TINY_MODEL)), batch_size="auto", r="none")
    assert lm.batch_size == 32 and lm.r is None and lm.max_length == TINY_MODEL["seq_len"]
    req = SimpleNamespace(args=("Q:", {"do_sample": True, "temperature": 0.7, "until": ["\n"]}))
    with pytest.raises(ConfigError, match="gen_kwargs: loopscale generates greedily"):
        lm.generate_until([req])
    ok = SimpleNamespace(args=("Q:", {"do_sample": False, "until": "\n", "max_gen_toks": 3}))
    assert len(lm.generate_until([ok])[0]) <= 3
