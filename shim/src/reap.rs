//! Children the process reaps itself. `vramtrace run` is the job's child subreaper and writes how each process
//! it reaps ended (`Record::Exit`), but a process whose own parent reaps it (torchrun's agent reaping its workers
//! with `os.waitpid`, a shell reaping its commands) never reaches it: a worker that died of an out-of-memory
//! error or a SIGKILL would be named nowhere. So the reaper's shim says what it reaped (`Record::Reaped`).
//!
//! `wait4`, `waitpid`, `wait` and `waitid` (exports.rs) call the real function with the caller's arguments
//! (a null status pointer becomes a local one) and return its result and `errno` exactly as it left them. Only a
//! real reap is reported: a child's pid back, and it exited or was killed; never a stopped or continued child,
//! nor a `WNOWAIT` peek (the child is still there to be reaped).
//!
//! The report may run in a signal handler (bash and others reap from their SIGCHLD handler), so it keeps to what
//! is async-signal-safe: nothing allocated, locked or waited for, no panic. The frame is encoded into a stack
//! buffer (format's `codec::encode_reaped_into`), then:
//! - a process that has its ring (it made a tracked call and is connected) publishes it there, lock-free
//!   (`record::publish_frame_anywhere`);
//! - any other (one that never touched CUDA, such as torchrun's agent or a shell; a forked child before its own
//!   first call; a full ring) makes a one-shot connection to the collector's socket: a non-blocking
//!   `socket`/`connect`, the one frame sent with `MSG_NOSIGNAL | MSG_DONTWAIT`, `close`. No hello, no ring: the
//!   collector takes a connection whose first frame is a Reaped frame as a report, from the process the kernel
//!   names (`SO_PEERCRED`). Whatever fails (no collector, its backlog full) drops the report silently.
//!
//! Not under vramtrace (no `VRAMTRACE_SOCKET`), nothing is done beyond the real call.
//!
//! The real functions and the collector's address are found ahead of any wait (waits.rs). Until then a wait is
//! the system call itself.

use std::ffi::{c_int, c_long, c_void};
use std::ptr::null_mut;

use libc::{id_t, idtype_t, pid_t, rusage, siginfo_t};

use crate::waits::{collector_addr, real, Real};
use vramtrace_format::{codec, ticks, ExitStatus};

type Wait4Fn = unsafe extern "C" fn(pid_t, *mut c_int, c_int, *mut rusage) -> pid_t;
type WaitpidFn = unsafe extern "C" fn(pid_t, *mut c_int, c_int) -> pid_t;
type WaitFn = unsafe extern "C" fn(*mut c_int) -> pid_t;
type WaitidFn = unsafe extern "C" fn(idtype_t, id_t, *mut siginfo_t, c_int) -> c_int;

#[inline]
fn errno() -> c_int {
    // SAFETY: glibc's `__errno_location` returns this thread's errno, a live, aligned `int`.
    unsafe { *libc::__errno_location() }
}

#[inline]
fn set_errno(e: c_int) {
    // SAFETY: as in `errno`: this thread's own errno.
    unsafe { *libc::__errno_location() = e };
}

// ---- the four functions ------------------------------------------------------------------------------------

pub unsafe fn wait4(pid: pid_t, status: *mut c_int, options: c_int, ru: *mut rusage) -> pid_t {
    let mut local: c_int = 0;
    let st = if status.is_null() { &mut local } else { status };
    let p = real(Real::Wait4);
    let r = if p.is_null() {
        sys_wait4(pid, st, options, ru)
    } else {
        std::mem::transmute::<*mut c_void, Wait4Fn>(p)(pid, st, options, ru)
    };
    after_wait(r, options, st);
    r
}

pub unsafe fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t {
    let mut local: c_int = 0;
    let st = if status.is_null() { &mut local } else { status };
    let p = real(Real::Waitpid);
    let r = if p.is_null() {
        sys_wait4(pid, st, options, null_mut())
    } else {
        std::mem::transmute::<*mut c_void, WaitpidFn>(p)(pid, st, options)
    };
    after_wait(r, options, st);
    r
}

pub unsafe fn wait(status: *mut c_int) -> pid_t {
    let mut local: c_int = 0;
    let st = if status.is_null() { &mut local } else { status };
    let p = real(Real::Wait);
    let r = if p.is_null() {
        sys_wait4(-1, st, 0, null_mut())
    } else {
        std::mem::transmute::<*mut c_void, WaitFn>(p)(st)
    };
    after_wait(r, 0, st);
    r
}

pub unsafe fn waitid(idtype: idtype_t, id: id_t, infop: *mut siginfo_t, options: c_int) -> c_int {
    let mut local: siginfo_t = std::mem::zeroed();
    let ip = if infop.is_null() { &mut local } else { infop };
    let p = real(Real::Waitid);
    let r = if p.is_null() {
        sys_waitid(idtype, id, ip, options)
    } else {
        std::mem::transmute::<*mut c_void, WaitidFn>(p)(idtype, id, ip, options)
    };
    if r == 0 {
        let si = &*ip;
        if let Some((child, status)) = reaped_by_waitid(
            options,
            si.si_signo,
            si.si_code,
            si.si_pid(),
            si.si_status(),
        ) {
            let e = errno();
            report(child, status);
            set_errno(e);
        }
    }
    r
}

/// The system calls behind glibc's functions, for a process where the lookup found none (never seen).
unsafe fn sys_wait4(pid: pid_t, st: *mut c_int, options: c_int, ru: *mut rusage) -> pid_t {
    libc::syscall(libc::SYS_wait4, pid as c_long, st, options as c_long, ru) as pid_t
}

unsafe fn sys_waitid(idtype: idtype_t, id: id_t, ip: *mut siginfo_t, options: c_int) -> c_int {
    let ru = null_mut::<rusage>();
    let (idtype, id, options) = (idtype as c_long, id as c_long, options as c_long);
    libc::syscall(libc::SYS_waitid, idtype, id, ip, options, ru) as c_int
}

/// After `wait4`, `waitpid` or `wait` returned `r` with the status at `st`: report it if it reaped a child.
/// `st` is read only when the call succeeded (the kernel wrote it): a bad pointer the caller passed gave
/// `EFAULT`, which must not become our fault.
#[inline]
unsafe fn after_wait(r: pid_t, options: c_int, st: *const c_int) {
    if r <= 0 {
        return;
    }
    if let Some((child, status)) = reaped_by_wait(r, options, *st) {
        let e = errno();
        report(child, status);
        set_errno(e);
    }
}

/// What `wait4`/`waitpid`/`wait` reaped: a child's pid back (not 0 for `WNOHANG` with none ready, not -1), and
/// it exited or was killed; not a stopped or continued one, nor one only peeked at (`WNOWAIT`).
pub fn reaped_by_wait(r: pid_t, options: c_int, status: c_int) -> Option<(u32, ExitStatus)> {
    if r <= 0 || options & libc::WNOWAIT != 0 {
        return None;
    }
    Some((r as u32, ExitStatus::from_wait(status)?))
}

/// What a `waitid` that returned 0 reaped: the child it names (`si_pid`; 0 for `WNOHANG` with none ready), if
/// it exited, was killed or dumped core (`si_code`), and was not only peeked at (`WNOWAIT`).
pub fn reaped_by_waitid(
    options: c_int,
    si_signo: c_int,
    si_code: c_int,
    si_pid: pid_t,
    si_status: c_int,
) -> Option<(u32, ExitStatus)> {
    if options & libc::WNOWAIT != 0 || si_signo != libc::SIGCHLD || si_pid <= 0 {
        return None;
    }
    Some((
        si_pid as u32,
        ExitStatus::from_child_info(si_code, si_status)?,
    ))
}

// ---- the report --------------------------------------------------------------------------------------------

/// Tells the collector, if there is one, that this process reaped `child`. Async-signal-safe; never waits.
fn report(child: u32, status: ExitStatus) {
    let Some(addr) = collector_addr() else {
        return;
    };
    let mut buf = [0u8; codec::REAPED_FRAME_MAX];
    // SAFETY: getpid has no preconditions, and is async-signal-safe.
    let pid = unsafe { libc::getpid() } as u32;
    let Some(n) = codec::encode_reaped_into(&mut buf, pid, ticks::monotonic(), child, status)
    else {
        return;
    };
    let Some(frame) = buf.get(..n) else {
        return;
    };
    if !crate::record::publish_frame_anywhere(frame) {
        one_shot(&addr, frame);
    }
}

/// The report on a connection of its own: connect without waiting, send the one frame without waiting, close.
fn one_shot(addr: &libc::sockaddr_un, frame: &[u8]) {
    // SAFETY: `fd` is a socket made here and closed once, here; `addr` is a whole `sockaddr_un` of the length
    // given; `frame` is a live slice of `frame.len()` bytes. All four calls are async-signal-safe.
    unsafe {
        let fd = libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
        if fd < 0 {
            return;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::connect(fd, (addr as *const libc::sockaddr_un).cast(), len) == 0 {
            libc::send(
                fd,
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            );
        }
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_real_reaps_are_reported() {
        let code = |c: i32| c << 8;
        // exit(3), SIGKILL, a core dump.
        assert_eq!(
            reaped_by_wait(42, 0, code(3)),
            Some((42, ExitStatus::Code(3)))
        );
        assert_eq!(
            reaped_by_wait(42, libc::WNOHANG, 9),
            Some((
                42,
                ExitStatus::Signal {
                    signal: 9,
                    core: false
                }
            ))
        );
        assert_eq!(
            reaped_by_wait(42, 0, 0x80 | 6),
            Some((
                42,
                ExitStatus::Signal {
                    signal: 6,
                    core: true
                }
            ))
        );
        // Nothing reaped: none ready, an error, a peek, a stopped child, a continued one.
        assert_eq!(reaped_by_wait(0, libc::WNOHANG, 0), None);
        assert_eq!(reaped_by_wait(-1, 0, 0), None);
        assert_eq!(reaped_by_wait(42, libc::WNOWAIT, code(3)), None);
        assert_eq!(
            reaped_by_wait(42, libc::WUNTRACED, (libc::SIGSTOP << 8) | 0x7f),
            None
        );
        assert_eq!(reaped_by_wait(42, libc::WCONTINUED, 0xffff), None);
    }

    #[test]
    fn waitid_reports_only_exits_and_kills_it_reaped() {
        let sig = libc::SIGCHLD;
        assert_eq!(
            reaped_by_waitid(libc::WEXITED, sig, libc::CLD_EXITED, 7, 3),
            Some((7, ExitStatus::Code(3)))
        );
        assert_eq!(
            reaped_by_waitid(libc::WEXITED, sig, libc::CLD_KILLED, 7, 9),
            Some((
                7,
                ExitStatus::Signal {
                    signal: 9,
                    core: false
                }
            ))
        );
        assert_eq!(
            reaped_by_waitid(libc::WEXITED, sig, libc::CLD_DUMPED, 7, 11),
            Some((
                7,
                ExitStatus::Signal {
                    signal: 11,
                    core: true
                }
            ))
        );
        // A peek, WNOHANG with none ready (the kernel zeroes the info), stopped, continued, trapped.
        let peek = libc::WEXITED | libc::WNOWAIT;
        assert_eq!(reaped_by_waitid(peek, sig, libc::CLD_EXITED, 7, 3), None);
        assert_eq!(
            reaped_by_waitid(libc::WEXITED | libc::WNOHANG, 0, 0, 0, 0),
            None
        );
        for c in [libc::CLD_STOPPED, libc::CLD_CONTINUED, libc::CLD_TRAPPED] {
            assert_eq!(reaped_by_waitid(libc::WSTOPPED, sig, c, 7, 19), None);
        }
    }

    #[test]
    fn the_system_calls_standing_in_for_missing_functions_reap_as_glibc_does() {
        let fork_exiting = |code: i32| {
            // SAFETY: the child only calls `_exit`, which is async-signal-safe, as a child of a threaded process
            // must.
            let p = unsafe { libc::fork() };
            assert!(p >= 0);
            if p == 0 {
                // SAFETY: _exit has no preconditions; the child leaves without running the parent's exit
                // handlers.
                unsafe { libc::_exit(code) };
            }
            p
        };
        let a = fork_exiting(5);
        let mut st = 0;
        // SAFETY: `st` is a local the kernel writes; a null rusage is allowed.
        assert_eq!(unsafe { sys_wait4(a, &mut st, 0, null_mut()) }, a);
        assert_eq!(
            reaped_by_wait(a, 0, st),
            Some((a as u32, ExitStatus::Code(5)))
        );
        let b = fork_exiting(6);
        // SAFETY: `siginfo_t` is integers and unions of them: all zeroes is valid.
        let mut si: siginfo_t = unsafe { std::mem::zeroed() };
        assert_eq!(
            // SAFETY: `si` is a local `siginfo_t` the kernel writes.
            unsafe { sys_waitid(libc::P_PID, b as id_t, &mut si, libc::WEXITED) },
            0
        );
        // SAFETY: `si` was filled by a successful waitid for an exited child, so `si_pid` and `si_status` name
        // the union members the kernel wrote.
        let got = unsafe {
            reaped_by_waitid(
                libc::WEXITED,
                si.si_signo,
                si.si_code,
                si.si_pid(),
                si.si_status(),
            )
        };
        assert_eq!(got, Some((b as u32, ExitStatus::Code(6))));
        // Nothing left to reap: -1 and ECHILD, as glibc's would say.
        // SAFETY: `st` is a local; a null rusage is allowed (the call fails with ECHILD here anyway).
        assert_eq!(unsafe { sys_wait4(b, &mut st, 0, null_mut()) }, -1);
        assert_eq!(errno(), libc::ECHILD);
    }
}
