"""The task registry: every evaluation task by name, with its axis and its loader (arXiv 2604.21106 §6).

    axis        world tasks (embedded default)                      real benchmarks (--data-dir)
    knowledge   bio_qa  (bio_qa_unseen: control)                    triviaqa  nq_open  webquestions
    reading     passage_qa  story_cloze                             lambada  tydiqa_goldp  squad_v2  drop  coqa
    math        arith_word                                          svamp  asdiv  mawps
    reasoning   induction  varassign_d{0,1}_{math,code}  (the paper's primitives, also in the "paper" group)
    symbolic    dyck  string_compose                                arc_easy  bigbench_dyck_languages
                                                                    bigbench_qa_wikidata  bigbench_cs_algorithms

World tasks come from ``loopscale.data``'s held-out evaluation items of the data config the model
was trained on (so ``bio_qa`` asks about the people in *its* training stream). The reasoning
primitives are the world's: 8 random key -> value pairs, query one (induction); 5 variables with
values 1-25, depth 1 adds 5 aliases and queries an alias, in math and code style (variable
assignment) — exactly the paper's spec (arXiv 2604.21106 §6) (tested). Groups: ``world`` (every world task, the
default), ``benchmarks`` (every real benchmark), ``paper`` (the benchmarks + the reasoning
primitives: the paper's suite), ``all``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopscale.config.data import AXES, DataConfig
from loopscale.data.world import CONTROL_TASKS, TASKS, EvalItem
from loopscale.errors import ConfigError
from loopscale.eval.benchmarks import BENCHMARKS, Benchmark, TaskData


@dataclass
class EvalContext:
    """What loaders may read: the world of a data config, and the folder of benchmark files."""

    data: DataConfig | None = None
    data_dir: str | Path | None = None

    def world(self) -> Any:
        """The embedded default data of ``data`` (built once per config and process)."""
        from loopscale.data.mixture import build_default

        cfg = self.data or DataConfig()
        key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
        if key not in _WORLDS:
            _WORLDS.clear()  # one world at a time: they are a few MB each
            _WORLDS[key] = build_default(cfg)
        return _WORLDS[key]


_WORLDS: dict[str, Any] = {}


@dataclass(frozen=True)
class TaskSpec:
    """One evaluation task.

    ``accuracy``: ``choice`` (multiple choice: correct when the gold has the lowest total loss
    among the item's ``choices``), ``generate`` (greedy generation until ``until``, normalised
    with ``match``, equals the gold or any of ``meta["answers"]``) or ``greedy`` (greedy decoding
    reproduces the gold tokens: cloze tasks). An item with ``choices`` is always scored as
    multiple choice (BIG-bench tasks mix both kinds).
    """

    name: str
    axis: str
    source: str  # "world" | "benchmark"
    load: Callable[[EvalContext], TaskData]
    shots: int = 0
    accuracy: str = "generate"
    match: str = "exact"
    until: tuple[str, ...] = ("\n",)
    control: bool = False
    about: str = ""
    benchmark: Benchmark | None = field(default=None, repr=False)


def _world_loader(task: str) -> Callable[[EvalContext], TaskData]:
    def load(ctx: EvalContext) -> TaskData:
        data = ctx.world()
        items = [it for it in data.eval_items if it.task == task]
        shots = data.world.shots.get(task) or data.world.shots.get("bio_qa" if task.startswith("bio_qa") else task)
        return TaskData(items, list(shots or []))

    return load


def _benchmark_loader(b: Benchmark) -> Callable[[EvalContext], TaskData]:
    def load(ctx: EvalContext) -> TaskData:
        return b.parse(b.locate(ctx.data_dir), b.name, b.axis)

    return load


_WORLD_ABOUT = {
    "bio_qa": "closed-book question about a person whose biography is in training (4 choices)",
    "bio_qa_unseen": "control: the same questions about people never in training (not in the axis score)",
    "passage_qa": "a fresh passage and a question answerable only from it",
    "story_cloze": "a fresh story whose last word is a name from the story",
    "arith_word": "one- and two-step arithmetic word problems",
    "induction": "8 random key -> value pairs, look one up",
    "varassign_d0_math": "5 variables, values 1-25, query one (math style)",
    "varassign_d1_math": "5 variables + 5 aliases, query an alias (math style)",
    "varassign_d0_code": "5 variables, values 1-25, query one (code style)",
    "varassign_d1_code": "5 variables + 5 aliases, query an alias (code style)",
    "dyck": "close an open bracket sequence",
    "string_compose": "apply 1-3 string operations to a random word",
}
_WORLD_ACCURACY = {"bio_qa": "choice", "bio_qa_unseen": "choice", "story_cloze": "greedy"}
PRIMITIVES: tuple[str, ...] = (
    "induction",
    "varassign_d0_math",
    "varassign_d1_math",
    "varassign_d0_code",
    "varassign_d1_code",
)
"""The paper's reasoning primitives (generated by the task world to the paper's spec)."""


def _registry() -> dict[str, TaskSpec]:
    out: dict[str, TaskSpec] = {}
    for name, axis in TASKS.items():
        out[name] = TaskSpec(
            name,
            axis,
            "world",
            _world_loader(name),
            accuracy=_WORLD_ACCURACY.get(name, "generate"),
            control=name in CONTROL_TASKS,
            about=_WORLD_ABOUT.get(name, ""),
        )
    for b in BENCHMARKS.values():
        out[b.name] = TaskSpec(
            b.name,
            b.axis,
            "benchmark",
            _benchmark_loader(b),
            shots=b.shots,
            accuracy=b.accuracy,
            match=b.match,
            until=b.until,
            about=b.about,
            benchmark=b,
        )
    return out


REGISTRY: dict[str, TaskSpec] = _registry()
"""Every task by name (world tasks first, then benchmarks, each in axis order)."""

GROUPS: dict[str, tuple[str, ...]] = {
    "world": tuple(TASKS),
    "benchmarks": tuple(BENCHMARKS),
    "paper": (*BENCHMARKS, *PRIMITIVES),
    "all": tuple(REGISTRY),
}


def resolve_tasks(spec: str | Sequence[str] | None) -> list[TaskSpec]:
    """Task names and groups (comma-separated or a list) -> tasks in registry order, no duplicates."""
    if spec is None:
        spec = "world"
    given = [spec] if isinstance(spec, str) else list(spec)
    parts = [name.strip() for chunk in given for name in chunk.split(",") if name.strip()]
    if not parts:
        raise ConfigError("--tasks", "no task given", value=spec)
    names: set[str] = set()
    for p in parts:
        if p in GROUPS:
            names.update(GROUPS[p])
        elif p in REGISTRY:
            names.add(p)
        else:
            raise ConfigError(
                "--tasks", f"unknown task {p!r}; groups: {', '.join(GROUPS)}; tasks: {', '.join(REGISTRY)}"
            )
    return [t for t in REGISTRY.values() if t.name in names]


def axis_order(axis: str) -> int:
    return AXES.index(axis) if axis in AXES else len(AXES)


# ---- prompts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """A task's items with their final prompts (few-shot examples and preamble included)."""

    spec: TaskSpec
    items: list[EvalItem]  # the evaluated items
    prompts: list[str]  # full prompt per item
    shots: int


def prepare(spec: TaskSpec, ctx: EvalContext, *, shots: int | None = None, limit: int | None = None) -> Prepared:
    """Load a task and build its k-shot prompts: preamble + k examples + the item's prompt.

    Examples are the task's fixed shots (world: training-distribution items), or for benchmarks
    the first k items of the file (then not evaluated). ``limit`` keeps the first items only.
    """
    td = spec.load(ctx)
    k = spec.shots if shots is None else int(shots)
    if k < 0:
        raise ConfigError("--shots", "must be >= 0", value=k)
    items = list(td.items)
    pool = td.shots if td.shots is not None else items[:k]
    if td.shots is None:
        items = items[k:]
    if k > len(pool):
        raise ConfigError("--shots", f"task {spec.name} has only {len(pool)} examples for few-shot prompts", value=k)
    if limit is not None:
        items = items[:limit]
    if not items:
        raise ConfigError(spec.name, "no items to evaluate (after few-shot examples and --limit)")
    head = td.sep.join(s.prompt + s.gold for s in pool[:k])
    prefix = td.preamble + (head + td.sep if head else "")
    return Prepared(spec, items, [prefix + it.prompt for it in items], k)
