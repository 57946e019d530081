//! The shim's own file descriptors, kept out of the host's way.

/// The shim's own descriptors (the ledger's lock, the collector's socket) move to the lowest free number at or
/// above this: a host that closes and reopens its own low descriptors then never gets ours by number.
pub const HIGH_FD: i32 = 512;

/// `fd` moved to a high number (close-on-exec), or left where it is if that cannot be done.
pub(crate) fn high_fd(fd: i32) -> i32 {
    if fd < 0 {
        return fd;
    }
    // SAFETY: `rlimit` is two integers: all zeroes is a valid value.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a local the call writes.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur as i64
    } else {
        0
    };
    let want = HIGH_FD.min((soft / 2) as i32);
    if want <= fd {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC only reads `fd` (the caller's, handed to us) and creates a new descriptor.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, want) };
    if high < 0 {
        return fd;
    }
    // SAFETY: the caller handed `fd` over to be moved; `high` now stands in for it and the caller uses only what
    // this returns, so nothing else closes or uses `fd`.
    unsafe { libc::close(fd) };
    high
}
