//! The job run as it is, without the shim, when no runtime directory can be made.

use std::io;
use std::process::Command;

use vramtrace_format::env;

use super::args::{CapMode, RunArgs};
use super::cap::cap_mode;
use super::supervise::{as_started, wait_signal, Signals, FORWARDED};
use crate::process::exit::{self, Code};

/// Runs the command as it is, without the shim, when the job's runtime directory cannot be made: nothing of the
/// job is traced, capped or bridged, and `run` says so in one line before the job starts. Signals sent to us
/// are passed on as in a traced run; its exit code is the command's.
pub(super) fn run_untraced(
    args: &RunArgs,
    why: &crate::files::runtime_dir::NoRuntimeDir,
    signals: &Signals,
) -> Code {
    let cap = args.cap.clone().or_else(|| {
        std::env::var(env::CAP)
            .ok()
            .filter(|c| !c.trim().is_empty())
    });
    // An enforced cap that cannot be kept is not dropped quietly on a shared GPU: refused, as before the job.
    if cap.is_some() && cap_mode(args).is_ok_and(|m| m == CapMode::Enforce) {
        return exit::fail(
            exit::USAGE,
            format!(
                "{why}: the cap cannot be enforced without it, so the job was not started (with \
                 --cap-mode warn it runs untraced and uncapped)"
            ),
        );
    }
    crate::note!(
        "vramtrace: {why}: the job runs untraced: no trace is written{}, no Python bridge",
        cap.map_or(String::new(), |c| format!(
            ", the cap ({c}, warn) is not checked"
        ))
    );
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    as_started(&mut cmd, None);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return spawn_failed(args, &e),
    };
    let pid = child.id() as i32;
    std::mem::forget(child);
    loop {
        let mut status = 0;
        // SAFETY: `status` is a local int the call writes; the pid is an integer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if let Some(x) = vramtrace_format::ExitStatus::from_wait(status) {
                return x.shell_code();
            }
        } else if r < 0 {
            return exit::FAILURE;
        }
        if let Some(signo) = wait_signal(signals, 200) {
            if FORWARDED.contains(&signo.0) && signo.1 != libc::SI_KERNEL {
                // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
                unsafe { libc::kill(pid, signo.0) };
            }
        }
    }
}

/// Exit code and one line for a command that could not be started.
pub(super) fn spawn_failed(args: &RunArgs, e: &io::Error) -> Code {
    let name = args.command[0].to_string_lossy();
    match e.kind() {
        io::ErrorKind::NotFound => {
            exit::fail(exit::NOT_FOUND, format!("{name}: command not found"))
        }
        // execve says EACCES for a folder too; the shell's words for it are clearer.
        io::ErrorKind::PermissionDenied if is_folder(&args.command[0]) => {
            exit::fail(exit::NOT_EXECUTABLE, format!("{name}: is a directory"))
        }
        io::ErrorKind::PermissionDenied => {
            exit::fail(exit::NOT_EXECUTABLE, format!("{name}: permission denied"))
        }
        _ => exit::fail(exit::NOT_EXECUTABLE, format!("{name}: cannot run: {e}")),
    }
}

/// Whether the command names a folder: by its path when it has a slash, else the first match on `PATH`, as
/// execvp looks it up.
fn is_folder(cmd: &std::ffi::OsStr) -> bool {
    let p = std::path::Path::new(cmd);
    if cmd.as_encoded_bytes().contains(&b'/') {
        return p.is_dir();
    }
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(p))
            .find(|c| c.exists())
            .is_some_and(|c| c.is_dir())
    })
}
