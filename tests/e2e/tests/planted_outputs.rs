//! Another local user plants something at the name a job's user will write (`run --out`, `export --out`) in a
//! folder both may write (`/tmp`, a team's 1777 scratch folder): a link to a file of the job's user, or a file
//! of its own, open to all. With `--force` or not, the victim's file is never written through the link and the
//! trace never lands in a file the other user can read.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::*;

const JOB_USER: u32 = 65533;
const OTHER: u32 = 65534;

/// A sticky folder every user may write, as /tmp is.
fn shared_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramtrace-plant-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

/// `path`, made by `uid` (root makes it, then gives it away: what a user can make in the folder).
fn give(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

/// A file of the job's user that the other user would like overwritten (its shell profile, say).
fn victim(dir: &Path) -> PathBuf {
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    give(&home, JOB_USER);
    let v = home.join("profile");
    std::fs::write(&v, b"export PATH=/usr/bin\n").unwrap();
    give(&v, JOB_USER);
    v
}

fn run_job(fc: &FakeCuda, out: &Path, force: bool) -> std::process::Output {
    let mut c = fc.as_user(JOB_USER, vramtrace());
    c.args(["run", "--python-agent", "off", "--quiet"]);
    if force {
        c.arg("--force");
    }
    c.arg("--out")
        .arg(out)
        .args(["--", "true"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_planted_link_never_redirects_a_trace_or_an_export() {
    if !can_drop_privileges() {
        return;
    }
    let fc = FakeCuda::new();
    let dir = shared_dir("link");
    let v = victim(&dir);
    let before = std::fs::read(&v).unwrap();
    // A trace of the job's user to export from.
    let good = dir.join("good.vtrace");
    let o = run_job(&fc, &good, false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (verb, name) in [("run", "t.vtrace"), ("export", "t.html")] {
        let out = dir.join(name);
        std::os::unix::fs::symlink(&v, &out).unwrap();
        give(&out, OTHER);
        for force in [false, true] {
            let o = if verb == "run" {
                run_job(&fc, &out, force)
            } else {
                let mut c = fc.as_user(JOB_USER, vramtrace());
                c.args(["export", "--format", "html"]);
                if force {
                    c.arg("--force");
                }
                c.arg("--out").arg(&out).arg(&good).output().unwrap()
            };
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{verb} force={force}: {err}");
            assert!(
                err.contains("belongs to another user"),
                "{verb} force={force}: {err}"
            );
            assert_eq!(
                std::fs::read(&v).unwrap(),
                before,
                "{verb} force={force} wrote through the link"
            );
            assert!(std::fs::symlink_metadata(&out)
                .unwrap()
                .file_type()
                .is_symlink());
        }
    }
    // Nothing half-made is left in the shared folder: the two names, the victim's home, the good trace.
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 4, "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_planted_open_file_never_receives_the_trace() {
    if !can_drop_privileges() {
        return;
    }
    let fc = FakeCuda::new();
    let dir = shared_dir("file");
    let out = dir.join("t.vtrace");
    std::fs::write(&out, b"").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o666)).unwrap();
    give(&out, OTHER);
    let o = run_job(&fc, &out, true);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("belongs to another user"), "{err}");
    assert_eq!(
        std::fs::metadata(&out).unwrap().len(),
        0,
        "the trace went into their file"
    );
    // The job's user's own trace at a fresh name is its alone.
    let mine = dir.join("mine.vtrace");
    let o = run_job(&fc, &mine, false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = std::fs::metadata(&mine).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (JOB_USER, 0o600));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 50: names planted at every `TRACE.postmortem.N.txt` (2,000 of them, as another user can in a shared
/// folder) do not stop the post-mortem of a failed job from being written: past the plain names it takes one
/// nobody can guess, and says where.
#[test]
fn planted_post_mortem_names_do_not_stop_the_post_mortem() {
    let dir = shared_dir("postmortem-names");
    let out = dir.join("t.vtrace");
    std::fs::write(dir.join("t.postmortem.txt"), b"planted").unwrap();
    for n in 1..2000 {
        std::fs::write(dir.join(format!("t.postmortem.{n}.txt")), b"planted").unwrap();
    }
    let fc = FakeCuda::new();
    let r = fc
        .command(vramtrace())
        .args(["run", "--python-agent", "off", "--out"])
        .arg(&out)
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(3));
    let err = String::from_utf8_lossy(&r.stderr);
    let written = err
        .lines()
        .find_map(|l| l.split("post-mortem written to ").nth(1))
        .unwrap_or_else(|| panic!("{err}"));
    let path = PathBuf::from(written.split(' ').next().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("exit"), "{text}");
    assert!(!err.contains("cannot write the post-mortem"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
