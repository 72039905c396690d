"""The headline in plain words: what was measured, the result, how sure it is — the lines a newcomer reads after the
verdict.

One function (``plain_groups``) writes the sentences, and the terminal (``loopscale demo``), ``summary.md``
and ``index.html`` print them as they are, so the three never disagree. It always leads with one
estimand: the reference variant's φ against its own r = 1 runs, and says which r = 1 ran (here the plain
stack; in the paper's code a loop of one over all blocks). A re-fit against loop-of-one r = 1 controls
(``V@control``, docs/cpu-scale.md) follows in its own group, "what the control measures", labelled as a
different quantity and never set beside the paper's 0.46. The verdicts and the tests' words are
``honesty.phi_verdict``'s (``fit/inference/verdict.py``); the reasons a φ is not resolved are the verdict's to
list, once, so the sentences here point to them instead of repeating them.
"""

from __future__ import annotations

import pandas as pd

from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI
from loopscale.fit.table import CONTROL_SEP, r1_anchor
from loopscale.numbers import flops, phi, phi_ci, phi_interval
from loopscale.report.context import ReportContext
from loopscale.report.honesty import MAX_CI_WIDTH, Verdict

#: sentences round φ to two decimals (tables and verdicts print ``numbers.PHI_DIGITS``).
PROSE = 2


def plain_headline(ctx: ReportContext) -> list[str]:
    """The headline's sentences, most important first (one paragraph each): ``plain_groups``' two groups, in order."""
    explain, control = plain_groups(ctx)
    return explain + control


def plain_groups(ctx: ReportContext) -> tuple[list[str], list[str]]:
    """The sentences in two groups: what was measured and what it says (``explain``), and what the loop-of-one
    control measures (``control``; empty without a control re-fit).

    One estimand leads, always: φ of the reference variant against its own r = 1 runs (the paper's design,
    arXiv 2604.21106 §2). A re-fit against loop-of-one controls is a different quantity and is labelled so;
    only the lead result is set beside the paper's 0.46."""
    ref = ctx.verdict
    control = _control_refit(ctx)
    explain = [_measured(ctx), "Result: " + _result(ref, "one extra pass through the shared blocks")]
    explain.append(
        _r1_meaning(ctx) + f" For reference, the paper measures φ = "
        f"{phi_ci(PAPER_COEFFICIENTS['phi'], PAPER_PHI_CI, PROSE)} with 116 GPU runs at 4.6e17–2.2e19 FLOPs."
    )
    lines: list[str] = []
    if control is not None:
        name = control.variant.split(CONTROL_SEP, 1)[1]
        lines.append(
            f"A different quantity, against r = 1 models built as a loop of one ({name}, fitted as "
            f"{control.variant}): " + _result(control, "a pass")
        )
        lines.append(_difference(ctx, name) + _tax_reading(ctx, name, ref, control))
    return explain, lines


def _r1_meaning(ctx: ReportContext) -> str:
    """Which r = 1 ran here, and which the paper ran."""
    anchor = r1_anchor(ctx.variant)
    here = (
        f"Here r = 1 is a loop of one ({anchor}: the looped models' own layout, each block run once)."
        if anchor is not None
        else "Here r = 1 is the plain stack (the same depth of unique blocks, each run once, no loop)."
    )
    return (
        here + " The paper's code runs r = 1 as a loop of one over all 20 of its blocks (0 + 20 + 0: no prelude or "
        "coda, a passthrough injection, its recurrent-state norm applied once): close to a plain stack, not the "
        "same model."
    )


def _control_refit(ctx: ReportContext) -> Verdict | None:
    """The reference recipe re-fitted against control r = 1 runs, if the fit file has one."""
    names = [n for n in ctx.verdicts if n.startswith(f"{ctx.variant}{CONTROL_SEP}")]
    return ctx.verdicts[names[0]] if names else None


def _measured(ctx: ReportContext) -> str:
    df = ctx.inputs.runs.df
    rs = sorted(int(r) for r in set(df["r"]))
    budgets = sorted(set(ctx.budgets))
    where = (
        f" at {len(budgets)} compute budgets from {flops(budgets[0])} to {flops(budgets[-1])} FLOPs" if budgets else ""
    )
    return (
        f"What was measured: {df['run_id'].nunique()} training runs of small transformers whose middle blocks loop "
        f"r = {', '.join(map(str, rs))} times{where}, fitted with the paper's scaling law to ask how much "
        "one extra pass through the shared blocks is worth, as φ: 0 means nothing, 1 means as much as a "
        "new unique block (arXiv 2604.21106)."
    )


def _result(v: Verdict, what: str) -> str:
    """The estimate and how sure it is, in words: resolved (and what the tests say), or that it is not (the verdict
    lists why, once)."""
    if v.phi_undetermined:
        return "φ could not be estimated: " + "; ".join(v.reasons) + "."
    kind = "profile-likelihood interval" if v.method == "profile likelihood" else "block-bootstrap percentile interval"
    ci = f" ({v.ci_level:.0%} {kind} {phi_interval(v.ci, PROSE)})" if v.ci else ""
    if not v.resolved:
        why = "one reason, listed with the verdict" if len(v.reasons) == 1 else "the reasons listed with the verdict"
        return (
            f"not measured precisely enough to quote. The best estimate is that {what} is worth "
            f"φ = {phi(v.phi, PROSE)} of a unique block{ci}, but the fit does not pin it down ({why})."
        )
    return f"{what} is worth φ = {phi(v.phi, PROSE)} of a unique block{ci}. " + _sureness(v)


def _sureness(v: Verdict) -> str:
    """How sure a resolved φ is: the interval's width, then what the tests say about φ = 0, 1 and 0.46."""
    if v.ci is None:
        return "Its uncertainty was not estimated (no bootstrap)."
    lo, hi = v.ci
    out = f"Resolved: the interval is {hi - lo:.2f} wide (this report asks for under {MAX_CI_WIDTH:g})."
    if v.claims:
        out += " The tests: " + "; ".join(v.claims) + "."
    return out


def _difference(ctx: ReportContext, control: str) -> str:
    tax = structure_tax(ctx.inputs.runs.df, ctx.variant, control)
    cost = (
        (f", which by itself costs {_span(tax)} nats against the plain stack at the same compute (best run per budget)")
        if tax
        else ""
    )
    return (
        f"Its r = 1 models ({control}) are a loop of one in the looped models' own "
        f"layout, with their prelude, coda, input injection and recurrent-state norm{cost}. So its φ prices a "
        "repeat apart from the fixed cost of the loop's structure; it is not the paper's estimand "
        "(docs/cpu-scale.md)."
    )


def _tax_reading(ctx: ReportContext, control: str, ref: Verdict, fit: Verdict) -> str:
    """Why the paper-design φ is lower than the control fit's, when the runs show a structural cost."""
    tax = structure_tax(ctx.inputs.runs.df, ctx.variant, control)
    lower = ref.phi is not None and fit.phi is not None and ref.phi < fit.phi
    if ref.resolved or not tax or max(tax.values()) <= 0 or not lower:
        return ""
    return (
        " The paper-design fit's φ is lower because every looped model also pays that structural cost, "
        "which the law has no term for."
    )


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
