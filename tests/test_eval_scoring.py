"""Scoring: continuation loss by hand, padding and batching, truncation, greedy decoding, exact match,
multiple choice, test-time recurrence."""

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_MODEL
from loopscale.config import ModelConfig
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.data.world import EvalItem
from loopscale.errors import ConfigError
from loopscale.eval import evaluate, greedy_generate, score_continuations
from loopscale.eval.benchmarks import TaskData
from loopscale.eval.scoring import is_match, normalize
from loopscale.eval.tasks import TaskSpec
from loopscale.model import LoopedLM

TOK = ByteTokenizer()
V = TOK.vocab_size


class BigramLM(torch.nn.Module):
    """A toy LM whose next-token logits depend on the current token only: logits[t] = table[idx[t]].

    Padded to 320 ids like LoopedLM; the padding ids get a huge logit that scoring must ignore.
    """

    def __init__(self, edges: dict[str, str], strength: float = 10.0, seq_len: int = 64) -> None:
        super().__init__()
        table = torch.zeros(V, 320)
        table[:, V:] = 50.0  # padding ids: never a real token
        for a, b in edges.items():
            table[ord(a), ord(b)] = strength
        self.table = torch.nn.Parameter(table)
        self.cfg = SimpleNamespace(vocab_size=V, seq_len=seq_len, r=1)
        self.calls = []

    def forward(self, idx, *, r=None, cache=None):
        self.calls.append(r)
        return self.table[idx]


# ": 42\n" is the greedy path after "A:"
ANSWER_42 = {":": " ", " ": "4", "4": "2", "2": "\n"}


def edge_nll(strength: float = 10.0) -> float:
    """-log p(next | current) for a hand-set edge over the 257 real ids (the other 256 have logit 0)."""
    return math.log(math.exp(strength) + (V - 1)) - strength


def tiny_looped(r: int = 2, **over) -> LoopedLM:
    """A random tiny looped model; the injection is perturbed away from its [I | 0] init, which
    ignores the recurrent state (so that r matters, as in a trained model)."""
    torch.manual_seed(0)
    model = LoopedLM(ModelConfig(**{**TINY_MODEL, "r": r, **over})).eval()
    with torch.no_grad():
        if r > 1:
            model.inject.weight.add_(0.3 * torch.randn_like(model.inject.weight))
    return model


def test_continuation_loss_equals_hand_computation_on_a_toy_bigram_model() -> None:
    lm = BigramLM(ANSWER_42)
    [s] = score_continuations(lm, TOK, [("Q: 6*7\nA:", " 42")])
    assert s.n_tokens == 3 and s.n_bytes == 3 and s.greedy and s.truncated == 0
    assert s.nll == pytest.approx(3 * edge_nll(), rel=1e-6)
    # an unlikely token: uniform row (logit 0 everywhere among the real ids) -> log 257
    [u] = score_continuations(lm, TOK, [("Q: 6*7\nA:", " 4x")])
    assert u.nll == pytest.approx(2 * edge_nll() + (math.log(math.exp(10) + 256) - 0.0), rel=1e-6)
    assert not u.greedy


def test_continuation_loss_equals_hand_computation_on_a_looped_model() -> None:
    model = tiny_looped()
    prompt, gold = "Question: In what year was Ada Abbot born?\nAnswer:", " 1950"
    ctx = [TOK.bos_id, *TOK.encode(prompt)]
    cont = TOK.encode(gold)
    seq = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq[:, :-1])[0, :, :V].double(), dim=-1)
    hand = -sum(logp[len(ctx) - 1 + j, cont[j]].item() for j in range(len(cont)))
    [s] = score_continuations(model, TOK, [(prompt, gold)])
    assert s.nll == pytest.approx(hand, rel=1e-5)
    assert s.loss == pytest.approx(hand / len(cont), rel=1e-5)


def test_padding_batching_and_order_do_not_change_scores() -> None:
    model = tiny_looped()
    pairs = [
        ("Pairs: abc 12, xyz 34\nLookup: xyz\nValue:", " 34"),
        ("a", " b"),
        ("Close the brackets: ( [ {\nAnswer:", " } ] )"),
        ("Let a = 3, b = 7. What is b?\nAnswer:", " 7"),
        ("", " hello world"),
        ("Word: cat\nSteps: reverse\nAnswer:", " tac"),
    ]
    one = score_continuations(model, TOK, pairs, batch_size=1)
    for bs in (2, 4, 64):
        many = score_continuations(model, TOK, pairs, batch_size=bs)
        for a, b in zip(one, many, strict=True):
            assert b.nll == pytest.approx(a.nll, rel=1e-5, abs=1e-6)
            assert (b.greedy, b.n_tokens) == (a.greedy, a.n_tokens)
    rev = score_continuations(model, TOK, pairs[::-1], batch_size=3)[::-1]
    assert [s.nll for s in rev] == pytest.approx([s.nll for s in one], rel=1e-5)
    again = score_continuations(model, TOK, pairs, batch_size=4)
    assert [s.nll for s in again] == [s.nll for s in score_continuations(model, TOK, pairs, batch_size=4)]


def test_long_prompts_are_truncated_from_the_left_keeping_bos() -> None:
    model = tiny_looped()  # seq_len 64
    long_prompt = "x" * 100 + " The end:"
    [s] = score_continuations(model, TOK, [(long_prompt, " yes")])
    keep = 64 + 1 - 1 - 4  # model reads 64 tokens: BOS + kept prompt + gold[:-1]
    assert s.truncated == len(long_prompt) - keep
    [ref] = score_continuations(model, TOK, [(long_prompt[-keep:], " yes")])
    assert ref.truncated == 0 and s.nll == pytest.approx(ref.nll, rel=1e-6)


def test_greedy_generation_is_batched_and_matches_the_models_own_decoder() -> None:
    model = tiny_looped()
    prompts = ["Question: In what year", "a", "Let a = 3, b = 7. What is b?\nAnswer:", "Pairs: abc 12"]
    texts = greedy_generate(model, TOK, prompts, max_new_tokens=6, until=(), batch_size=3)
    for p, t in zip(prompts, texts, strict=True):
        out = model.generate(torch.tensor([[TOK.bos_id, *TOK.encode(p)]]), 6)[0].tolist()
        out = out[: out.index(TOK.bos_id)] if TOK.bos_id in out else out
        assert t == TOK.decode(out)
    assert greedy_generate(model, TOK, prompts, max_new_tokens=6, until=(), batch_size=1) == texts


def test_generation_stops_at_the_stop_string_and_ignores_padded_vocab() -> None:
    lm = BigramLM(ANSWER_42)
    assert greedy_generate(lm, TOK, ["Q: 6*7\nA:"], max_new_tokens=10) == [" 42"]
    assert greedy_generate(lm, TOK, ["Q: 6*7\nA:"], max_new_tokens=2) == [" 4"]


def _toy_task(items: list[EvalItem], accuracy: str = "generate", match: str = "exact") -> TaskSpec:
    return TaskSpec("toy", "math", "world", lambda ctx: TaskData(items, []), accuracy=accuracy, match=match)


def test_exact_match_agrees_with_hand_labelled_toy_cases() -> None:
    lm = BigramLM(ANSWER_42)
    cases = [  # (gold, answers, hand label): the model says " 42" and then a newline
        (" 42", [], True),
        (" 41", [], False),
        (" 4", [], False),  # greedy goes on to " 42": a prefix is not a match
        (" 420", [], False),
        (" forty-two", ["42"], True),  # any accepted answer counts
    ]
    items = [EvalItem("toy", "math", "Q: 6*7\nA:", g, None, {"answers": a}) for g, a, _ in cases]
    res = evaluate(lm, [_toy_task(items)], tokenizer=TOK)
    got = [s.correct for s in res.items["toy"]]
    assert got == [label for *_, label in cases]
    assert {s.prediction for s in res.items["toy"]} == {" 42"}
    assert res.task("toy").accuracy == pytest.approx(2 / 5)


def test_multiple_choice_accuracy_agrees_with_hand_labelled_toy_cases() -> None:
    lm = BigramLM(ANSWER_42)
    # After "2" the toy expects a newline (so a "4" there is very unlikely); after "1" it has no preference.
    cases = [
        (" 42", (" 41", " 42", " 24"), True),
        (" 41", (" 41", " 42"), False),
        (" 11", (" 24", " 11"), True),
    ]
    items = [EvalItem("toy", "math", "Q: 6*7\nA:", g, c) for g, c, _ in cases]
    res = evaluate(lm, [_toy_task(items, accuracy="choice")], tokenizer=TOK)
    assert [s.correct for s in res.items["toy"]] == [label for *_, label in cases]
    assert [s.prediction for s in res.items["toy"]] == [" 42", " 42", " 11"]


def test_cloze_accuracy_is_greedy_reproduction_of_the_gold() -> None:
    lm = BigramLM(ANSWER_42)
    items = [EvalItem("toy", "reading", "A:", g) for g in (" 42", " 4", " 43")]
    res = evaluate(lm, [_toy_task(items, accuracy="greedy")], tokenizer=TOK)
    assert [s.correct for s in res.items["toy"]] == [True, True, False]


def test_answer_normalisation_modes() -> None:
    assert normalize(" The Eiffel Tower. ", "squad") == "eiffel tower"
    assert normalize("27.0", "number") == "27" and normalize("1,200", "number") == "1200"
    assert normalize(" } ] )", "exact") == "} ] )"
    assert is_match("Paris, France", ["paris france"], "squad") and not is_match("Lyon", ["Paris"], "squad")
    with pytest.raises(ConfigError, match="match: unknown answer normalisation"):
        normalize("x", "fuzzy")


def test_scores_work_at_any_r_including_test_time_recurrence() -> None:
    model = tiny_looped(r=2)
    pairs = [("Let a = 3, b = 7. What is b?\nAnswer:", " 7"), ("Pairs: abc 12\nLookup: abc\nValue:", " 12")]
    base = score_continuations(model, TOK, pairs)
    same = score_continuations(model, TOK, pairs, r=2)
    more = score_continuations(model, TOK, pairs, r=4)
    one = score_continuations(model, TOK, pairs, r=1)
    assert [s.nll for s in same] == [s.nll for s in base]
    assert all(math.isfinite(s.nll) for s in more + one)
    assert [s.nll for s in more] != pytest.approx([s.nll for s in base])
    lm = BigramLM(ANSWER_42)
    score_continuations(lm, TOK, pairs, r=8)
    assert set(lm.calls) == {8}


def test_scoring_errors_are_one_line() -> None:
    with pytest.raises(ConfigError, match="gold: empty continuation"):
        score_continuations(BigramLM({}), TOK, [("Q", "")])
    with pytest.raises(ConfigError, match="batch_size: must be positive"):
        score_continuations(BigramLM({}), TOK, [("Q", " a")], batch_size=0)
