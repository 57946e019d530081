//! A PyTorch process's call sites at a device's peak are its tensors' lines, read from the history it kept
//! beside the trace, in place of the sites where its cache grew (issue 53): on runs recorded on an H200
//! (collector/tests/fixtures/whatif/, each with its whole history), in the text, the JSON and the HTML page
//! alike, adding up to the peak, with PyTorch's own reserve.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::{text, unpack_run, TempDir};
use serde_json::Value;
use vramtrace_collector::names::units::bytes;

/// (folder under fixtures/whatif, run).
const RUNS: [(&str, &str); 7] = [
    ("", "train"),
    ("", "finetune"),
    ("", "serve"),
    ("", "frag"),
    ("batch", "train.b4"),
    ("batch", "conv.b16"),
    ("oom_batch", "conv.b48"),
];

fn fixtures(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/whatif")
        .join(sub)
}

fn vramtrace(args: &[&str], trace: &Path) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(args)
        .arg(trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    out.stdout
}

/// The HTML page's data.
fn page(dir: &TempDir, trace: &Path) -> Value {
    let out = dir.0.join("p.html");
    let o = out.to_str().unwrap();
    vramtrace(
        &["export", "--force", "--format", "html", "--out", o],
        trace,
    );
    let html = std::fs::read_to_string(&out).unwrap();
    let open = "<script type=\"application/json\" id=\"vramtrace-data\">";
    let start = html.find(open).unwrap() + open.len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

#[test]
fn a_pytorch_process_with_its_history_is_shown_by_its_tensors_lines_at_the_peak() {
    let dir = TempDir::new("tensor-lines");
    for (sub, run) in RUNS {
        let trace = unpack_run(&fixtures(sub), &dir, run);
        let a = vramtrace_collector::whatif::trace_file::analyze(&trace).unwrap();
        let json: Value =
            serde_json::from_slice(&vramtrace(&["report", "--json"], &trace)).unwrap();
        let report = text(&vramtrace(&["report"], &trace));
        let d = &json["devices"][0];
        let peak = d["peak_bytes"].as_u64().unwrap();
        let at = &d["call_sites_at_peak"];
        let tl = at["tensor_lines"].as_array().unwrap();
        assert_eq!(tl.len(), 1, "{run}: {at}");
        let t = &tl[0];
        let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{run}: {k} in {v}"));
        assert!(!t["lines"].as_array().unwrap().is_empty(), "{run}: {t}");

        // The lines and the tensors without one are all the tensors then.
        let lines: u64 = t["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| n(l, "bytes"))
            .sum();
        assert_eq!(
            lines + n(t, "unlisted_bytes") + n(t, "no_line_bytes") + n(t, "before_history_bytes"),
            n(t, "allocated_bytes"),
            "{run}: {t}"
        );
        // A history from the process's first allocation assumes nothing.
        assert_eq!(n(t, "before_history_bytes"), 0, "{run}");
        // Its reserve then is PyTorch's own reserved peak (the device peaked with the cache).
        let f = a.devices[0].framework.as_ref().expect(run);
        assert_eq!(n(t, "reserved_bytes"), f.peak_reserved, "{run}");
        assert!(n(t, "allocated_bytes") <= n(t, "reserved_bytes"), "{run}");

        // The text: every line with its bytes, no segment's native frame, the cache's legend not needed.
        let section = report
            .split("CALL SITES AT EACH DEVICE'S PEAK")
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap();
        for l in t["lines"].as_array().unwrap() {
            let row = format!("{}  ", bytes(n(l, "bytes")));
            assert!(
                section
                    .lines()
                    .any(|x| x.contains(&row) && x.ends_with(l["line"].as_str().unwrap())),
                "{run}: {l} in\n{section}"
            );
        }
        assert!(!section.contains(".so+0x"), "{run}:\n{section}");
        assert!(
            !section.contains("where the cache grew:"),
            "{run}:\n{section}"
        );
        assert!(section.contains("by the line that allocated them"), "{run}");

        // The page shows the same rows, and they add up to the peak.
        let p = page(&dir, &trace);
        let ap = &p["sites_at_peak"][0];
        let rows = ap["sites"].as_array().unwrap();
        let sum: u64 = rows.iter().map(|r| n(r, "bytes")).sum();
        assert_eq!(
            sum + n(ap, "unlisted_bytes") + n(ap, "no_site_bytes"),
            peak,
            "{run}: {ap}"
        );
        for r in rows {
            let row = format!("{}  ", bytes(n(r, "bytes")));
            let name = r["name"].as_str().unwrap();
            assert!(
                section
                    .lines()
                    .any(|x| x.contains(&row) && x.ends_with(name)),
                "{run}: page row {r} not in\n{section}"
            );
        }
        assert!(ap["note"].as_str().is_some(), "{run}");
    }
}

/// Without its history beside the trace (moved without it), the process keeps its call sites: where its cache
/// grew, with the legend that says so.
#[test]
fn without_the_history_the_sites_stay_where_the_cache_grew() {
    let dir = TempDir::new("tensor-lines-none");
    let trace = dir.0.join("train.vtrace");
    std::fs::copy(fixtures("").join("train.vtrace"), &trace).unwrap();
    let json: Value = serde_json::from_slice(&vramtrace(&["report", "--json"], &trace)).unwrap();
    let at = &json["devices"][0]["call_sites_at_peak"];
    assert_eq!(at["tensor_lines"].as_array().map(Vec::len), Some(0), "{at}");
    let report = text(&vramtrace(&["report"], &trace));
    assert!(report.contains("where the cache grew"), "{report}");
}
