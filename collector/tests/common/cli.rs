//! Running the real `vramtrace` binary in tests, and checking what it prints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("vramtrace-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `vramtrace <verb> FILE [--json]`.
pub fn vramtrace(verb: &str, file: &Path, json: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vramtrace"));
    c.arg(verb).arg(file);
    if json {
        c.arg("--json");
    }
    c.env("RUST_BACKTRACE", "1").output().unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

/// One line on stderr, exit 2, nothing on stdout, no panic.
pub fn assert_usage_error(out: &Output, want: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(out.stdout.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("vramtrace: "), "{err}");
    assert!(err.contains(want), "want {want:?} in {err:?}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Runs the Python `script` with the JSON parsed as `d` (and `vramtrace_format_version` defined); returns its
/// stdout. Fails the test if the script fails.
pub fn python_check(json: &[u8], script: &str) -> String {
    let program = format!(
        "import json, sys\nvramtrace_format_version = {}\nd = json.loads(sys.stdin.read())\n{script}\n",
        vramtrace_format::VERSION
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(json).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python: {}\njson: {}",
        text(&out.stderr),
        text(json)
    );
    text(&out.stdout)
}

/// A headless Chromium for the page tests, or `None` (said loudly; a failure under VRAMTRACE_REQUIRE_BROWSER=1).
pub fn chromium() -> Option<String> {
    let found = std::env::var("VRAMTRACE_CHROMIUM")
        .ok()
        .into_iter()
        .chain(["chromium", "chromium-browser", "google-chrome"].map(String::from))
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        assert!(
            std::env::var("VRAMTRACE_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "VRAMTRACE_REQUIRE_BROWSER=1 but no chromium found (VRAMTRACE_CHROMIUM, chromium, chromium-browser)"
        );
        // Past the test harness's capture: this must be seen.
        let _ = writeln!(
            std::io::stderr().lock(),
            "\n!!! export_html: SKIPPED the headless-browser test: no chromium found. Install Debian's \
             `chromium` (scripts/test.sh does) or set VRAMTRACE_CHROMIUM. !!!\n"
        );
    }
    found
}

/// A recorded run `NAME.vtrace` from fixture folder `src` copied into `dir`, with its PyTorch snapshots
/// (`NAME.vtrace.torch-*.gz`, gunzipped) beside it, where `whatif` looks for them. Returns the trace's path.
pub fn unpack_run(src: &std::path::Path, dir: &TempDir, name: &str) -> PathBuf {
    let trace = dir.0.join(format!("{name}.vtrace"));
    std::fs::copy(src.join(format!("{name}.vtrace")), &trace).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let file = e.unwrap().file_name().into_string().unwrap();
        if let Some(pickle) = file
            .strip_prefix(&format!("{name}.vtrace.torch-"))
            .and_then(|_| file.strip_suffix(".gz"))
        {
            let out = std::process::Command::new("gzip")
                .arg("-dc")
                .arg(src.join(&file))
                .output()
                .expect("gzip");
            assert!(out.status.success());
            std::fs::write(dir.0.join(pickle), out.stdout).unwrap();
        }
    }
    trace
}

/// In a `whatif --knob --json` answer, how many requests took `shape` (0 where none did).
pub fn fitted(answer: &serde_json::Value, shape: &str) -> u64 {
    answer["fits"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["shape"] == shape)
        .and_then(|f| f["requests"].as_u64())
        .unwrap_or(0)
}

/// The runs' knob values of a `gpu_results.json` case (`runs`).
pub fn run_values(case: &serde_json::Value) -> Vec<u64> {
    case["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_u64())
        .collect()
}

/// What a `whatif --knob --json` answer predicts PyTorch reserves for a `gpu_results.json` row: its batch under its
/// settings (`"defaults"`: the runs' own), the first process's reserved peak.
pub fn predicted_for(answer: &serde_json::Value, row: &serde_json::Value) -> u64 {
    let conf = match row["conf"].as_str().unwrap() {
        "defaults" => "",
        c => c,
    };
    let cfg = answer["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conf"] == conf)
        .unwrap_or_else(|| panic!("no configuration {conf:?}"));
    cfg["at"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["value"] == row["batch"])
        .unwrap_or_else(|| panic!("no answer at {}", row["batch"]))["predicted"]["reserved_peaks"]
        [0]
    .as_u64()
    .unwrap()
}
