"""`loopscale sweep plan|run|status|collect`: the iso-depth grid, planned, run, resumed and tabulated.

Heavy imports (torch through loopscale.train, pandas) stay inside the command functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from loopscale.cli.app import app, console, err_console
from loopscale.numbers import count, flops

sweep_app = typer.Typer(help="Plan, run, resume and collect an iso-depth sweep (docs/sweep.md).", no_args_is_help=True)
app.add_typer(sweep_app, name="sweep")

SPEC_HELP = "Spec TOML, a sweep dir (its spec.toml) or a preset name (e.g. demo, paper)."


def _store_for(spec_arg: str, out: Path | None, spec: Any) -> Any:
    from loopscale.sweep import default_dir

    p = Path(spec_arg)
    if out is not None:
        return out
    if p.is_dir() and (p / "spec.toml").is_file():
        return p
    return default_dir(spec)


@sweep_app.command()
def plan(
    spec_arg: str = typer.Argument(..., metavar="SPEC", help=SPEC_HELP),
    set_: list[str] = typer.Option([], "--set", help="Dotted override of the spec, e.g. --set sweep.seeds=[0,1]"),
    variant: list[str] = typer.Option([], "--variant", "-v", help="Only these variants (r = 1 runs included)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Sweep dir for the calibration cache (default sweeps/<name>)."
    ),
    calibrate: bool = typer.Option(True, "--calibrate/--no-calibrate", help="Time a few steps per model shape."),
    calibrate_s: float = typer.Option(60.0, "--calibrate-s", help="Time budget of the calibration (seconds)."),
    slots: int | None = typer.Option(
        None,
        "--slots",
        min=1,
        help=escape("CPU runs at once, as `sweep run --slots` (default: cores // run.threads, or [local] slots)."),
    ),
    flops_per_s: float | None = typer.Option(None, "--flops-per-s", help="Assume this FLOP/s per run instead."),
    pack: str | None = typer.Option(
        None,
        "--pack",
        help=escape("As `sweep run --pack`: auto (default, or [local] pack), off, or the most runs per pack."),
    ),
    csv: Path | None = typer.Option(None, "--csv", help="Also write the plan as CSV."),
    device_memory: str | None = typer.Option(
        None,
        "--device-memory",
        help="Each run's GPU memory, e.g. 80GB or 79.6GiB: adds every run's micro-batch "
        "and predicted peak memory (loopscale.memory). Default: this machine's GPU, if it has one.",
    ),
) -> None:
    """Print every run (size, tokens, steps, estimated time) and the totals, with warnings; trains nothing."""
    from loopscale.cores import check_slots
    from loopscale.sweep import load_spec, make_plan
    from loopscale.sweep.calibrate import Calibration
    from loopscale.sweep.progress import duration as _dur

    check_slots(slots)
    from loopscale.sweep.packs import parse_pack

    pack_mode = parse_pack(pack) if pack is not None else None
    spec = load_spec(spec_arg, set_)
    root = Path(_store_for(spec_arg, out, spec))
    if pack_mode is None:
        pack_mode = parse_pack((spec.executors.get("local") or {}).get("pack"), "[local] pack")
    cal = None
    if calibrate and not flops_per_s:
        cal = Calibration(root / "calibration.json")
    mem_bytes = _device_memory(device_memory)
    p = make_plan(
        spec,
        variants=variant or None,
        calibration=cal,
        flops_per_s=flops_per_s,
        calibrate_s=calibrate_s,
        log=lambda m: err_console.print(m, style="dim", highlight=False),
        device_memory=mem_bytes,
        slots=slots or (spec.executors.get("local") or {}).get("slots"),
        pack=pack_mode,
    )
    packed = any(len(g) > 1 for g in p.packs)
    t = Table(box=box.SIMPLE_HEAD, title=f"sweep {spec.name}: {len(p.rows)} runs", title_justify="left")
    mem_cols = ("micro", "peak") if mem_bytes else ()
    pack_cols = ("pack",) if packed else ()
    cols = (
        "run",
        "C",
        "r",
        "d",
        "layout",
        "N_once",
        "N_rec",
        "tokens",
        "tok/param",
        "steps",
        *mem_cols,
        *pack_cols,
        "est.",
        "",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("run", "layout", "") else "right")
    for row in p.rows:
        rs = row.run
        peak = f"{row.peak_bytes / 1e9:.1f} GB" if row.peak_bytes else "-"
        mem: tuple[str, ...] = (str(row.micro_batch or "-"), peak) if mem_bytes else ()
        t.add_row(
            rs.run_id,
            flops(rs.C),
            str(rs.r),
            str(rs.d_model),
            rs.config.model.layout,
            count(row.N_once),
            count(row.N_rec),
            count(row.tokens),
            f"{row.tokens_per_param:.3g}",
            str(row.steps),
            *mem,
            *((f"{(row.pack or 0) + 1}/{len(p.packs[row.pack or 0])}",) if packed else ()),
            _dur(row.est_s) + ("*" if row.est_kind == "extrapolated" else ""),
            "!" if row.warnings else "",
        )
    console.print(t)
    warned = [row for row in p.rows if row.warnings]
    if warned:
        console.print(f"[bold yellow]{len(warned)} warning(s):[/]", markup=True)
        for row in warned:
            for w in row.warnings:
                console.print(f"  {row.run.run_id}: {w}", highlight=False, markup=False)
    per_variant = ", ".join(f"{k} {v}" for k, v in p.by_variant().items())
    console.print(
        f"[bold]total:[/] {len(p.rows)} runs ({escape(per_variant)}), {p.total_flops:.4g} FLOPs, "
        f"{sum(r.tokens for r in p.rows):.4g} tokens",
        markup=True,
        highlight=False,
    )
    if p.memory_note:
        console.print(f"[bold]memory:[/] {escape(p.memory_note)}", markup=True, highlight=False)
    if p.total_s is None and p.calibration_note:
        console.print(f"[bold]estimated time:[/] - ({escape(p.calibration_note)})", markup=True, highlight=False)
    if packed:
        sizes = [len(g) for g in p.packs]
        console.print(
            f"[bold]packs:[/] {len(p.rows)} runs as {len(sizes)} packs of {min(sizes)}-{max(sizes)} (runs of one "
            "shape trained as one model in one slot; column pack = pack/its size; --pack off: one run at a time)",
            markup=True,
            highlight=False,
        )
    if p.total_s is not None:
        star = "; * = extrapolated" if any(r.est_kind == "extrapolated" for r in p.rows) else ""
        at_once = (
            f"{_dur(p.unpacked_wall_s)} with {p.slots} runs at a time ({_dur(p.total_s)} of run time, each timed "
            "alone at its slot's threads)"
            if p.slots > 1
            else f"{_dur(p.total_s)} one run at a time"
        )
        if packed:
            where = f"{p.slots} slots" if p.slots > 1 else "one slot"
            at_once = f"{_dur(p.wall_s)} in packs on {where}; without packs {at_once}"
        console.print(
            f"[bold]estimated time:[/] {at_once} ({escape(p.calibration_note + star)})", markup=True, highlight=False
        )
    from loopscale.sweep import executor as executors

    for name, table in spec.executors.items():  # e.g. [slurm]: its GPU-hours
        if table:
            ex = executors.get(name)
            note = ex.plan_note(ex.settings(table, spec.source), p.total_flops)
            if note:
                console.print(note, markup=True, highlight=False)
    if csv is not None:
        import pandas as pd

        from loopscale.io import atomic_write_text

        atomic_write_text(csv, pd.DataFrame([r.as_dict() for r in p.rows]).to_csv(index=False))
        console.print(f"plan written to {csv}", highlight=False)


def _device_memory(text: str | None) -> float | None:
    """--device-memory in bytes; without it this machine's GPU memory, or None (no memory columns)."""
    from loopscale import memory
    from loopscale.errors import ConfigError

    if text is None:
        return memory.device_total_memory("cuda")
    try:
        return float(memory.parse_bytes(text))
    except ValueError:
        raise ConfigError("--device-memory", "expected a size such as 80GB or 79.6GiB", value=text) from None


@sweep_app.command()
def run(
    spec_arg: str = typer.Argument(..., metavar="SPEC_OR_DIR", help=SPEC_HELP),
    out: Path | None = typer.Option(None, "--out", "-o", help="Sweep dir (default sweeps/<name>, or SPEC_OR_DIR)."),
    executor: str = typer.Option("local", "--executor", "-e", help="local or slurm (loopscale.sweep.executor)."),
    max_retries: int | None = typer.Option(None, "--max-retries", help="Retries of a failed run (default: spec)."),
    isolate: bool = typer.Option(
        False, "--isolate", help=escape("Each run in its own subprocess (or [local] isolate).")
    ),
    gpus: str | None = typer.Option(
        None,
        "--gpus",
        help="GPU ids for local slots, e.g. 0,1,2,3 (default: all); positions in CUDA_VISIBLE_DEVICES when it is set.",
    ),
    nproc_per_run: int | None = typer.Option(None, "--nproc-per-run", help="torchrun processes (GPUs) per run."),
    slots: int | None = typer.Option(
        None,
        "--slots",
        min=1,
        help=escape(
            "CPU runs trained at once (default: cores // run.threads, or [local] slots; 1 = one at a time in "
            "this process)."
        ),
    ),
    pack: str | None = typer.Option(
        None,
        "--pack",
        help=escape(
            "Runs of the same shape trained as one model in one slot: auto (default, or [local] pack), off, or "
            "the most runs per pack (docs/sweep.md, Packs)."
        ),
    ),
    variant: list[str] = typer.Option([], "--variant", "-v", help="Only these variants (r = 1 runs included)."),
    seed: list[int] = typer.Option(
        [], "--seed", help="Only these seeds (repeat; one seed at a time leaves a whole grid after each)."
    ),
    set_: list[str] = typer.Option([], "--set", help="Dotted override of the spec."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Give failed runs a fresh set of retries."),
    change_spec: bool = typer.Option(
        False,
        "--change-spec",
        help="Let SPEC replace the sweep dir's spec.toml (runs another config started are still refused).",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars (one line per run)."),
    cluster: str = typer.Option("slurm", "--cluster", hidden=True, help="submitit backend: slurm, local, debug."),
    resubmit_queued: bool = typer.Option(
        False,
        "--resubmit-queued",
        help="slurm: resubmit queued runs even when squeue cannot confirm their job is gone.",
    ),
) -> None:
    """Run (or resume) the sweep: finished runs are skipped, interrupted ones resume, failed ones are retried."""
    from loopscale.cores import check_slots
    from loopscale.sweep import executor as executors
    from loopscale.sweep import load_spec, prepare
    from loopscale.train.batches import check_allowed

    check_slots(slots)
    from loopscale.sweep.packs import parse_pack

    if pack is not None:
        parse_pack(pack)  # a bad value is one line before anything starts
    chosen = executors.get(executor)  # a typo fails before the sweep dir exists
    spec = load_spec(spec_arg, set_)
    runs = spec.runs(variant or None, seed or None)
    for rs in runs:  # refused data (the paper preset without data) fails here, before any job starts
        check_allowed(rs.config.data)
    store = prepare(spec, _store_for(spec_arg, out, spec), change_spec=change_spec)
    retries = spec.max_retries if max_retries is None else max_retries
    if retry_failed:
        for rs in runs:
            st = store.state(rs.run_id)
            if st.status == "failed":
                store.reset_failures(rs.run_id)
    err_console.print(f"sweep {spec.name}: {len(runs)} runs in {store.root}", highlight=False)
    from loopscale.sweep import plan_row

    gpu_ids = [int(g) for g in gpus.split(",") if g.strip()] if gpus is not None else None
    flags = {
        "isolate": isolate or None,
        "gpus": gpu_ids,
        "nproc_per_run": nproc_per_run,
        "slots": slots,
        "pack": pack,
        "cluster": cluster,
        "resubmit_queued": resubmit_queued or None,
    }  # each executor takes its own
    job = executors.SweepJob(
        name=spec.name,
        store=store,
        runs=runs,
        flops={rs.run_id: plan_row(rs, spec).flops for rs in runs},
        max_retries=retries,
        console=err_console,
        table=spec.executors.get(executor, {}),
        source=spec.source,
        options=flags,
        progress=not no_progress,
    )
    chosen.launch(job)


@sweep_app.command("run-one", hidden=True)
def run_one(
    sweep_dir: Path = typer.Argument(...),
    run_ids: list[str] = typer.Argument(..., metavar="RUN_ID..."),
    max_retries: int = typer.Option(2, "--max-retries"),
) -> None:
    """Worker: train one run, or the runs of one pack, of a sweep dir with the sweep's bookkeeping (used by
    --isolate and GPU slots)."""
    from loopscale.signals import worker_process
    from loopscale.sweep.attempt import execute_pack
    from loopscale.sweep.executor import SweepIncomplete
    from loopscale.sweep.store import open_store

    with worker_process():  # a repeated SIGTERM cannot kill it between its checkpoint and its lock's release
        outcomes = execute_pack(open_store(sweep_dir), run_ids, max_retries=max_retries, executor="local-worker")
    failed = [f"{rid}: {o}" for rid, o in outcomes.items() if o in ("failed", "retry")]
    if failed:
        raise SweepIncomplete("; ".join(failed))


@sweep_app.command()
def status(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="Sweep dir."),
    all_runs: bool = typer.Option(False, "--all", "-a", help="List every run, not only unfinished ones."),
) -> None:
    """Progress of a sweep: runs per status, FLOPs done, and the runs not yet done."""
    from loopscale.sweep import STATUSES, open_store, plan_row
    from loopscale.sweep.spec import load_spec

    store = open_store(sweep_dir)
    spec = load_spec(store.root)
    planned = store.planned([rs.run_id for rs in spec.runs()])
    counts = dict.fromkeys(STATUSES, 0)
    flops_total = flops_done = flops_failed = 0.0
    t = Table(box=box.SIMPLE_HEAD)
    for col in ("run", "status", "step", "val loss", "attempts", "note"):
        t.add_column(col, justify="right" if col in ("step", "val loss", "attempts") else "left")
    for rs in planned:
        st = store.state(rs.run_id)
        counts[st.status] += 1
        f = plan_row(rs, spec).flops
        flops_total += f
        if st.status in ("done", "diverged"):  # finished: neither runs again
            flops_done += f
        elif st.status == "failed":
            flops_failed += f
        if all_runs or st.status != "done":
            res = st.result or {}
            vl = res.get("val_loss")
            note = str(res.get("error") or "").splitlines()[0][:90] if res.get("error") else ""
            if st.status == "running" and st.lock:
                note = f"{st.lock.get('host')} pid {st.lock.get('pid')}"
            if st.status == "queued" and st.lock:
                note = f"job {st.lock.get('job_id')}"
            if st.problem:
                note = f"{note}; {st.problem}" if note else st.problem
            total = rs.config.total_steps()
            step = res.get("steps", st.step)
            t.add_row(
                rs.run_id,
                st.status,
                f"{step or 0}/{total}",
                f"{vl:.4f}" if vl is not None else "-",
                str(st.attempts.get("attempts", 0)),
                note,
            )
    in_spec = {rs.run_id: rs for rs in spec.runs()}
    unreadable = store.unreadable_plans()
    for rid, problem in unreadable.items():  # not planned: its sweep.json cannot be read
        counts["corrupt"] += 1
        flops_total += plan_row(in_spec[rid], spec).flops if rid in in_spec else 0.0
        t.add_row(rid, "corrupt", "-", "-", "-", problem)
    if t.row_count:
        console.print(t)
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    failed_note = f", {flops_failed:.3g} in failed runs" if flops_failed else ""
    console.print(
        f"[bold]{escape(str(store.root))}:[/] {len(planned) + len(unreadable)} runs: {summary}; "
        f"{flops_done:.3g}/{flops_total:.3g} FLOPs done ({100 * flops_done / max(flops_total, 1):.0f}%)"
        f"{failed_note}",
        markup=True,
        highlight=False,
    )


@sweep_app.command()
def collect(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="Sweep dir."),
    out: Path | None = typer.Option(None, "--out", "-o", help="CSV path (default DIR/runs.csv); Parquet beside it."),
) -> None:
    """Write the runs table (runs.csv and runs.parquet) from the runs' result.json files."""
    from loopscale.sweep import open_store, runs_table, write_table
    from loopscale.sweep.collect import corrupt_files
    from loopscale.sweep.executor import SweepIncomplete

    store = open_store(sweep_dir)
    df, missing = runs_table(store)
    csv_path, pq_path = write_table(df, out or store.root / "runs.csv")
    by_status = df["status"].value_counts().to_dict() if len(df) else {}
    msg = ", ".join(f"{v} {k}" for k, v in by_status.items()) or "no results yet"
    console.print(f"{csv_path} and {pq_path}: {len(df)} runs ({msg})", highlight=False)
    if missing:
        console.print(
            "not in the table (no result yet): " + ", ".join(f"{v} {k}" for k, v in missing.items()), highlight=False
        )
    corrupt = corrupt_files(store)
    for line in corrupt:
        console.print(f"corrupt, not in the table: {line}", highlight=False, markup=False)
    if corrupt:  # the table is written, but a script's `collect && fit` must not go on as if it were whole
        raise SweepIncomplete(
            f"{len(corrupt)} run(s) left out of {csv_path} because a file of theirs is corrupt "
            "(listed above); fix or delete them, or rerun `loopscale sweep run` to retrain them"
        )
