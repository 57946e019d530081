// The page of `vramtrace export --format html` (collector/src/reporters/html.rs writes it around this script):
// reads the JSON in #vramtrace-data and draws it with uPlot (embedded in the page). Loads nothing.
// When every plot is drawn, document.body.dataset.ready says "N plots" (the browser test waits for it).
(function () {
  "use strict";
  // A legend entry fits on one line: C++ frames can run to hundreds of characters (the tables hold them whole).
  function short(name) {
    return name.length > 96 ? name.slice(0, 93) + "\u2026" : name;
  }
  var plots = [];
  // One section per trace: several traces of one job (one per node) each draw their own, on their own clock.
  var blocks = [document.getElementById("vramtrace-data")]
    .concat(Array.prototype.slice.call(document.querySelectorAll("script.vramtrace-data")));
  var root = document.getElementById("app");
  var hosts = blocks.map(function (b, i) {
    var D = JSON.parse(b.textContent);
    var app = root;
    if (blocks.length > 1) {
      app = document.createElement("section");
      app.className = "host";
      root.appendChild(app);
    }
    render(D, app, blocks.length > 1 ? " " + i : "");
    return D;
  });

  // `key`: what keeps this section's cursor to itself (hostnames may repeat).
  function render(D, app, key) {
  if (D.host !== undefined) {
    app.appendChild(el("h2", { cls: "host", text: "Host " + D.host + " (its clock starts at +" +
      secs(D.host_offset_ns) + " on the job's)" }));
  }

  // ---- formatting ----
  var UNITS = [["TiB", Math.pow(2, 40)], ["GiB", Math.pow(2, 30)], ["MiB", Math.pow(2, 20)], ["KiB", 1024]];
  // `bytes` and `secs` write sizes and times as the text report does (collector/src/units.rs): in integers,
  // sizes in hundredths of their unit and times in milliseconds from the run's start, rounded half up.
  function pad(n, w) { var s = String(n); while (s.length < w) s = "0" + s; return s; }
  function bytes(b) {
    if (b === null || b === undefined) return "";
    for (var i = 0; i < UNITS.length; i++) {
      if (b >= UNITS[i][1]) {
        var h = Math.round(b * 100 / UNITS[i][1]);
        return Math.floor(h / 100) + "." + pad(h % 100, 2) + " " + UNITS[i][0];
      }
    }
    return b + " B";
  }
  function axisBytes(u, vals) {
    var top = Math.max.apply(null, vals.map(Math.abs).concat([1]));
    var unit = ["B", 1];
    for (var i = 0; i < UNITS.length; i++) {
      if (top >= UNITS[i][1]) { unit = UNITS[i]; break; }
    }
    return vals.map(function (v) {
      var x = v / unit[1];
      return (Math.abs(x) >= 100 || x === Math.round(x) ? x.toFixed(0) : x.toFixed(1)) + " " + unit[0];
    });
  }
  function secs(ns) {
    if (ns === null || ns === undefined) return "";
    var ms = Math.floor(ns / 1e6) + (ns % 1e6 >= 5e5 ? 1 : 0);
    return Math.floor(ms / 1000) + "." + pad(ms % 1000, 3) + " s";
  }
  function span(ns) {
    if (ns < 1e6) return (ns / 1e3).toPrecision(3) + " \u00b5s";
    if (ns < 1e9) return (ns / 1e6).toPrecision(3) + " ms";
    return (ns / 1e9).toPrecision(3) + " s";
  }
  // Ticks of the bytes axis: 1, 2, 4, ... 512 of a binary unit.
  var BYTE_INCRS = [];
  [1, 1024, Math.pow(2, 20), Math.pow(2, 30), Math.pow(2, 40)].forEach(function (u) {
    for (var k = 1; k <= 512; k *= 2) BYTE_INCRS.push(k * u);
  });
  function count(n) {
    return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  }

  // ---- DOM helpers (text only: nothing from the trace is parsed as HTML) ----
  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (k === "text") e.textContent = attrs[k];
        else if (k === "cls") e.className = attrs[k];
        else e.setAttribute(k, attrs[k]);
      }
    }
    (kids || []).forEach(function (c) {
      if (c !== null && c !== undefined) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return e;
  }
  function table(heads, rows, numeric) {
    var t = el("table");
    t.appendChild(el("thead", null, [el("tr", null, heads.map(function (h, i) {
      return el("th", { text: h, cls: numeric && numeric[i] ? "num" : "" });
    }))]));
    var tb = el("tbody");
    rows.forEach(function (r) {
      tb.appendChild(el("tr", null, r.map(function (c, i) {
        return el("td", { text: c === null || c === undefined ? "" : String(c), cls: numeric && numeric[i] ? "num" : "" });
      })));
    });
    t.appendChild(tb);
    return t;
  }

  // ---- colours ----
  var HUES = [210, 30, 130, 280, 0, 180, 55, 320, 95, 245, 15, 160];
  function colour(i, name) {
    if (/^other|^no call site|other processes$/.test(name)) return { fill: "#d4d4d4", stroke: "#8a8a8a" };
    var h = HUES[i % HUES.length];
    var l = i >= HUES.length ? 80 : 72;
    return { fill: "hsl(" + h + ",62%," + l + "%)", stroke: "hsl(" + h + ",55%,38%)" };
  }

  // ---- header ----
  var head = el("header", null, [
    el("h1", null, ["vramtrace ", el("span", { cls: "cmd", text: D.command || "(no command)" })]),
    el("p", { cls: "meta", text: [
      "over " + secs(D.end_ns),
      count(D.events) + " events",
      D.processes.length + " process" + (D.processes.length === 1 ? "" : "es"),
      D.devices.length + " device" + (D.devices.length === 1 ? "" : "s"),
      D.oom_records + " out-of-memory error" + (D.oom_records === 1 ? "" : "s"),
      D.refusals_recovered ? D.refusals_recovered + " refusal" + (D.refusals_recovered === 1 ? "" : "s") + " recovered from" : null,
      D.made_by
    ].filter(function (x) { return x !== null; }).join("  \u00b7  ") })
  ]);
  app.appendChild(head);
  if (D.partial) {
    app.appendChild(el("p", { cls: "warn", text: "Partial trace: " + D.partial + ". What follows covers what was recorded before that point." }));
  }
  if (D.notes.length) {
    app.appendChild(el("ul", { cls: "notes" }, D.notes.map(function (n) { return el("li", { text: "note: " + n }); })));
  }

  // ---- one plot per device ----
  var syncing = false;
  function syncX(u) {
    if (syncing) return;
    syncing = true;
    var x = u.scales.x;
    plots.forEach(function (p) {
      if (p.u !== u && p.u && p.D === D) p.u.setScale("x", { min: x.min, max: x.max });
    });
    syncing = false;
  }

  // One error's verdict, structured: the cause and why, its line, the figures that prove it, findings, advice;
  // the whole text of `vramtrace oom --full` folded below.
  function verdict(box, pm) {
    box.appendChild(el("h4", { text: "Cause: " + pm.cause + " (" + pm.cause_title + ")" }));
    box.appendChild(el("p", { text: "Because " + pm.reason + "." }));
    if (pm.line) box.appendChild(el("p", { cls: "line", text: "Line: " + pm.line }));
    box.appendChild(table(["figure", "bytes"], pm.figures));
    if (pm.findings.length) {
      box.appendChild(el("h5", { text: "Findings" }));
      box.appendChild(el("ul", null, pm.findings.map(function (f) { return el("li", { text: f }); })));
    }
    box.appendChild(el("h5", { text: "Advice" }));
    box.appendChild(el("ol", null, pm.advice.map(function (a) { return el("li", { text: a }); })));
    var more = el("details", null, [el("summary", { text: "the whole post-mortem" }), el("pre", { text: pm.text })]);
    box.appendChild(more);
  }

  function markerPlugin(dev) {
    return {
      hooks: {
        draw: [function (u) {
          var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height, dpr = window.devicePixelRatio || 1, lastLabel = -1e9;
          dev.ooms.forEach(function (m, k) {
            var x = u.valToPos(m.t_ns / 1e9, "x", true);
            if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) return;
            var sel = dev.selected === k;
            ctx.save();
            // Errors red (amber when the cap refused); refusals the program recovered from grey.
            ctx.strokeStyle = m.recovered ? "#9ca3af" : m.cap_refused ? "#b45309" : "#dc2626";
            ctx.lineWidth = (sel ? 2.5 : 1.5) * dpr;
            ctx.setLineDash([4 * dpr, 3 * dpr]);
            ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
            ctx.setLineDash([]);
            ctx.fillStyle = ctx.strokeStyle;
            var s = (sel ? 8 : 6) * dpr;
            ctx.beginPath(); ctx.moveTo(x - s, top); ctx.lineTo(x + s, top); ctx.lineTo(x, top + 1.6 * s); ctx.closePath(); ctx.fill();
            ctx.font = (11 * dpr) + "px sans-serif";
            if (sel || (!m.recovered && !m.folded && x - lastLabel > 48 * dpr)) {
              ctx.fillText(m.recovered || m.folded ? "refusal" : "OOM " + (m.n), x + s + 2 * dpr, top + 11 * dpr);
              lastLabel = x;
            }
            ctx.restore();
          });
        }]
      }
    };
  }

  function buildSeries(dev, mode) {
    // The plot starts a bucket before the first memory (or error) on the device: the job's start-up is empty.
    var bs = dev.bucket_ns / 1e9, lead = dev.job.findIndex(function (v) { return v > 0; });
    if (lead < 0) lead = dev.job.length;
    dev.ooms.forEach(function (m) { lead = Math.min(lead, Math.floor(m.t_ns / dev.bucket_ns)); });
    lead = Math.max(0, Math.min(lead - 1, dev.job.length - 2));
    var n = dev.job.length - lead;
    var xs = new Array(n + 1);
    for (var i = 0; i <= n; i++) xs[i] = (lead + i) * bs;
    function ext(a) { var b = a.slice(lead); b.push(b.length ? b[b.length - 1] : 0); return b; }
    var data = [xs], series = [{ label: "time", value: function (u, v) { return v === null ? "" : secs(Math.round(v * 1e9)); } }];
    var parts = mode === "sites" ? dev.sites : dev.processes;
    var step = uPlot.paths.stepped({ align: 1 });
    if (mode === "alone") {
      dev.processes.forEach(function (p, k) {
        var own = p.at.slice();
        p.peaks.forEach(function (iv) { own[iv[0]] = iv[1]; });
        var c = colour(k, p.name);
        data.push(ext(own));
        series.push({ label: short(p.name), stroke: c.stroke, width: 1.5, paths: step, value: function (u, v) { return bytes(v); } });
      });
    } else {
      // Stacked: cumulative sums, drawn from the top one down, each filled to 0 over the one before.
      var cum = [], run = new Array(dev.job.length).fill(0);
      parts.forEach(function (p) {
        run = run.map(function (v, i) { return v + p.at[i]; });
        cum.push(run);
      });
      for (var k = parts.length - 1; k >= 0; k--) {
        (function (k) {
          var c = colour(k, parts[k].name), raw = ext(parts[k].at);
          data.push(ext(cum[k]));
          series.push({
            label: short(parts[k].name), stroke: c.stroke, fill: c.fill, width: 1, paths: step,
            value: function (u, v, si, di) { return di === null || di === undefined ? "" : bytes(raw[di]); }
          });
        })(k);
      }
    }
    var job = ext(dev.job);
    data.push(job);
    series.push({ label: "job (bucket maximum)", stroke: "#111827", width: 1.5, paths: step, value: function (u, v) { return bytes(v); } });
    if (dev.framework) {
      // The framework's own figures beside the driver's: the tensors, and what its cache holds.
      data.push(ext(dev.framework.allocated));
      series.push({ label: dev.framework.name + " allocated", stroke: "#7c3aed", width: 2, paths: step, value: function (u, v) { return bytes(v); } });
      data.push(ext(dev.framework.reserved));
      series.push({ label: dev.framework.name + " reserved", stroke: "#7c3aed", width: 1.5, dash: [6, 3], paths: step, value: function (u, v) { return bytes(v); } });
    }
    var flat = function (v) { var a = new Array(n + 1); for (var i = 0; i <= n; i++) a[i] = v; return a; };
    if (dev.cap_bytes !== null) {
      data.push(flat(dev.cap_bytes));
      series.push({ label: "cap " + bytes(dev.cap_bytes), stroke: "#dc2626", width: 1.5, dash: [8, 5], points: { show: false }, value: function () { return bytes(dev.cap_bytes); } });
    }
    if (dev.total_bytes !== null) {
      data.push(flat(dev.total_bytes));
      series.push({ label: "device " + bytes(dev.total_bytes), stroke: "#6b7280", width: 1.5, dash: [2, 4], points: { show: false }, value: function () { return bytes(dev.total_bytes); } });
    }
    // Where the legend rests when the cursor is elsewhere: the job's highest bucket (its peak), so its values
    // read without hovering.
    var peakIdx = 0;
    for (var j = 1; j < job.length; j++) if (job[j] > job[peakIdx]) peakIdx = j;
    return { data: data, series: series, peakIdx: peakIdx };
  }

  // Time-axis labels with as many decimals as the tick spacing needs (0.002 s, not 0.0020000000000000005 s), so
  // that a short run's labels do not run into each other.
  function axisSecs(u, vals, axisIdx, space, incr) {
    var d = incr > 0 ? Math.max(0, Math.min(9, -Math.floor(Math.log10(incr) + 1e-9))) : 3;
    return vals.map(function (v) { return v.toFixed(d) + " s"; });
  }

  function yRange(dev) {
    var top = Math.max(dev.peak_bytes || 0, dev.cap_bytes || 0, 1);
    if (dev.total_bytes !== null && dev.total_bytes < 3 * top) top = Math.max(top, dev.total_bytes);
    return [0, top * 1.08];
  }

  function drawPlot(p) {
    var dev = p.dev, box = p.box;
    var b = buildSeries(dev, p.mode);
    var width = Math.max(320, box.clientWidth || 800);
    var opts = {
      width: width,
      height: 340,
      series: b.series,
      scales: { x: { time: false }, y: { range: function () { return yRange(dev); } } },
      axes: [
        { label: "seconds since the start", values: axisSecs, space: 60 },
        { values: axisBytes, size: 70, incrs: BYTE_INCRS }
      ],
      legend: { live: true },
      cursor: { sync: { key: "vramtrace" + key, setSeries: false }, drag: { x: true, y: false } },
      plugins: [markerPlugin(dev)],
      hooks: {
        setScale: [function (u, key) { if (key === "x") syncX(u); }],
        ready: [function (u) { u.setLegend({ idx: b.peakIdx }, false); }],
        setLegend: [function (u) { if (u.legend.idx === null || u.legend.idx === undefined) u.setLegend({ idx: b.peakIdx }, false); }]
      }
    };
    var x = p.u && p.u.scales.x;
    if (p.u) p.u.destroy();
    p.u = new uPlot(opts, b.data, box);
    if (x && x.min !== null && p.keepZoom) p.u.setScale("x", { min: x.min, max: x.max });
    p.u.over.addEventListener("click", function (ev) {
      var u = p.u, best = -1, bestD = 8;
      var left = ev.offsetX;
      dev.ooms.forEach(function (m, k) {
        var d = Math.abs(u.valToPos(m.t_ns / 1e9, "x") - left);
        if (d < bestD) { bestD = d; best = k; }
      });
      if (best >= 0) p.select(best);
    });
  }

  D.devices.forEach(function (dev) {
    dev.ooms = D.ooms.filter(function (m) { return m.device === dev.name; });
    // Errors are numbered; refusals the program recovered from are not.
    dev.ooms.forEach(function (m) { m.n = m.post_mortem !== null ? m.post_mortem + 1 : D.ooms.filter(function (x) { return !x.recovered && !x.folded; }).indexOf(m) + 1; });
    dev.selected = dev.ooms.length ? 0 : null;
    var sec = el("section", { cls: "device" });
    var facts = [
      "peak " + bytes(dev.peak_bytes) + (dev.peak_time_ns !== null ? " at " + secs(dev.peak_time_ns) : ""),
      dev.cap_bytes !== null ? "cap " + bytes(dev.cap_bytes) : null,
      dev.total_bytes !== null ? "device " + bytes(dev.total_bytes) : null,
      "live at end " + bytes(dev.live_bytes_at_end || 0),
      dev.in_use_bytes_at_end ? "in use when the trace ends " + bytes(dev.in_use_bytes_at_end) + " (processes still running)" : null,
      dev.headroom
    ].filter(Boolean).join("  \u00b7  ");
    sec.appendChild(el("h2", { text: dev.name }));
    sec.appendChild(el("p", { cls: "facts", text: facts }));
    var controls = el("div", { cls: "controls" }, [el("span", { text: "stacked by " })]);
    var modes = [["processes", "process"], ["sites", "call site"], ["alone", "each process alone"]];
    // The view to open with: `page.html#sites` or `#alone` (for links and screenshots).
    var first = location.hash.replace("#", "");
    var p = { dev: dev, mode: (first === "sites" && dev.sites.length) || first === "alone" ? first : "processes", u: null };
    var buttons = [];
    modes.forEach(function (m) {
      if (m[0] === "sites" && !dev.sites.length) return;
      var bt = el("button", { type: "button", text: m[1], "data-mode": m[0] });
      bt.addEventListener("click", function () {
        p.mode = m[0];
        p.keepZoom = true;
        buttons.forEach(function (x) { x.classList.toggle("on", x === bt); });
        drawPlot(p);
      });
      if (m[0] === p.mode) bt.classList.add("on");
      buttons.push(bt);
      controls.appendChild(bt);
    });
    if (!dev.sites.length) controls.appendChild(el("span", { cls: "hint", text: "(no call sites in this trace)" }));
    controls.appendChild(el("span", { cls: "hint", text: "drag to zoom (all devices" + (D.host === undefined ? "" : " of this host") + " follow), double-click to zoom out; each point is a bucket's maximum (" + span(dev.bucket_ns) + " wide), the parts as they were at that moment" }));
    sec.appendChild(controls);
    var row = el("div", { cls: dev.ooms.length ? "row with-side" : "row" });
    var box = el("div", { cls: "plot" });
    row.appendChild(box);
    p.box = box;
    if (dev.ooms.length) {
      var side = el("aside", { cls: "postmortem" });
      var list = el("div", { cls: "oomlist" });
      var text = el("div", { cls: "verdict" });
      var listButtons = [];
      p.select = function (k) {
        dev.selected = k;
        var m = dev.ooms[k];
        listButtons.forEach(function (b, i) { b.classList.toggle("on", i === k); });
        var pm = m.post_mortem !== null ? D.post_mortems[m.post_mortem] : null;
        text.textContent = "";
        if (pm) {
          verdict(text, pm);
        } else {
          text.appendChild(el("pre", { text: (m.recovered ? "Refused at " : "Out of memory at ") + secs(m.t_ns) + ": pid " + m.pid + " asked for " + bytes(m.requested_bytes) +
            (m.cap_refused ? " (refused by the cap)" : "") + (m.call_site ? "\n  from " + m.call_site : "") +
            (m.recovered ? "\n\nRecovered: the same thread allocated on the device again (PyTorch flushed its cache and retried). Not an error; the job was at its limit."
              : "\n\n(Not analysed: only the first out-of-memory errors get a post-mortem; see `vramtrace oom`.)") }));
        }
        if (p.u) p.u.redraw(false);
      };
      dev.ooms.forEach(function (m, k) {
        var pm = m.post_mortem !== null ? D.post_mortems[m.post_mortem] : null;
        var b = el("button", { type: "button", text: (m.recovered ? "refusal (recovered)" : m.folded ? "refusal (retried, then OOM " + m.n + ")" : "OOM " + m.n) + " at " + secs(m.t_ns) + ": pid " + m.pid + ", " + bytes(m.requested_bytes) +
          (m.cap_refused ? " (cap)" : "") + (pm ? " \u2014 " + pm.cause : "") });
        b.addEventListener("click", function () { p.select(k); });
        listButtons.push(b);
        if (k < 200) list.appendChild(b);
      });
      if (dev.ooms.length > 200) list.appendChild(el("p", { cls: "hint", text: (dev.ooms.length - 200) + " more marked on the timeline" }));
      side.appendChild(el("h3", { text: "Out of memory: the post-mortem" }));
      side.appendChild(list);
      side.appendChild(text);
      row.appendChild(side);
      // Open on the first error, not on a refusal before it.
      var firstError = dev.ooms.findIndex(function (m) { return !m.recovered && !m.folded; });
      p.select(firstError < 0 ? 0 : firstError);
    } else {
      p.select = function () {};
    }
    sec.appendChild(row);
    app.appendChild(sec);
    // Drawn once laid out (below, with every section's); zoom and cursor move together within a host.
    p.D = D;
    p.draw = drawPlot;
    plots.push(p);
  });

  // ---- tables ----
  function section(title, kids) {
    app.appendChild(el("section", { cls: "tables" }, [el("h2", { text: title })].concat(kids)));
  }
  var siteKids = [];
  D.sites_at_peak.forEach(function (d) {
    var rows = d.sites.map(function (s) { return [s.name, bytes(s.bytes)]; });
    if (d.unlisted_bytes) rows.push(["(other call sites)", bytes(d.unlisted_bytes)]);
    if (d.no_site_bytes) rows.push(["(no call site: below the threshold)", bytes(d.no_site_bytes)]);
    siteKids.push(el("h3", { text: d.device + ": live at its peak of " + bytes(d.peak_bytes) }));
    siteKids.push(table(["call site", "bytes"], rows, [false, true]));
    if (d.note) siteKids.push(el("p", { cls: "hint", text: d.note }));
  });
  if (D.sites_by_allocated.length) {
    siteKids.push(el("h3", { text: "Most bytes allocated, all devices" }));
    siteKids.push(table(["call site", "pid", "allocations", "allocated", "live at the end"], D.sites_by_allocated.map(function (s) {
      return [s.name, s.pid, count(s.allocations), bytes(s.allocated_bytes), bytes(s.live_bytes_at_end)];
    }), [false, true, true, true, true]));
  }
  if (!siteKids.length) siteKids.push(el("p", { cls: "hint", text: "The trace has no call sites (`vramtrace run` records them for allocations of at least VRAMTRACE_STACK_MIN_BYTES)." }));
  section("Top call sites", siteKids);

  var liveKids = [el("p", { text: count(D.live_at_end.count) + " allocations, " + bytes(D.live_at_end.bytes) + ", were never freed before their process ended (or the trace did)." })];
  var holders = D.processes.filter(function (p) { return p.live_bytes_at_end > 0; });
  if (holders.length) {
    liveKids.push(el("h3", { text: "By process" }));
    liveKids.push(table(["process", "ended", "live at the end", "allocations"], holders.map(function (p) {
      return [p.name, p.ended, bytes(p.live_bytes_at_end), count(p.live_allocations_at_end)];
    }), [false, false, true, true]));
  }
  if (D.live_at_end.largest.length) {
    liveKids.push(el("h3", { text: "The largest" }));
    liveKids.push(table(["pid", "device", "api", "bytes", "allocated at", "age", "call site"], D.live_at_end.largest.map(function (l) {
      return [l.pid, l.device, l.api, bytes(l.bytes), secs(l.alloc_time_ns), secs(l.age_ns), l.call_site || ""];
    }), [true, false, false, true, true, true, false]));
  }
  section("Live at the end", liveKids);

  if (D.whatif) {
    var W = D.whatif, wk = [];
    wk.push(el("p", { text: "PyTorch's caching allocator, replayed from each process's own history under other settings (vramtrace whatif; docs/WHATIF.md)." + (W.limit ? " Limit: " + W.limit + "." : "") }));
    if (W.histories.length) wk.push(el("ul", { cls: "notes" }, W.histories.map(function (h) { return el("li", { text: h }); })));
    var heads = ["settings", "peak", "smallest cap"], num = [false, true, true];
    if (W.limit) { heads.push("fits", "first refused"); num.push(false, false); }
    wk.push(table(heads, W.rows.map(function (r) {
      var row = [r.settings, bytes(r.peak_bytes), bytes(r.smallest_cap_bytes)];
      if (W.limit) row.push(r.fits ? "yes" : "no", r.first_refused || "");
      return row;
    }), num));
    wk.push(el("p", { text: W.best ? "Saves most: " + W.best + "." : "None of these settings needs less than the run's own." }));
    section("What if", wk);
  }

  section("Processes", [table(["pid", "rank", "command", "devices", "ended", "peak", "at", "allocations", "failed", "live at the end"], D.processes.map(function (p) {
    return [p.pid, p.rank === null ? "" : p.rank, p.command || "(not announced)", p.devices, p.ended, bytes(p.peak_bytes), secs(p.peak_time_ns), count(p.allocations), count(p.failed_allocations), bytes(p.live_bytes_at_end)];
  }), [true, true, false, false, false, true, true, true, true, true])]);

  }

  // ---- draw (after layout, so the plots know their width) ----
  plots.forEach(function (p) { p.draw(p); });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      plots.forEach(function (p) { p.u.setSize({ width: Math.max(320, p.box.clientWidth), height: 340 }); });
    }, 100);
  });
  window.vramtrace = { data: hosts[0], hosts: hosts, get plots() { return plots.map(function (p) { return p.u; }); } };
  document.body.dataset.ready = plots.length + " plots";
})();
