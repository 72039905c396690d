"""What the report's tests check on a rendered report: every interval printed for φ and Δφ, and where the verdict
sits on a browser's first screen (tests/test_report_intervals.py, test_report.py, test_demo.py).

**The interval cross-check.** A page, summary.md or a terminal's output is cut into text units — a paragraph, a
list item, a line, or a table cell with its column header and its row's label (and the row's "method" cell) —
in sections (an HTML ``<section>``, a Markdown heading, a table). Every bracketed interval with two decimal ends,
``[lo, hi]``, is read for the quantity it belongs to: the last symbol before it in its unit (φ, Δφ, a coefficient,
or a loss, gap or size, which are not checked), else the last one of an earlier unit of its section, as a reader
reads a list under its heading. The words beside it (its unit up to the interval and the clause after it; in a
table its header, row label and method) name its method, and the interval must be the one fit.json holds under
that name, to the digits printed:

* φ: unlabelled, the variant's quoted interval (``inference.phi.ci``); "block bootstrap" / "percentile": its
  block-bootstrap percentile interval (``bootstrap.ci.phi``); "paper": the paper's 0.41-0.53.
* Δφ: unlabelled, the leading reading (``delta_phi[].leading.ci``); "separate fits", "shared law", "separate laws":
  that reading; "block bootstrap" / "percentile": ``delta_phi[].secondary_ci``.
* α, β, E, A, B: their interval must say "block bootstrap" (their only one).

The variant is the one the unit names (``baseline@loop1``, a technique), else any of the fit's. A secondary
interval shown without its method's name fails, as does a quoted interval mislabelled as another reading.
"""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from loopscale.fit.paper import PAPER_PHI_CI

NUM = r"[-+−]?\d+\.\d+(?:e[+-]?\d+)?"
INTERVAL = re.compile(rf"\[\s*({NUM})\s*,\s*({NUM})\s*\]")
#: the quantity an interval belongs to: the last of these before it (order: longest first at one position).
MARKERS = re.compile(
    r"(?P<dphi>Δφ|Delta-phi|delta phi)"
    r"|(?P<other>val loss|loss gap|loss CI|\bnats\b|\bgap\b|N_eq|N_cost|\bN\*|\bL\*|\bD\*)"
    r"|(?P<phi>(?<![Δ^\w-])(?:φ|phi)(?![\w-]))"
    r"|(?P<coef>α|β|\balpha\b|\bbeta\b|(?<![\w'-])[EAB](?![\w'-]))"
)
SECONDARY_WORDS = ("block bootstrap", "percentile")
READINGS = {"shared law": "shared_law", "separate laws": "separate_laws", "separate fits": "separate fits"}


@dataclass
class Unit:
    text: str  # where the quantity's symbol is looked for (header, row label, cell: in that order)
    section: str
    label: str = ""  # extra words naming the method (a table row's "method" cell)


@dataclass
class Found:
    """One interval read from a report: its text, quantity, variant candidates and the verdict on it."""

    where: str
    text: str
    quantity: str
    lo: str
    hi: str
    scope: str
    problems: list[str] = field(default_factory=list)


# ---- cutting outputs into units --------------------------------------------------------------------------
class _Units(HTMLParser):
    BLOCKS = frozenset(
        {"p", "li", "h1", "h2", "h3", "caption", "figcaption", "summary", "pre", "div", "header", "ul", "ol"}
    )
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "source", "col", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.units: list[Unit] = []
        self.buf: list[str] = []
        self.sections: list[str] = ["page"]
        self.stack: list[str] = []
        self.in_table = 0
        self.table_id = ""
        self.header: list[str] = []
        self.row: list[str] = []
        self.cell: list[str] | None = None
        self.in_head = False
        self.skip = 0  # <style>, <title>

    def _flush(self) -> None:
        text = " ".join("".join(self.buf).split())
        if text and not self.in_table:
            self.units.append(Unit(text, self.sections[-1]))
        self.buf = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("style", "title", "script"):
            self.skip += 1
        if tag == "section":
            self._flush()
            self.sections.append(a.get("id") or f"section-{len(self.units)}")
        if tag == "table":
            self._flush()
            self.in_table += 1
            self.table_id = a.get("id") or "table"
            self.header = []
        if tag == "thead":
            self.in_head = True
        if tag == "tr":
            self.row = []
        if tag in ("td", "th"):
            self.cell = []
        if tag in self.BLOCKS and not self.in_table:
            self._flush()
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "title", "script"):
            self.skip -= 1
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        if tag == "tr":
            if self.in_head:
                self.header = self.row
            else:
                self.units += table_units(self.header, self.row, self.table_id)
        if tag == "thead":
            self.in_head = False
        if tag == "table":
            self.in_table -= 1
        if tag in self.BLOCKS and not self.in_table:
            self._flush()
        if tag == "section":
            self._flush()
            self.sections.pop()
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.cell is not None:
            self.cell.append(data)
        elif not self.in_table:
            self.buf.append(data)


def table_units(header: list[str], row: list[str], section: str) -> list[Unit]:
    """One unit per cell: its column's header, the row's label, the cell; a "method" column names the row's
    intervals' method."""
    method = next((row[i] for i, h in enumerate(header) if "method" in h and i < len(row)), "")
    label = row[0] if row else ""
    out = []
    for i, cell in enumerate(row):
        head = header[i] if i < len(header) else ""
        text = cell if i == 0 else f"{head} ¦ {label} ¦ {cell}"
        out.append(Unit(text, section, method))
    return out


def html_units(page: str) -> list[Unit]:
    p = _Units()
    p.feed(page)
    p.close()
    p._flush()
    return p.units


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def markdown_units(md: str) -> list[Unit]:
    """summary.md (or `fit --markdown`): lines, and pipe tables cell by cell; a section per heading or table."""
    lines = md.splitlines()
    units: list[Unit] = []
    section = "top"
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("# ").strip()
        if line.strip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            header = _cells(line)
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                units += table_units(header, _cells(lines[i]), f"table {header[0]} {i}")
                i += 1
            continue
        if line.strip():
            units.append(Unit(line.strip(), section))
        i += 1
    return units


def terminal_units(text: str) -> list[Unit]:
    """A terminal's output (rich): lines; a table row's unit is its header line (the line above the ━ rule) and
    the row, so a column's name ("Delta-phi", "loss") tells the row's intervals' quantity."""
    lines = text.splitlines()
    units: list[Unit] = []
    section = "top"
    header = None
    for i, line in enumerate(lines):
        if re.fullmatch(r"\s*[━─]{10,}\s*", line) and i > 0:
            header = lines[i - 1].strip()
            if units and units[-1].text == header:
                units.pop()
            section = f"table {i}"
            continue
        if not line.strip():
            header = None
            section = f"block {i}"
            continue
        if re.match(r"^\s*\|[\s:|-]+\|\s*$", line) and i > 0:  # a markdown box's header rule
            header = lines[i - 1].strip()
            if units and units[-1].text == header:
                units.pop()
            section = f"table {i}"
            continue
        units.append(Unit(f"{header} ¦ {line.strip()}" if header else line.strip(), section))
    return units


# ---- reading and checking the intervals -------------------------------------------------------------------
def _f(x: str) -> float:
    return float(x.replace("−", "-"))


def _matches(lo: str, hi: str, ci: Any) -> bool:
    """Does the printed interval round from ``ci``, end by end, at the digits printed?"""
    if not ci or ci[0] is None or ci[1] is None:
        return False
    for printed, true in ((lo, ci[0]), (hi, ci[1])):
        digits = len(printed.split(".")[1]) if "." in printed else 0
        if abs(_f(printed) - float(true)) > 0.5 * 10**-digits + 1e-9:
            return False
    return True


def _named(text: str, names: list[str]) -> list[str]:
    return [n for n in names if re.search(rf"(?<![\w@]){re.escape(n)}(?![\w@])", text)]


def _marker(text: str) -> str | None:
    last = None
    for m in MARKERS.finditer(text):
        last = m.lastgroup
    return last


def read_intervals(units: list[Unit], fit: dict[str, Any], where: str) -> list[Found]:
    """Every φ, Δφ and coefficient interval of ``units``, each checked against ``fit`` (a fit file's dict)."""
    variants = list(fit["variants"])
    dphi = {d["variant"]: d for d in fit.get("delta_phi") or []}
    out: list[Found] = []
    inherited: dict[str, str | None] = {}
    for u in units:
        prev_end = 0
        for m in INTERVAL.finditer(u.text):
            before = u.text[: m.start()]
            quantity = _marker(before) or inherited.get(u.section)
            after = re.split(r"[,;:]|(?<=\)) |\s¦", u.text[m.end() :], maxsplit=1)[0]
            scope = (u.text[prev_end : m.end()] + after + " " + u.label).lower()
            prev_end = m.end()
            if quantity not in ("phi", "dphi", "coef"):
                continue
            f = Found(where, u.text, quantity, m.group(1), m.group(2), scope)
            _check(f, fit, variants, dphi, u.text)
            out.append(f)
        last = _marker(u.text)
        if last is not None:
            inherited[u.section] = last
    return out


def _check(f: Found, fit: dict[str, Any], variants: list[str], dphi: dict[str, Any], text: str) -> None:
    secondary = any(w in f.scope for w in SECONDARY_WORDS)
    if f.quantity == "coef":
        if "block bootstrap" not in f.scope:
            f.problems.append("a coefficient's interval without its method (block bootstrap)")
        return
    if f.quantity == "phi":
        if re.search(r"\bthe paper\b", f.scope):
            if not _matches(f.lo, f.hi, PAPER_PHI_CI):
                f.problems.append("labelled the paper's, is not the paper's interval")
            return
        names = _named(text, variants) or variants
        want = []
        for name in names:
            rec = fit["variants"][name]
            quoted = ((rec.get("inference") or {}).get("phi") or {}).get("ci")
            boot = ((rec.get("bootstrap") or {}).get("ci") or {}).get("phi")
            if secondary:
                want.append(boot)
            else:
                want.append(quoted if quoted is not None else boot)  # older fit files: the percentile one
        if not any(_matches(f.lo, f.hi, ci) for ci in want):
            kind = "block-bootstrap percentile" if secondary else "quoted (inference.phi.ci)"
            f.problems.append(f"φ interval is not the {kind} interval of {', '.join(names)}")
        return
    names = _named(text, list(dphi)) or list(dphi)
    if not names:
        f.problems.append("a Δφ interval in a fit without Δφ")
        return
    labels = [key for word, key in READINGS.items() if word in f.scope]
    want = []
    for name in names:
        d = dphi[name]
        if secondary:
            want.append(d.get("secondary_ci"))
            continue
        paired = (fit["variants"].get(name, {}).get("inference") or {}).get("paired_delta_phi") or {}
        for key in labels:
            want.append(
                (d.get("inference") or {}).get("ci") if key == "separate fits" else (paired.get(key) or {}).get("ci")
            )
        if not labels:
            want.append((d.get("leading") or {}).get("ci") or d.get("ci"))
    if not any(_matches(f.lo, f.hi, ci) for ci in want):
        kind = "secondary" if secondary else (", ".join(labels) or "leading")
        f.problems.append(f"Δφ interval is not the {kind} reading of {', '.join(names)}")


def check_outputs(fit: dict[str, Any], outputs: dict[str, list[Unit]]) -> list[Found]:
    """Read every output's intervals; fail with each wrong one listed. Returns what was read (for counts)."""
    found = [f for where, units in outputs.items() for f in read_intervals(units, fit, where)]
    bad = [
        f"{f.where}: [{f.lo}, {f.hi}] ({f.quantity}): {'; '.join(f.problems)} — in: {f.text[:300]}"
        for f in found
        if f.problems
    ]
    assert not bad, "\n".join(bad)
    return found


def quoted_intervals(fit: dict[str, Any]) -> dict[str, Any]:
    """What must appear: the reference's quoted φ interval and each technique's leading Δφ interval."""
    ref = fit.get("reference_variant") or next(iter(fit["variants"]))
    out = {f"φ {ref}": ((fit["variants"][ref].get("inference") or {}).get("phi") or {}).get("ci")}
    for d in fit.get("delta_phi") or []:
        out[f"Δφ {d['variant']}"] = (d.get("leading") or {}).get("ci") or d.get("ci")
    return {k: v for k, v in out.items() if v is not None}


def assert_quoted_everywhere(fit: dict[str, Any], found: list[Found], wheres: list[str]) -> None:
    """The quoted φ interval and every leading Δφ interval are printed in each output (not only checked when
    present)."""
    for key, ci in quoted_intervals(fit).items():
        quantity = "dphi" if key.startswith("Δφ") else "phi"
        for where in wheres:
            hits = [
                f
                for f in found
                if f.where == where and f.quantity == quantity and _matches(f.lo, f.hi, ci) and not f.problems
            ]
            assert hits, f"{key} {ci}: not printed in {where}"


# ---- one report, every output ---------------------------------------------------------------------------
def terminal_outputs(fit_path: Path, index: Path, monkeypatch: Any, capsys: Any) -> dict[str, str]:
    """What `loopscale fit` prints after its fit (the tables and verdicts), `loopscale plan --fit` and the demo's
    terminal summary, each on a console wide enough not to wrap a line."""
    from rich.console import Console

    from loopscale.cli import run_app
    from loopscale.cli.app import console, err_console
    from loopscale.cli.fit import _print_fit, _print_verdicts
    from loopscale.demo import _demo_numbers, _print_headline
    from loopscale.fit import load_fit
    from loopscale.report import ReportContext, load_inputs
    from loopscale.report.build import headline_record
    from loopscale.report.tables import axes_table

    monkeypatch.setattr(console, "_width", 250)
    monkeypatch.setattr(err_console, "_width", 250)
    doc = load_fit(fit_path)
    capsys.readouterr()
    _print_fit(doc, markdown=False)
    _print_verdicts(doc)
    fit_out = capsys.readouterr().out
    assert run_app(["plan", "-C", "4e10", "--fit", str(fit_path)]) == 0
    plan_out = capsys.readouterr().out
    src = fit_path.parent
    axes = src / "axes.csv" if (src / "axes.csv").is_file() else None
    ctx = ReportContext.build(load_inputs(src / "runs.csv", index.parent, fit=fit_path, axes=axes))
    buf = io.StringIO()
    head = {**headline_record(ctx, index), **_demo_numbers(ctx, ctx.inputs.runs, [], 60.0)}
    _print_headline(Console(file=buf, width=400), head, axes_table(ctx))
    return {"fit (terminal)": fit_out, "plan (terminal)": plan_out, "demo (terminal)": buf.getvalue()}


def check_report(index: Path, fit_path: Path, terminals: dict[str, str]) -> list[Any]:
    """The cross-check on one report: index.html, summary.md and the terminals' outputs, and headline.json's
    numbers; returns what was read."""
    fit = json.loads(fit_path.read_text(encoding="utf-8"))
    outputs: dict[str, list[Unit]] = {
        "index.html": html_units(index.read_text(encoding="utf-8")),
        "summary.md": markdown_units((index.parent / "summary.md").read_text(encoding="utf-8")),
        **{where: terminal_units(text) for where, text in terminals.items()},
    }
    found = check_outputs(fit, outputs)
    assert_quoted_everywhere(fit, found, ["index.html", "summary.md", "fit (terminal)"])
    for where in ("plan (terminal)", "demo (terminal)"):
        assert any(f.where == where and f.quantity == "phi" for f in found), where
    if fit.get("delta_phi"):
        assert any(f.where == "demo (terminal)" and f.quantity == "dphi" for f in found)
    head = json.loads((index.parent / "headline.json").read_text(encoding="utf-8"))
    ref = fit["variants"][head["reference_variant"]]
    assert head["phi_ci"] == ((ref.get("inference") or {}).get("phi") or {}).get("ci")
    assert head["ci_method"] == ("profile likelihood" if head["phi_ci"] else None)
    for name, v in head["variants"].items():
        assert v["phi_ci"] == ((fit["variants"][name].get("inference") or {}).get("phi") or {}).get("ci"), name
    for rec, d in zip(head["delta_phi"], fit.get("delta_phi") or [], strict=True):
        assert rec["ci"] == d["leading"]["ci"] and rec["estimate"] == d["leading"]["estimate"]
        assert rec["reading"] == d["leading"]["reading"] and rec["sentence"].startswith(f"{d['variant']} − ")
    return found


# ---- the browser ----------------------------------------------------------------------------------------
BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "google-chrome-stable")
#: measures after layout and writes the result into the DOM, which --dump-dom prints.
PROBE = """<script>(function () {
  function box(sel) { var e = document.querySelector(sel); if (!e) return "none";
    var r = e.getBoundingClientRect(); return Math.round(r.top + window.scrollY) + " " +
      Math.round(r.bottom + window.scrollY); }
  var pre = document.createElement("pre"); pre.id = "first-screen";
  pre.textContent = ["verdict " + box("#headline"), "label " + box("#headline .label"),
    "viewport " + window.innerWidth + " " + window.innerHeight,
    "dphi " + box("#headline .dphi"), "plain " + box("#plain")].join("\\n");
  document.body.appendChild(pre);
})();</script></body>"""


def browser() -> str | None:
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


def first_screen(index: Path, shot: Path, profile: Path, size: tuple[int, int] = (1280, 800)) -> dict[str, Any]:
    """Open ``index`` in headless Chromium at ``size``: the verdict box's top and bottom (CSS px from the page's
    top, after layout), and a screenshot of the first screen at ``shot``, from one headless run. The page is opened
    from a copy with a measuring script appended (the report itself has none; what it writes lands at the page's
    end, below the first screen); the network is mapped to nowhere."""
    exe = browser()
    assert exe is not None
    args = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
    ]
    probe = profile.parent / f"{profile.name}-probe.html"
    probe.write_text(index.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    shot.unlink(missing_ok=True)
    run = [*args, "--dump-dom", f"--screenshot={shot}", probe.resolve().as_uri()]
    dom = subprocess.run(run, capture_output=True, text=True, timeout=60).stdout
    m = re.search(r'<pre id="first-screen">(.*?)</pre>', dom, re.S)
    assert m, "the page did not render (no measurement in the DOM)"
    out: dict[str, Any] = {}
    for line in html.unescape(m.group(1)).splitlines():
        key, *vals = line.split()
        out[key] = None if vals == ["none"] else tuple(int(float(v)) for v in vals)
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "no screenshot"
    return out
