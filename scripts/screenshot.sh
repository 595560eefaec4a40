#!/usr/bin/env bash
# The first screen (1280 x 800) of a conformance HTML report as headless Chromium shows it: the
# verdict banner, the per-tier counts and the performance chart must all be in it.
#     bash scripts/screenshot.sh [BACKEND] [OUT_DIR]      (default: cpu, screenshots/)
# Needs Chromium (Debian: apt-get install chromium) and portkit installed (scripts/setup.sh).
set -euo pipefail
backend=${1:-cpu}
out=$(realpath -m "${2:-screenshots}")
mkdir -p "$out"
portkit conform --backend "$backend" --quick --html "$out/$backend.html" > "$out/$backend.log" \
    || echo "portkit conform exited $? (see $out/$backend.log); the report still shows it"
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome) || {
    echo "no Chromium here: apt-get install chromium" >&2; exit 2; }
"$browser" --headless --no-sandbox --hide-scrollbars --window-size=1280,800 \
    --screenshot="$out/$backend.png" "file://$out/$backend.html" 2> /dev/null
echo "$out/$backend.png: the report's first screen"
