#!/usr/bin/env python3
"""Loads a snapshot pickle (`vramtrace export --format memory-viz`) into PyTorch's own memory_viz page script
(torch/utils/viz/MemoryViz.js, as pytorch.org/memory_viz runs it) in headless Chromium, offline, and checks that
every view of every device draws without an error.

    memory_viz_page.py PICKLE --memory-viz PATH/MemoryViz.js --d3 NODE_MODULES [--browser PATH] [--screenshot-dir D]

MemoryViz.js is PyTorch's (take it from an installed torch: torch/utils/viz/MemoryViz.js); it is not part of
vramtrace. It imports d3 5 and four d3 modules from cdn.skypack.dev: an import map points them at a local
`npm install d3@5 d3-axis@1 d3-scale@1 d3-zoom@1 d3-brush@1` (NODE_MODULES), served from 127.0.0.1 with the
extension-less module paths d3 1.x uses resolved as a bundler would. Nothing is fetched from elsewhere (a
request that is not to the local server is an error).

For each device that has events or segments, and each of the page's three views ("Active Memory Timeline",
"Allocator State History", "Active Cached Segment Timeline"), it loads the snapshot with the page's own
`add_local_files`, selects the device, and fails (exit 1, reasons on stderr) on any uncaught exception or console
error, or a view that drew nothing (no SVG shapes). Prints a JSON summary on stdout.
"""

import argparse
import base64
import http.server
import json
import os
import pickle
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "collector", "tests"))
from html_check import Browser, find_browser  # noqa: E402

VIEWS = ["Active Memory Timeline", "Allocator State History", "Active Cached Segment Timeline"]
SKYPACK = "https://cdn.skypack.dev/"


def module_path(pkg_dir, url_dir):
    with open(os.path.join(pkg_dir, "package.json")) as f:
        j = json.load(f)
    entry = j.get("module") or j.get("main") or "index.js"
    return url_dir + "/" + entry.lstrip("./")


def import_map(nm):
    """Bare d3 specifiers to their ES sources, nested versions scoped to the package that needs them, and the
    skypack URLs MemoryViz.js imports to the top-level packages."""
    imports, scopes = {}, {}
    for name in sorted(os.listdir(nm)):
        pkg = os.path.join(nm, name)
        if not os.path.isfile(os.path.join(pkg, "package.json")):
            continue
        imports[name] = module_path(pkg, "/nm/" + name)
        nested = os.path.join(pkg, "node_modules")
        if os.path.isdir(nested):
            scope = {}
            for dep in sorted(os.listdir(nested)):
                d = os.path.join(nested, dep)
                if os.path.isfile(os.path.join(d, "package.json")):
                    scope[dep] = module_path(d, "/nm/%s/node_modules/%s" % (name, dep))
            scopes["/nm/%s/" % name] = scope
    for spec in ["d3@5", "d3-axis@1", "d3-scale@1", "d3-zoom@1", "d3-brush@1"]:
        imports[SKYPACK + spec] = imports[spec.split("@")[0]]
    return {"imports": imports, "scopes": scopes}


def serve(root):
    class H(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=root, **k)

        def log_message(self, *a):
            pass

        def translate_path(self, path):
            p = super().translate_path(path)
            # d3 1.x imports "./bisect" and "./src": resolve as a bundler would.
            for cand in (p, p + ".js", os.path.join(p, "index.js")):
                if os.path.isfile(cand):
                    return cand
            return p

        def guess_type(self, path):
            return "text/javascript" if path.endswith(".js") else super().guess_type(path)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<script type="importmap">%s</script></head><body>
<script type="module">
import {add_local_files} from "/MemoryViz.js";
const b64 = await (await fetch("/snapshot.b64")).text();
add_local_files([{name: "snapshot", base64: b64}], new URLSearchParams(location.search).get("view"));
window.__loaded = true;
</script></body></html>"""

# Selects device `d` in the page's third <select> (its device picker) and counts what the shown view drew.
SELECT_JS = """
(() => {
  const sels = document.querySelectorAll('body > select');
  const gpu = sels[2];
  const opts = [...gpu.options].map(o => o.text);
  if (!opts.includes('%d')) return {options: opts, shapes: -1};
  gpu.value = '%d';
  gpu.dispatchEvent(new Event('change'));
  const shown = [...document.querySelectorAll('body > div')].filter(d => d.style.display !== 'none');
  let shapes = 0;
  for (const d of shown) shapes += d.querySelectorAll('svg rect, svg polygon, pre').length;
  return {options: opts, shapes};
})()
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pickle")
    ap.add_argument("--memory-viz", required=True)
    ap.add_argument("--d3", required=True, help="node_modules holding d3@5 and the d3 modules MemoryViz.js imports")
    ap.add_argument("--browser")
    ap.add_argument("--screenshot-dir")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    exe = find_browser(a.browser)
    if not exe:
        print("memory_viz_page: no chromium found (set VRAMTRACE_CHROMIUM)", file=sys.stderr)
        return 3
    raw = open(a.pickle, "rb").read()
    snap = pickle.loads(raw)
    with_segments = {s["device"] for s in snap["segments"]}
    devices = [i for i, t in enumerate(snap["device_traces"]) if t or i in with_segments]

    root = tempfile.mkdtemp(prefix="vramtrace-mv-")
    os.symlink(os.path.abspath(a.d3), os.path.join(root, "nm"))
    os.symlink(os.path.abspath(a.memory_viz), os.path.join(root, "MemoryViz.js"))
    with open(os.path.join(root, "snapshot.b64"), "w") as f:
        f.write(base64.b64encode(raw).decode())
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write(PAGE % json.dumps(import_map(a.d3)))
    srv = serve(root)
    base = "http://127.0.0.1:%d/" % srv.server_address[1]

    log = tempfile.TemporaryFile()
    b = Browser(exe, log)
    errors, summary = [], {"devices": devices, "views": {}}
    try:
        for view in VIEWS:
            target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for d in ("Runtime", "Log", "Network", "Page"):
                b.send(d + ".enable", session=s)
            b.send("Emulation.setDeviceMetricsOverride",
                   {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=s)
            start = len(b.events)
            b.send("Page.navigate", {"url": base + "index.html?view=" + view.replace(" ", "%20")}, session=s)
            deadline = time.time() + a.timeout
            loaded = False
            while time.time() < deadline and not loaded:
                r = b.send("Runtime.evaluate", {"expression": "window.__loaded === true", "returnByValue": True},
                           session=s)
                loaded = r.get("result", {}).get("value") is True
                b.pump(0.1)
            if not loaded:
                errors.append("%s: the page did not load the snapshot within %.0f s" % (view, a.timeout))
            per_dev = {}
            for dev in devices:
                r = b.send("Runtime.evaluate", {"expression": SELECT_JS % (dev, dev), "returnByValue": True},
                           session=s)
                b.pump(0.5)
                got = r.get("result", {}).get("value") or {}
                per_dev[dev] = got.get("shapes", -1)
                if got.get("shapes", -1) <= 0:
                    errors.append("%s: device %d drew nothing (%s)" % (view, dev, got))
                if a.screenshot_dir:
                    shot = b.send("Page.captureScreenshot", {"format": "png"}, session=s)
                    os.makedirs(a.screenshot_dir, exist_ok=True)
                    name = "%s-gpu%d.png" % (view.lower().replace(" ", "-"), dev)
                    with open(os.path.join(a.screenshot_dir, name), "wb") as f:
                        f.write(base64.b64decode(shot["data"]))
            for e in b.events[start:]:
                m, p = e.get("method"), e.get("params", {})
                if m == "Runtime.exceptionThrown":
                    d = p.get("exceptionDetails", {})
                    errors.append("%s: exception: %s" % (
                        view, d.get("exception", {}).get("description") or d.get("text", "")))
                elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    errors.append("%s: console.%s: %s" % (view, p["type"], " ".join(
                        str(x.get("value", x.get("description", ""))) for x in p.get("args", []))))
                elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                    errors.append("%s: browser log: %s %s" % (view, p["entry"].get("text", ""), p["entry"].get("url", "")))
                elif m == "Network.requestWillBeSent":
                    url = p.get("request", {}).get("url", "")
                    if not url.startswith(base) and not url.startswith("about:"):
                        errors.append("%s: request outside the local server: %s" % (view, url))
            summary["views"][view] = per_dev
            b.send("Target.closeTarget", {"targetId": target})
    finally:
        b.close()
        srv.shutdown()
    summary["errors"] = errors
    print(json.dumps(summary))
    if errors:
        for e in errors:
            print("memory_viz_page: " + e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
