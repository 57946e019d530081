#!/usr/bin/env python3
"""Loads a page of `vramtrace export --format html` in headless Chromium and checks that it works.

    html_check.py PAGE [--browser PATH] [--width W] [--height H] [--screenshot OUT.png [--full] [--view MODE]]
                  [--text]

Drives the browser over the DevTools protocol on a pipe (`--remote-debugging-pipe`; standard library only) and
fails (exit 1, the reasons on stderr) on:
- any console error, uncaught exception or error logged by the browser (a Content-Security-Policy violation
  among them);
- any request for something other than the page itself (the page must load nothing);
- the page not saying it is ready (`document.body.dataset.ready = "N plots"`) within the time limit;
- a plot whose plotting area has no coloured pixels (its data did not draw), in each of its views (the
  "stacked by" buttons are clicked in turn).
Prints a JSON summary on stdout: ready, per plot its canvas size and coloured pixels per view, the errors.
"""

import argparse
import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]

# Per plot, the pixels of its plotting area that carry colour (fills and coloured lines; the grid and axes are
# grey, the job's line nearly black).
PIXELS_JS = r"""
(() => {
  const out = [];
  for (const u of (window.vramtrace ? window.vramtrace.plots : [])) {
    const c = u.ctx.canvas, b = u.bbox;
    const d = u.ctx.getImageData(b.left, b.top, Math.max(1, b.width), Math.max(1, b.height)).data;
    let coloured = 0, painted = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] === 0) continue;
      painted++;
      const mx = Math.max(d[i], d[i + 1], d[i + 2]), mn = Math.min(d[i], d[i + 1], d[i + 2]);
      if (mx - mn > 30) coloured++;
    }
    out.push({ width: c.width, height: c.height, area: b.width * b.height, painted, coloured,
               series: u.series.length, points: u.data[0].length });
  }
  return out;
})()
"""


class Browser:
    def __init__(self, exe, log):
        self.ud = tempfile.mkdtemp(prefix="vramtrace-chromium-")
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()

        def fds():
            # The browser reads commands on fd 3 and writes answers on fd 4.
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.p = subprocess.Popen(
            [exe, *FLAGS, "--user-data-dir=" + self.ud, "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=fds,
            close_fds=False,
        )
        os.close(cmd_r)
        os.close(res_w)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        want = self.next_id
        deadline = time.time() + timeout
        while True:
            for m in self._read(deadline):
                if m.get("id") == want:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    return m.get("result", {})
                self.events.append(m)

    def pump(self, seconds):
        """Reads the events that arrive within `seconds`."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.events.extend(self._read(deadline, quiet=True))

    def _read(self, deadline, quiet=False):
        left = deadline - time.time()
        if left <= 0:
            if quiet:
                return []
            raise TimeoutError("the browser did not answer in time")
        r, _, _ = select.select([self.res_r], [], [], left)
        if not r:
            if quiet:
                return []
            raise TimeoutError("the browser did not answer in time")
        chunk = os.read(self.res_r, 1 << 20)
        if not chunk:
            raise RuntimeError("the browser closed its pipe (it exited)")
        self.buf += chunk
        out = []
        while b"\0" in self.buf:
            one, self.buf = self.buf.split(b"\0", 1)
            out.append(json.loads(one))
        return out

    def close(self):
        try:
            os.write(self.cmd_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.p.wait(timeout=10)
        except Exception:
            self.p.kill()
            self.p.wait()
        shutil.rmtree(self.ud, ignore_errors=True)


def find_browser(given):
    for c in [given, os.environ.get("VRAMTRACE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def problems_in(events, page_url):
    errs = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errs.append("exception: " + (d.get("exception", {}).get("description") or d.get("text", "")))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errs.append("console.%s: %s" % (p["type"], " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errs.append("browser log: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
        elif m == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if url != page_url and not url.startswith("about:"):
                errs.append("request: " + url)
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("--browser")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--screenshot")
    ap.add_argument("--full", action="store_true", help="the screenshot holds the whole page")
    ap.add_argument("--view", default="processes", help="the view of the screenshot: processes, sites, alone")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--text", action="store_true", help="the summary holds the page's text as shown (`text`)")
    a = ap.parse_args()
    exe = find_browser(a.browser)
    if not exe:
        print("html_check: no chromium found (set VRAMTRACE_CHROMIUM)", file=sys.stderr)
        return 3
    page_url = "file://" + os.path.abspath(a.page)
    log = tempfile.TemporaryFile()
    b = Browser(exe, log)
    errors, summary = [], {}
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for d in ("Runtime", "Log", "Network", "Page"):
            b.send(d + ".enable", session=s)
        b.send("Emulation.setDeviceMetricsOverride",
               {"width": a.width, "height": a.height, "deviceScaleFactor": 1, "mobile": False}, session=s)
        b.send("Page.navigate", {"url": page_url}, session=s)
        deadline = time.time() + a.timeout
        ready = ""
        while time.time() < deadline:
            r = b.send("Runtime.evaluate", {"expression": "document.body && document.body.dataset.ready || ''",
                                            "returnByValue": True}, session=s)
            ready = r.get("result", {}).get("value") or ""
            if ready:
                break
            b.pump(0.1)
        summary["ready"] = ready
        if not ready:
            errors.append("the page did not say it was ready within %.0f s" % a.timeout)
        else:
            b.pump(0.3)

            def pixels():
                r = b.send("Runtime.evaluate", {"expression": PIXELS_JS, "returnByValue": True}, session=s)
                return r.get("result", {}).get("value") or []

            views = {"processes": pixels()}
            modes = b.send("Runtime.evaluate", {"expression": "[...new Set([...document.querySelectorAll('button[data-mode]')].map(b => b.dataset.mode))]",
                                                "returnByValue": True}, session=s)["result"]["value"]
            for mode in [m for m in modes if m != "processes"] + ["processes"]:
                b.send("Runtime.evaluate", {"expression": "document.querySelectorAll('button[data-mode=\"%s\"]').forEach(b => b.click())" % mode}, session=s)
                b.pump(0.2)
                views[mode] = pixels()
            summary["modes"] = modes
            n = int(ready.split()[0])
            summary["plots"] = views["processes"]
            if len(views["processes"]) != n:
                errors.append("the page says %s but holds %d" % (ready, len(views["processes"])))
            for mode, plots in views.items():
                for i, p in enumerate(plots):
                    if p["coloured"] < max(50, p["area"] // 1000):
                        errors.append("plot %d drew no data in view %r: %s" % (i, mode, p))
            summary["coloured"] = {m: [p["coloured"] for p in v] for m, v in views.items()}
            if a.text:
                r = b.send("Runtime.evaluate", {"expression": "document.body.innerText", "returnByValue": True}, session=s)
                summary["text"] = r.get("result", {}).get("value") or ""
            if a.screenshot:
                b.send("Runtime.evaluate", {"expression": "document.querySelectorAll('button[data-mode=\"%s\"]').forEach(b => b.click())" % a.view}, session=s)
                b.pump(0.3)
                if a.full:
                    m = b.send("Page.getLayoutMetrics", session=s)
                    h = int(m.get("cssContentSize", m.get("contentSize"))["height"])
                    b.send("Emulation.setDeviceMetricsOverride",
                           {"width": a.width, "height": h, "deviceScaleFactor": 1, "mobile": False}, session=s)
                    b.pump(0.5)
                shot = b.send("Page.captureScreenshot", {"format": "png"}, session=s)
                with open(a.screenshot, "wb") as f:
                    f.write(base64.b64decode(shot["data"]))
        errors += problems_in(b.events, page_url)
    except Exception as e:  # noqa: BLE001 - any failure of the harness is a failure of the check
        errors.append("harness: %r" % e)
    finally:
        b.close()
    summary["errors"] = errors
    print(json.dumps(summary))
    if errors:
        log.seek(0)
        tail = log.read()[-4000:].decode(errors="replace")
        print("html_check: FAILED\n  " + "\n  ".join(errors) + "\n--- browser output (tail) ---\n" + tail, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
