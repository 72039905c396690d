"""The report: figures, an HTML page and a Markdown summary from a runs table and a fit file.

Never imports torch (numpy, pandas, matplotlib only), like ``loopscale.fit``.

    from loopscale.report import make_report
    make_report("sweep_dir/", "report/", fit="sweep_dir/fit.json")   # -> report/index.html

The pieces, for a notebook: ``load_inputs`` -> ``ReportContext.build`` -> ``figures.fig_*(ctx)``
(each returns a matplotlib Figure); ``phi_verdict(fit)`` is the rule that labels phi honestly.
"""

from loopscale.report.build import FORMATS, make_report, save_figure
from loopscale.report.context import ReportContext
from loopscale.report.honesty import MAX_CI_WIDTH, NOT_IDENTIFIED, Verdict, phi_verdict
from loopscale.report.inputs import AXES, ReportInputs, load_inputs, read_axes

__all__ = [
    "AXES",
    "FORMATS",
    "MAX_CI_WIDTH",
    "NOT_IDENTIFIED",
    "ReportContext",
    "ReportInputs",
    "Verdict",
    "load_inputs",
    "make_report",
    "phi_verdict",
    "read_axes",
    "save_figure",
]
