#!/usr/bin/env bash
# docs/img/notebook.png from the notebook scripts/gpu/notebook.sh executed on the GPU machine, made HERE (no GPU):
# the executed .ipynb rendered by nbconvert's classic template (its <pre> is monospace; the default lab template's
# `.jp-OutputArea-output pre { font-family: inherit }` sets the magics' text in the page's proportional font), the
# failed cell's traceback put in a scrolled box at its end (as Jupyter shows a long output; the only change to the
# page), then headless chromium at 1200x1800, reduced to 128 colours.
#   Usage: bash scripts/gpu/notebook_shot.sh EXECUTED.ipynb [OUT.png]   (default docs/img/notebook.png)
#   Needs: a venv with nbconvert and pillow (NBC, default /tmp/nbc: `python3 -m venv /tmp/nbc && /tmp/nbc/bin/pip
#   install nbconvert pillow`) and chromium.
set -eu
NB=$(realpath "$1")
PNG=$(realpath -m "${2:-$(dirname "$0")/../../docs/img/notebook.png}")
NBC=${NBC:-/tmp/nbc}
W=$(mktemp -d /tmp/vt-nbshot.XXXX)
cp "$NB" "$W/notebook.ipynb"
"$NBC/bin/jupyter" nbconvert --to html --template classic --output page "$W/notebook.ipynb" >/dev/null 2>&1
"$NBC/bin/python" - "$W/page.html" "$W/shot.html" <<'PY'
import sys
s = open(sys.argv[1]).read()
inj = """<style>div.output_error { max-height: 190px; overflow-y: auto; }</style>
<script>window.addEventListener('load', function () {
  document.querySelectorAll('div.output_error').forEach(function (e) { e.scrollTop = e.scrollHeight; });
});</script>
</head>"""
assert s.count("</head>") == 1
open(sys.argv[2], "w").write(s.replace("</head>", inj))
PY
timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$W/shot.png" \
    --window-size=1200,1800 "file://$W/shot.html" >/dev/null 2>&1
mkdir -p "$(dirname "$PNG")"
"$NBC/bin/python" -c "
import sys
from PIL import Image
im = Image.open(sys.argv[1]).convert('RGB')
im.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(sys.argv[2], optimize=True)
" "$W/shot.png" "$PNG"
rm -rf "$W"
ls -la "$PNG"
