//! One trace, one set of figures: the text report, the JSON and the HTML page (as headless Chromium shows it)
//! say the same run length and the same peak, at the same time, written the same way (collector/src/names/units.rs;
//! the page's script follows it). The figures go into a golden file (tests/figures_golden.txt), blessed with
//! VRAMTRACE_BLESS=1 like the others. Needs Chromium as export_html.rs's browser test does.

mod common;

use std::path::Path;
use std::process::Command;

use common::cli::{chromium, text, vramtrace, TempDir};
use common::fixture;
use vramtrace_collector::names::units;

/// The text after `key` up to the end of its figure (`0.123 s`, `1.00 GiB`).
fn after<'a>(s: &'a str, key: &str) -> &'a str {
    let i = s
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in:\n{s}"))
        + key.len();
    let rest = &s[i..];
    let end = rest.find(" s").map(|e| e + 2).unwrap_or(rest.len());
    let unit = ["B", "KiB", "MiB", "GiB", "TiB"]
        .iter()
        .filter_map(|u| rest.find(&format!(" {u}")).map(|e| e + 1 + u.len()))
        .min()
        .unwrap_or(end);
    &rest[..end.min(unit)]
}

#[test]
fn text_json_and_html_show_the_same_figures() {
    let Some(browser) = chromium() else { return };
    let trace = fixture("backward.vtrace");
    let dir = TempDir::new("figures");

    let t = text(&vramtrace("report", &trace, false).stdout);
    let text_figs = [
        after(&t, " over ").to_string(),
        after(&t, "GPU 0  peak ").to_string(),
        after(&t, ") at ").to_string(),
    ];

    let j: serde_json::Value =
        serde_json::from_slice(&vramtrace("report", &trace, true).stdout).unwrap();
    let dev = &j["devices"][0];
    let json_figs = [
        units::secs(j["end_ns"].as_u64().unwrap()),
        units::bytes(dev["peak_bytes"].as_u64().unwrap()),
        units::secs(dev["peak_time_ns"].as_u64().unwrap()),
    ];

    let page = dir.0.join("t.html");
    let o = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("export")
        .arg(&trace)
        .args(["--format", "html", "--out"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/html_check.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&page)
        .args(["--browser", &browser, "--text"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let shown = summary["text"].as_str().unwrap();
    let html_figs = [
        after(shown, "over ").to_string(),
        after(shown, "peak ").to_string(),
        after(after_str(shown, "peak "), " at ").to_string(),
    ];

    assert_eq!(text_figs, json_figs, "text vs JSON");
    assert_eq!(text_figs, html_figs, "text vs HTML");
    let got = format!(
        "trace: backward.vtrace\nrun length: text {} | json {} | html {}\npeak: text {} | json {} | html {}\npeak at: text {} | json {} | html {}\n",
        text_figs[0], json_figs[0], html_figs[0], text_figs[1], json_figs[1], html_figs[1], text_figs[2],
        json_figs[2], html_figs[2]
    );
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/figures_golden.txt");
    if std::env::var_os("VRAMTRACE_BLESS").is_some() {
        std::fs::write(&golden, &got).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&golden).unwrap_or_default(), got);
}

/// `s` from just after `key`.
fn after_str<'a>(s: &'a str, key: &str) -> &'a str {
    &s[s.find(key).unwrap() + key.len()..]
}
