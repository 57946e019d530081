//! The JSON outputs, byte for byte, against goldens under tests/golden/: `report --json` and `oom --json` of every
//! trace in tests/fixtures/ and tests/fixtures/gpu/ (with the snapshot pickles beside them), the data the HTML
//! export embeds, and the traces tests/common/traces.rs builds for what the fixtures lack (every string escape,
//! call sites, growth, exit statuses, a process never announced, a trace cut short, several traces of one job,
//! each rule of the diagnosis).
//!
//! The goldens pin the documented schema's layout (docs/JSON-SCHEMA.md): a change to any of them is a change
//! users see. When one is intended, regenerate them and review the diff before committing:
//!
//! ```text
//! VRAMTRACE_BLESS=1 cargo test -p vramtrace --test json_golden
//! ```
//!
//! Nothing in these outputs varies between runs (no clock, no host name of this machine): the traces' paths
//! are given relative to a fixed working directory, so the ones the JSON names (a snapshot beside a trace, a
//! trace of several) are the same everywhere. The HTML data names this build's version (`made_by`): a version
//! bump is a bless.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::{text, TempDir};
use common::golden::{self, Outcome};

/// One output: the golden's file name, the verb and its arguments, where it runs.
struct Case {
    golden: String,
    args: Vec<String>,
    cwd: PathBuf,
    /// `export --format html`: the JSON sections of the page written here, not stdout.
    html_out: Option<PathBuf>,
}

/// `report --json`, `oom --json` and the HTML export's data of `traces` (one name for them all).
fn cases_for(name: &str, traces: &[&str], cwd: &Path, out_dir: &Path) -> Vec<Case> {
    let mut v = Vec::new();
    for verb in ["report", "oom"] {
        let mut args = vec![verb.to_string(), "--json".into()];
        args.extend(traces.iter().map(|t| t.to_string()));
        v.push(Case {
            golden: format!("{name}.{verb}.json"),
            args,
            cwd: cwd.to_path_buf(),
            html_out: None,
        });
    }
    let out = out_dir.join(format!("{name}.html"));
    let mut args = vec!["export".to_string()];
    args.extend(traces.iter().map(|t| t.to_string()));
    args.extend(["--format", "html", "--force", "--out"].map(String::from));
    args.push(out.display().to_string());
    v.push(Case {
        golden: format!("{name}.html.json"),
        args,
        cwd: cwd.to_path_buf(),
        html_out: Some(out),
    });
    v
}

fn all_cases(synthetic: &TempDir) -> Vec<Case> {
    let root = golden::manifest_dir();
    let mut v = Vec::new();
    for (name, f) in golden::fixtures() {
        v.extend(cases_for(&name, &[&f], &root, &synthetic.0));
    }
    let s = &synthetic.0;
    for (name, traces) in common::traces::write_synthetic(synthetic) {
        let traces: Vec<&str> = traces.iter().map(String::as_str).collect();
        v.extend(cases_for(&name, &traces, s, s));
    }
    v
}

/// What the case printed: stdout, or the JSON sections of the page it wrote (one a line).
fn output(c: &Case) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(&c.args)
        .current_dir(&c.cwd)
        .env("RUST_BACKTRACE", "1")
        // What this machine's files say must not decide the output: the demo fixture names a workload binary
        // that each build rebuilds, and a fresh clone has none at that path.
        .env("VRAMTRACE_SYMBOLS", "off")
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "`vramtrace {}` exited {:?}: {}",
            c.args.join(" "),
            out.status.code(),
            text(&out.stderr)
        ));
    }
    let Some(page) = &c.html_out else {
        return Ok(text(&out.stdout));
    };
    let page = std::fs::read_to_string(page).unwrap();
    let mut sections = String::new();
    let mut rest = page.as_str();
    while let Some(i) = rest.find("<script type=\"application/json\"") {
        let body = &rest[i..];
        let start = body.find('>').unwrap() + 1;
        let len = body[start..].find("</script>").unwrap();
        sections.push_str(&body[start..start + len]);
        sections.push('\n');
        rest = &body[start + len..];
    }
    if sections.is_empty() {
        return Err(format!("{}: no JSON in the page", c.golden));
    }
    Ok(sections)
}

#[test]
fn json_outputs_match_the_goldens() {
    let synthetic = TempDir::new("json-golden");
    let outcomes = all_cases(&synthetic)
        .iter()
        .map(|c| Outcome {
            golden: c.golden.clone(),
            what: format!("`vramtrace {}`", c.args.join(" ")),
            got: output(c),
        })
        .collect();
    golden::check("JSON", "json_golden", ".json", outcomes);
}
