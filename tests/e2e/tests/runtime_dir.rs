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

#[test]
fn a_full_runtime_filesystem_does_not_stop_the_job() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small filesystem needs root");
        return;
    }
    let dir = TempDir::new("full");
    let base = dir.path().join("full");
    std::fs::create_dir_all(&base).unwrap();
    let fc = FakeCuda::new().env("XDG_RUNTIME_DIR", &base);
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&base)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(base.clone());
    // Fill it.
    let _ = std::fs::write(base.join("fill"), vec![0u8; 1 << 20]);
    assert!(std::fs::metadata(base.join("fill")).unwrap().size() < 1 << 20);
    let (run, path) = fc.traced("full", &[], program("probe"), &["alloc 1048576", "exit 0"]);
    run.assert_success("on a full runtime filesystem");
    run.says("cannot write the Python bridge");
    let t = vramtrace_e2e::traced::read_trace(&path);
    assert_eq!(t.events.values().flatten().filter(|e| e.ok()).count(), 1);
}
