#!/usr/bin/env bash
# The first screen (1280 x 800) of a conformance HTML report as headless Chromium shows it: the
# verdict banner, the per-tier counts and the performance chart must all be in it; then the same
# of each benchmark chart named (an SVG or PNG that benchmarks/charts.py drew).
#     bash scripts/screenshot.sh [BACKEND] [OUT_DIR] [CHART ...]   (default: cpu, screenshots/)
# Needs Chromium (Debian: apt-get install chromium) and portkit installed (scripts/setup.sh).
set -euo pipefail
backend=${1:-cpu}
out=$(realpath -m "${2:-screenshots}")
charts=("${@:3}")
mkdir -p "$out"
portkit conform --backend "$backend" --quick --html "$out/$backend.html" > "$out/$backend.log" \
    || echo "portkit conform exited $? (see $out/$backend.log); the report still shows it"
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome) || {
    echo "no Chromium here: apt-get install chromium" >&2; exit 2; }
"$browser" --headless --no-sandbox --hide-scrollbars --window-size=1280,800 \
    --screenshot="$out/$backend.png" "file://$out/$backend.html" 2> /dev/null
echo "$out/$backend.png: the report's first screen"
for chart in "${charts[@]}"; do
    shot="$out/$(basename "$chart").png"
    "$browser" --headless --no-sandbox --hide-scrollbars --window-size=1280,800 \
        --screenshot="$shot" "file://$(realpath "$chart")" 2> /dev/null
    echo "$shot: the chart's first screen"
done
