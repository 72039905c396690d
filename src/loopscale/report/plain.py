"""The headline in plain words: what was measured, the result, how sure it is — the first lines a newcomer reads.

One function (``plain_headline``) writes the sentences, and the terminal (``loopscale demo``), ``summary.md``
and ``index.html`` print them as they are, so the three never disagree. It leads with the fit the design
can identify: with loop-of-one r = 1 controls in the fit file (``V@control``, docs/cpu-scale.md) that is
the re-fit against them, and the sentences say how it differs from the paper's definition (arXiv
2604.21106: r = 1 is the plain stack); the paper-design fit follows with the reason for its verdict.
Without controls the reference fit is the result. The verdicts are ``honesty.phi_verdict``'s.
"""

from __future__ import annotations

import pandas as pd

from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI
from loopscale.fit.table import CONTROL_SEP
from loopscale.numbers import flops, phi, phi_ci
from loopscale.report.context import ReportContext
from loopscale.report.honesty import MAX_CI_WIDTH, Verdict

#: sentences round φ to two decimals (tables and verdicts print ``numbers.PHI_DIGITS``).
PROSE = 2


def plain_headline(ctx: ReportContext) -> list[str]:
    """The headline's sentences, most important first (one paragraph each)."""
    ref = ctx.verdict
    control = _control_refit(ctx)
    lines = [_measured(ctx)]
    if control is None or ref.identified:
        lines.append("Result: " + _result(ref, "one extra pass through the shared blocks"))
        if control is not None:
            lines.append(f"Against r = 1 models built as a loop of one ({control.variant}): "
                         + _result(control, "a pass"))
    else:
        name = control.variant.split(CONTROL_SEP, 1)[1]
        lines.append("Result: " + _result(control, "one extra pass through the shared blocks"))
        lines.append(_difference(ctx, name))
        lines.append("With the paper's own definition (r = 1 is the plain stack): " + _result(ref, "a pass")
                     + _tax_reading(ctx, name, ref, control))
    lines.append(f"For reference, the paper measures φ = {phi_ci(PAPER_COEFFICIENTS['phi'], PAPER_PHI_CI, PROSE)} "
                 "with 116 GPU runs at 4.6e17–2.2e19 FLOPs.")
    return lines


def _control_refit(ctx: ReportContext) -> Verdict | None:
    """The reference recipe re-fitted against control r = 1 runs, if the fit file has one."""
    names = [n for n in ctx.verdicts if n.startswith(f"{ctx.variant}{CONTROL_SEP}")]
    return ctx.verdicts[names[0]] if names else None


def _measured(ctx: ReportContext) -> str:
    df = ctx.inputs.runs.df
    rs = sorted(int(r) for r in set(df["r"]))
    budgets = sorted(set(ctx.budgets))
    where = (f" at {len(budgets)} compute budgets from {flops(budgets[0])} to {flops(budgets[-1])} FLOPs"
             if budgets else "")
    return (f"What was measured: {df['run_id'].nunique()} training runs of small transformers whose middle blocks loop "
            f"r = {', '.join(map(str, rs))} times{where}, fitted with the paper's scaling law to ask how much "
            "one extra pass through the shared blocks is worth, as φ: 0 means nothing, 1 means as much as a "
            "new unique block (arXiv 2604.21106).")


def _result(v: Verdict, what: str) -> str:
    """The estimate and how sure it is, in words: identified (and what its CI rules out), or why it is not."""
    if v.phi_undetermined:
        return "φ could not be estimated: " + "; ".join(v.reasons) + "."
    ci = f" (95% CI {phi(v.ci[0], PROSE)} to {phi(v.ci[1], PROSE)})" if v.ci else ""
    if not v.identified:
        return (f"not measured precisely enough to quote. The best estimate is that {what} is worth "
                f"φ = {phi(v.phi, PROSE)} of a unique block{ci}, but {'; '.join(v.reasons)}.")
    return f"{what} is worth φ = {phi(v.phi, PROSE)} of a unique block{ci}. " + _sureness(v)


def _sureness(v: Verdict) -> str:
    """How sure an identified φ is: the CI's width, and which of φ = 0 and φ = 1 it rules out."""
    if v.ci is None:
        return "Its uncertainty was not estimated (no bootstrap)."
    lo, hi = v.ci
    out = f"Identified: the CI is {hi - lo:.2f} wide (this report asks for under {MAX_CI_WIDTH:g})"
    ruled = [f"φ = {x:g}" for x in (0.0, 1.0) if not lo <= x <= hi]
    kept = [f"φ = {x:g}" for x in (0.0, 1.0) if lo <= x <= hi]
    if ruled:
        out += f" and rules out {' and '.join(ruled)}"
    if kept:
        out += f", but it includes {' and '.join(kept)}" + (
            " (a pass may be worth a full block)" if "φ = 1" in kept else " (a pass may add nothing)")
    return out + "."


def _difference(ctx: ReportContext, control: str) -> str:
    tax = structure_tax(ctx.inputs.runs.df, ctx.variant, control)
    cost = (f", which by itself costs {_span(tax)} nats against the plain stack at the same compute "
            "(best run per budget)") if tax else ""
    return ("How this differs from the paper: the paper's r = 1 runs are one pass through all of their blocks "
            "(no prelude, coda or input injection); here the r = 1 models "
            f"({control}) are a loop of one in the looped models' own layout, with their prelude, coda, input "
            f"injection and recurrent-state norm{cost}. So this φ prices a repeat apart from the fixed cost of "
            "the loop's structure (docs/cpu-scale.md).")


def _tax_reading(ctx: ReportContext, control: str, ref: Verdict, fit: Verdict) -> str:
    """Why the paper-design φ is lower than the control fit's, when the runs show a structural cost."""
    tax = structure_tax(ctx.inputs.runs.df, ctx.variant, control)
    lower = ref.phi is not None and fit.phi is not None and ref.phi < fit.phi
    if ref.identified or not tax or max(tax.values()) <= 0 or not lower:
        return ""
    return (" Every looped model also pays that structural cost, which the law has no term for, so it pulls "
            "this fit's φ down.")


def _span(tax: dict[float, float]) -> str:
    lo, hi = min(tax.values()), max(tax.values())
    return f"{lo:+.2f}" if abs(hi - lo) < 0.005 else f"{lo:+.2f} to {hi:+.2f}"


def structure_tax(df: pd.DataFrame, variant: str, control: str) -> dict[float, float]:
    """Per budget: the best loop-of-one r = 1 run's loss minus the best plain r = 1 run's (nats)."""
    if "C" not in df.columns:
        return {}
    ok = df[(df["r"] == 1) & (df.get("status", pd.Series("ok", index=df.index)).fillna("ok") == "ok")]
    plain = ok[ok["variant"] == variant].groupby("C")["val_loss"].min()
    looped = ok[ok["variant"] == control].groupby("C")["val_loss"].min()
    return {float(c): float(looped[c] - plain[c]) for c in looped.index if c in plain.index}
