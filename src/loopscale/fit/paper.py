"""The paper's published fit (arXiv 2604.21106 §1 and §5): the one place these numbers live.

Used by ``loopscale plan --paper``, by the tests that check the abstract's worked example, and by
the docs when loopscale's fit is compared with the paper's. Coefficients are the unrounded values
of arXiv 2604.21106 §1 (the literature warns that rounded coefficients bias predictions).
"""

from __future__ import annotations

from typing import Final

#: L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta, fitted on the 116-run iso-depth sweep.
PAPER_COEFFICIENTS: Final[dict[str, float]] = {
    "E": 1.56773,
    "A": 28.027,
    "alpha": 0.19924,
    "B": 915.82,
    "beta": 0.36863,
    "phi": 0.459,
}

#: 95% block-bootstrap CI of phi (200 resamples over (budget, r) cells).
PAPER_PHI_CI: Final[tuple[float, float]] = (0.41, 0.53)

#: Goodness of fit on raw nats: the joint law and the restricted fits.
PAPER_R2: Final[dict[str, float]] = {"joint": 0.9972, "phi=0": 0.9858, "phi=1": 0.9552, "per_r": 0.998}

#: Delta-phi probes: phi of each recipe (the baseline is the joint fit above).
PAPER_PROBES_PHI: Final[dict[str, float]] = {
    "baseline": 0.459,
    "truncated_bptt": 0.380,
    "hyperconnect": 0.646,
}

#: The paper's fitting box: starts are drawn uniformly in it (a = log A, b = log B, e = log E).
PAPER_BOX: Final[dict[str, tuple[float, float]]] = {
    "a": (-5.0, 35.0),
    "b": (-5.0, 35.0),
    "e": (-3.0, 2.0),
    "alpha": (0.0, 2.5),
    "beta": (0.0, 2.5),
    "phi": (-3.0, 3.0),
}

#: The paper's fit settings (§5): 500 starts, summed Huber loss in log space with delta 1e-3, 200 resamples.
PAPER_RESTARTS: Final[int] = 500
PAPER_LOSS: Final = "huber"
PAPER_HUBER_DELTA: Final[float] = 1e-3
PAPER_BOOTSTRAP: Final[int] = 200
