#!/usr/bin/env python3
"""Does a report page fit a phone? Opens REPORT_DIR/index.html in headless Chromium at WIDTH px (default
390) and fails if the page scrolls sideways, naming the outermost elements that stick out (docs/report.md).

    python bench/report_width.py REPORT_DIR [WIDTH]

Exit 0: fits; 1: the page is wider than the viewport; 2: no index.html; 3: no Chromium
(Debian: apt-get install -y chromium, or chromium-headless-shell). Standard library only.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Measures after layout and writes the result into the DOM, which --dump-dom prints. Elements inside a
# scroll box and children of an element already reported are left out, so the list names the causes.
PROBE = """<script>(function () {
  var w = document.documentElement.clientWidth, s = document.documentElement.scrollWidth, out = [];
  document.querySelectorAll("body *").forEach(function (e) {
    var p = e.parentElement;
    if (p && p.closest(".scroll")) return;
    if (p && p.tagName !== "MAIN" && p.tagName !== "BODY" && p.getBoundingClientRect().right > w + 0.5) return;
    var r = e.getBoundingClientRect();
    if (r.right > w + 0.5) out.push(e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
                                    (e.className ? "." + e.className : "") + " right=" + Math.round(r.right));
  });
  var pre = document.createElement("pre");
  pre.id = "report-width";
  pre.textContent = w + " " + s + "\\n" + out.join("\\n");
  document.body.appendChild(pre);
})();</script></body>"""

BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    page = Path(argv[0]) / "index.html"
    width = int(argv[1]) if len(argv) > 1 else 390
    if not page.is_file():
        print(f"no index.html in {argv[0]}", file=sys.stderr)
        return 2
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        print("chromium not found (apt-get install -y chromium)", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "index.html"  # beside nothing: the page is self-contained
        probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
        dom = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={tmp}/profile",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--window-size={width},900",
                "--dump-dom",
                probe.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    m = re.search(r'<pre id="report-width">(.*?)</pre>', dom, re.S)
    if m is None:
        print("the page did not render (no measurement in the DOM)", file=sys.stderr)
        return 1
    head, *outside = html.unescape(m.group(1)).splitlines()
    view, scroll = map(int, head.split())
    print(f"{page}: viewport {view} px, page {scroll} px wide")
    for line in outside:
        print(f"  sticks out: {line}")
    return 0 if scroll <= view else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
