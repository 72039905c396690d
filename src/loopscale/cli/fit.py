"""`loopscale fit` and `loopscale plan`: the joint law from a runs table, and what it recommends.

Heavy imports (scipy, pandas, the fitter) stay inside the command functions; ``loopscale.fit.settings``, which
holds the defaults the options show, imports neither.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from loopscale import grids
from loopscale.cli.app import app, console, err_console
from loopscale.fit.settings import FitSettings
from loopscale.numbers import (
    BLOCK_BOOTSTRAP,
    MISSING,
    PHI_DIGITS,
    PROFILE,
    SECONDARY,
    count,
    flops,
    interval,
    interval_method,
    num,
    phi_ci,
    phi_interval,
    signed,
)
from loopscale.numbers import phi as phi_txt

if TYPE_CHECKING:
    from loopscale.fit.result import DeltaInference, FitResult, PairedReading


#: the fit's defaults (each written once, in ``fit.settings``), shown by --help.
DEFAULTS = FitSettings(template={}, law_variants=())


@app.command()
def fit(
    runs: list[Path] = typer.Argument(
        ...,
        help="Runs table (CSV/Parquet) or sweep dir (runs.csv or */result.json); "
        "several are fitted as one (e.g. one sweep per seed).",
    ),
    seed_means: bool = typer.Option(
        False, "--seed-means", help="Fit the mean loss of each design point over its seeds, not every run as a point."
    ),
    bootstrap: int = typer.Option(
        DEFAULTS.bootstrap,
        "--bootstrap",
        "-b",
        help="Block-bootstrap resamples for the secondary percentile intervals (0: off).",
    ),
    lr_draws: int = typer.Option(
        DEFAULTS.lr_draws,
        "--lr-draws",
        help="Wild-bootstrap tables calibrating φ's and Δφ's "
        "profile-likelihood intervals and tests (0: off; docs/fit.md, 'Inference').",
    ),
    restarts: int = typer.Option(DEFAULTS.restarts, "--restarts", help="Random starts in the paper's box."),
    variant: list[str] = typer.Option([], "--variant", "-v", help="Variant(s) to fit (default: all)."),
    r1_from: str | None = typer.Option(
        None,
        "--r1-from",
        help="Also fit each variant V as V@CONTROL, against "
        "this variant's r = 1 runs (loop-of-one controls, model.r1_looped).",
    ),
    only_r: list[int] = typer.Option(
        [],
        "--r",
        help="Fit only runs with these r (repeat: --r 2 --r 4 --r 8 fits "
        "phi among looped models, without the r = 1 baseline).",
    ),
    reference: str | None = typer.Option(None, "--reference", help="Delta-phi reference (default: baseline)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Fit file (default: fit.json beside RUNS)."),
    loss: str | None = typer.Option(
        None,
        "--loss",
        help=escape("Objective: huber (the paper's) or mse (default: the sweep's [fit] table, else huber)."),
    ),
    delta: float | None = typer.Option(
        None,
        "--delta",
        help=escape("Huber delta (summed Huber in log space; default: the sweep's [fit] table, else 1e-3)."),
    ),
    phi_min: float = typer.Option(DEFAULTS.phi_bounds[0], "--phi-min", help="Lower bound of phi."),
    phi_max: float = typer.Option(DEFAULTS.phi_bounds[1], "--phi-max", help="Upper bound of phi."),
    fix_phi: float | None = typer.Option(None, "--fix-phi", help="Fit with phi fixed to this value."),
    restricted: bool = typer.Option(True, "--restricted/--no-restricted", help="Also fit phi = 0 and phi = 1."),
    per_r: bool = typer.Option(True, "--per-r/--no-per-r", help="Also fit Chinchilla's law per r."),
    law_variants: bool = typer.Option(
        True,
        "--law-variants/--no-law-variants",
        help="Also fit the law variants (loop_tax: a loss factor on looped runs, its own phi), compared held out.",
    ),
    compare: str | None = typer.Option(
        None,
        "--compare",
        help="Test phi, alpha, beta against 'paper' or a fit file (bootstrap p-value and interval of the difference).",
    ),
    checks: bool = typer.Option(True, "--checks/--no-checks", help="Extrapolation, leave-one-r-out, half split."),
    ci: float = typer.Option(DEFAULTS.ci_level, "--ci", help="Confidence level of the percentile CIs."),
    seed: int = typer.Option(DEFAULTS.seed, "--seed", help="Seed of the random starts and resamples."),
    set_: list[str] = typer.Option([], "--set", help="Template override for the frontier, e.g. model.head_dim=64"),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown tables (paste into a paper/issue)."),
) -> None:
    """Fit L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta; print phi [CI] and write the fit file."""
    from loopscale.fit import fit_runs, prepare_fit, write_fit

    law_switch: dict[str, Any] = {} if law_variants else {"law_variants": ()}
    prepared = prepare_fit(
        runs,
        seed_means=seed_means,
        r1_from=r1_from,
        only_r=only_r,
        template_overrides=set_,
        loss=loss,
        delta=delta,
        phi_bounds=(phi_min, phi_max),
        fixed_phi=fix_phi,
        restarts=restarts,
        bootstrap=bootstrap,
        lr_draws=lr_draws,
        ci_level=ci,
        seed=seed,
        restricted=DEFAULTS.restricted if restricted else (),
        per_r=per_r,
        checks=checks,
        variants=list(variant) or None,
        reference_variant=reference,
        **law_switch,
    )
    for note in prepared.notes:
        err_console.print(note, highlight=False, markup=False)
    table, settings = prepared.table, prepared.settings
    if not seed_means and len(table.df) > BIG_TABLE:
        _hint_seed_means(table, bootstrap)
    if table.n_excluded:
        err_console.print(
            f"excluded {table.n_excluded} run(s) that did not finish: "
            + ", ".join(f"{k} x{n}" for k, n in sorted(table.excluded.items()))
        )
    reference_doc = _reference(compare)
    with err_console.status("fitting") as status:
        result = fit_runs(table, settings, progress=lambda msg: status.update(escape(msg)))  # spinners parse markup
    if reference_doc is not None:
        from loopscale.fit.inference.compare import compare as compare_fits

        result.compare = compare_fits(result, reference_doc, seed=seed)
    path = out or ((runs[0] if runs[0].is_dir() else runs[0].parent) / "fit.json")
    write_fit(path, result)
    if as_json:
        console.print_json(json.dumps(_summary(result), allow_nan=False, default=str))
    else:
        _print_fit(result, markdown)
        _print_verdicts(result)
        if result.compare:
            _print_compare(result.compare, box.MARKDOWN if markdown else box.SIMPLE_HEAVY)
    for w in result.warnings:
        loud = "NOT identifiable" in w or "POORLY" in w or "did not converge" in w
        err_console.print(
            f"[bold {'red' if loud else 'yellow'}]warning:[/] {escape(w)}", markup=True, highlight=False, soft_wrap=True
        )
    err_console.print(f"fit file: {path}  ({result.wall_s:.1f} s)")


#: above this many runs `fit` says how long it will take and suggests --seed-means.
BIG_TABLE = 2000


def _hint_seed_means(table: Any, bootstrap: int) -> None:
    """Large tables: say what to expect, and that averaging seeds first is far cheaper."""
    df = table.df
    points = len(df.groupby(["variant", "r", "N_once", "N_rec", "D"], sort=False))
    msg = (
        f"{len(df)} runs: the fit polishes every bootstrap refit on all of them ({bootstrap} resamples), progress below"
    )
    if points < len(df):
        msg += f"; --seed-means fits the {points} design points' mean losses instead (much faster)"
    err_console.print(msg, highlight=False)


def _reference(compare: str | None) -> Any:
    """'paper', or a fit file read up front (a bad path fails before the fit, not after)."""
    if compare is None or compare == "paper":
        return compare
    from loopscale.fit import read_fit

    return read_fit(Path(compare))


def _verdicts(res: FitResult) -> dict[str, Any]:
    from loopscale.fit.inference.verdict import verdicts

    return verdicts(res)


def _phi_line(v: Any) -> str:
    """φ with its interval as the report prints it, the interval's method, then the verdict:
    "φ = 0.461 [0.410, 0.530] (95%, profile likelihood), resolved: ..."."""
    if v.phi is None:
        return "φ " + v.sentence
    method = f" ({v.ci_level:.0%}, {interval_method(v.method)})" if v.ci is not None else ""
    return f"φ = {phi_ci(v.phi, v.ci)}{method}, " + v.sentence


def _print_verdicts(result: FitResult) -> None:
    """The same verdict the report shows: "resolved" or "not resolved, because ..."."""
    for name, v in _verdicts(result).items():
        colour = "green" if v.resolved else "bold red"
        console.print(
            f"[{colour}]{escape(name)}: {escape(_phi_line(v))}[/]", highlight=False, soft_wrap=True, markup=True
        )
        for c in v.claims:
            console.print(f"  {escape(c)}", highlight=False, soft_wrap=True)
        for c in v.caveats:
            console.print(f"  caveat: {escape(c)}", highlight=False, soft_wrap=True)


def _print_compare(cmp: dict[str, Any], style: box.Box) -> None:
    t = Table(title=f"consistency with {cmp['reference']} ({cmp['variant']}, bootstrap)", box=style)
    level = f"{100 * cmp['level']:.0f}%"
    for c in (
        "quantity",
        "fitted",
        f"{level} CI ({BLOCK_BOOTSTRAP})",
        "reference",
        "difference",
        f"{level} CI of difference ({BLOCK_BOOTSTRAP})",
        "p-value",
        "consistent",
        "p (calibrated, = ref value)",
    ):
        t.add_column(c, justify="right")
    for row in cmp["rows"]:
        ref = num(row["reference"]) + (f" {interval(row['reference_ci'])}" if row["reference_ci"] else "")
        cons = MISSING if row["consistent"] is None else ("yes" if row["consistent"] else "NO")
        pc = row.get("p_calibrated")
        t.add_row(
            row["quantity"],
            num(row["fitted"]),
            interval(row["fitted_ci"]),
            ref,
            signed(row["difference"]),
            interval(row["difference_ci"]),
            MISSING if row["p_value"] is None else f"{row['p_value']:.3f}",
            cons,
            MISSING if pc is None else f"{pc:.3g}",
        )
    console.print(t)


def _summary(res: FitResult) -> dict[str, Any]:
    from loopscale.fit.fitfile import json_ready
    from loopscale.fit.inference.verdict import phi_verdict
    from loopscale.fit.law.formula import COEFFICIENTS

    out: dict[str, Any] = {"source": res.source["path"], "variants": {}, "delta_phi": []}
    for name, v in res.variants.items():
        cis = v.bootstrap.ci
        out["variants"][name] = {
            "params": v.params.as_dict(),
            "ci": {k: cis.get(k) for k in COEFFICIENTS},
            "r2": v.metrics.r2,
            "rmse": v.metrics.rmse,
            "rmse_per_r": v.metrics.rmse_per_r,
            "restricted_r2": {k: x.r2 for k, x in v.restricted.items()},
            "held_out": {
                "free": v.checks.held_out if v.checks else None,
                **{k: x.held_out for k, x in v.restricted.items()},
            },
            "converged": v.law.converged,
            "at_bounds": v.law.at_bounds,
            "verdict": phi_verdict(res, name).as_dict(),
            "law_variants": {
                k: {key: getattr(x, key) for key in ("phi", "kappa", "r2", "rmse", "held_out")}
                for k, x in v.law_variants.items()
            },
        }
        out["variants"][name]["held_out"].update({k: x.held_out for k, x in v.law_variants.items()})
    for d in res.delta_phi:
        row: dict[str, Any] = {
            "reference": d.reference,
            "variant": d.variant,
            "delta_phi": d.delta_phi,
            "ci": d.ci,
            "fraction_above_zero": d.fraction_above_zero,
            "leading": d.leading,
        }
        inf = res.variants[d.variant].inference if d.variant in res.variants else None
        paired = inf.paired_delta_phi if inf is not None else None
        row["paired"] = None
        if paired is not None:
            keep = ("estimate", "ci", "tests", "at_bound", "misfit")
            row["paired"] = {
                m: {k: getattr(paired.reading(m.replace("_", " ")), k, None) for k in keep}
                for m in ("shared_law", "separate_laws")
            }
            row["paired"]["held_out"] = paired.held_out
        out["delta_phi"].append(row)
    if res.compare:
        out["compare"] = res.compare
    out["warnings"] = res.warnings
    return json_ready(out)


def _print_fit(res: FitResult, markdown: bool) -> None:
    style = box.MARKDOWN if markdown else box.SIMPLE_HEAVY
    from loopscale.fit.law.formula import PhiState

    level = f"{100 * res.ci_level:.0f}% CI"
    for name, rec in res.variants.items():
        p, cis = rec.params, rec.bootstrap.ci
        t = Table(title=f"joint law - {name} ({rec.n_runs} runs, r = {', '.join(map(str, rec.rs))})", box=style)
        t.add_column("quantity")
        t.add_column("value", justify="right")
        t.add_column(level, justify="right")
        t.add_column("interval's method")
        state = res.phi_state(name)
        phi_cell = "undetermined (no r > 1 runs)" if state is PhiState.UNDETERMINED else phi_txt(p.phi)
        if state is PhiState.FIXED:
            phi_cell += " (fixed)"
        prof = rec.inference.phi.ci if rec.inference and rec.inference.phi else None
        boot = phi_interval(cis.get("phi"))
        if prof is not None:  # the calibrated interval, quoted; the block bootstrap's below it (secondary)
            t.add_row("phi", phi_cell, phi_interval(prof), f"{PROFILE} (quoted)")
            if boot != MISSING:
                t.add_row("phi, secondary", "", boot, SECONDARY)
        else:
            t.add_row("phi", phi_cell, boot, "" if boot == MISSING else "block bootstrap percentile")
        for k in ("alpha", "beta", "E", "A", "B"):
            ci = interval(cis.get(k))
            t.add_row(k, num(getattr(p, k)), ci, "" if ci == MISSING else BLOCK_BOOTSTRAP)
        t.add_row("R^2 (raw nats)", num(rec.metrics.r2), "")
        per_r = ", ".join(f"r={r}: {x:.4f}" for r, x in rec.metrics.rmse_per_r.items())
        t.add_row("RMSE (nats)", num(rec.metrics.rmse), per_r)
        for key, rf in rec.restricted.items():
            t.add_row(f"R^2 restricted {key}", num(rf.r2), f"RMSE {rf.rmse:.4f}")
        for key, lv in rec.law_variants.items():
            factor = "" if lv.kappa is None else f", looped-loss factor 1{lv.kappa:+.3f}"
            t.add_row(f"R^2 {key}", num(lv.r2), f"RMSE {lv.rmse:.4f}; phi {phi_txt(lv.phi)}{factor}")
        for label, ho in (
            ("free", rec.checks.held_out if rec.checks else None),
            *((k, rf.held_out) for k, rf in rec.restricted.items()),
            *((k, lv.held_out) for k, lv in rec.law_variants.items()),
        ):
            if ho is not None:
                t.add_row(
                    f"held-out RMSE {label}",
                    num(ho.extrapolation_rmse),
                    f"top budget; leave-one-r-out {num(ho.leave_one_r_out_rmse)}",
                )
        for r, cf in rec.per_r.items():
            t.add_row(
                f"R^2 Chinchilla r={r}",
                num(cf.r2),
                f"alpha {cf.params['alpha']:.3f}, beta {cf.params['beta']:.3f}",
            )
        n_near = rec.law.n_near_optimal
        t.add_row(
            "converged",
            "yes" if rec.law.converged else "NO",
            f"{n_near} near-optimal minim{'um' if n_near == 1 else 'a'}",
        )
        hs = rec.checks.half_split if rec.checks is not None else None
        lower, upper = (hs.lower, hs.upper) if hs is not None else (None, None)
        if lower is not None and upper is not None and lower.phi is not None and upper.phi is not None:
            t.add_row("phi lower / upper budgets", f"{phi_txt(lower.phi)} / {phi_txt(upper.phi)}", "")
        ex = rec.checks.extrapolation if rec.checks is not None else None
        if ex is not None:
            t.add_row(
                f"extrapolation RMSE (C={flops(ex.held_out_budget)})",
                num(ex.rmse),
                f"bias {ex.bias:+.4f}",
            )
        console.print(t)
    _print_frontier(res, style, level)
    if res.delta_phi:
        _print_delta_phi(res, style, level)


def _print_delta_phi(res: FitResult, style: box.Box, level: str) -> None:
    """Each reading of Δφ on its own row, named by its method; the leading one marked, and why it leads."""
    from loopscale.fit.inference import paired as paired_mod

    t = Table(title="Delta-phi (variant - reference): each reading; the marked one leads", box=style)
    for c in ("variant", "reference", "reading", "Delta-phi", level, "p (Delta-phi = 0)", ""):
        t.add_column(c, justify="right")
    reasons = []
    for d in res.delta_phi:
        lead = d.leading.reading if d.leading else None
        inf = d.inference
        v_inf = res.variants[d.variant].inference if d.variant in res.variants else None
        paired = v_inf.paired_delta_phi if v_inf is not None else None
        rows: list[tuple[str, float | None, list[float] | None, DeltaInference | PairedReading | None, bool]] = [
            (
                "separate fits (profile)",
                inf.estimate if inf is not None and inf.estimate is not None else d.delta_phi,
                inf.ci if inf is not None else None,
                inf,
                lead == "separate fits",
            )
        ]
        for model in paired_mod.MODELS:
            rec = paired_mod.reading(paired, model)
            if rec is not None:
                name = f"paired ({model})"
                rows.append((name + " (profile)", rec.estimate, rec.ci, rec, lead == name))
        for label, est, ci, reading, leads in rows:
            if reading is None and est is None:
                continue
            test = reading.zero if reading is not None else None
            p = test.p if test is not None else None
            t.add_row(
                d.variant,
                d.reference,
                label,
                MISSING if est is None else signed(est, PHI_DIGITS),
                MISSING if not ci else interval(ci, PHI_DIGITS, is_signed=True),
                MISSING if p is None else f"{p:.3g}",
                "← leads" if leads else "",
            )
        sec = d.secondary_ci or (inf.secondary.ci if inf is not None and inf.secondary is not None else None)
        if sec:
            t.add_row(
                d.variant,
                d.reference,
                SECONDARY,
                "",
                interval(sec, PHI_DIGITS, is_signed=True),
                "",
                "",
            )
        sh = d.shared
        if sh is not None and isinstance(sh.delta_phi, int | float):
            held = str(sh.held_out.supported if sh.held_out is not None else None)
            note = {"shared": "held-out: not contradicted", "separate": "held-out: contradicted"}.get(held, "")
            t.add_row(
                d.variant, d.reference, "shared law (no interval)", signed(sh.delta_phi, PHI_DIGITS), "", "", note
            )
        if d.leading:
            reasons.append(f"{d.variant}: {d.leading.reason}")
    console.print(t)
    for line in reasons:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _print_frontier(res: FitResult, style: box.Box, level: str) -> None:
    """Compute-optimal frontier of the reference variant: law-based, with the empirical gap beside it."""
    v = res.variant()
    rows = v.optima.frontier
    if not rows:
        return
    cis = v.bootstrap.ci
    emp = {(e["C"], e["r"]): e for e in v.optima.empirical}
    t = Table(title=f"compute-optimal frontier (law) - {res.reference}", box=style)
    for c in ("C", "r", "d*", "N*", "D*", "D/N", "L*", "gap to r=1", f"{level} ({BLOCK_BOOTSTRAP})", "empirical gap"):
        t.add_column(c, justify="right")
    for row in rows:
        ci = cis.get(f"gap_to_r1_r{row['r']}_C{row['C']:.3g}")
        e = emp.get((row["C"], row["r"]))
        egap = MISSING if e is None else signed(e.get("gap_to_r1"))
        t.add_row(
            flops(row["C"]),
            str(row["r"]),
            f"{row['d']:.0f}",
            count(row["N"]),
            count(row["D"]),
            f"{row['tokens_per_param']:.1f}",
            f"{row['L']:.4f}",
            signed(row["gap_to_r1"]),
            interval(ci, is_signed=True) if row["r"] != 1 else "",
            egap,
        )
    console.print(t)


def _ci_kind(kind: str) -> str:
    """The plan's loss interval, named by its method: the law at every block-bootstrap draw of the fit file
    ("bootstrap 95%"), or the paper's φ interval alone ("phi CI only")."""
    return f"{BLOCK_BOOTSTRAP} {kind.removeprefix('bootstrap ')}" if kind.startswith("bootstrap ") else kind


@app.command()
def plan(
    budget: float = typer.Option(..., "--budget", "-C", help="Training budget C in FLOPs."),
    fit_file: Path | None = typer.Option(None, "--fit", help="Fit file written by `loopscale fit`."),
    paper: bool = typer.Option(False, "--paper", help="Use the paper's published coefficients."),
    variant: str | None = typer.Option(None, "--variant", help="Variant of the fit file (default: reference)."),
    r: list[int] = typer.Option([], "--r", help="Recurrences to plan (default: 1 2 4 8)."),
    set_: list[str] = typer.Option([], "--set", help="Template override, e.g. model.seq_len=1024"),
    tokens_per_step: int | None = typer.Option(
        None, help="Global batch in tokens (default: the fit's runs', else the paper's 2^18)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Recommend (r, width, tokens) per r at budget C, with the predicted loss and its CI."""
    from loopscale.errors import ConfigError
    from loopscale.fit import (
        PAPER_COEFFICIENTS,
        PAPER_PHI_CI,
        JointLaw,
        law_from_fit,
    )
    from loopscale.fit import (
        plan as make_plan,
    )

    if not (budget > 0 and math.isfinite(budget)):
        raise ConfigError("--budget", "expected a positive, finite FLOP budget, e.g. 1e19", value=budget)
    if tokens_per_step is not None and tokens_per_step < 1:
        raise ConfigError(
            "--tokens-per-step", "expected a positive global batch in tokens, e.g. 524288", value=tokens_per_step
        )
    if (fit_file is None) == (not paper):
        raise ConfigError("--fit", "give exactly one of --fit FIT or --paper")
    verdict = None
    if paper:
        law = JointLaw.from_params(**PAPER_COEFFICIENTS)
        draws, base, paper_ci, src = (
            None,
            dict(grids.PAPER_MODEL),
            PAPER_PHI_CI,
            "paper's published coefficients",
        )
        fitted_rs, tps = list(grids.PAPER_R), grids.PAPER_TOKENS_PER_STEP
    else:
        from loopscale.fit.fitfile import load_fit
        from loopscale.fit.inference.verdict import phi_verdict

        doc = load_fit(fit_file)  # type: ignore[arg-type]
        law, draws = law_from_fit(doc, variant)
        base, paper_ci, src = dict(doc.template or grids.PAPER_MODEL), None, str(fit_file)
        name = variant or doc.reference
        fitted_rs = [int(x) for x in doc.variant(name).rs or grids.PAPER_R]
        tps = doc.tokens_per_step or grids.PAPER_TOKENS_PER_STEP
        verdict = phi_verdict(doc, name)
    outside = sorted(x for x in set(r) if not min(fitted_rs) <= x <= max(fitted_rs))
    if outside:
        raise ConfigError(
            "--r",
            f"outside the range of r the law was fitted on ({min(fitted_rs)}-{max(fitted_rs)}: "
            f"r = {', '.join(map(str, fitted_rs))}); the fit says nothing about r = " + ", ".join(map(str, outside)),
            value=outside,
        )
    from loopscale.fit.prepare import template_with

    template = template_with(base, set_, source="--set")
    rows = make_plan(
        budget,
        law=law,
        template=template,
        draws=draws,
        rs=list(r) or fitted_rs,
        tokens_per_step=int(tokens_per_step or tps),
        phi_ci=paper_ci,
    )
    if not rows:
        raise ConfigError("--r", "no r to plan: each r must divide the template's recurrent depth", value=list(r))
    if as_json:
        from loopscale.fit.fitfile import json_ready

        console.print_json(
            json.dumps(
                json_ready(
                    {
                        "budget": budget,
                        "source": src,
                        "template": template,
                        "tokens_per_step": int(tokens_per_step or tps),
                        "verdict": None if verdict is None else verdict.as_dict(),
                        "plan": rows,
                    }
                )
            )
        )
        return
    phi_shown = MISSING if law.phi_undetermined else phi_txt(law.phi_)
    t = Table(
        title=f"plan at C = {flops(budget)} FLOPs ({src}; phi = {phi_shown})",
        box=box.SIMPLE_HEAVY,
    )
    for c in (
        "r",
        "layout",
        "d_model",
        "N_once",
        "N_rec",
        "N_eq",
        "N_cost",
        "D (tokens)",
        "D/N",
        "steps",
        "loss",
        "loss CI",
        "gap to r=1",
    ):
        t.add_column(c, justify="right")
    for row in rows:
        ci_txt = interval(row["loss_ci"])
        t.add_row(
            str(row["r"]),
            row["layout"],
            str(row["d_model"]),
            count(row["N_once"]),
            count(row["N_rec"]),
            count(row["N_eq"]),
            count(row["N_cost"]),
            count(row["D"]),
            f"{row['tokens_per_param']:.1f}",
            str(row["steps"]),
            f"{row['loss']:.4f}",
            ci_txt,
            signed(row["gap_to_r1"]),
        )
    console.print(t)
    if verdict is not None:
        colour = "green" if verdict.resolved else "bold red"
        console.print(f"[{colour}]{escape(_phi_line(verdict))}[/]", highlight=False, soft_wrap=True, markup=True)
        if not verdict.resolved:
            console.print(
                "the looped rows rest on a φ the fit does not pin down; treat their losses as unknown", highlight=False
            )
    kinds = {_ci_kind(row["ci_kind"]) for row in rows if row["ci_kind"]}
    if kinds:
        console.print(f"loss CI: {', '.join(sorted(kinds))}", highlight=False)
    best = min(rows, key=lambda row: row["loss"])
    console.print(
        f"lowest predicted loss: r = {best['r']} at d_model = {best['d_model']} on {count(best['D'])} tokens "
        f"({best['steps']} steps of {count(int(tokens_per_step or tps))} tokens)",
        highlight=False,
    )
