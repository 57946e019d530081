//! `vramtrace kernel launch --traces DIR [--cap SPEC] -- CMD...`: what a traced kernel's spec runs. Names this
//! session's trace (`DIR/<UTC time>-<pid>.vtrace`) and becomes `vramtrace run --out TRACE -- CMD` (exec: the
//! same process, so Jupyter's signals and its kill reach `run`, which passes them on), with `VRAMTRACE_BIN` set
//! so that the kernel's `%vramtrace` asks this same binary. Before it starts, the oldest sessions past the kernel's
//! `--keep` are removed ([`prune`]): a notebook user starts a session a day, and each trace (with PyTorch's
//! history beside it) can be hundreds of MiB.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::KernelError;
use super::paths;

/// This session's trace in `traces` (made private if it went missing).
pub fn trace_for_session(traces: &Path) -> Result<PathBuf, KernelError> {
    paths::private_dir(traces)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // `2026-03-21 12:34:56 UTC` as a name that sorts by time: `2026-03-21T123456Z`.
    let stamp = crate::names::units::utc(now)
        .trim_end_matches(" UTC")
        .replace(' ', "T")
        .replace(':', "");
    Ok(traces.join(format!("{stamp}Z-{}.vtrace", std::process::id())))
}

/// The session a file of a kernel's folder belongs to: its name's stem as [`trace_for_session`] makes it
/// (`2026-03-21T123456Z-4242`), followed by `.` and anything `run` or the bridge writes beside the trace
/// (`.vtrace`, `.oom.txt`, PyTorch's history). None for any other name: nothing else is ever removed.
fn session_of(name: &str) -> Option<&str> {
    let (stem, _) = name.split_once('.')?;
    let b = stem.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let shaped = b.len() > 19
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..17)
        && &b[17..19] == b"Z-"
        && digits(19..b.len());
    shaped.then_some(stem)
}

/// Removes the files of the oldest sessions in `traces` so that `keep` are left with the one about to start
/// (`keep` 0: all kept). A session whose trace `run` still writes (another notebook open on this kernel) is
/// never touched, nor is anything that is not a plain file of a session's name. Best effort: a session that
/// cannot be pruned must not stop the kernel. Returns how many sessions went.
pub fn prune(traces: &Path, keep: u32) -> usize {
    if keep == 0 {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(traces) else {
        return 0;
    };
    let mut sessions: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    for e in entries.flatten() {
        let (Some(name), Ok(t)) = (e.file_name().to_str().map(str::to_string), e.file_type())
        else {
            continue;
        };
        if let Some(stem) = session_of(&name).filter(|_| t.is_file()) {
            sessions.entry(stem.to_string()).or_default().push(e.path());
        }
    }
    let excess = sessions.len().saturating_sub(keep as usize - 1);
    let mut gone = 0;
    for (stem, files) in sessions.into_iter().take(excess) {
        if crate::whatif::trace_file::being_written(&traces.join(format!("{stem}.vtrace"))) {
            continue;
        }
        for f in files {
            let _ = std::fs::remove_file(f);
        }
        gone += 1;
    }
    gone
}

/// Becomes `vramtrace run`; returns only if that could not start.
pub fn exec(traces: &Path, keep: u32, cap: Option<&str>, command: &[OsString]) -> KernelError {
    if traces.is_dir() && paths::own_dir(traces).is_ok() {
        prune(traces, keep);
    }
    let trace = match trace_for_session(traces) {
        Ok(t) => t,
        Err(e) => return e,
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return KernelError::Io(PathBuf::from("/proc/self/exe"), e),
    };
    let mut c = Command::new(&exe);
    c.args(["run", "--quiet", "--out"]).arg(&trace);
    if let Some(cap) = cap {
        c.args(["--cap", cap]);
    }
    c.arg("--").args(command).env("VRAMTRACE_BIN", &exe);
    KernelError::Io(exe, c.exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_session_has_its_own_trace_named_by_its_time() {
        let d = std::env::temp_dir().join(format!("vt-kernel-launch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let t = trace_for_session(&d.join("k")).unwrap();
        let name = t.file_name().unwrap().to_str().unwrap();
        // 2026-03-21T123456Z-4242.vtrace
        assert_eq!(&name[10..11], "T", "{name}");
        assert_eq!(&name[17..19], "Z-", "{name}");
        assert!(
            name.ends_with(&format!("-{}.vtrace", std::process::id())),
            "{name}"
        );
        assert!(t.starts_with(d.join("k")));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_session_files_have_a_session() {
        assert_eq!(
            session_of("2026-03-21T123456Z-4242.vtrace"),
            Some("2026-03-21T123456Z-4242")
        );
        assert_eq!(
            session_of("2026-03-21T123456Z-4242.oom.txt"),
            Some("2026-03-21T123456Z-4242")
        );
        for other in [
            "spec",
            "notes.vtrace",
            ".2026-03-21T123456Z-4242.vtrace.tmp",
            "2026-03-21T123456Z-.vtrace",
            "2026-03-21T123456Z-4242",
            "2026-03-21 123456Z-4242.vtrace",
            "2026-03-21T12345xZ-4242.vtrace",
        ] {
            assert_eq!(session_of(other), None, "{other}");
        }
    }

    #[test]
    fn the_oldest_sessions_go_the_running_one_and_others_files_stay() {
        use std::os::unix::io::AsRawFd;
        let d = std::env::temp_dir().join(format!("vt-kernel-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let session = |i: u32| format!("2026-03-{:02}T120000Z-{}", i + 1, 100 + i);
        for i in 0..6 {
            std::fs::write(d.join(format!("{}.vtrace", session(i))), b"t").unwrap();
            std::fs::write(d.join(format!("{}.oom.txt", session(i))), b"o").unwrap();
        }
        std::fs::write(d.join("spec"), b"/x\n").unwrap();
        std::fs::write(d.join("mine.txt"), b"m").unwrap();
        // A link with a session's name is left alone (and what it points at).
        let target = d.join("target.txt");
        std::fs::write(&target, b"x").unwrap();
        std::os::unix::fs::symlink(&target, d.join("2026-01-01T000000Z-1.vtrace")).unwrap();
        // The oldest session's trace is still being written by its `run`.
        let busy = std::fs::File::open(d.join(format!("{}.vtrace", session(0)))).unwrap();
        // SAFETY: flock on a descriptor we own.
        assert_eq!(unsafe { libc::flock(busy.as_raw_fd(), libc::LOCK_EX) }, 0);

        // Keep 3 with the new one: sessions 0 (running), 4 and 5 stay; 1, 2 and 3 go.
        assert_eq!(prune(&d, 3), 3);
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            "2026-01-01T000000Z-1.vtrace".to_string(),
            "mine.txt".into(),
            "spec".into(),
            "target.txt".into(),
        ];
        for i in [0, 4, 5] {
            want.push(format!("{}.oom.txt", session(i)));
            want.push(format!("{}.vtrace", session(i)));
        }
        want.sort();
        assert_eq!(left, want);
        // 0 keeps everything; so does a folder with fewer sessions.
        assert_eq!(prune(&d, 0), 0);
        assert_eq!(prune(&d, 10), 0);
        drop(busy);
        let _ = std::fs::remove_dir_all(&d);
    }
}
