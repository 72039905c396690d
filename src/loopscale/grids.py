"""The paper's sweep (PAPER.md section 4) as data, shared by `info`, the sweep planner and the fit tests."""

from __future__ import annotations

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
    "vocab_size": 32064,  # Llama-2 tokenizer (+ specials) as the paper pads it: V_padded = 32064
    "head_dim": 128,
    "L_eff": 20,
    "n_prelude": 2,
    "n_coda": 2,
    "seq_len": 2048,
}
PAPER_TOKENS_PER_STEP = 2**18


def paper_grid() -> list[tuple[float, int, int]]:
    """(budget C, s, r) for the paper's 116 runs."""
    return [(c, s, r) for c in PAPER_BUDGETS for s in PAPER_WIDTHS[c] for r in PAPER_R]
