"""The paper's sweep (arXiv 2604.21106 §4) as data, shared by `info`, the sweep planner and the fit tests.

Widths are in the paper's unit s (d_model = 64 s). The baseline grid is the paper's
``shells/scaling_laws/scaling_laws.sh``; the two Delta-phi probes train their own looped runs
(r = 2, 4, 8) on the baseline's widths plus a few wider ones (``scaling_laws_truncbptt.sh``,
``scaling_laws_hyperconnect.sh``) and reuse the baseline's r = 1 runs.
"""

from __future__ import annotations

from loopscale.errors import ConfigError

PAPER_BUDGETS: tuple[float, ...] = (4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19)
PAPER_WIDTHS: dict[float, tuple[int, ...]] = {
    4.64e17: (6, 8, 10, 12),
    1e18: (6, 8, 10, 12, 14),
    2.15e18: (8, 10, 12, 14, 16),
    4.64e18: (10, 12, 14, 16, 18, 20),
    1e19: (12, 16, 18, 20, 24),
    2.15e19: (18, 24, 28, 34),
}
PAPER_R: tuple[int, ...] = (1, 2, 4, 8)
PAPER_MODEL: dict[str, object] = {
    "vocab_size": 32001,  # Llama-2 (32,000) + one special token, the paper code's vocabulary; padded to 32064
    "head_dim": 128,
    "L_eff": 20,
    "n_prelude": 2,
    "n_coda": 2,
    "seq_len": 2048,
}
# The paper's r = 1 baseline ("noloop" in scaling_laws.sh) is not the plain 2 + 16 + 2 stack but
# 0 + 20 + 0 blocks with passthrough injection and one recurrence: a loop of one, whose recurrent-state
# RMSNorm is applied once. These are the ModelConfig keys (over PAPER_MODEL) that build it.
PAPER_R1_MODEL: dict[str, object] = {"n_prelude": 0, "n_coda": 0, "injection": "passthrough", "r1_looped": True}
PAPER_TOKENS_PER_STEP = 2**18

# The probes' extra widths per budget (on top of PAPER_WIDTHS), for their looped runs only.
PAPER_PROBE_R: tuple[int, ...] = (2, 4, 8)
PAPER_PROBE_WIDTHS: dict[str, dict[float, tuple[int, ...]]] = {
    # truncated BPTT moves the optimum wider: one more width at every budget >= 1e18
    "truncated_bptt": {1e18: (16,), 2.15e18: (18,), 4.64e18: (22,), 1e19: (28,), 2.15e19: (40,)},
    "hyperconnect": {2.15e18: (18,)},
}


def paper_grid() -> list[tuple[float, int, int]]:
    """(budget C, s, r) for the paper's 116 baseline runs."""
    return [(c, s, r) for c in PAPER_BUDGETS for s in PAPER_WIDTHS[c] for r in PAPER_R]


def paper_model(s: int, r: int) -> dict[str, object]:
    """ModelConfig keys of the paper's run at width s and r (the r = 1 run is the loop of one)."""
    return {**PAPER_MODEL, **(PAPER_R1_MODEL if r == 1 else {}), "s": s, "r": r}


def probe_widths(probe: str) -> dict[float, tuple[int, ...]]:
    """Every width (s) a probe's looped runs train per budget: the baseline's plus the probe's own."""
    if probe not in PAPER_PROBE_WIDTHS:
        raise ConfigError("probe", f"unknown; expected one of {sorted(PAPER_PROBE_WIDTHS)}", value=probe)
    added = PAPER_PROBE_WIDTHS[probe]
    return {c: tuple(sorted({*PAPER_WIDTHS[c], *added.get(c, ())})) for c in PAPER_BUDGETS}


def probe_grid(probe: str) -> list[tuple[float, int, int]]:
    """(budget C, s, r) for a probe's own runs (34 per r for truncated BPTT, 30 for hyperconnect)."""
    widths = probe_widths(probe)
    return [(c, s, r) for c in PAPER_BUDGETS for s in widths[c] for r in PAPER_PROBE_R]
