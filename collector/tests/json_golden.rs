//! The JSON outputs, byte for byte, against goldens under tests/golden/: `report --json` and `oom --json` of every
//! trace in tests/fixtures/ and tests/fixtures/gpu/ (with the snapshot pickles beside them), the data the HTML
//! export embeds, and a few traces built here for what the fixtures lack (every string escape, call sites,
//! growth, exit statuses, a process never announced, a trace cut short, several traces of one job).
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
use common::*;
use vramtrace_format::codec::put_record;
use vramtrace_format::{
    Api, EndKind, Exit, ExitStatus, Framework, FrameworkSample, LossCause, Oom, Record,
};

const BLESS: &str = "VRAMTRACE_BLESS";

/// One output: the golden's file name, the verb and its arguments, where it runs.
struct Case {
    golden: String,
    args: Vec<String>,
    cwd: PathBuf,
    /// `export --format html`: the JSON sections of the page written here, not stdout.
    html_out: Option<PathBuf>,
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden_dir() -> PathBuf {
    manifest_dir().join("tests/golden")
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

/// Every `*.vtrace` in `dir`, relative to the manifest directory, sorted.
fn fixtures_in(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(manifest_dir().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".vtrace"))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    v.sort();
    v
}

/// A string with every character JSON escapes (and DEL, which the reports escape too), a quote and a backslash,
/// and some it must not (non-ASCII, U+2028, `<`, `/`).
const ODD: &str = "q\"b\\s/n\nr\rt\tb\u{8}f\u{c}c\u{1}\u{1f}d\u{7f}é\u{2028}</script>";

/// `pid`'s out-of-memory record at `ms` on GPU 0 asking `requested` bytes (`common::oom`'s figures).
fn oom_of(pid: u32, ms: u64, requested: u64) -> Oom {
    match oom(pid, ms, 0, requested, 0, false) {
        Record::Oom(o) => o,
        _ => unreachable!("common::oom makes an out-of-memory record"),
    }
}

/// Strings of every kind, a process never announced, a dropped batch and its cause, exits by code and by
/// signal, an out-of-memory error without the driver's figures, and the trace cut in the middle of a frame.
fn odd_trace() -> Vec<u8> {
    let mut h = header();
    h.command = vec!["python".into(), ODD.into(), String::new()];
    h.hostname = format!("host {ODD}");
    let mut hi = hello(11, 0);
    if let Record::Hello(x) = &mut hi {
        x.cmdline.push(ODD.into());
        x.hostname = ODD.into();
    }
    let mut t = vramtrace_format::codec::encode_header(&h);
    let mut refused = failed(alloc(30, 0, 0, 6 * GIB), 2);
    refused.stack = 1;
    let records = [
        hi,
        hello(12, 0),
        stack(
            11,
            1,
            vec![],
            vec![py(ODD, ODD, 3), py("train.py", "<module>", 0)],
        ),
        note(11, 2, ODD),
        events(
            11,
            vec![with_stack(alloc(10, 0, 0xa000, 10 * GIB), 1), refused],
        ),
        Record::Oom(Oom {
            device_free_bytes: None,
            device_total_bytes: None,
            ..oom_of(11, 30, 6 * GIB)
        }),
        // Never announced: no hello, no host.
        events(13, vec![alloc(12, 1, 0xb000, 3 * MIB)]),
        events(12, vec![ptsz(alloc(14, 1, 0xc000, MIB))]),
        Record::Dropped {
            pid: 12,
            ts_ns: START + 15 * MS,
            count: 7,
        },
        Record::Lost {
            pid: 12,
            ts_ns: START + 15 * MS,
            count: 7,
            cause: LossCause::RingFull,
        },
        end(12, 40, EndKind::Vanished),
        Record::Exit(Exit {
            pid: 12,
            ts_ns: START + 41 * MS,
            status: ExitStatus::Signal {
                signal: 9,
                core: true,
            },
        }),
        goodbye(11, 45),
        Record::Exit(Exit {
            pid: 11,
            ts_ns: START + 46 * MS,
            status: ExitStatus::Code(3),
        }),
        events(13, vec![alloc(50, 1, 0xd000, MIB)]),
    ];
    for r in &records {
        put_record(&mut t, r);
    }
    // The last frame cut short: the trace is partial.
    t.truncate(t.len() - 3);
    t
}

/// Training steps over a persistent 1 GiB, each keeping 64 MiB from one of two call sites, then an
/// out-of-memory error: growth with its sites and figures.
fn growth_trace() -> Vec<u8> {
    let mut evs = vec![alloc(1, 0, 0x1000, GIB)];
    for k in 0..=10u64 {
        let t = 100 * k;
        evs.push(alloc(t + 10, 0, 0x2000, 4 * GIB));
        let site = 1 + (k % 2) as u32;
        evs.push(with_stack(
            alloc(t + 20, 0, 0x10_0000 + k * 0x1000, 64 * MIB),
            site,
        ));
        if k < 10 {
            evs.push(free(t + 60, 0x2000));
        }
    }
    let at = 1030;
    evs.push(failed(alloc(at, 0, 0, 8 * GIB), 2));
    let mut o = oom_of(100, at, 8 * GIB);
    o.device_free_bytes = Some(GIB);
    o.device_total_bytes = Some(8 * GIB);
    trace(&[
        hello(100, 0),
        stack(100, 1, vec![], vec![py("model.py", "keep", 12)]),
        stack(100, 2, vec![], vec![py("model.py", "keep_more", 20)]),
        events(100, evs),
        Record::Oom(o),
        end(100, at + 1, EndKind::Vanished),
    ])
}

/// A node's trace of job 42 with a second process that never announced itself (no host of its own).
fn node(host: &str, start_unix_ns: u64, start_mono_ns: u64, bytes: u64) -> Vec<u8> {
    let mut t = node_trace(host, start_unix_ns, start_mono_ns, "42", bytes);
    let mut e = alloc(25, 1, 0x5000, bytes / 4);
    e.ts_ns = e.ts_ns - START + start_mono_ns;
    put_record(&mut t, &events(77, vec![e]));
    t
}

fn all_cases(synthetic: &TempDir) -> Vec<Case> {
    let root = manifest_dir();
    let mut v = Vec::new();
    for f in fixtures_in("tests/fixtures")
        .into_iter()
        .chain(fixtures_in("tests/fixtures/gpu"))
    {
        let name = Path::new(&f)
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        v.extend(cases_for(&name, &[&f], &root, &synthetic.0));
    }
    let s = &synthetic.0;
    synthetic.file("export.vtrace", &export_trace());
    synthetic.file("odd.vtrace", &odd_trace());
    synthetic.file("growth.vtrace", &growth_trace());
    let mut capped = capped_header(6 * GIB, 80 * GIB);
    capped.extra.push(("job".into(), "odd \"job\"\n".into()));
    let mut t = vramtrace_format::codec::encode_header(&capped);
    // Refused by the cap once and recovered from; refused again just after an async free (the pool's cache,
    // beside the cause), the shim's ledger far from what the trace saw live, and the process gone.
    let mut capped_oom = oom_of(11, 15, 2 * GIB);
    capped_oom.flags = vramtrace_format::flags::CAP_REFUSED;
    capped_oom.device_free_bytes = Some(70 * GIB);
    capped_oom.job_used_bytes = Some(GIB);
    let mut async_alloc = ev(2, Api::MemAllocAsync, 0, 0xd000, 512 * MIB);
    async_alloc.aux = 7;
    let mut refused = failed(alloc(15, 0, 0, 2 * GIB), 2);
    refused.flags |= vramtrace_format::flags::CAP_REFUSED;
    for r in [
        hello(11, 0),
        events(11, vec![alloc(1, 0, 0xa000, 5 * GIB), async_alloc]),
        events(11, vec![failed(alloc(3, 0, 0, 2 * GIB), 2)]),
        oom(11, 3, 0, 2 * GIB, 70 * GIB, true),
        events(
            11,
            vec![
                alloc(4, 0, 0xb000, 512 * MIB),
                ev(14, Api::MemFreeAsync, 0, 0xd000, 0),
                refused,
            ],
        ),
        // The bridge's samples of PyTorch's figures, no record of its own of the error.
        Record::FrameworkSample(FrameworkSample {
            pid: 11,
            ts_ns: START + 14 * MS,
            framework: Framework::Torch,
            device: 0,
            allocated: 5 * GIB,
            reserved: 5 * GIB + 512 * MIB,
            active: 5 * GIB,
            inactive_split: 3 * MIB,
            requested: 5 * GIB - 1,
            alloc_retries: 2,
            ooms: 1,
        }),
        Record::Oom(capped_oom),
        end(11, 16, EndKind::Vanished),
    ] {
        put_record(&mut t, &r);
    }
    synthetic.file("capped.vtrace", &t);
    synthetic.file(
        "node-a.vtrace",
        &node("node-a", 1_700_000_000_000_000_000, 5_000_000_000, 8 * MIB),
    );
    synthetic.file(
        "node-b.vtrace",
        &node(
            "node-b",
            1_700_000_002_500_000_000,
            900_000_000_000,
            4 * MIB,
        ),
    );
    for n in ["export", "odd", "growth", "capped"] {
        v.extend(cases_for(
            &format!("synthetic_{n}"),
            &[&format!("{n}.vtrace")],
            s,
            s,
        ));
    }
    // Several traces of one job (the fleet's JSON), given in the other order than their starts.
    v.extend(cases_for(
        "synthetic_job",
        &["node-b.vtrace", "node-a.vtrace"],
        s,
        s,
    ));
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

/// The first line where `got` and `want` differ, both shown.
fn first_difference(want: &str, got: &str) -> String {
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

#[test]
fn json_outputs_match_the_goldens() {
    let bless = std::env::var_os(BLESS).is_some_and(|v| v == "1");
    let synthetic = TempDir::new("json-golden");
    let cases = all_cases(&synthetic);
    let dir = golden_dir();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut failures = Vec::new();
    for c in &cases {
        let got = match output(c) {
            Ok(g) => g,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let path = dir.join(&c.golden);
        if bless {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Err(e) => failures.push(format!(
                "{}: no golden ({e}); {BLESS}=1 writes it",
                c.golden
            )),
            Ok(want) if want != got => failures.push(format!(
                "{} differs from `vramtrace {}` at {}",
                c.golden,
                c.args.join(" "),
                first_difference(&want, &got)
            )),
            Ok(_) => {}
        }
    }
    // A golden no case writes is stale: a fixture went away or was renamed.
    let names: Vec<&str> = cases.iter().map(|c| c.golden.as_str()).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        if !names.contains(&n.as_str()) {
            if bless {
                std::fs::remove_file(dir.join(&n)).unwrap();
            } else {
                failures.push(format!("{n}: a golden of no case; {BLESS}=1 removes it"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} JSON outputs differ from their goldens (if intended: {BLESS}=1 cargo test -p vramtrace \
         --test json_golden, then review the diff):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
