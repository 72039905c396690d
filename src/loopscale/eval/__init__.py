"""Downstream evaluation on five axes (arXiv 2604.21106 §6; docs/eval.md).

- ``scoring``    the loss of a gold continuation given a prompt (batched, padded, truncated from the
                 left), greedy generation with the looped KV cache, answer normalisation;
- ``tasks``      the registry: task name -> axis, loader, few-shot k, accuracy rule; groups
                 ``world`` / ``benchmarks`` / ``paper`` / ``all``; k-shot prompt assembly;
- ``benchmarks`` loaders of the real benchmarks from local files in their standard formats;
- ``runner``     ``evaluate(model, tasks, r=...)`` -> ``EvalResult`` (task, axis, overall scores);
- ``runs``       checkpoints and sweeps: compute-optimal run per cell, test-time r, the axes table;
- ``harness``    the lm-evaluation-harness adapter (extra ``[eval]``), imported on demand.

    from loopscale.eval import evaluate
    res = evaluate(model, "world", data=cfg.data, r=4)
    res.axes()["knowledge"]["loss"], res.overall(), res.task("bio_qa").accuracy
"""

from loopscale.eval.runner import EvalResult, ItemScore, TaskScore, evaluate
from loopscale.eval.runs import Evaluation, evaluate_path, evaluate_run, find_runs
from loopscale.eval.scoring import Continuation, greedy_generate, score_continuations
from loopscale.eval.tasks import GROUPS, REGISTRY, TaskSpec, resolve_tasks

__all__ = [
    "GROUPS",
    "REGISTRY",
    "Continuation",
    "EvalResult",
    "Evaluation",
    "ItemScore",
    "TaskScore",
    "TaskSpec",
    "evaluate",
    "evaluate_path",
    "evaluate_run",
    "find_runs",
    "greedy_generate",
    "resolve_tasks",
    "score_continuations",
]
