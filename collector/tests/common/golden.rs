//! Outputs against their goldens under tests/golden/ (tests/json_golden.rs, tests/text_golden.rs): each test
//! owns the goldens ending in its suffix, writes them with `VRAMTRACE_BLESS=1`, and fails on any byte that
//! differs, a golden missing, or a golden no case writes.

use std::path::{Path, PathBuf};

pub const BLESS: &str = "VRAMTRACE_BLESS";

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn golden_dir() -> PathBuf {
    manifest_dir().join("tests/golden")
}

/// Every `*.vtrace` in `dir`, relative to the manifest directory, sorted.
pub fn fixtures_in(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(manifest_dir().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".vtrace"))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    v.sort();
    v
}

/// Every fixture trace (tests/fixtures/ and tests/fixtures/gpu/): its golden name (the file's stem) and its
/// path relative to the manifest directory.
pub fn fixtures() -> Vec<(String, String)> {
    fixtures_in("tests/fixtures")
        .into_iter()
        .chain(fixtures_in("tests/fixtures/gpu"))
        .map(|f| {
            let name = Path::new(&f).file_stem().unwrap().to_str().unwrap();
            (name.to_string(), f)
        })
        .collect()
}

/// The first line where `got` and `want` differ, both shown.
pub fn first_difference(want: &str, got: &str) -> String {
    let (mut w, mut g) = (want.split_inclusive('\n'), got.split_inclusive('\n'));
    let mut n = 1;
    loop {
        match (w.next(), g.next()) {
            (None, None) => return "no line differs (?)".into(),
            (a, b) if a == b => n += 1,
            (a, b) => {
                // Long lines (a timeline's buckets) shown up to 400 characters.
                let cut = |s: Option<&str>| match s {
                    None => "(no more lines)".to_string(),
                    Some(s) if s.chars().count() > 400 => {
                        format!("{:?}...", s.chars().take(400).collect::<String>())
                    }
                    Some(s) => format!("{s:?}"),
                };
                return format!("line {n}:\n  want {}\n  got  {}", cut(a), cut(b));
            }
        }
    }
}

/// One output: its golden's file name, what made it (for the message), and what it printed or why it failed.
pub struct Outcome {
    pub golden: String,
    pub what: String,
    pub got: Result<String, String>,
}

/// Checks `outcomes` against the goldens, or with `VRAMTRACE_BLESS=1` writes them (and removes those of this
/// test no case writes). `suffix`: the goldens this test owns; `test`: its name, for the message.
pub fn check(kind: &str, test: &str, suffix: &str, outcomes: Vec<Outcome>) {
    let bless = std::env::var_os(BLESS).is_some_and(|v| v == "1");
    let dir = golden_dir();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut failures = Vec::new();
    for c in &outcomes {
        let got = match &c.got {
            Ok(g) => g,
            Err(e) => {
                failures.push(e.clone());
                continue;
            }
        };
        let path = dir.join(&c.golden);
        if bless {
            std::fs::write(&path, got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Err(e) => failures.push(format!(
                "{}: no golden ({e}); {BLESS}=1 writes it",
                c.golden
            )),
            Ok(want) if &want != got => failures.push(format!(
                "{} differs from {} at {}",
                c.golden,
                c.what,
                first_difference(&want, got)
            )),
            Ok(_) => {}
        }
    }
    // A golden no case writes is stale: a fixture went away or was renamed.
    let names: Vec<&str> = outcomes.iter().map(|c| c.golden.as_str()).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        if !n.ends_with(suffix) || names.contains(&n.as_str()) {
            continue;
        }
        if bless {
            std::fs::remove_file(dir.join(&n)).unwrap();
        } else {
            failures.push(format!("{n}: a golden of no case; {BLESS}=1 removes it"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} {kind} outputs differ from their goldens (if intended: {BLESS}=1 cargo test -p vramtrace \
         --test {test}, then review the diff):\n{}",
        failures.len(),
        outcomes.len(),
        failures.join("\n")
    );
}
