//! `vramtrace kernel launch --traces DIR [--cap SPEC] -- CMD...`: what a traced kernel's spec runs. Names this
//! session's trace (`DIR/<UTC time>-<pid>.vtrace`) and becomes `vramtrace run --out TRACE -- CMD` (exec: the
//! same process, so Jupyter's signals and its kill reach `run`, which passes them on), with `VRAMTRACE_BIN` set
//! so that the kernel's `%vramtrace` asks this same binary.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{paths, KernelError};

/// This session's trace in `traces` (made private if it went missing).
pub fn trace_for_session(traces: &Path) -> Result<PathBuf, KernelError> {
    paths::private_dir(traces)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // `2026-03-21 12:34:56 UTC` as a name that sorts by time: `2026-03-21T123456Z`.
    let stamp = crate::units::utc(now)
        .trim_end_matches(" UTC")
        .replace(' ', "T")
        .replace(':', "");
    Ok(traces.join(format!("{stamp}Z-{}.vtrace", std::process::id())))
}

/// Becomes `vramtrace run`; returns only if that could not start.
pub fn exec(traces: &Path, cap: Option<&str>, command: &[OsString]) -> KernelError {
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
}
