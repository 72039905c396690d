"""The report: figures, an HTML page and a Markdown summary from a runs table and a fit file.

Never imports torch (numpy, pandas, matplotlib only), like ``loopscale.fit``.

    from loopscale.report import make_report
    make_report("sweep_dir/", "report/", fit="sweep_dir/fit.json")   # -> report/index.html

The pieces, for a notebook: ``load_inputs`` -> ``ReportContext.build`` -> ``figures.fig_*(ctx)``
(each returns a matplotlib Figure); ``phi_verdict(fit)`` is the rule that labels phi honestly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopscale.report.context import ReportContext
from loopscale.report.honesty import MAX_CI_WIDTH, NOT_IDENTIFIED, Verdict, phi_verdict
from loopscale.report.inputs import AXES, ReportInputs, load_inputs, read_axes

if TYPE_CHECKING:
    from loopscale.report.build import FORMATS, Report, make_report, save_figure, write_report

#: names served by ``report.build``, which loads matplotlib: imported on first use, so that
#: ``loopscale.report.tables`` (and the context, the verdict) stay free of the plotting stack.
_BUILD = ("FORMATS", "Report", "make_report", "save_figure", "write_report")

__all__ = [
    "AXES",
    "FORMATS",
    "MAX_CI_WIDTH",
    "NOT_IDENTIFIED",
    "Report",
    "ReportContext",
    "ReportInputs",
    "Verdict",
    "load_inputs",
    "make_report",
    "phi_verdict",
    "read_axes",
    "save_figure",
    "write_report",
]


def __getattr__(name: str) -> Any:
    if name in _BUILD:
        from loopscale.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
