//! The runtime directory: a killed collector's is removed by the next run of its user; a runtime filesystem
//! that is full does not stop a job (the Python bridge is left out, and `run` says so).

use std::os::unix::fs::MetadataExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::*;

/// The runtime directories under `base`.
fn runtime_dirs(base: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(base)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("vramtrace-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_killed_collectors_runtime_directory_is_removed_by_the_next_run() {
    let fc = FakeCuda::new();
    let base = fc.dir().join("rt");
    std::fs::create_dir_all(&base).unwrap();
    let mut run = fc
        .command(vramtrace())
        .env("XDG_RUNTIME_DIR", &base)
        .args(["run", "--python-agent", "off", "--out"])
        .arg(fc.dir().join("killed.vtrace"))
        .args(["--", "sleep", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let left = loop {
        let d = runtime_dirs(&base);
        if d.len() == 1 && d[0].join("collector").exists() {
            break d[0].clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no runtime dir");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Killed: nothing of it cleans up.
    // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
    unsafe { libc::kill(run.id() as i32, libc::SIGKILL) };
    run.wait().unwrap();
    assert!(left.exists());
    // Another user's (here: a directory we do not own is never touched) and a live one's stay.
    let live_other = base.join("vramtrace-abcdef");
    std::fs::create_dir(&live_other).unwrap();
    let out = fc
        .command(vramtrace())
        .env("XDG_RUNTIME_DIR", &base)
        .args(["run", "--python-agent", "off", "--out"])
        .arg(fc.dir().join("next.vtrace"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        !left.exists(),
        "the killed collector's directory is still there"
    );
    assert!(
        live_other.exists(),
        "a directory without its collector's name was removed"
    );
    // The `sleep` the killed collector left running.
    let _ = std::process::Command::new("pkill")
        .args(["-f", "^sleep 30$"])
        .status();
}

/// A 64 KiB tmpfs mounted as the runtime folder (`XDG_RUNTIME_DIR`) and filled, as another user can fill one:
/// unmounted when dropped. `None` (the test then skips, and says so) without root or a tmpfs.
struct FullRuntime {
    _dir: TempDir,
    base: std::path::PathBuf,
}

impl FullRuntime {
    fn mount(name: &str) -> Option<FullRuntime> {
        // SAFETY: no arguments and no preconditions; it cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a small filesystem needs root");
            return None;
        }
        let dir = TempDir::new(name);
        let base = dir.path().join("full");
        std::fs::create_dir_all(&base).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&base)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs here");
            return None;
        }
        let _ = std::fs::write(base.join("fill"), vec![0u8; 1 << 20]);
        Some(FullRuntime { _dir: dir, base })
    }

    /// The simulated driver with this folder as the runtime one.
    fn fc(&self) -> FakeCuda {
        FakeCuda::new().env("XDG_RUNTIME_DIR", &self.base)
    }
}

impl Drop for FullRuntime {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.base)
            .status();
    }
}

#[test]
fn a_full_runtime_filesystem_does_not_stop_the_job() {
    let Some(full) = FullRuntime::mount("full") else {
        return;
    };
    let (fc, base) = (full.fc(), &full.base);
    assert!(std::fs::metadata(base.join("fill")).unwrap().size() < 1 << 20);
    let (run, path) = fc.traced("full", &[], program("probe"), &["alloc 1048576", "exit 0"]);
    run.assert_success("on a full runtime filesystem");
    run.says("cannot write the Python bridge");
    let t = vramtrace_e2e::traced::read_trace(&path);
    assert_eq!(t.events.values().flatten().filter(|e| e.ok()).count(), 1);
}

/// Runs `script` in a mount namespace of its own where /tmp and /dev/shm are filesystems with bytes free but no
/// inode left (the fake driver's folder, under /tmp, bound back in). `None` where that cannot be made here.
fn without_inodes(fc: &FakeCuda, script: &str) -> Option<std::process::Output> {
    // SAFETY: no arguments and no preconditions; it cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a mount namespace needs root");
        return None;
    }
    let keep = std::path::Path::new("/var/tmp").join(format!("vt-keep-{}", std::process::id()));
    std::fs::create_dir_all(&keep).unwrap();
    // What the test runs from that lives under /tmp (the fake driver's folders; the build itself when the checkout
    // is there, as CI's may be), made again in the new /tmp and bound back from the old one.
    let mut dirs: Vec<std::path::PathBuf> = [
        fc.dir().to_path_buf(),
        fake_lib_dir().to_path_buf(),
        vramtrace().parent().unwrap().to_path_buf(),
        program("probe").parent().unwrap().to_path_buf(),
        scratch_dir().to_path_buf(),
    ]
    .into_iter()
    .map(|d| d.canonicalize().unwrap_or(d))
    .filter(|d| d.starts_with("/tmp"))
    .collect();
    dirs.sort();
    dirs.dedup();
    let mut back = String::new();
    let mut bound: Vec<std::path::PathBuf> = Vec::new();
    for d in dirs {
        if bound.iter().any(|b| d.starts_with(b)) {
            continue;
        }
        let rel = d.strip_prefix("/tmp").unwrap();
        back.push_str(&format!(
            "mkdir -p {d}; mount --bind {keep}/{rel} {d}; ",
            d = d.display(),
            keep = keep.display(),
            rel = rel.display()
        ));
        bound.push(d);
    }
    let setup = format!(
        "set -e; mount --make-rprivate /; mount --bind /tmp {keep}; \
         for m in /tmp /dev/shm; do mount -t tmpfs -o size=64m,nr_inodes=64 tmpfs $m; done; \
         {back} \
         for m in /tmp /dev/shm; do i=0; while touch $m/fill$i 2>/dev/null; do i=$((i+1)); done; done; \
         if mkdir /tmp/probe-inode 2>/dev/null; then echo 'inodes left' >&2; exit 99; fi; \
         unset XDG_RUNTIME_DIR TMPDIR; {script}",
        keep = keep.display(),
    );
    let o = fc
        .command("unshare")
        .args(["--mount", "sh", "-c", &setup])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&keep);
    if o.status.code() == Some(99) || String::from_utf8_lossy(&o.stderr).contains("unshare failed")
    {
        eprintln!("skipped: {}", String::from_utf8_lossy(&o.stderr));
        return None;
    }
    Some(o)
}

#[test]
fn runtime_filesystems_without_inodes_do_not_stop_the_job() {
    let fc = FakeCuda::new();
    // /tmp and /dev/shm have no inode left: the runtime directory goes beside the trace, and the job is traced.
    let out = std::path::Path::new("/var/tmp").join(format!("vt-noinode-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let trace = out.join("t.vtrace");
    let script = format!(
        "{vt} run --python-agent off --out {t} -- {p} 'alloc 1048576' 'exit 3'",
        vt = vramtrace().display(),
        t = trace.display(),
        p = program("probe").display()
    );
    let Some(o) = without_inodes(&fc, &script) else {
        let _ = std::fs::remove_dir_all(&out);
        return;
    };
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(3), "{err}");
    let t = vramtrace_e2e::traced::read_trace(&trace);
    assert_eq!(
        t.events.values().flatten().filter(|e| e.ok()).count(),
        1,
        "{err}"
    );
    // The runtime directory made beside the trace is gone with the run.
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("vramtrace-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Nor beside it (a folder too deep for a socket's path): the job still runs, untraced, its exit code its
    // own, and run says what is lost in one line.
    let deep = out.join("d".repeat(100));
    std::fs::create_dir_all(&deep).unwrap();
    let trace = deep.join("t.vtrace");
    let run = |cap: &str| {
        let script = format!(
            "{vt} run --python-agent off {cap} --out {t} -- {p} 'alloc 1048576' 'exit 3'",
            vt = vramtrace().display(),
            t = trace.display(),
            p = program("probe").display()
        );
        let o = without_inodes(&fc, &script).unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run("");
    assert_eq!(code, Some(3), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("vramtrace:"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("cannot create a private runtime directory")
            && said[0].contains("the job runs untraced"),
        "{err}"
    );
    assert!(!trace.exists(), "an untraced run left a trace");
    // An enforced cap that cannot be kept is never dropped quietly: the job is not started. Warned of only, it
    // runs.
    let (code, err) = run("--cap 1GiB");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the cap cannot be enforced without it"),
        "{err}"
    );
    let (code, err) = run("--cap 1GiB --cap-mode warn");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("the cap (1GiB, warn) is not checked"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Issue 50: on a runtime filesystem another user filled, the cap's ledger cannot be reserved: the job is not
/// started (its processes would each cap themselves alone, the job as a whole uncapped, in silence), and the
/// line says why and what to do.
#[test]
fn a_cap_whose_ledger_cannot_be_reserved_is_refused_before_the_job_starts() {
    let Some(full) = FullRuntime::mount("full-ledger") else {
        return;
    };
    let fc = full.fc();
    let (run, _) = fc.traced(
        "full-ledger",
        &["--cap", "1GiB", "--python-agent", "off"],
        program("probe"),
        &["alloc 1048576", "exit 0"],
    );
    assert!(!run.status.success(), "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot reserve the cap's ledger"),
        "{}",
        run.stderr
    );
    // The program never ran: the driver saw no allocation.
    let log = std::fs::read_to_string(fc.log_path()).unwrap_or_default();
    assert!(!log.contains("cuMemAlloc"), "{log}");
}
