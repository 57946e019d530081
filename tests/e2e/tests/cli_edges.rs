//! The command line at its edges, through the real binary (issue 53): a closed pipe is a quiet exit for every verb
//! that prints, a file that cannot be read is one line naming it once (exit 2), a folder is "is a directory",
//! `demo --out` refuses an existing file before running anything, `export` says what it wrote, and every help
//! screen fits 100 columns.

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::TempDir;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../collector/tests/fixtures")
        .join(rel)
}

/// A failed trace with a PyTorch history and a post-mortem.
fn failed_trace() -> PathBuf {
    fixture("gpu/holds/keep_cap.vtrace")
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(vramtrace())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("vramtrace")
}

fn os(s: &str) -> &std::ffi::OsStr {
    s.as_ref()
}

/// Runs `vramtrace args` with stdout a pipe nobody reads (its reading end closed before the start), as
/// `vramtrace ... | head -1` ends up once head has gone.
fn with_closed_stdout(args: &[&std::ffi::OsStr]) -> Output {
    let mut fds = [0; 2];
    // SAFETY: an array of two ints for pipe(2) to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made by pipe2 and are owned here alone.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    Command::new(vramtrace())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("vramtrace")
}

#[test]
fn a_closed_pipe_is_a_quiet_exit_for_every_verb() {
    let dir = TempDir::new("cli-pipe");
    let t = failed_trace();
    let t = t.as_os_str();
    let demo_out = dir.path().join("demo.vtrace");
    let cases: Vec<Vec<&std::ffi::OsStr>> = vec![
        vec![os("report"), t],
        vec![os("report"), t, os("--json")],
        vec![os("oom"), t],
        vec![os("oom"), t, os("--full")],
        vec![os("whatif"), t],
        vec![os("--help")],
        vec![
            os("demo"),
            os("--simulated"),
            os("--out"),
            demo_out.as_os_str(),
        ],
    ];
    for args in cases {
        let out = with_closed_stdout(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn files_that_cannot_be_read_are_one_line_naming_them_once() {
    let dir = TempDir::new("cli-files");
    let empty = dir.path().join("empty.vtrace");
    fs::write(&empty, b"").unwrap();
    let fifo = dir.path().join("fifo.vtrace");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let missing = dir.path().join("missing.vtrace");
    let folder = dir.path().join("a-folder");
    fs::create_dir(&folder).unwrap();
    let t = failed_trace();
    let beside = |p: &Path| format!("{}=16", p.display());
    for (args, names, says) in [
        (
            vec![os("whatif"), empty.as_os_str()],
            empty.clone(),
            "the file is empty",
        ),
        (
            vec![os("report"), missing.as_os_str()],
            missing.clone(),
            "no such file or directory",
        ),
        (
            vec![os("report"), folder.as_os_str()],
            folder.clone(),
            "is a directory",
        ),
        (
            vec![os("oom"), folder.as_os_str()],
            folder.clone(),
            "is a directory",
        ),
        (
            vec![
                os("oom"),
                t.as_os_str(),
                os("--beside"),
                os(&beside(&missing)),
            ],
            missing.clone(),
            "--beside",
        ),
        (
            vec![os("oom"), t.as_os_str(), os("--beside"), fifo.as_os_str()],
            fifo.clone(),
            "FIFO",
        ),
        (
            vec![os("oom"), t.as_os_str(), os("--beside"), os("/dev/zero")],
            PathBuf::from("/dev/zero"),
            "character device",
        ),
        // A trace with no error to advise on checks what it was given all the same.
        (
            vec![
                os("oom"),
                fixture("whatif/train.vtrace").into_os_string().leak(),
                os("--beside"),
                os(&beside(&missing)),
            ],
            missing.clone(),
            "no such file",
        ),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        let name = names.display().to_string();
        assert_eq!(err.matches(&name).count(), 1, "{args:?}: {err}");
        assert!(
            !err.contains("os error") && !err.contains(" { "),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn run_names_a_folder_as_one() {
    let dir = TempDir::new("cli-run-folder");
    let out = run(&[
        os("run"),
        os("--out"),
        dir.path().join("t.vtrace").as_os_str(),
        os("--"),
        dir.path().as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("is a directory"), "{err}");
    assert!(!err.contains("permission denied"), "{err}");
}

#[test]
fn demo_refuses_an_existing_out_before_running() {
    let dir = TempDir::new("cli-demo-out");
    let existing = dir.path().join("kept.vtrace");
    fs::write(&existing, b"the user's own file").unwrap();
    let out = run(&[
        os("demo"),
        os("--simulated"),
        os("--out"),
        existing.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("already exists"), "{err}");
    assert!(!err.contains("workload failed"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // Nothing ran, nothing was reported, nothing was touched.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(fs::read(&existing).unwrap(), b"the user's own file");
    // With --force it is replaced by the demo's trace.
    let out = run(&[
        os("demo"),
        os("--simulated"),
        os("--force"),
        os("--out"),
        existing.as_os_str(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(vramtrace_collector::whatif::trace_file::analyze(&existing).is_ok());
}

#[test]
fn export_says_what_it_wrote() {
    let dir = TempDir::new("cli-export");
    let page = dir.path().join("page.html");
    let out = run(&[
        os("export"),
        failed_trace().as_os_str(),
        os("--format"),
        os("html"),
        os("--out"),
        page.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let size = fs::metadata(&page).unwrap().len();
    assert!(size > 10_000);
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.starts_with(&format!("vramtrace: wrote {}", page.display())),
        "{err}"
    );
    assert!(line.contains("HTML page") && line.contains("KiB"), "{err}");
}

#[test]
fn every_help_fits_100_columns() {
    for verb in [
        "", "run", "report", "oom", "export", "top", "demo", "whatif",
    ] {
        let args: Vec<&std::ffi::OsStr> = if verb.is_empty() {
            vec![os("--help")]
        } else {
            vec![os(verb), os("--help")]
        };
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{verb}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.lines().count() > 3, "{verb}: {text}");
        for l in text.lines() {
            assert!(
                l.chars().count() <= 100,
                "{verb}: {} columns: {l}",
                l.chars().count()
            );
        }
    }
}
