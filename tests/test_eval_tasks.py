"""Tasks and axes: the registry, the world's tasks and the paper's primitives, k-shot prompts, the real
benchmark loaders on tiny files in their standard formats, one-line errors, axis aggregation."""

import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import TINY_DATA, TINY_MODEL
from loopscale.config import ModelConfig, validate
from loopscale.config.data import AXES, DataConfig
from loopscale.data.world import TASKS
from loopscale.errors import ConfigError
from loopscale.eval import REGISTRY, TaskScore, evaluate, resolve_tasks
from loopscale.eval.benchmarks import BENCHMARKS
from loopscale.eval.runner import EvalResult
from loopscale.eval.tasks import GROUPS, PRIMITIVES, EvalContext, prepare
from loopscale.model import LoopedLM

BENCH_DIR = Path(__file__).parent / "data" / "benchmarks"
DATA = validate(DataConfig, TINY_DATA, prefix="data")


@pytest.fixture(scope="module")
def model() -> LoopedLM:
    torch.manual_seed(0)
    return LoopedLM(ModelConfig(**{**TINY_MODEL, "r": 2, "seq_len": 128})).eval()


def test_every_world_task_and_benchmark_is_registered_with_its_axis() -> None:
    for name, axis in TASKS.items():
        assert REGISTRY[name].axis == axis and REGISTRY[name].source == "world"
    for name, b in BENCHMARKS.items():
        assert REGISTRY[name].axis == b.axis and REGISTRY[name].source == "benchmark"
    assert {t.axis for t in REGISTRY.values()} == set(AXES)
    assert {b.axis for b in BENCHMARKS.values()} == {"knowledge", "reading", "math", "symbolic"}
    assert set(GROUPS["paper"]) == set(BENCHMARKS) | set(PRIMITIVES)
    assert [t.name for t in resolve_tasks("dyck, bio_qa")] == ["bio_qa", "dyck"]  # registry order
    assert [t.name for t in resolve_tasks(["world"])] == list(TASKS)
    assert REGISTRY["triviaqa"].shots == 5 and REGISTRY["nq_open"].shots == 5 and REGISTRY["webquestions"].shots == 5


def test_unknown_task_names_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"--tasks: unknown task 'trivia'; groups: world, benchmarks") as exc:
        resolve_tasks("bio_qa,trivia")
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="--tasks: no task given"):
        resolve_tasks(" , ")


def test_the_papers_reasoning_primitives_follow_its_spec() -> None:
    ctx = EvalContext(DATA)
    for it in prepare(REGISTRY["induction"], ctx).items:  # 8 random key -> value pairs, query one
        pairs = re.match(r"Pairs: (.*)\nLookup: (\w+)\nValue:$", it.prompt)
        kv = dict(p.split(" ") for p in pairs.group(1).split(", "))
        assert len(kv) == 8 and " " + kv[pairs.group(2)] == it.gold
    for depth in (0, 1):
        for style in ("math", "code"):
            for it in prepare(REGISTRY[f"varassign_d{depth}_{style}"], ctx).items:
                text = it.prompt.removeprefix("Let ")
                assigns = re.findall(r"\b([a-z]) = (\w+)", text)
                values = {k: v for k, v in assigns if v.isdigit()}
                aliases = {k: v for k, v in assigns if not v.isdigit()}
                assert len(values) == 5 and all(1 <= int(v) <= 25 for v in values.values())
                assert len(aliases) == (5 if depth else 0)
                query = re.search(r"What is (\w)\?|print\((\w)\)", it.prompt).group(1, 2)
                q = query[0] or query[1]
                assert (q in aliases) == bool(depth)
                assert it.gold == " " + values[aliases.get(q, q)]


def test_world_tasks_come_from_the_data_configs_held_out_items_with_fixed_shots() -> None:
    from loopscale.data.mixture import build_default

    data = build_default(DATA)
    ctx = EvalContext(DATA)
    p0 = prepare(REGISTRY["bio_qa"], ctx)
    assert p0.items == [it for it in data.eval_items if it.task == "bio_qa"] and p0.prompts[0] == p0.items[0].prompt
    p2 = prepare(REGISTRY["arith_word"], ctx, shots=2, limit=3)
    shots = data.world.shots["arith_word"][:2]
    assert len(p2.items) == 3
    head = f"{shots[0].prompt}{shots[0].gold}\n\n{shots[1].prompt}{shots[1].gold}\n\n"
    assert p2.prompts[0] == head + p2.items[0].prompt
    unseen = prepare(REGISTRY["bio_qa_unseen"], ctx, shots=1)  # the control borrows bio_qa's shots
    assert unseen.prompts[0].startswith(data.world.shots["bio_qa"][0].prompt)
    with pytest.raises(ConfigError, match="--shots: task dyck has only 8 examples"):
        prepare(REGISTRY["dyck"], ctx, shots=9)


def test_every_benchmark_loads_from_its_standard_format() -> None:
    ctx = EvalContext(None, BENCH_DIR)
    loaded = {name: prepare(REGISTRY[name], ctx, shots=0) for name in BENCHMARKS}
    for name, p in loaded.items():
        assert p.items, name
        for it in p.items:
            assert it.gold.startswith(" ") and it.gold.strip() and it.axis == BENCHMARKS[name].axis
            assert it.gold[1:] == it.meta["answers"][0]
    tq = loaded["triviaqa"].items[0]
    assert tq.prompt == "Question: Which city is the capital of France?\nAnswer:" and tq.gold == " Paris"
    assert tq.meta["answers"] == ["Paris", "Paris, France", "City of Light"]  # aliases, no duplicates
    assert loaded["nq_open"].items[1].meta["answers"] == ["four", "4"]
    assert [it.meta["answers"] for it in loaded["webquestions"].items] == [["Jazz", "Blues"], ["New York City"]]
    lam = loaded["lambada"].items[0]
    assert lam.prompt.endswith("He folded the") and lam.gold == " map"
    assert [it.gold for it in loaded["squad_v2"].items] == [" its lighthouse", " 1850"]  # unanswerable skipped
    assert loaded["squad_v2"].items[0].prompt.startswith("Passage: The island is famous")
    assert [it.gold for it in loaded["tydiqa_goldp"].items] == [" South America"]  # English only
    assert [it.gold for it in loaded["drop"].items] == [" 24", " Smith", " 12 March 2005"]
    coqa = loaded["coqa"].items
    assert (
        coqa[1].prompt.endswith(
            "Question: What was the cat called?\nAnswer: Tom\nQuestion: Where did he live?\nAnswer:"
        )
        and coqa[1].gold == " on a farm"
    )
    assert [it.gold for it in loaded["svamp"].items] == [" 51", " 6"]
    assert [it.gold for it in loaded["asdiv"].items] == [" 9", " 15"]  # the unit is dropped
    assert [it.gold for it in loaded["mawps"].items] == [" 43", " 2"]  # both MAWPS layouts
    arc = loaded["arc_easy"].items
    assert arc[0].choices == (" the Moon", " the Sun", " a mirror", " a window") and arc[0].gold == " the Sun"
    assert arc[1].gold == " sunlight"  # numeric labels
    dyck = loaded["bigbench_dyck_languages"]
    assert (
        dyck.prompts[0]
        == (
            "Complete the rest of the sequence, making sure that the parentheses are closed "
            "properly.\nInput: [ { [\nOutput:"
        )
        and dyck.items[0].gold == " ] } ]"
    )
    assert loaded["bigbench_qa_wikidata"].items[1].meta["answers"] == ["William Shakespeare", "Shakespeare"]
    cs = loaded["bigbench_cs_algorithms"].items
    assert [it.meta["subtask"] for it in cs] == ["lcs", "valid_parentheses", "valid_parentheses"]
    assert cs[2].choices == (" Valid", " Invalid") and cs[2].gold == " Invalid"


def test_benchmark_few_shot_examples_come_from_the_head_of_the_file() -> None:
    p = prepare(REGISTRY["triviaqa"], EvalContext(None, BENCH_DIR))  # 5-shot as in the paper
    assert len(p.items) == 2 and p.shots == 5
    assert p.prompts[0].startswith("Question: Which city is the capital of France?\nAnswer: Paris\n\nQuestion: ")
    assert p.prompts[0].count("Question:") == 6
    assert p.prompts[0].endswith("Question: Which river flows through Cairo?\nAnswer:")


def test_missing_benchmark_files_say_what_to_download_and_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        prepare(REGISTRY["triviaqa"], EvalContext(None, tmp_path))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"triviaqa: missing {tmp_path}/triviaqa/unfiltered-web-dev.json")
    assert "https://nlp.cs.washington.edu/triviaqa/" in msg
    with pytest.raises(
        ConfigError,
        match=r"--data-dir: task squad_v2 reads local benchmark files; give the folder "
        r"that holds squad_v2/dev-v2\.0\.json \(download dev-v2\.0\.json",
    ):
        prepare(REGISTRY["squad_v2"], EvalContext(None, None))


def test_malformed_lines_report_their_file_and_line_number(tmp_path: Path) -> None:
    (tmp_path / "nq_open").mkdir()
    bad = tmp_path / "nq_open" / "NQ-open.dev.jsonl"
    bad.write_text('{"question": "a", "answer": ["b"]}\n\n{"question": "c", "answer": \n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: line 3: not valid JSON: Expecting value"):
        prepare(REGISTRY["nq_open"], EvalContext(None, tmp_path), shots=0)
    bad.write_text('{"question": "a", "answer": ["b"]}\n{"query": "c", "answer": ["d"]}\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: line 2: missing key 'question'$"):
        prepare(REGISTRY["nq_open"], EvalContext(None, tmp_path), shots=0)
    bad.write_text('["not", "an object"]\n')
    with pytest.raises(ConfigError, match=r"line 1: expected a JSON object, got list"):
        prepare(REGISTRY["nq_open"], EvalContext(None, tmp_path), shots=0)
    shutil.copytree(BENCH_DIR / "squad_v2", tmp_path / "squad_v2")
    squad = tmp_path / "squad_v2" / "dev-v2.0.json"
    squad.write_text(squad.read_text().replace('"question": "When was the lighthouse built?", ', ""))
    where = r"dev-v2\.0\.json: data\[0\]\.paragraphs\[1\]\.qas\[0\]: missing key 'question'"
    with pytest.raises(ConfigError, match=where):
        prepare(REGISTRY["squad_v2"], EvalContext(None, tmp_path))
    squad.write_text('{"data": [\n  {"title": "x",,}\n]}')
    with pytest.raises(ConfigError, match=r"dev-v2\.0\.json: line 2: not valid JSON"):
        prepare(REGISTRY["squad_v2"], EvalContext(None, tmp_path))
    (tmp_path / "asdiv").mkdir()
    (tmp_path / "asdiv" / "ASDiv.xml").write_text("<a>\n<Problem>\n</a>")
    with pytest.raises(ConfigError, match=r"ASDiv\.xml: line 3: not valid XML"):
        prepare(REGISTRY["asdiv"], EvalContext(None, tmp_path))


def test_all_benchmarks_evaluate_end_to_end_from_local_files(model: LoopedLM) -> None:
    res = evaluate(model, "benchmarks", data_dir=BENCH_DIR, shots=0, limit=1, batch_size=16)
    assert [t.task for t in res.tasks] == list(BENCHMARKS)
    for t in res.tasks:
        assert t.loss > 0 and t.accuracy is not None and 0 <= t.accuracy <= 1 and t.n_items == 1
    assert set(res.axes()) == {"knowledge", "reading", "math", "symbolic"}
    assert res.items["arc_easy"][0].prediction in (" the Moon", " the Sun", " a mirror", " a window")
    assert res.task("triviaqa").truncated == 0 and res.task("drop").truncated == 1  # a passage longer than T


def test_axis_score_is_the_macro_average_of_its_tasks_and_overall_the_mean_of_axes() -> None:
    def ts(task: str, axis: str, loss: float, acc: float | None, n: int, control: bool = False) -> TaskScore:
        return TaskScore(task, axis, loss, loss, acc, n, 10 * n, 0, control)

    res = EvalResult(
        [
            ts("bio_qa", "knowledge", 2.0, 0.5, 10),
            ts("bio_qa_unseen", "knowledge", 3.0, 0.25, 10, True),
            ts("passage_qa", "reading", 1.0, 0.0, 100),
            ts("story_cloze", "reading", 3.0, 1.0, 1),
            ts("dyck", "symbolic", 4.0, None, 5),
        ]
    )
    axes = res.axes()
    assert list(axes) == ["knowledge", "reading", "symbolic"]
    assert axes["knowledge"]["loss"] == 2.0  # the control is not part of the axis
    assert axes["reading"]["loss"] == 2.0 and axes["reading"]["accuracy"] == 0.5  # macro, not item-weighted
    assert axes["symbolic"]["accuracy"] is None
    assert res.overall()["loss"] == pytest.approx((2.0 + 2.0 + 4.0) / 3)
    assert res.overall()["accuracy"] == pytest.approx((0.5 + 0.5) / 2)
    assert res.knowledge_gap() == 1.0
    levels = [row["level"] for row in res.rows()]
    assert levels.count("task") == 5 and levels.count("axis") == 3 and levels[-1] == "overall"
