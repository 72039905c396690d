"""Iso-depth sweeps: spec -> plan -> runs (local or SLURM) -> one runs table for the fit.

    from loopscale.sweep import load_spec, make_plan, prepare, run_sweep, runs_table
    spec = load_spec("demo")                    # a file, a sweep dir or a preset name
    plan = make_plan(spec)                      # every run's N, D, steps, warnings (+ time estimates)
    store = prepare(spec, "sweeps/demo")        # spec.toml + runs/<id>/sweep.json
    run_sweep(spec, store)                      # idempotent: finished runs are skipped
    df, _ = runs_table(store)                   # the runs table (collect writes CSV + Parquet)

Modules: ``spec`` (format, validation, expansion), ``plan`` and ``calibrate`` (planner),
``store`` (run dirs and statuses), ``attempt`` (one attempt of a run with its bookkeeping), ``executor`` (the
executors' interface and registry), ``local`` and ``slurm`` (executors), ``progress``, ``collect``.
The format and the statuses are in docs/sweep.md; a new executor in docs/extending.md.
"""

from __future__ import annotations

from pathlib import Path

from loopscale.sweep.collect import COLUMNS, runs_table, write_table
from loopscale.sweep.plan import Plan, PlanRow, make_plan, plan_row
from loopscale.sweep.runspec import RunSpec
from loopscale.sweep.spec import BASELINE, SweepSpec, load_spec, preset_path, presets, spec_from_dict
from loopscale.sweep.store import STATUSES, SweepStore, open_store


def default_dir(spec: SweepSpec) -> Path:
    return Path("sweeps") / spec.name


def prepare(spec: SweepSpec, out: str | Path | None = None, *, change_spec: bool = False) -> SweepStore:
    """Create (or resume) the sweep dir: the resolved spec.toml and every run's sweep.json.

    A sweep dir belongs to one spec: another spec (or an edited one, or ``--set`` on top) is refused unless
    ``change_spec`` (``sweep run --change-spec``); even then no run dir that another config started, or that a
    live process holds, is rewritten (docs/sweep.md, "One spec per sweep dir").
    """
    from loopscale.errors import ConfigError

    store = SweepStore(out if out is not None else default_dir(spec))
    text = spec.resolved_text()
    changed = holds_another_spec(spec, store)
    if changed and not change_spec:
        raise ConfigError(
            "spec",
            f"{store.root} already holds another spec (its spec.toml differs from {spec.source}"
            "); use a new sweep dir (--out), rerun it as `loopscale sweep run "
            f"{store.root}`, or pass --change-spec to change its spec",
            source=str(store.spec_path),
        )
    store.materialise(spec.runs())  # refuses run dirs trained with a different config
    if changed or not store.exists():  # keep the original header when rerun from the sweep dir
        store.write_spec(text)
    return store


def holds_another_spec(spec: SweepSpec, store: SweepStore) -> bool:
    """Does the sweep dir exist with a spec.toml other than ``spec`` (comments aside)?"""
    if not store.exists():
        return False
    return _body(store.spec_path.read_text(encoding="utf-8")) != _body(spec.resolved_text())


def _body(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def run_sweep(
    spec: SweepSpec,
    store: SweepStore,
    *,
    variants: list[str] | None = None,
    max_retries: int | None = None,
    isolate: bool = False,
    gpus: list[int] | None = None,
    nproc_per_run: int = 1,
    progress: bool = True,
    console=None,
    slots: int | None = None,
    pack: str | int | None = None,
):
    """Run the sweep with the local executor; returns a ``local.Summary``.

    ``slots``: CPU runs at once (None: as many as the cores hold at ``run.threads`` each; 1: serial, in-process).
    ``pack``: auto, off or the most runs per pack (None: the spec's ``[local] pack``, else auto; ``sweep.packs``).
    """
    from rich.console import Console

    from loopscale.sweep.local import run_local
    from loopscale.sweep.packs import parse_pack

    runs = spec.runs(variants)
    flops = {rs.run_id: plan_row(rs, spec).flops for rs in runs}
    retries = spec.max_retries if max_retries is None else max_retries
    return run_local(
        store,
        runs,
        flops,
        max_retries=retries,
        console=console or Console(stderr=True),
        isolate=isolate,
        gpus=gpus,
        nproc_per_run=nproc_per_run,
        progress=progress,
        slots=slots,
        pack=parse_pack(pack if pack is not None else (spec.executors.get("local") or {}).get("pack")),
    )


__all__ = [
    "BASELINE",
    "COLUMNS",
    "STATUSES",
    "Plan",
    "PlanRow",
    "RunSpec",
    "SweepSpec",
    "SweepStore",
    "default_dir",
    "holds_another_spec",
    "load_spec",
    "make_plan",
    "open_store",
    "plan_row",
    "prepare",
    "preset_path",
    "presets",
    "run_sweep",
    "runs_table",
    "spec_from_dict",
    "write_table",
]
