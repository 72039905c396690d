"""One look for every figure: a colour, a marker and a line style per r, print-ready fonts, axis labels.

Colours are the Okabe–Ito colour-blind-safe set, ordered so that lightness increases with r
(r = 1 black, then blue, green, orange, ...): in greyscale print the order survives, and every r also
has its own marker and line style, so no figure relies on colour alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# Okabe & Ito (2008), "Color Universal Design": dark to light for the paper's r = 1, 2, 4, 8.
COLOURS: tuple[str, ...] = ("#000000", "#0072B2", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES: tuple[Any, ...] = (
    "-",
    (0, (5, 1.5)),
    (0, (3, 1, 1, 1)),
    (0, (1, 1)),
    (0, (5, 1, 1, 1, 1, 1)),
    "-",
    "--",
    ":",
)

# Axis labels with units, used by every figure (the words of the paper).
LOSS = "validation loss (nats/token)"
CONT_LOSS = "continuation loss (nats/token)"
FLOPS = "training FLOPs C"
PARAMS = "unique non-embedding parameters N"
TOKENS_PER_PARAM = "tokens per parameter D/N"

#: matplotlib settings for figures that are read on paper: 9-10 pt text at 7.2 in width, thin grid.
RC: dict[RcKeyType, Any] = {
    "font.size": 9.5,
    "axes.titlesize": 10,
    "axes.labelsize": 9.5,
    "axes.titleweight": "bold",
    "legend.fontsize": 8.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "axes.grid": True,
    "grid.color": "#d0d0d0",
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.8,
    "lines.linewidth": 1.6,
    "lines.markersize": 5.5,
    "legend.frameon": False,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.05,
    "svg.hashsalt": "loopscale",  # deterministic SVG ids
    "pdf.fonttype": 42,  # TrueType in PDFs: editable text, accepted by publishers
}

FULL_WIDTH = 7.2  # inches: a two-column paper's full text width


@dataclass(frozen=True)
class Palette:
    """Colour, marker and line style per r: fixed for the whole report, so r = 4 looks alike everywhere."""

    rs: tuple[int, ...]

    @classmethod
    def for_rs(cls, *groups: Any) -> Palette:
        rs: set[int] = set()
        for g in groups:
            rs.update(int(r) for r in g)
        return cls(tuple(sorted(rs)) or (1,))

    def _index(self, r: int) -> int:
        r = int(r)
        if r in self.rs:
            return self.rs.index(r)
        return len(self.rs) + sorted({*self.rs, r}).index(r)  # an r outside the report's set: next free style

    def colour(self, r: int) -> str:
        return COLOURS[self._index(r) % len(COLOURS)]

    def marker(self, r: int) -> str:
        return MARKERS[self._index(r) % len(MARKERS)]

    def linestyle(self, r: int) -> Any:
        return LINESTYLES[self._index(r) % len(LINESTYLES)]

    def point(self, r: int, *, filled: bool = True) -> dict[str, Any]:
        """Keyword arguments for a scatter/errorbar point of r (open markers: white face)."""
        c = self.colour(r)
        return {
            "marker": self.marker(r),
            "color": c,
            "markerfacecolor": c if filled else "white",
            "markeredgecolor": c if r != 1 or filled else "#000000",
            "markeredgewidth": 1.0,
            "linestyle": "none",
        }

    def line(self, r: int) -> dict[str, Any]:
        return {"color": self.colour(r), "linestyle": self.linestyle(r)}


def r_label(r: int) -> str:
    return "r = 1 (non-looped)" if int(r) == 1 else f"r = {int(r)}"
