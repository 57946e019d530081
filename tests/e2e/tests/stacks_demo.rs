//! The README's first command, `vramtrace demo`, on the simulated driver: its call sites must name the
//! workload's own functions (workload/src/main.rs), not cudarc's allocation frames above them, and no two of
//! its sites may read the same.

use std::collections::BTreeSet;
use std::process::Command;

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::TempDir;

#[test]
fn the_demo_names_the_workloads_own_functions() {
    let dir = TempDir::new("demo");
    let trace = dir.path().join("demo.vtrace");
    let out = Command::new(vramtrace())
        .args(["demo", "--simulated", "--steps", "2", "--out"])
        .arg(&trace)
        .output()
        .expect("vramtrace demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let a = vramtrace_collector::whatif::trace_file::analyze(&trace).unwrap();
    let sites = &a.call_sites.sites;
    // Above 1 MiB in its small sizes: the activations and the workspace, from two lines of `training`.
    assert!(sites.len() >= 2, "{sites:#?}");
    for s in sites {
        let f = s.site_frame().expect("a site frame");
        let file = f.file.as_deref().unwrap_or("");
        let function = f.function.as_deref().unwrap_or("");
        assert!(
            file.ends_with("workload/src/main.rs") && function.starts_with("vramtrace_workload::"),
            "{}: {f:?}",
            s.label()
        );
        assert!(!s.label().contains("cudarc"), "{}", s.label());
        // cudarc's frames are still in the stack, inside the site.
        let i = s.site.unwrap();
        assert!(
            s.frames[..i].iter().any(|f| f
                .function
                .as_deref()
                .is_some_and(|n| n.contains("cudarc::"))),
            "{:#?}",
            s.frames
        );
    }
    let labels: BTreeSet<String> = sites.iter().map(|s| s.label()).collect();
    assert_eq!(labels.len(), sites.len(), "{labels:#?}");

    // The report the demo printed: each call site row names the workload, none names cudarc.
    let calls: Vec<&str> = stdout
        .split("\n\n")
        .filter(|s| s.starts_with("CALL SITES"))
        .collect();
    assert_eq!(calls.len(), 2, "{stdout}");
    for list in calls {
        assert!(!list.contains("cudarc"), "{list}");
        assert!(list.contains("vramtrace_workload::"), "{list}");
    }

    // The JSON's labels too.
    let json = Command::new(vramtrace())
        .arg("report")
        .arg(&trace)
        .arg("--json")
        .output()
        .expect("vramtrace report --json");
    assert!(json.status.success());
    let json = String::from_utf8_lossy(&json.stdout);
    let labels: Vec<&str> = json
        .match_indices("\"label\": \"")
        .map(|(i, m)| {
            let rest = &json[i + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(labels.len(), sites.len(), "{json}");
    assert!(
        labels.iter().all(|l| l.starts_with("vramtrace_workload::")),
        "{labels:?}"
    );
    assert_eq!(
        labels.iter().collect::<BTreeSet<_>>().len(),
        labels.len(),
        "{labels:?}"
    );
}

/// The demo as a user reads it: no developer counters unless `--verbose`, no std or runtime frames in its call
/// chains, the threshold named where a call site is missing, and nothing left in the temporary folder.
#[test]
fn the_demo_reads_as_a_users_and_leaves_nothing_behind() {
    let dir = TempDir::new("demo-tmp");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let run = |verbose: bool| {
        let mut c = Command::new(vramtrace());
        c.args(["demo", "--simulated", "--steps", "2"])
            .env("TMPDIR", &tmp)
            .current_dir(dir.path());
        if verbose {
            c.arg("--verbose");
        }
        let out = c.output().expect("vramtrace demo");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "the demo left {left:?} in TMPDIR");
        stdout
    };
    let out = run(false);
    for unwanted in [
        "workload: ",
        "core::ops::function",
        "std::rt::",
        "__rust_begin_short_backtrace",
    ] {
        assert!(!out.contains(unwanted), "{unwanted:?} in:\n{out}");
    }
    assert!(
        out.contains("(no call site: below the 1.00 MiB threshold of --stack-min-bytes)"),
        "{out}"
    );
    assert!(out.contains("<- vramtrace_workload::main"), "{out}");
    assert!(out.contains("the trace was temporary"), "{out}");
    // Its one folder besides TMPDIR: the working folder, untouched.
    let here: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(here, vec![std::ffi::OsString::from("tmp")]);

    let verbose = run(true);
    assert!(
        verbose.contains("workload: peak_expected_bytes="),
        "{verbose}"
    );
}
