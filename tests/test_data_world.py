"""The task world: deterministic, five axes, eval items held out, closed-book facts seen in training."""

from __future__ import annotations

import re
from functools import lru_cache

from loopscale.config.data import AXES, DataConfig
from loopscale.data.mixture import DefaultData, build_default
from loopscale.data.world import CONTROL_TASKS, EVAL_QUESTIONS, TASKS, TRAIN_QUESTIONS, build_world

# sha256 of the default config's train + validation + eval sets (DefaultData.fingerprint).
# Generation uses only random.Random(str seed) and ordered containers, so this constant holds
# on every platform; if you change the generator on purpose, update it and say so in the commit.
DEFAULT_FINGERPRINT = "c44a67151010892adadcee17d407d7824ca3d711fc7dc09bfc6e69593306b922"
SMALL = DataConfig(real_text_bytes=150_000, world={"n_entities": 40, "n_unseen_entities": 20, "eval_per_task": 30})
SMALL_FINGERPRINT = "470cbb2fa9d532146a9ed9acf1f07ab61513e501f7b5261fb613bfc7ddbe25a8"


@lru_cache(maxsize=1)
def default_data() -> DefaultData:
    return build_default(DataConfig())


@lru_cache(maxsize=1)
def default_train_text() -> str:
    return "\x00".join(default_data().train_docs)


def test_the_default_seed_gives_byte_identical_train_val_and_eval_sets() -> None:
    assert default_data().fingerprint() == DEFAULT_FINGERPRINT


def test_a_small_config_is_byte_identical_too_and_rebuilding_changes_nothing() -> None:
    a, b = build_default(SMALL), build_default(SMALL)
    assert a.fingerprint() == b.fingerprint() == SMALL_FINGERPRINT


def test_another_seed_gives_another_world_but_the_same_validation_scenes() -> None:
    a = build_default(SMALL)
    b = build_default(SMALL.model_copy(update={"seed": 1}))
    assert a.fingerprint() != b.fingerprint()
    real_val = [d for d, f in zip(a.val_docs, a.val_family, strict=True) if f == "real"]
    assert sorted(real_val) == sorted(d for d, f in zip(b.val_docs, b.val_family, strict=True) if f == "real")


def test_eval_items_cover_the_five_axes_with_stable_task_names() -> None:
    items = default_data().eval_items
    assert sorted({it.axis for it in items}) == sorted(AXES)
    assert [t for t in TASKS if t in {it.task for it in items}] == list(TASKS)
    for it in items:
        assert TASKS[it.task] == it.axis
        assert it.gold.startswith(" ") and it.gold.strip()
        assert it.choices is None or it.gold in it.choices
    counts = {t: sum(it.task == t for it in items) for t in TASKS}
    assert set(counts.values()) == {DataConfig().world.eval_per_task}
    assert CONTROL_TASKS == ("bio_qa_unseen",)


def test_no_eval_prompt_and_answer_of_open_book_math_reasoning_or_symbolic_occurs_in_training() -> None:
    text = default_train_text()
    leaked = [it for it in default_data().eval_items if it.axis != "knowledge" and (it.prompt + it.gold) in text]
    assert leaked == []


def test_every_closed_book_eval_fact_is_stated_in_training() -> None:
    data = default_data()
    docs = [d for d, f in zip(data.train_docs, data.train_family, strict=True) if f in ("bio", "bio_qa_train")]
    for it in data.eval_items:
        if it.task == "bio_qa":
            name, value = it.meta["entity"], it.gold.strip()
            assert any(name in d and value in d for d in docs), (name, value)


def test_unseen_people_never_appear_in_training() -> None:
    text = default_train_text()
    unseen = default_data().world.unseen_entities
    assert len(unseen) == DataConfig().world.n_unseen_entities
    assert [e.name for e in unseen if e.name in text] == []


def test_closed_book_questions_use_wordings_that_training_never_uses() -> None:
    data = default_data()
    text = default_train_text()
    for it in data.eval_items:
        if it.axis == "knowledge":
            assert it.prompt not in text
    for attr, wordings in EVAL_QUESTIONS.items():
        for w in wordings:
            assert w not in TRAIN_QUESTIONS[attr]
            pattern = re.escape(f"Question: {w}").replace(re.escape("{n}"), r"[A-Z][a-z]+ [A-Z][a-z]+")
            assert re.search(pattern, text) is None, w


def test_unseen_items_are_matched_to_seen_items_by_attribute_and_wording() -> None:
    items = default_data().eval_items
    seen = [it for it in items if it.task == "bio_qa"]
    unseen = [it for it in items if it.task == "bio_qa_unseen"]
    assert len(seen) == len(unseen)
    for s, u in zip(seen, unseen, strict=True):
        assert (s.meta["attribute"], s.meta["template"]) == (u.meta["attribute"], u.meta["template"])
        assert s.meta["seen"] and not u.meta["seen"]
        assert s.prompt.replace(s.meta["entity"], "X") == u.prompt.replace(u.meta["entity"], "X")


def test_each_person_has_several_differently_worded_biographies_in_training() -> None:
    data = default_data()
    name = data.world.entities[0].name
    bios = [d for d, f in zip(data.train_docs, data.train_family, strict=True) if f == "bio" and name in d]
    assert len(bios) >= 10
    assert len(set(bios)) >= 0.9 * len(bios)


def test_reasoning_and_symbolic_golds_are_correct() -> None:
    closers = {"(": ")", "[": "]", "{": "}", "<": ">"}
    for it in default_data().eval_items:
        if it.task == "induction":
            pairs = dict(p.split(" ") for p in it.prompt.split("\n")[0].removeprefix("Pairs: ").split(", "))
            assert len(pairs) == 8
            assert " " + pairs[it.prompt.split("Lookup: ")[1].split("\n")[0]] == it.gold
        elif it.task.startswith("varassign"):
            body = it.prompt.removeprefix("Let ").split(". What")[0].replace(", ", "\n")
            env: dict[str, int] = {}
            for line in body.split("\n"):
                if " = " in line:
                    k, v = line.split(" = ")
                    env[k] = int(v) if v.isdigit() else env[v]
            query = re.search(r"What is (\w)\?|print\((\w)\)", it.prompt)
            assert f" {env[query.group(1) or query.group(2)]}" == it.gold
            assert len(env) == (10 if "_d1_" in it.task else 5)
            assert all(1 <= v <= 25 for v in env.values())
        elif it.task == "dyck":
            stack: list[str] = []
            for c in it.prompt.split(": ", 1)[1].split("\n")[0].split(" "):
                if c in closers:
                    stack.append(closers[c])
                else:
                    assert stack.pop() == c
            assert it.gold == " " + " ".join(reversed(stack))


def test_generation_fills_the_default_sizes() -> None:
    cfg = DataConfig()
    from loopscale.data.mixture import world_budget

    train_bytes, val_bytes = world_budget(cfg)  # loads (and caches) the corpus
    world = build_world(cfg, train_bytes=train_bytes, val_bytes=val_bytes)  # about 0.6 s on one core
    assert len(world.train_docs) > 10_000
