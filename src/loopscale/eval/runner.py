"""Evaluate one model on tasks: per-item scores -> task scores -> axis scores -> overall.

task loss     = sum of gold NLL / sum of gold tokens over the task's items   (nats/token, primary)
task accuracy = mean over items: multiple choice (gold has the lowest total loss) where an item
                has choices, else exact match of greedy decoding (see TaskSpec.accuracy)
axis score    = macro average over the axis's tasks (controls such as bio_qa_unseen excluded)
overall       = mean of the axis scores
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loopscale.config.data import AXES, DataConfig
from loopscale.data.tokenizer import ByteTokenizer, Tokenizer
from loopscale.errors import ConfigError
from loopscale.eval.scoring import greedy_generate, is_match, score_continuations
from loopscale.eval.tasks import EvalContext, Prepared, TaskSpec, prepare, resolve_tasks


@dataclass(frozen=True)
class ItemScore:
    """One item's result. ``correct`` is None when the task defines no accuracy."""

    task: str
    index: int  # position in the task's evaluated items
    nll: float  # gold NLL (nats)
    n_tokens: int
    n_bytes: int
    correct: bool | None
    prediction: str | None  # greedy text (generate), the chosen choice (multiple choice), else None
    truncated: int = 0

    @property
    def loss(self) -> float:
        return self.nll / self.n_tokens


@dataclass(frozen=True)
class TaskScore:
    task: str
    axis: str
    loss: float  # nats per gold token
    loss_per_byte: float  # nats per gold byte
    accuracy: float | None
    n_items: int
    n_tokens: int
    shots: int
    control: bool = False
    truncated: int = 0  # items whose prompt lost tokens to fit seq_len

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(vals) / len(vals) if vals else None


@dataclass
class EvalResult:
    """Scores of one model at one r on a set of tasks."""

    tasks: list[TaskScore]
    items: dict[str, list[ItemScore]] = field(default_factory=dict, repr=False)
    r: int | None = None

    def task(self, name: str) -> TaskScore:
        for t in self.tasks:
            if t.task == name:
                return t
        raise KeyError(name)

    def axes(self) -> dict[str, dict[str, Any]]:
        """Per axis (in the paper's order): macro-averaged loss and accuracy over its scored tasks."""
        out: dict[str, dict[str, Any]] = {}
        for axis in [a for a in AXES if any(t.axis == a and not t.control for t in self.tasks)]:
            ts = [t for t in self.tasks if t.axis == axis and not t.control]
            out[axis] = {
                "loss": _mean([t.loss for t in ts]),
                "loss_per_byte": _mean([t.loss_per_byte for t in ts]),
                "accuracy": _mean([t.accuracy for t in ts]),
                "n_tasks": len(ts),
                "n_items": sum(t.n_items for t in ts),
            }
        return out

    def overall(self) -> dict[str, Any]:
        ax = self.axes()
        return {
            "loss": _mean([a["loss"] for a in ax.values()]),
            "loss_per_byte": _mean([a["loss_per_byte"] for a in ax.values()]),
            "accuracy": _mean([a["accuracy"] for a in ax.values()]),
            "n_axes": len(ax),
            "n_items": sum(a["n_items"] for a in ax.values()),
        }

    def knowledge_gap(self) -> float | None:
        """Closed-book loss on unseen minus seen facts (> 0: the model memorised its facts)."""
        names = {t.task: t for t in self.tasks}
        if "bio_qa" in names and "bio_qa_unseen" in names:
            return names["bio_qa_unseen"].loss - names["bio_qa"].loss
        return None

    def rows(self) -> list[dict[str, Any]]:
        """Long format: one row per task, per axis and overall (``level`` says which)."""
        rows = [
            {
                "level": "task",
                "axis": t.axis,
                "task": t.task,
                "loss": t.loss,
                "loss_per_byte": t.loss_per_byte,
                "accuracy": t.accuracy,
                "n_items": t.n_items,
                "n_tokens": t.n_tokens,
                "shots": t.shots,
                "control": t.control,
            }
            for t in self.tasks
        ]
        for axis, a in self.axes().items():
            rows.append(
                {
                    "level": "axis",
                    "axis": axis,
                    "task": "",
                    "loss": a["loss"],
                    "loss_per_byte": a["loss_per_byte"],
                    "accuracy": a["accuracy"],
                    "n_items": a["n_items"],
                    "n_tokens": None,
                    "shots": None,
                    "control": False,
                }
            )
        o = self.overall()
        rows.append(
            {
                "level": "overall",
                "axis": "overall",
                "task": "",
                "loss": o["loss"],
                "loss_per_byte": o["loss_per_byte"],
                "accuracy": o["accuracy"],
                "n_items": o["n_items"],
                "n_tokens": None,
                "shots": None,
                "control": False,
            }
        )
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "r": self.r,
            "tasks": [t.as_dict() for t in self.tasks],
            "axes": self.axes(),
            "overall": self.overall(),
            "knowledge_gap": self.knowledge_gap(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        return cls([TaskScore(**t) for t in d["tasks"]], {}, d.get("r"))


def _shots_for(shots: int | dict[str, int] | None, spec: TaskSpec) -> int | None:
    if isinstance(shots, dict):
        return shots.get(spec.name)
    return shots


def evaluate(
    model: Any,
    tasks: str | Sequence[str] | Sequence[TaskSpec] = "world",
    *,
    tokenizer: Tokenizer | None = None,
    r: int | None = None,
    data: DataConfig | None = None,
    data_dir: str | Path | None = None,
    shots: int | dict[str, int] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> EvalResult:
    """Score ``model`` on ``tasks`` (names, groups or TaskSpecs) at ``r`` recurrences (None: training r).

    ``data`` is the data config the model was trained on (its world holds the knowledge facts);
    ``data_dir`` the folder with real benchmark files; ``shots`` overrides the tasks' few-shot k
    (one number, or per task name); ``limit`` keeps the first items of each task.
    ``progress(done, total)`` is called as sequences finish; ``log`` hears each task as it is prepared.
    """
    tokenizer = tokenizer or ByteTokenizer()
    if tasks and all(isinstance(t, TaskSpec) for t in tasks):
        specs: list[TaskSpec] = list(tasks)  # type: ignore[arg-type]
    else:
        specs = resolve_tasks(tasks)  # type: ignore[arg-type]
    if isinstance(shots, dict) and set(shots) - {s.name for s in specs}:
        unknown = sorted(set(shots) - {s.name for s in specs})
        raise ConfigError("--shots", f"task {unknown[0]!r} is not among the evaluated tasks", value=shots)
    ctx = EvalContext(data, data_dir)
    preps = []
    for s in specs:
        preps.append(prepare(s, ctx, shots=_shots_for(shots, s), limit=limit))
        if log is not None:
            log(f"prepared {s.name} ({len(preps[-1].items)} items)")
    if log is not None:
        log(f"scoring {sum(len(p.items) for p in preps)} items of {len(preps)} tasks")
    return score_prepared(model, tokenizer, preps, r=r, batch_size=batch_size, progress=progress)


def score_prepared(
    model: Any,
    tokenizer: Tokenizer,
    preps: Sequence[Prepared],
    *,
    r: int | None = None,
    batch_size: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Score prepared tasks: one batched loss pass over every (prompt, continuation), one greedy
    generation pass per stop-string set."""
    pairs: dict[tuple[str, str], int] = {}

    def want(prompt: str, cont: str) -> int:
        return pairs.setdefault((prompt, cont), len(pairs))

    plan = []  # per task, per item: (gold id, choice ids or None, generation id or None)
    gens: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for prep in preps:
        rows = []
        for it, prompt in zip(prep.items, prep.prompts, strict=True):
            gold = want(prompt, it.gold)
            choices = None
            if it.choices:
                if it.gold not in it.choices:
                    raise ConfigError(prep.spec.name, f"gold {it.gold!r} is not among the choices {it.choices}")
                choices = [want(prompt, c) for c in it.choices]
            gen = None
            if choices is None and prep.spec.accuracy == "generate":
                answers = [it.gold, *(" " + a for a in it.meta.get("answers", []))]
                limit = max(len(tokenizer.encode(a)) for a in answers) + 4
                queue = gens.setdefault(prep.spec.until, [])
                gen = len(queue)
                queue.append((prompt, limit))
            rows.append((gold, choices, gen))
        plan.append(rows)

    total = len(pairs) + sum(len(q) for q in gens.values())
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total)

    scores = score_continuations(model, tokenizer, list(pairs), r=r, batch_size=batch_size, progress=tick)
    texts: dict[tuple[str, ...], list[str]] = {}
    for until, queue in gens.items():
        texts[until] = greedy_generate(
            model,
            tokenizer,
            [p for p, _ in queue],
            max_new_tokens=[m for _, m in queue],
            until=until,
            r=r,
            batch_size=batch_size,
            progress=tick,
        )

    results, items_out = [], {}
    for prep, rows in zip(preps, plan, strict=True):
        spec = prep.spec
        out = []
        for i, (it, (gold, choices, gen)) in enumerate(zip(prep.items, rows, strict=True)):
            g = scores[gold]
            correct: bool | None = None
            pred: str | None = None
            if choices is not None:
                choice_nll = [scores[c].nll for c in choices]
                best = min(range(len(choice_nll)), key=choice_nll.__getitem__)
                correct = it.choices[best] == it.gold  # type: ignore[index]
                pred = it.choices[best]  # type: ignore[index]
            elif gen is not None:
                pred = texts[spec.until][gen]
                correct = is_match(pred, [it.gold, *it.meta.get("answers", [])], spec.match)
            elif spec.accuracy == "greedy":
                correct = g.greedy
            out.append(ItemScore(spec.name, i, g.nll, g.n_tokens, g.n_bytes, correct, pred, g.truncated))
        n_tok = sum(s.n_tokens for s in out)
        n_bytes = sum(s.n_bytes for s in out)
        nll = sum(s.nll for s in out)
        accs = [s.correct for s in out if s.correct is not None]
        results.append(
            TaskScore(
                spec.name,
                spec.axis,
                nll / n_tok,
                nll / max(n_bytes, 1),
                sum(accs) / len(accs) if accs else None,
                len(out),
                n_tok,
                prep.shots,
                spec.control,
                sum(1 for s in out if s.truncated),
            )
        )
        items_out[spec.name] = out
    return EvalResult(results, items_out, r)
