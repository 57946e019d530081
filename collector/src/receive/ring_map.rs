//! A ring's memory as it came from a process: mapped only when sealed and of a size its header agrees with,
//! unmapped when dropped; and whether the process still maps it.

use std::io::{self};
use std::os::fd::{AsRawFd, OwnedFd};

use vramtrace_format::ring::{self, Ring};

/// A shared mapping of a ring's memory, unmapped when dropped.
pub(super) struct Mapping {
    pub(super) base: *mut libc::c_void,
    pub(super) len: usize,
}

// SAFETY: the mapping is plain shared memory, unmapped only by Drop; moving the owner to another thread moves
// nothing the kernel ties to a thread.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping made in `map_ring`, unmapped once, here; no view of it outlives
        // its owner.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Maps a ring's descriptor as it came from a process: only sealed memory (a process that shrank it would make
/// the collector fault), of a size its header agrees with.
pub(super) fn map_ring(fd: &OwnedFd) -> Result<(Mapping, Ring, u64), String> {
    // SAFETY: F_GET_SEALS takes and returns integers on a descriptor we hold.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("its memory is not sealed against shrinking".into());
    }
    // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a local stat the call writes; the descriptor is one we hold.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || st.st_size <= 0 {
        return Err("its size cannot be read".into());
    }
    let len = st.st_size as usize;
    if len > ring::bytes_for(ring::MAX_SLOTS) {
        return Err(format!("it is too large ({len} bytes)"));
    }
    // SAFETY: maps `len` bytes (checked against the descriptor's size and sealed against shrinking above) of a
    // descriptor we hold; the result is checked for MAP_FAILED.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!(
            "it cannot be mapped: {}",
            io::Error::last_os_error()
        ));
    }
    let map = Mapping { base, len };
    // SAFETY: `len` bytes mapped shared for as long as `map` lives; sealed, so they cannot go away.
    match unsafe { Ring::open(base.cast(), len) } {
        Ok(r) => Ok((map, r, st.st_ino)),
        Err(e) => Err(format!(
            "its header is not one this collector reads ({e:?})"
        )),
    }
}

/// Whether process `pid` still maps the file with inode `ino` (its ring): false once it exited or exec'd, or
/// when its maps cannot be read.
pub(super) fn maps_inode(pid: u32, ino: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    // address perms offset dev inode path: the fifth field.
    maps.lines().any(|l| {
        l.split_whitespace()
            .nth(4)
            .and_then(|i| i.parse::<u64>().ok())
            == Some(ino)
    })
}
