#!/usr/bin/env bash
# Render a loopscale report page in headless Chromium and save a screenshot (docs/report.md).
#
#   bench/render_report.sh REPORT_DIR [SCREENSHOT.png] [WIDTHxHEIGHT]
#
# Checks that the page renders without network access (every URL but file:// is blocked) and that the
# screenshot is not blank. Needs chromium (Debian: apt-get install -y chromium); exits 3 if it is absent.
set -euo pipefail
dir=${1:?usage: bench/render_report.sh REPORT_DIR [SCREENSHOT.png] [WIDTHxHEIGHT]}
shot=${2:-$dir/screenshot.png}
size=${3:-1280x2000}
page=$(cd "$dir" && pwd)/index.html
[[ -f $page ]] || { echo "no index.html in $dir" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[[ -n $browser ]] || { echo "chromium not found (apt-get install -y chromium)" >&2; exit 3; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
  --host-resolver-rules="MAP * ~NOTFOUND" --window-size="${size/x/,}" --screenshot="$shot" "file://$page" \
  >"$profile/log" 2>&1 || { cat "$profile/log" >&2; exit 1; }
python3 - "$shot" <<'PY'
# stdlib only: decompress the PNG's pixel data; a blank page filters to (almost) all zero bytes.
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width, height = 8, b"", 0, 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    if kind == b"IHDR":
        width, height = struct.unpack(">II", data[pos + 8:pos + 16])
    elif kind == b"IDAT":
        idat += data[pos + 8:pos + 8 + n]
    pos += 12 + n
raw = zlib.decompress(idat)
busy = sum(1 for b in raw if b) / len(raw)
print(f"{sys.argv[1]}: {width}x{height} px, {busy:.1%} non-zero filtered bytes")
sys.exit(0 if busy > 0.01 else "screenshot is blank")
PY
