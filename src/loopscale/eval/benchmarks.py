"""Loaders for the paper's real benchmarks (arXiv 2604.21106 §6), from local files in their standard formats.

Nothing is downloaded at run time: each benchmark names the file it reads under ``--data-dir`` and
says where to get it when the file is missing (docs/eval.md lists them all). Every loader turns the
file into ``EvalItem``s — a prompt, a gold continuation starting with a space, choices for multiple
choice, and ``meta["answers"]`` (every accepted answer) for exact match — in file order.

Prompt formats follow lm-evaluation-harness where it has the task ("Question: ...\\nAnswer:"),
passages are shown as "Passage: ...", BIG-bench tasks use their own prefixes.

Errors are one line: a malformed JSONL line names the file and line number
(``.../NQ-open.dev.jsonl: line 3: not valid JSON: Expecting value (column 1)``), a JSON record
with a missing field names the record (``.../dev-v2.0.json: data[0].paragraphs[1].qas[2]: missing key 'question'``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopscale.data.world import EvalItem
from loopscale.errors import ConfigError


@dataclass
class TaskData:
    """What a task loader returns: the items (file order), and optionally fixed few-shot examples.

    ``shots=None`` means few-shot examples come from the head of ``items`` (the first k items are
    then removed from the evaluated set). ``preamble`` is written once before the shots.
    """

    items: list[EvalItem]
    shots: list[EvalItem] | None = None
    preamble: str = ""
    sep: str = "\n\n"


@dataclass(frozen=True)
class Benchmark:
    """A real benchmark: where its file lies under ``--data-dir``, how to read it, how to get it."""

    name: str
    axis: str
    files: tuple[str, ...]  # candidate paths under the data dir; the first that exists is read
    parse: Callable[[Path, str, str], TaskData]  # (path, task name, axis) -> TaskData
    get: str  # one line: what to download and from where
    shots: int = 0
    accuracy: str = "generate"  # "choice" (MC), "generate" (exact match of greedy text), "greedy" (cloze)
    match: str = "squad"
    until: tuple[str, ...] = ("\n",)
    about: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def locate(self, data_dir: str | Path | None) -> Path:
        if data_dir is None:
            raise ConfigError(
                "--data-dir",
                f"task {self.name} reads local benchmark files; give the folder "
                f"that holds {self.files[0]} ({self.get})",
            )
        root = Path(data_dir)
        for rel in self.files:
            if (root / rel).exists():
                return root / rel
        raise ConfigError(self.name, f"missing {root / self.files[0]}: {self.get}")


# ---- file readers with one-line errors ---------------------------------------------------------


def _err(path: Path, where: str, message: str) -> ConfigError:
    return ConfigError(where, message, source=str(path))


def read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _err(path, "file", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _err(path, f"line {exc.lineno}", f"not valid JSON: {exc.msg} (column {exc.colno})") from None


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line; a bad line is an error naming it."""
    with open(path, encoding="utf-8", errors="strict") as fh:
        lineno = 0
        while True:
            try:
                line = fh.readline()
            except UnicodeDecodeError as exc:
                raise _err(path, f"line {lineno + 1}", f"not UTF-8 text ({exc.reason})") from None
            if not line:
                return
            lineno += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _err(path, f"line {lineno}", f"not valid JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise _err(path, f"line {lineno}", f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def _get(obj: Any, key: str, path: Path, where: str, kind: type | tuple[type, ...] = str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _err(path, where, f"missing key {key!r}")
    v = obj[key]
    if not isinstance(v, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _err(path, where, f"key {key!r} should be {names}, got {type(v).__name__}")
    return v


def _list(obj: Any, path: Path, where: str) -> list[Any]:
    if not isinstance(obj, list):
        raise _err(path, where, f"expected a JSON list, got {type(obj).__name__}")
    return obj


def _text(s: Any) -> str:
    return " ".join(str(s).split())


def _item(
    task: str,
    axis: str,
    prompt: str,
    answers: list[str],
    *,
    choices: list[str] | None = None,
    meta: dict[str, Any] | None = None,
    path: Path,
    where: str,
) -> EvalItem:
    answers = list(dict.fromkeys(a for a in (_text(a) for a in answers) if a))  # unique, in order
    if not answers:
        raise _err(path, where, "no non-empty answer")
    m = {"answers": answers, **(meta or {})}
    ch = tuple(" " + _text(c) for c in choices) if choices is not None else None
    return EvalItem(task, axis, prompt, " " + answers[0], ch, m)


def _qa_prompt(question: str) -> str:
    return f"Question: {_text(question)}\nAnswer:"


def _passage_prompt(passage: str, question: str) -> str:
    return f"Passage: {_text(passage)}\nQuestion: {_text(question)}\nAnswer:"


# ---- knowledge ---------------------------------------------------------------------------------


def parse_triviaqa(path: Path, task: str, axis: str) -> TaskData:
    """Official TriviaQA JSON (``{"Data": [{"Question", "Answer": {"Value", "Aliases"}}]}``)."""
    data = _list(_get(read_json(path), "Data", path, "top level", list), path, "Data")
    items = []
    for i, rec in enumerate(data):
        where = f"Data[{i}]"
        q = _get(rec, "Question", path, where)
        ans = _get(rec, "Answer", path, where, dict)
        value = _get(ans, "Value", path, f"{where}.Answer")
        aliases = [a for a in ans.get("Aliases", []) if isinstance(a, str)]
        items.append(
            _item(
                task, axis, _qa_prompt(q), [value, *aliases], path=path, where=where, meta={"id": rec.get("QuestionId")}
            )
        )
    return TaskData(items)


def parse_qa_jsonl(path: Path, task: str, axis: str) -> TaskData:
    """JSONL with ``question`` and ``answer`` (string or list) — NQ-open's format; also accepts
    ``answers`` (Hugging Face exports of WebQuestions / TriviaQA)."""
    items = []
    for lineno, rec in read_jsonl(path):
        where = f"line {lineno}"
        q = _get(rec, "question", path, where)
        key = "answer" if "answer" in rec else "answers"
        a = _get(rec, key, path, where, (str, list))
        answers = [a] if isinstance(a, str) else [str(x) for x in a]
        items.append(_item(task, axis, _qa_prompt(q), answers, path=path, where=where))
    return TaskData(items)


_WEBQ_TARGET = re.compile(r'\(description\s+(?:"((?:[^"\\]|\\.)*)"|([^)\s]+))\)')


def parse_webquestions(path: Path, task: str, axis: str) -> TaskData:
    """WebQuestions as released with SEMPRE (a JSON list of ``{"utterance", "targetValue"}`` where
    targetValue is ``(list (description "A") (description B))``), or JSONL with question/answers."""
    if path.suffix == ".jsonl":
        return parse_qa_jsonl(path, task, axis)
    items = []
    for i, rec in enumerate(_list(read_json(path), path, "top level")):
        where = f"[{i}]"
        q = _get(rec, "utterance", path, where)
        target = _get(rec, "targetValue", path, where)
        answers = [(a or b).replace('\\"', '"') for a, b in _WEBQ_TARGET.findall(target)]
        if not answers:
            raise _err(path, where, f"targetValue has no (description ...) answer: {target[:60]!r}")
        items.append(_item(task, axis, _qa_prompt(q), answers, path=path, where=where))
    return TaskData(items)


# ---- reading -----------------------------------------------------------------------------------


def parse_squad(path: Path, task: str, axis: str, *, id_prefix: str | None = None) -> TaskData:
    """SQuAD-format JSON (SQuAD v2, TyDiQA-GoldP): answerable questions only, gold = first answer."""
    data = _list(_get(read_json(path), "data", path, "top level", list), path, "data")
    items = []
    for i, art in enumerate(data):
        for j, para in enumerate(_get(art, "paragraphs", path, f"data[{i}]", list)):
            pw = f"data[{i}].paragraphs[{j}]"
            context = _get(para, "context", path, pw)
            for k, qa in enumerate(_get(para, "qas", path, pw, list)):
                where = f"{pw}.qas[{k}]"
                qid = str(qa.get("id", "")) if isinstance(qa, dict) else ""
                if id_prefix is not None and not qid.startswith(id_prefix):
                    continue
                q = _get(qa, "question", path, where)
                if qa.get("is_impossible"):
                    continue
                answers = [
                    _get(a, "text", path, f"{where}.answers", str) for a in _get(qa, "answers", path, where, list)
                ]
                if not answers:
                    continue
                items.append(
                    _item(task, axis, _passage_prompt(context, q), answers, path=path, where=where, meta={"id": qid})
                )
    return TaskData(items)


def parse_tydiqa(path: Path, task: str, axis: str) -> TaskData:
    """TyDiQA-GoldP (SQuAD format, every language in one file): the English questions."""
    return parse_squad(path, task, axis, id_prefix="english")


def _drop_answer(ans: dict[str, Any]) -> str:
    if str(ans.get("number", "")).strip():
        return str(ans["number"]).strip()
    spans = [s for s in ans.get("spans") or [] if str(s).strip()]
    if spans:
        return ", ".join(str(s) for s in spans)
    date = ans.get("date") or {}
    return " ".join(str(date.get(k, "")) for k in ("day", "month", "year")).strip()


def parse_drop(path: Path, task: str, axis: str) -> TaskData:
    """DROP's official JSON (``{passage_id: {"passage", "qa_pairs": [{"question", "answer", ...}]}}``)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise _err(path, "top level", "expected a JSON object of passages")
    items = []
    for pid, rec in data.items():
        passage = _get(rec, "passage", path, pid)
        for k, qa in enumerate(_get(rec, "qa_pairs", path, pid, list)):
            where = f"{pid}.qa_pairs[{k}]"
            q = _get(qa, "question", path, where)
            cands = [_get(qa, "answer", path, where, dict), *qa.get("validated_answers", [])]
            answers = [a for a in (_drop_answer(c) for c in cands if isinstance(c, dict)) if a]
            items.append(
                _item(
                    task,
                    axis,
                    _passage_prompt(passage, q),
                    answers,
                    path=path,
                    where=where,
                    meta={"id": qa.get("query_id")},
                )
            )
    return TaskData(items)


def parse_coqa(path: Path, task: str, axis: str) -> TaskData:
    """CoQA's official JSON: one item per turn, earlier turns (with their gold answers) in the prompt."""
    data = _list(_get(read_json(path), "data", path, "top level", list), path, "data")
    items = []
    for i, rec in enumerate(data):
        where = f"data[{i}]"
        story = _get(rec, "story", path, where)
        qs = _get(rec, "questions", path, where, list)
        ans = _get(rec, "answers", path, where, list)
        if len(qs) != len(ans):
            raise _err(path, where, f"{len(qs)} questions but {len(ans)} answers")
        history = f"Passage: {_text(story)}"
        for t, (q, a) in enumerate(zip(qs, ans, strict=True)):
            q_text = _get(q, "input_text", path, f"{where}.questions[{t}]")
            a_text = _get(a, "input_text", path, f"{where}.answers[{t}]")
            prompt = f"{history}\nQuestion: {_text(q_text)}\nAnswer:"
            if _text(a_text):
                items.append(
                    _item(
                        task,
                        axis,
                        prompt,
                        [a_text],
                        path=path,
                        where=f"{where}.answers[{t}]",
                        meta={"id": rec.get("id"), "turn": t + 1},
                    )
                )
            history = f"{prompt} {_text(a_text)}"
    return TaskData(items)


def parse_lambada(path: Path, task: str, axis: str) -> TaskData:
    """LAMBADA as JSONL of ``{"text": ...}`` (OpenAI's ``lambada_test.jsonl``): predict the last word."""
    items = []
    for lineno, rec in read_jsonl(path):
        text = _get(rec, "text", path, f"line {lineno}").strip()
        prompt, sep, last = text.rpartition(" ")
        if not sep or not last:
            raise _err(path, f"line {lineno}", "text needs at least two words")
        items.append(EvalItem(task, axis, prompt, " " + last, None, {"answers": [last]}))
    return TaskData(items)


# ---- math --------------------------------------------------------------------------------------


def _number(v: Any) -> str:
    try:
        f = float(str(v).replace(",", ""))
    except ValueError:
        return str(v).strip()
    return str(int(f)) if f == int(f) else repr(f)


def parse_svamp(path: Path, task: str, axis: str) -> TaskData:
    """SVAMP.json: a list of ``{"Body", "Question", "Answer"}``."""
    items = []
    for i, rec in enumerate(_list(read_json(path), path, "top level")):
        where = f"[{i}]"
        body = _get(rec, "Body", path, where)
        q = _get(rec, "Question", path, where)
        a = _get(rec, "Answer", path, where, (int, float, str))
        items.append(
            _item(
                task,
                axis,
                _qa_prompt(f"{_text(body)} {_text(q)}"),
                [_number(a)],
                path=path,
                where=where,
                meta={"id": rec.get("ID")},
            )
        )
    return TaskData(items)


def parse_asdiv(path: Path, task: str, axis: str) -> TaskData:
    """ASDiv.xml (``<Problem><Body/><Question/><Answer>9 (apples)</Answer></Problem>``)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        line, col = exc.position
        raise _err(path, f"line {line}", f"not valid XML (column {col + 1})") from None
    items = []
    for i, prob in enumerate(root.iter("Problem")):
        where = f"Problem {prob.get('ID') or i + 1}"
        parts = {}
        for tag in ("Body", "Question", "Answer"):
            node = prob.find(tag)
            text = (node.text or "").strip() if node is not None else ""
            if not text:
                raise _err(path, where, f"missing <{tag}>")
            parts[tag] = text
        answer = parts["Answer"].split(" (")[0].strip()
        items.append(
            _item(
                task,
                axis,
                _qa_prompt(f"{_text(parts['Body'])} {_text(parts['Question'])}"),
                [_number(answer)],
                path=path,
                where=where,
                meta={"id": prob.get("ID")},
            )
        )
    if not items:
        raise _err(path, "file", "no <Problem> elements")
    return TaskData(items)


def parse_mawps(path: Path, task: str, axis: str) -> TaskData:
    """MAWPS: the original JSON list (``{"sQuestion", "lSolutions"}``) or MWPToolkit's
    (``{"original_text", "ans"}``); ``.jsonl`` with ``question``/``answer`` also works."""
    if path.suffix == ".jsonl":
        return parse_qa_jsonl(path, task, axis)
    items = []
    for i, rec in enumerate(_list(read_json(path), path, "top level")):
        where = f"[{i}]"
        if isinstance(rec, dict) and "sQuestion" in rec:
            q = _get(rec, "sQuestion", path, where)
            sol = _get(rec, "lSolutions", path, where, list)
            if not sol:
                raise _err(path, where, "empty lSolutions")
            a = sol[0]
        else:
            q = _get(rec, "original_text", path, where)
            a = _get(rec, "ans", path, where, (int, float, str))
        items.append(_item(task, axis, _qa_prompt(q), [_number(a)], path=path, where=where))
    return TaskData(items)


# ---- symbolic ----------------------------------------------------------------------------------


def parse_arc(path: Path, task: str, axis: str) -> TaskData:
    """ARC JSONL (``{"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}``): multiple choice."""
    items = []
    for lineno, rec in read_jsonl(path):
        where = f"line {lineno}"
        q = _get(rec, "question", path, where, dict)
        stem = _get(q, "stem", path, where)
        choices = _get(q, "choices", path, where, list)
        labels = [str(_get(c, "label", path, where, (str, int))) for c in choices]
        texts = [_get(c, "text", path, where) for c in choices]
        key = str(_get(rec, "answerKey", path, where, (str, int)))
        if key not in labels:
            raise _err(path, where, f"answerKey {key!r} is not one of the labels {labels}")
        gold = texts[labels.index(key)]
        items.append(
            _item(
                task, axis, _qa_prompt(stem), [gold], choices=texts, path=path, where=where, meta={"id": rec.get("id")}
            )
        )
    return TaskData(items)


def parse_bigbench(path: Path, task: str, axis: str) -> TaskData:
    """A BIG-bench JSON task (``task.json``), or a folder of subtasks each with a ``task.json``.

    Examples with ``target_scores`` become multiple choice (gold = the highest score); others use
    their first ``target``. Prompts use the task's ``task_prefix``, ``example_input_prefix``
    (default ``"\\nQ: "``) and ``example_output_prefix`` (default ``"\\nA: "``), as BIG-bench does.
    """
    files = [path] if path.is_file() else sorted(path.glob("*/task.json"))
    if not files:
        raise _err(path, "folder", "no task.json and no */task.json subtasks")
    items: list[EvalItem] = []
    preamble, sep = "", "\n"
    for f in files:
        spec = read_json(f)
        if not isinstance(spec, dict):
            raise _err(f, "top level", "expected a BIG-bench task object")
        examples = _get(spec, "examples", f, "top level", list)
        in_pre = str(spec.get("example_input_prefix", "\nQ: "))
        out_pre = str(spec.get("example_output_prefix", "\nA: ")).rstrip(" ")  # the gold carries the space
        task_prefix = str(spec.get("task_prefix", "") or "")
        sub = f.parent.name if len(files) > 1 else None
        if sub is None:  # one task: its prefix once, before any shots
            preamble, sep = task_prefix, str(spec.get("few_shot_example_separator", "\n"))
        for i, ex in enumerate(examples):
            where = f"examples[{i}]"
            x = _get(ex, "input", f, where)
            prompt = (task_prefix if sub is not None else "") + in_pre + x + out_pre
            meta = {"subtask": sub} if sub else {}
            if "target_scores" in ex:
                scores = _get(ex, "target_scores", f, where, dict)
                if not scores:
                    raise _err(f, where, "empty target_scores")
                choices = list(scores)
                gold = max(choices, key=lambda c: float(scores[c]))
                items.append(_item(task, axis, prompt, [gold], choices=choices, path=f, where=where, meta=meta))
            else:
                t = _get(ex, "target", f, where, (str, list))
                answers = [t] if isinstance(t, str) else [str(a) for a in t]
                items.append(_item(task, axis, prompt, answers, path=f, where=where, meta=meta))
    return TaskData(items, preamble=preamble, sep=sep)


# ---- the registry ------------------------------------------------------------------------------

_TQA = "https://nlp.cs.washington.edu/triviaqa/"
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "triviaqa",
            "knowledge",
            ("triviaqa/unfiltered-web-dev.json", "triviaqa/verified-web-dev.json"),
            parse_triviaqa,
            f"download triviaqa-unfiltered.tar.gz from {_TQA} and put its unfiltered-web-dev.json there",
            shots=5,
            until=("\n", ".", ","),
            about="closed-book TriviaQA (unfiltered dev), gold = Answer.Value, exact match on any alias",
        ),
        Benchmark(
            "nq_open",
            "knowledge",
            ("nq_open/NQ-open.dev.jsonl",),
            parse_qa_jsonl,
            "download NQ-open.dev.jsonl from https://github.com/google-research-datasets/natural-questions "
            "(folder nq_open)",
            shots=5,
            until=("\n", ".", ","),
            about="closed-book Natural Questions (open dev set)",
        ),
        Benchmark(
            "webquestions",
            "knowledge",
            ("webquestions/webquestions.examples.test.json", "webquestions/test.jsonl"),
            parse_webquestions,
            "get webquestions.examples.test.json from the SEMPRE release of WebQuestions "
            "(Berant et al. 2013; Hugging Face: stanfordnlp/web_questions, test split as JSONL test.jsonl)",
            shots=5,
            until=("\n", ".", ","),
            about="closed-book WebQuestions (test set)",
        ),
        Benchmark(
            "lambada",
            "reading",
            ("lambada/lambada_test.jsonl",),
            parse_lambada,
            "download lambada_test.jsonl (OpenAI's LAMBADA, lm-eval's lambada_openai; "
            "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl)",
            accuracy="greedy",
            match="exact",
            about="last word of a passage; accuracy = greedy decoding gives the word",
        ),
        Benchmark(
            "tydiqa_goldp",
            "reading",
            ("tydiqa/tydiqa-goldp-v1.1-dev.json",),
            parse_tydiqa,
            "download tydiqa-goldp-v1.1-dev.json from https://github.com/google-research-datasets/tydiqa "
            "(gold passage task)",
            about="TyDiQA-GoldP, English questions with their gold passage",
        ),
        Benchmark(
            "squad_v2",
            "reading",
            ("squad_v2/dev-v2.0.json",),
            parse_squad,
            "download dev-v2.0.json from https://rajpurkar.github.io/SQuAD-explorer/",
            about="SQuAD v2 dev, answerable questions",
        ),
        Benchmark(
            "drop",
            "reading",
            ("drop/drop_dataset_dev.json",),
            parse_drop,
            "download drop_dataset.zip from https://allenai.org/data/drop and extract drop_dataset_dev.json",
            about="DROP dev: numbers, spans (joined with ', ') or dates",
        ),
        Benchmark(
            "coqa",
            "reading",
            ("coqa/coqa-dev-v1.0.json",),
            parse_coqa,
            "download coqa-dev-v1.0.json from https://stanfordnlp.github.io/coqa/",
            about="CoQA dev: every turn, with the conversation so far",
        ),
        Benchmark(
            "svamp",
            "math",
            ("svamp/SVAMP.json",),
            parse_svamp,
            "download SVAMP.json from https://github.com/arkilpatel/SVAMP",
            match="number",
            about="SVAMP word problems, numeric answer",
        ),
        Benchmark(
            "asdiv",
            "math",
            ("asdiv/ASDiv.xml",),
            parse_asdiv,
            "download dataset/ASDiv.xml from https://github.com/chaochun/nlu-asdiv-dataset",
            match="number",
            about="ASDiv word problems, numeric answer (unit dropped)",
        ),
        Benchmark(
            "mawps",
            "math",
            ("mawps/mawps.json", "mawps/mawps.jsonl"),
            parse_mawps,
            "get MAWPS (https://github.com/sroy9/mawps; or MWPToolkit's mawps.json) as a JSON list",
            match="number",
            about="MAWPS word problems, numeric answer",
        ),
        Benchmark(
            "arc_easy",
            "symbolic",
            ("arc/ARC-Easy-Test.jsonl", "arc/ARC-Easy/ARC-Easy-Test.jsonl"),
            parse_arc,
            "download ARC-V1-Feb2018.zip from https://allenai.org/data/arc and put ARC-Easy-Test.jsonl there",
            accuracy="choice",
            match="exact",
            about="ARC-Easy test, multiple choice by lowest loss",
        ),
        Benchmark(
            "bigbench_dyck_languages",
            "symbolic",
            ("bigbench/dyck_languages/task.json",),
            parse_bigbench,
            "copy bigbench/benchmark_tasks/dyck_languages/task.json from https://github.com/google/BIG-bench",
            match="exact",
            about="BIG-bench Dyck languages: close the brackets",
        ),
        Benchmark(
            "bigbench_qa_wikidata",
            "symbolic",
            ("bigbench/qa_wikidata/task.json",),
            parse_bigbench,
            "copy bigbench/benchmark_tasks/qa_wikidata/task.json from https://github.com/google/BIG-bench",
            about="BIG-bench QA-Wikidata: complete a Wikidata fact",
        ),
        Benchmark(
            "bigbench_cs_algorithms",
            "symbolic",
            ("bigbench/cs_algorithms",),
            parse_bigbench,
            "copy the folder bigbench/benchmark_tasks/cs_algorithms (subtasks lcs/, valid_parentheses/) "
            "from https://github.com/google/BIG-bench",
            match="exact",
            about="BIG-bench CS algorithms (both subtasks)",
        ),
    )
}
"""Every real benchmark, in report order. Files are relative to ``--data-dir``."""
