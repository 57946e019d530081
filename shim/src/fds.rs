//! The shim's own file descriptors, kept out of the host's way.

/// The shim's own descriptors (the ledger's lock, the collector's socket) move to the lowest free number at or
/// above this: a host that closes and reopens its own low descriptors then never gets ours by number.
pub const HIGH_FD: i32 = 512;

/// `fd` moved to a high number (close-on-exec), or left where it is if that cannot be done.
pub(crate) fn high_fd(fd: i32) -> i32 {
    if fd < 0 {
        return fd;
    }
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur as i64
    } else {
        0
    };
    let want = HIGH_FD.min((soft / 2) as i32);
    if want <= fd {
        return fd;
    }
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, want) };
    if high < 0 {
        return fd;
    }
    unsafe { libc::close(fd) };
    high
}
