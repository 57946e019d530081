#!/usr/bin/env bash
# Regenerates the screenshots in docs/ from what the repo holds, in headless Chromium (Debian's `chromium`, as the
# browser test uses: collector/tests/html_check.py takes each one):
#   docs/html-report.png      the demo's trace (`vramtrace demo --out`), exported as HTML, stacked by call site
#   docs/html-report-oom.png  the GPU fixture keep.vtrace (PyTorch under a 6 GiB cap): an error and its post-mortem
#   docs/html-report-gpu.png  the GPU fixture backward.vtrace (a training run on the H100), stacked by process
#   docs/memory-viz-page-{timeline,history}.png, only with MEMORY_VIZ=PATH/MemoryViz.js and D3=NODE_MODULES (see
#     scripts/memory_viz_page.py: PyTorch's page, from an installed torch, is not part of vramtrace), from the
#     memory-viz export of the GPU fixture verdict_growth.vtrace with PyTorch's history beside it
# Usage: scripts/screenshots.sh [BIN_DIR]   (BIN_DIR: a built vramtrace; default: cargo build --release first)
# Exit: 0 all taken, 1 a step failed (its message on stderr), 2 no browser.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -n "${1:-}" ]; then
    vt="$(cd "$1" && pwd)/vramtrace"
else
    cargo build --release --quiet
    vt="$root/target/release/vramtrace"
fi
browser="${VRAMTRACE_CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$browser" ]; then
    echo "screenshots.sh: no chromium (apt-get install chromium, or VRAMTRACE_CHROMIUM=PATH)" >&2
    exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
shot() { # TRACE PNG VIEW
    rm -f "$work/page.html"
    "$vt" export "$1" --format html --out "$work/page.html" >/dev/null
    python3 collector/tests/html_check.py "$work/page.html" --browser "$browser" --screenshot "$2" \
        --width 1400 --height 880 --view "$3" >/dev/null
    echo "screenshots.sh: $2 (from $1, view $3)"
}
"$vt" demo --out "$work/demo.vtrace" >/dev/null 2>&1
shot "$work/demo.vtrace" docs/html-report.png sites
shot collector/tests/fixtures/gpu/keep.vtrace docs/html-report-oom.png processes
shot collector/tests/fixtures/gpu/backward.vtrace docs/html-report-gpu.png processes
if [ -n "${MEMORY_VIZ:-}" ] && [ -n "${D3:-}" ]; then
    "$vt" export collector/tests/fixtures/gpu/verdict_growth.vtrace --format memory-viz --out "$work/mv.pickle" \
        >/dev/null
    python3 scripts/memory_viz_page.py "$work/mv.pickle" --memory-viz "$MEMORY_VIZ" --d3 "$D3" \
        --browser "$browser" --screenshot-dir "$work/mv" >/dev/null
    for pair in timeline:active-memory-timeline history:allocator-state-history; do
        view=${pair%%:*} f="$work/mv/${pair#*:}-gpu0.png"
        [ -f "$f" ] || { echo "screenshots.sh: memory_viz drew no $view view" >&2; exit 1; }
        cp "$f" "docs/memory-viz-page-$view.png"
        echo "screenshots.sh: docs/memory-viz-page-$view.png"
    done
else
    echo "screenshots.sh: memory-viz pages kept as they are (set MEMORY_VIZ and D3 to retake them)"
fi
