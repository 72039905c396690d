"""`loopscale design`: how narrow will phi's CI be with this grid, before any compute is spent.

Heavy imports (the sweep spec, scipy, loopscale.fit) stay inside the command function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from loopscale.cli.app import app, console, err_console
from loopscale.numbers import count, flops, phi

if TYPE_CHECKING:
    from loopscale.fit.result import FitResult


def planned_grid(spec: Any, r1_from: str | None = None, variant: str = "baseline") -> Any:
    """One row per planned run of ``variant``: C, r, d_model, seed and the accounting's N_once, N_rec, D.

    ``r1_from``: the r = 1 runs are that variant's (loop-of-one controls, as `fit --r1-from` reads them). A
    technique's rows (``variant`` another than the baseline) are its own runs with r > 1, as the fit pairs them."""
    import pandas as pd

    from loopscale.errors import ConfigError
    from loopscale.sweep import plan_row

    if variant not in spec.variant_names:
        raise ConfigError("--technique", f"not a variant of the spec; it has {spec.variant_names}", value=variant)
    own = [rs for rs in spec.runs([variant]) if rs.variant == variant]
    if variant != "baseline":
        runs = [rs for rs in own if rs.r > 1]
    else:
        runs = [rs for rs in own if r1_from is None or rs.r > 1]
        if r1_from is not None:
            control = [rs for rs in spec.runs([r1_from]) if rs.variant == r1_from and rs.r == 1]
            if not control:
                raise ConfigError("--r1-from", "no r = 1 runs of this variant in the spec", value=r1_from)
            runs += control
    rows = []
    for rs in runs:
        p = plan_row(rs, spec)
        rows.append(
            {
                "run_id": rs.run_id,
                "C": rs.C,
                "r": rs.r,
                "d_model": rs.d_model,
                "seed": rs.seed,
                "N_once": p.N_once,
                "N_rec": p.N_rec,
                "D": float(p.tokens),
            }
        )
    return pd.DataFrame(rows)


def _prior(prior: str, variant: str | None) -> tuple[dict[str, float], FitResult | None, str]:
    from loopscale.fit import PAPER_COEFFICIENTS
    from loopscale.fit.fitfile import load_fit

    if prior == "paper":
        return dict(PAPER_COEFFICIENTS), None, "paper (arXiv 2604.21106 §1)"
    from loopscale.errors import ConfigError

    doc = load_fit(Path(prior))
    name = variant or doc.reference
    if name not in doc.variants:
        raise ConfigError("--variant", f"not in the fit file; it has {sorted(doc.variants)}", value=name)
    rec = doc.variant(name)
    if rec.phi_undetermined:
        raise ConfigError(
            "--prior", "the fit file's law has no phi (no r > 1 runs); give a fit with looped runs", value=prior
        )
    return {k: float(x) for k, x in rec.params.as_dict().items()}, doc, f"{prior} [{name}]"


MISFIT_NATS = 0.5  # a noise estimate above this is a prior that does not describe the runs


def _noise(
    sigma: float | None,
    cell_sigma: float | None,
    noise_from: list[Path],
    prior: dict[str, float],
    doc: FitResult | None,
    r1_from: str | None,
) -> Any:
    """Flags win; else estimated from a runs table (seeds where present); else the fit's residual RMSE.

    The runs are read as the design reads its grid: baseline runs, against ``r1_from``'s r = 1 runs if given."""
    from loopscale.fit import load_runs
    from loopscale.fit.design import Noise, estimate_noise
    from loopscale.fit.law.formula import params_to_theta

    def residual_noise(paths: Any) -> Any:
        t = load_runs(paths)
        t = t.with_r1_control(r1_from).for_variant(f"baseline@{r1_from}") if r1_from else t.for_variant("baseline")
        return estimate_noise(t.df, params_to_theta(prior), source=t.source, fitted=doc is not None)

    est = None
    if noise_from:
        est = residual_noise(noise_from)
        if doc is None and max(est.run_sd, est.cell_sd) > MISFIT_NATS:  # the paper's law at tiny CPU scale
            from loopscale.console import err_console

            err_console.print(
                f"warning: against the prior law these runs scatter by {est.run_sd:.3g} (run) and "
                f"{est.cell_sd:.3g} (cell) nats: that is the law's misfit, not noise; pass --prior with "
                "a fit file of runs like these (e.g. their own `loopscale fit`)",
                highlight=False,
                markup=False,
            )
    elif doc is not None:
        src = Path(str(doc.source.get("path", "")))
        if src.is_file():
            est = residual_noise(src)
        else:
            rmse = doc.variant().metrics.rmse
            est = Noise(
                float("nan" if rmse is None else rmse), 0.0, "the fit's residual RMSE (its runs table is not here)"
            )
    if est is None:
        est = Noise(0.01, 0.0, "default: the paper's residual RMSE per r, 0.009-0.011 nats (§5)")
    if sigma is not None or cell_sigma is not None:
        est = Noise(
            est.run_sd if sigma is None else sigma,
            est.cell_sd if cell_sigma is None else cell_sigma,
            "flags" + (f" + {est.source}" if sigma is None or cell_sigma is None else ""),
            point_sd=est.point_sd,
        )
    return est


def _shared(
    noise: Any, doc: FitResult | None, technique: str, r1_from: str | None, runs: list[Path]
) -> tuple[float, str]:
    """How much of the law's misfit a technique shares with the reference (correlation rho), from the prior fit's
    paired reading of it: its non-shared sd, less the seed noise of a point, is sqrt(1 - rho) x the misfit's sd.
    1 (all shared) when the fit has no paired reading of the technique."""
    import numpy as np

    name = f"{technique}@{r1_from}" if r1_from else technique
    rec = None
    inf = doc.variant(name).inference if doc is not None and name in doc.variants else None
    if inf is not None and inf.paired_delta_phi is not None:
        rec = inf.paired_delta_phi.shared_law
    misfit = noise.misfit_sd
    if rec is None or rec.misfit is None or rec.misfit.not_shared_sd is None or misfit <= 0:
        return 1.0, "assumed: all of the misfit shared (no paired reading of the technique in the prior fit)"
    mean_loss, n_seeds = 1.0, 1.0
    if runs:
        from loopscale.fit import load_runs

        df = load_runs(runs).df
        mean_loss = float(df["val_loss"].mean())
        n_seeds = float(df["seed"].nunique()) if "seed" in df.columns else 1.0
    own = float(rec.misfit.not_shared_sd) * mean_loss  # log loss -> nats, at the runs' mean loss
    own2 = max(own**2 - noise.run_sd**2 / n_seeds, 0.0)
    rho = float(np.clip(1 - own2 / misfit**2, 0.0, 1.0))
    return rho, (
        f"the prior fit's paired reading of {name}: non-shared sd {own:.4f} nats, {np.sqrt(own2):.4f} beyond the "
        "seed noise of a point"
    )


@app.command()
def design(
    spec: str = typer.Argument(..., help="Planned sweep: a spec file, a sweep dir or a preset (paper, demo, study)."),
    prior: str = typer.Option("paper", "--prior", help="Law to simulate from: 'paper' or a fit file."),
    variant: str | None = typer.Option(None, "--variant", help="Variant of the prior fit file (default: reference)."),
    r1_from: str | None = typer.Option(
        None,
        "--r1-from",
        help="Use this spec variant's r = 1 runs (loop-of-one "
        "controls) as the r = 1 reference, as `fit --r1-from` does.",
    ),
    sigma: float | None = typer.Option(None, "--sigma", help="Per-run noise sd in nats (default: estimated)."),
    cell_sigma: float | None = typer.Option(None, "--cell-sigma", help="Noise sd shared by a (C, r) cell, nats."),
    point_sigma: float | None = typer.Option(
        None, "--point-sigma", help="The law's misfit per design point (C, r, width), shared by its seeds, nats."
    ),
    shared: float | None = typer.Option(
        None, "--shared", help="Correlation of a technique's misfit with the reference's (default: estimated)."
    ),
    flops_per_s: float | None = typer.Option(
        None, "--flops-per-s", help="Training FLOP/s of one run, for the search's times (default: the pilot's)."
    ),
    noise_from: list[Path] = typer.Option([], "--noise-from", help="Runs table(s) to estimate both sds from."),
    sims: int = typer.Option(32, "--sims", help="Simulated studies (each a full fit with bootstrap)."),
    bootstrap: int = typer.Option(50, "--bootstrap", help="Cell resamples per simulated fit."),
    lr_draws: int = typer.Option(
        200,
        "--lr-draws",
        help="Wild-bootstrap tables per simulated fit for the profile interval `fit` quotes (0: off).",
    ),
    restarts: int = typer.Option(100, "--restarts", help="Random starts per simulated fit."),
    target: float | None = typer.Option(
        None, "--target-width", help="Search for the cheapest grid whose phi CI is at most this wide."
    ),
    search_: bool = typer.Option(True, "--search/--no-search", help="Rank cheaper and dearer grid variants."),
    search_sims: int = typer.Option(20, "--search-sims", help="Simulations per variant in the search."),
    delta: float | None = typer.Option(
        None,
        "--delta",
        help=escape(
            "Huber delta of the simulated fits (default: the spec's [fit] table, else the prior fit's, else 1e-3)."
        ),
    ),
    technique: str | None = typer.Option(
        None, "--technique", help="A spec variant read against the baseline: simulate its Δφ (separate and paired)."
    ),
    delta_phi: float = typer.Option(0.0, "--delta-phi", help="The technique's true Δφ in the simulations."),
    seed_means: bool = typer.Option(
        False, "--seed-means/--no-seed-means", help="Fit seed means, as `fit --seed-means` (the probes preset)."
    ),
    target_half: float | None = typer.Option(
        None, "--target-half-width", help="Search for the cheapest grid whose Δφ half-width is at most this."
    ),
    hours: float | None = typer.Option(
        None, "--hours", help="The machine's limit for the search: grids whose estimated time exceeds it say so."
    ),
    workers: int = typer.Option(0, "--workers", help="Processes (0: one per CPU core)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the simulations."),
    set_: list[str] = typer.Option([], "--set", help="Spec override, e.g. sweep.seeds=[0,1]"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Simulate the planned study with the real fitter: expected phi CI width, bias, coverage, power."""
    import time

    from loopscale.errors import ConfigError
    from loopscale.fit.design import DesignSettings, search, simulate
    from loopscale.sweep import load_spec

    if sims < 2 or bootstrap < 0 or restarts < 1:
        raise ConfigError("--sims", "expected --sims >= 2, --bootstrap >= 0, --restarts >= 1", value=sims)
    for flag, x in (("--sigma", sigma), ("--cell-sigma", cell_sigma), ("--point-sigma", point_sigma)):
        if x is not None and not (x >= 0 and x < float("inf")):
            raise ConfigError(flag, "expected a noise sd in nats, >= 0 (e.g. 0.04)", value=x)
    if lr_draws < 0 or 0 < lr_draws < 100:
        raise ConfigError("--lr-draws", "expected 0 (off) or at least 100 tables", value=lr_draws)
    t0 = time.perf_counter()
    sp = load_spec(spec, set_)
    grid = planned_grid(sp, r1_from)
    tech = planned_grid(sp, None, technique) if technique else None
    law, doc, prior_src = _prior(prior, variant)
    import dataclasses

    noise = _noise(sigma, cell_sigma, noise_from, law, doc, r1_from)
    if point_sigma is not None:
        noise = dataclasses.replace(noise, point_sd=point_sigma, source=f"{noise.source}; point sd: --point-sigma")
    rho_src = ""
    if technique:
        if shared is not None:
            if not 0 <= shared <= 1:
                raise ConfigError("--shared", "expected a correlation in [0, 1]", value=shared)
            rho, rho_src = shared, "--shared"
        else:
            rho, rho_src = _shared(noise, doc, technique, r1_from, noise_from)
        noise = dataclasses.replace(noise, shared=rho)
    fit_delta = delta
    if fit_delta is None:
        stored = doc.settings.delta if doc is not None else 1e-3
        fit_delta = sp.fit.delta if "fit" in sp.raw else float(stored)
    settings = DesignSettings(
        sims=sims,
        bootstrap=bootstrap,
        lr_draws=lr_draws,
        restarts=restarts,
        delta=float(fit_delta),
        loss=sp.fit.loss,
        seed=seed,
        workers=workers,
        seed_means=seed_means,
    )
    pair_res = None
    pair_rows: list[Any] = []
    with err_console.status("simulating") as status:
        res = simulate(grid, law, noise, settings, progress=lambda d, n: status.update(f"simulated study {d}/{n}"))
        rows: list[Any] = []
        best: Any = None
        if search_ or target is not None:
            rows, best = search(
                grid, law, noise, settings, target=target, sims=search_sims, progress=lambda msg: status.update(msg)
            )
        if tech is not None:
            from loopscale.fit.paired_design import search_pair, simulate_pair

            pair_res = simulate_pair(
                grid,
                tech,
                law,
                delta_phi,
                noise,
                settings,
                progress=lambda d, n: status.update(f"simulated paired study {d}/{n}"),
            )
            if search_ or target_half is not None:
                pair_rows = search_pair(
                    grid,
                    tech,
                    law,
                    delta_phi,
                    noise,
                    settings,
                    sims=search_sims,
                    progress=lambda msg: status.update(msg),
                )
    wall = time.perf_counter() - t0
    rate = _flops_per_s(noise_from, doc) if flops_per_s is None else (flops_per_s, 1.0)
    if as_json:
        from dataclasses import asdict

        from loopscale.fit.fitfile import json_ready

        doc_out = {
            "spec": sp.source,
            "prior": prior_src,
            "prior_law": law,
            "result": res.as_dict(),
            "search": [asdict(r) for r in rows],
            "target_width": target,
            "cheapest_reaching_target": None if best is None else asdict(best),
            "paired": None if pair_res is None else {"technique": technique, **pair_res.as_dict()},
            "pair_search": [asdict(r) for r in pair_rows],
            "wall_s": wall,
        }
        console.print_json(json.dumps(json_ready(doc_out)))
        return
    _print(sp, grid, res, rows, best, target, prior_src, law, wall, search_sims)
    if pair_res is not None:
        _print_pair(sp, technique, pair_res, pair_rows, target_half, hours, rate, rho_src, search_sims)


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.0f}%"


def _print(
    sp: Any,
    grid: Any,
    res: Any,
    rows: list[Any],
    best: Any,
    target: float | None,
    prior_src: str,
    law: dict[str, float],
    wall: float,
    search_sims: int,
) -> None:
    st = res.settings
    n_seeds = grid["seed"].nunique()
    console.print(
        f"[bold]{escape(sp.source)}[/]: {res.n_runs} runs in {res.n_cells} (C, r) cells, {n_seeds} seed(s), "
        f"{res.cost_flops:.3g} FLOPs; prior {escape(prior_src)} (φ = {phi(law['phi'])}); noise: run sd "
        f"{res.noise.run_sd:.4f}, cell sd {res.noise.cell_sd:.4f} nats ({escape(res.noise.source)})",
        highlight=False,
        soft_wrap=True,
        markup=True,
    )
    t = Table(
        title=f"φ over {res.sims} simulated studies (the real fitter: {st.restarts} starts, "
        f"{st.bootstrap} cell resamples each)",
        box=box.SIMPLE_HEAVY,
    )
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("", justify="left")
    lvl = f"{100 * st.ci_level:.0f}%"
    if res.lr_ci_width == res.lr_ci_width:  # the interval `loopscale fit` quotes (docs/fit.md, "Inference")
        t.add_row(
            f"expected {lvl} profile interval width",
            f"{res.lr_ci_width:.3f}",
            f"median {res.lr_ci_width_median:.3f}; {st.lr_draws} wild-bootstrap tables each",
        )
        t.add_row("coverage of the true φ (profile)", _pct(res.lr_coverage), f"nominal {lvl}")
        t.add_row(
            "P(test rejects φ = 0 / φ = 1)",
            f"{_pct(res.lr_reject_0)} / {_pct(res.lr_reject_1)}",
            "the interval excludes it; 'rules out' also needs a worse held-out error",
        )
    t.add_row(
        f"expected {lvl} CI width (percentile)", f"{res.ci_width:.3f}", f"sd {res.ci_width_sd:.3f} over simulations"
    )
    t.add_row("sampling width of φ̂", f"{res.sampling_width:.3f}", "2 z × sd of φ̂: a calibrated CI's width")
    t.add_row("bias (median φ̂ − φ)", f"{res.bias:+.4f}", "")
    t.add_row("coverage of the true φ (percentile)", _pct(res.coverage), f"nominal {lvl}")
    t.add_row("P(percentile CI excludes φ = 0)", _pct(res.reject_0), "")
    t.add_row("P(percentile CI excludes φ = 1)", _pct(res.reject_1), "")
    t.add_row("P(φ̂ at its box)", _pct(res.at_bound), "")
    t.add_row(
        "P(verdict: resolved)", _pct(res.identified), "interval ≤ 0.5 wide, off the box (fit/inference/verdict.py)"
    )
    console.print(t)
    if res.bracketed:
        rs = sorted({int(k.split("|")[1]) for k in res.bracketed})
        budgets = sorted({float(k.split("|")[0]) for k in res.bracketed})
        b = Table(title="P(the empirical optimum is bracketed by the widths), per (C, r) cell", box=box.SIMPLE_HEAVY)
        b.add_column("C", justify="right")
        for r in rs:
            b.add_column(f"r={r}", justify="right")
        for c in budgets:
            b.add_row(flops(c), *(_pct(res.bracketed.get(f"{c:.3g}|{r}", float("nan"))) for r in rs))
        console.print(b)
    if rows:
        s = Table(
            title=f"grid variants, cheapest first (φ width: sampling spread of φ̂ over {search_sims} "
            "simulations each, no bootstrap)",
            box=box.SIMPLE_HEAVY,
        )
        for col in ("variant", "runs", "FLOPs", "cost", "φ width", "bias", "P(at box)"):
            s.add_column(col, justify="right")
        for row in rows:
            mark = " ←" if best is not None and row.name == best.name else ""
            s.add_row(
                escape(row.name) + mark,
                str(row.n_runs),
                f"{row.cost_flops:.3g}",
                f"{row.relative_cost:.2f}×",
                f"{row.sampling_width:.3f}",
                f"{row.bias:+.3f}",
                _pct(row.at_bound),
            )
        console.print(s)
    if target is not None:
        if best is None:
            console.print(
                f"[bold red]no variant reaches a φ width of {target:g}[/]; try more seeds or budgets",
                highlight=False,
                markup=True,
            )
        else:
            console.print(
                f"cheapest grid with a φ width ≤ {target:g}: [bold]{escape(best.name)}[/] "
                f"({best.n_runs} runs, {best.cost_flops:.3g} FLOPs, width {best.sampling_width:.3f})",
                highlight=False,
                markup=True,
            )
    n_search = sum(r.n_runs for r in rows) * search_sims
    console.print(
        f"design: {wall:.1f} s ({res.sims} simulated studies of {res.n_runs} runs"
        + (f", {count(n_search)} simulated runs in the search" if rows else "")
        + ")",
        highlight=False,
    )


def _flops_per_s(runs: list[Path], doc: FitResult | None) -> tuple[float, float] | None:
    """(FLOP/s of one run, runs at a time) measured on the pilot's runs (their budgets over their wall time), so
    a grid's time is its FLOPs over both; None without timed runs."""
    import os

    paths = runs or ([Path(str(doc.source.get("path", "")))] if doc is not None else [])
    paths = [p for p in paths if p.exists()]
    if not paths:
        return None
    from loopscale.fit import load_runs

    df = load_runs(paths).df
    if "wall_s" not in df.columns or "C" not in df.columns:
        return None
    ok = df["wall_s"].notna() & (df["wall_s"] > 0)
    if not ok.any():
        return None
    slots = max(1, (os.cpu_count() or 1) // max(1, int(df["threads"].max()) if "threads" in df.columns else 1))
    return float(df.loc[ok, "C"].sum() / df.loc[ok, "wall_s"].sum()), float(slots)


def _print_pair(
    sp: Any,
    technique: str | None,
    res: Any,
    rows: list[Any],
    target: float | None,
    hours: float | None,
    rate: tuple[float, float] | None,
    rho_src: str,
    search_sims: int,
) -> None:
    st = res.settings
    lvl = f"{100 * st.ci_level:.0f}%"
    console.print(
        f"Δφ of [bold]{escape(str(technique))}[/] against the baseline: {res.n_technique_runs} runs of its own, "
        f"true Δφ {res.delta_phi:+.3f}; the misfit (sd {res.noise.misfit_sd:.4f} nats per point) shared with "
        f"correlation {res.noise.shared:.2f} ({escape(rho_src)})" + ("; seed means" if st.seed_means else ""),
        highlight=False,
        soft_wrap=True,
        markup=True,
    )
    t = Table(
        title=f"Δφ over {res.sims} simulated paired studies ({st.lr_draws} wild-bootstrap tables, "
        f"{st.restarts} starts each)",
        box=box.SIMPLE_HEAVY,
    )
    for c in ("reading", f"median {lvl} half-width", "mean", "coverage", "P(excludes 0)", "bias", "leads"):
        t.add_column(c, justify="right")
    for name, r in res.readings.items():
        lead = res.leads.get(name)
        t.add_row(
            name,
            f"{r.median_half_width:.3f}",
            f"{r.mean_half_width:.3f}",
            _pct(r.coverage),
            _pct(r.reject_0),
            f"{r.bias:+.3f}",
            "" if lead is None else _pct(lead),
        )
    console.print(t)
    if not rows:
        return
    base_hw = rows[[r.name for r in rows].index("as planned")].sampling_half_width
    lead_hw = res.readings["leading"].median_half_width
    s = Table(
        title=f"grid variants, cheapest first (Δφ half-width: the paired shared-law estimate's sampling spread over "
        f"{search_sims} simulations, scaled to the leading reading's calibrated width as planned)",
        box=box.SIMPLE_HEAVY,
    )
    for c in ("variant", "runs", "cost", "est. time", "Δφ half-width", "P(at box)"):
        s.add_column(c, justify="right")
    total = float(sum(rs.C for rs in sp.runs()))
    best = None
    for row in rows:
        hw = row.sampling_half_width * (lead_hw / base_hw if base_hw == base_hw and base_hw > 0 else 1.0)
        secs = None if rate is None else total * row.relative_cost / (rate[0] * rate[1])
        fits = hours is None or secs is None or secs <= hours * 3600
        if target is not None and hw <= target and row.at_bound < 0.05 and fits and best is None:
            best = (row, hw, secs)
        s.add_row(
            escape(row.name),
            str(row.n_runs),
            f"{row.relative_cost:.2f}×",
            "?" if secs is None else f"{secs / 3600:.1f} h",
            f"{hw:.3f}",
            _pct(row.at_bound),
        )
    console.print(s)
    if rate is not None:
        console.print(
            f"time: the whole spec's {total:.3g} FLOPs x cost at {rate[0]:.3g} FLOP/s per run, {rate[1]:.0f} at a "
            "time (--flops-per-s, or measured on the pilot's runs)",
            highlight=False,
        )
    if target is None:
        return
    if best is not None:
        row, hw, secs = best
        when = "" if secs is None else f", ≈ {secs / 3600:.1f} h"
        console.print(
            f"cheapest grid with a Δφ half-width ≤ {target:g}: [bold]{escape(row.name)}[/] ({hw:.3f}{when})",
            markup=True,
            highlight=False,
        )
        return
    reach = [r for r in rows if r.sampling_half_width * (lead_hw / base_hw) <= target and r.at_bound < 0.05]
    if reach and rate is not None:
        r0 = reach[0]
        secs = total * r0.relative_cost / (rate[0] * rate[1])
        console.print(
            f"[bold red]beyond this machine[/]: the cheapest grid reaching a Δφ half-width ≤ {target:g} is "
            f"{escape(r0.name)}, ≈ {secs / 3600:.1f} h ({total * r0.relative_cost:.3g} FLOPs), over the "
            f"{hours:g} h limit",
            markup=True,
            highlight=False,
        )
    else:
        console.print(
            f"[bold red]no variant reaches a Δφ half-width of {target:g}[/]; try more seeds or budgets", markup=True
        )
