//! Waiting on the job: its signals (blocked, read through a signalfd, passed on to the command), the reaping of
//! every process of it (run is their subreaper), and its exit code as a shell would give it.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use vramtrace_format::{codec, Record};

use crate::names::ticks::mono_ns;
use crate::process::exit::{self, Code};
use crate::receive::{Connections, TraceWriter};

pub(super) const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The signals we forward, blocked and read from a signalfd.
pub(super) struct Signals {
    fd: i32,
}

impl Signals {
    pub(super) fn block() -> io::Result<Signals> {
        // SAFETY: `sa` and the signal sets are locals the calls read or write; `on_file_size_limit` is an extern
        // "C" handler that does nothing; the signalfd made here is owned by `Signals`.
        unsafe {
            // A write past a file-size limit (`ulimit -f`) raises SIGXFSZ, which kills: with a handler the write
            // fails with EFBIG instead, and the trace's writer says what was lost. A handler, unlike an ignored
            // signal, is not inherited by the command.
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_file_size_limit as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            if libc::sigaction(libc::SIGXFSZ, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in FORWARDED {
                libc::sigaddset(&mut set, s);
            }
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Signals { fd })
        }
    }
}

pub(super) extern "C" fn on_file_size_limit(_: libc::c_int) {}

/// Reaps every child that has ended (the command, and descendants orphaned to us), writing each one's wait
/// status into the trace. Returns the command's status when it is among them.
pub(super) fn reap(
    command: u32,
    trace: &Mutex<TraceWriter>,
    conns: &Connections,
) -> (Option<vramtrace_format::ExitStatus>, bool) {
    let mut mine = None;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a local int the call writes; the pid is an integer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid == 0 {
            return (mine, false);
        }
        if pid < 0 {
            // ECHILD: no process of the job is left.
            return (mine, true);
        }
        let Some(x) = vramtrace_format::ExitStatus::from_wait(status) else {
            continue;
        };
        let pid = pid as u32;
        if let Ok(mut r) = conns.reaped.lock() {
            r.insert(pid);
        }
        if pid == command {
            mine = Some(x);
        }
        let mut buf = Vec::new();
        codec::put_record(
            &mut buf,
            &Record::Exit(vramtrace_format::Exit {
                pid,
                ts_ns: mono_ns(),
                status: x,
            }),
        );
        if let Ok(mut w) = trace.lock() {
            w.write(pid, &buf);
        }
    }
}

/// Waits for the command, forwarding signals to it and reaping whatever else of the job ends meanwhile. A
/// signal the terminal sent to the whole foreground group (si_code SI_KERNEL) already reached the command, so
/// only signals sent to us alone are passed on.
pub(super) fn supervise(
    command: u32,
    signals: &Signals,
    trace: &Mutex<TraceWriter>,
    conns: &Connections,
) -> Option<vramtrace_format::ExitStatus> {
    loop {
        let (mine, none_left) = reap(command, trace, conns);
        if mine.is_some() {
            return mine;
        }
        if none_left {
            return None;
        }
        if let Some(signo) = wait_signal(signals, 200) {
            if FORWARDED.contains(&signo.0) && signo.1 != libc::SI_KERNEL {
                // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
                unsafe { libc::kill(command as i32, signo.0) };
            }
        }
    }
}

/// After the command: reaps the rest of the job until none is left or `deadline`. Returns how many processes
/// were still running then (at least one, if any).
pub(super) fn reap_until(
    signals: &Signals,
    trace: &Mutex<TraceWriter>,
    conns: &Connections,
    deadline: Instant,
) -> usize {
    loop {
        if reap(0, trace, conns).1 {
            return 0;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return children_left();
        }
        let _ = wait_signal(signals, left.as_millis().clamp(1, 50) as i32);
    }
}

/// Our children still running (by /proc), at least 1 when the count cannot be read.
pub(super) fn children_left() -> usize {
    let me = std::process::id();
    std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
        .map(|s| s.split_whitespace().count().max(1))
        .unwrap_or(1)
}

/// Waits up to `ms` for a signal on the signalfd: (signal, si_code).
pub(super) fn wait_signal(signals: &Signals, ms: i32) -> Option<(i32, i32)> {
    let mut pfd = libc::pollfd {
        fd: signals.fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one local pollfd, as the count says.
    if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
        return None;
    }
    // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is a local signalfd_siginfo and `size` its size, as the call is told; the descriptor is the
    // signalfd we made.
    let n = unsafe { libc::read(signals.fd, &mut info as *mut _ as *mut libc::c_void, size) };
    (n as usize == size).then_some((info.ssi_signo as i32, info.ssi_code))
}

/// The command's exit code, or 128+N when signal N ended it, as a shell reports it.
pub(super) fn exit_code(status: Option<vramtrace_format::ExitStatus>) -> Code {
    status.map_or(exit::FAILURE, |s| s.shell_code())
}

/// The command starts as if `run` were not there: none of our blocked signals (std does not reset the mask it
/// inherits), and the descriptor limit it had before we raised ours (`nofile`).
pub(super) fn as_started(cmd: &mut Command, nofile: Option<crate::process::fdlimit::Original>) {
    // SAFETY: the closure runs between fork and exec: it only clears the signal mask and restores a resource
    // limit, async-signal-safe system calls on locals.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            if let Some(o) = nofile {
                o.restore();
            }
            Ok(())
        });
    }
}
