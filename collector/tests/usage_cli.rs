//! Usage errors through the real binary: one line that says what is missing or wrong and what to do, exit 2.

use std::process::Command;

fn vramtrace(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_say_what_to_do_in_one_line() {
    for (args, says) in [
        (
            &["run"][..],
            &["missing <COMMAND>", "'vramtrace run --help'"][..],
        ),
        (
            &["run", "python3", "train.py"],
            &["the command to trace goes after '--'", "-- COMMAND"],
        ),
        (
            &["export", "t.vtrace", "--format", "pdf"],
            &[
                "one of: memory-viz, perfetto, html",
                "'vramtrace export --help'",
            ],
        ),
        (
            &["export", "t.vtrace", "--format", "html"],
            &["missing --out"],
        ),
        (&["report"], &["missing <FILES>"]),
    ] {
        let (code, err) = vramtrace(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        for s in says {
            assert!(err.contains(s), "{args:?}: {err}");
        }
        assert!(!err.contains("were not provided: ("), "{args:?}: {err}");
    }
}
