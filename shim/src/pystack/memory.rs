//! Reading the interpreter's memory: directly once a walk has been validated, else through process_vm_readv (or
//! a pipe), which reports an unreadable address instead of faulting.

use super::*;

/// Reading the process's own memory.
pub(super) trait Mem {
    /// Fills `dst` from `addr`; false when that memory cannot be read.
    fn copy(&self, addr: usize, dst: &mut [u8]) -> bool;

    /// Calls `f` with the `len` bytes at `addr`.
    fn with_bytes<R>(&self, addr: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let mut v = vec![0u8; len];
        self.copy(addr, &mut v).then(|| f(&v))
    }

    fn word(&self, addr: usize) -> Option<usize> {
        let mut b = [0u8; 8];
        (addr.is_multiple_of(8) && self.copy(addr, &mut b)).then(|| usize::from_ne_bytes(b))
    }

    fn u32(&self, addr: usize) -> Option<u32> {
        let mut b = [0u8; 4];
        (addr.is_multiple_of(4) && self.copy(addr, &mut b)).then(|| u32::from_ne_bytes(b))
    }

    fn i32(&self, addr: usize) -> Option<i32> {
        self.u32(addr).map(|v| v as i32)
    }

    fn u8(&self, addr: usize) -> Option<u8> {
        let mut b = [0u8; 1];
        self.copy(addr, &mut b).then_some(b[0])
    }
}

/// Plain loads, for a layout that passed validation. Addresses outside user space are refused.
pub(super) struct Direct;

#[inline]
pub(super) fn range_ok(addr: usize, len: usize) -> bool {
    addr >= 0x1000 && addr.checked_add(len).is_some_and(|end| end <= 1 << 48)
}

impl Mem for Direct {
    #[inline]
    fn copy(&self, addr: usize, dst: &mut [u8]) -> bool {
        if !range_ok(addr, dst.len()) {
            return false;
        }
        // SAFETY: the layout was validated with safe reads; every address here was derived from it.
        // Unlike `Safe`, nothing here survives a bad address: `Direct` is used only once VALIDATION passed
        // (and by tests, on their own memory), on addresses reached through the validated offsets from this
        // thread's own frames, each checked by `range_ok`, `ptr_ok` and the object type checks of the walk.
        // A layout wrong past what validation looked at would fault here, not return false.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        true
    }

    #[inline]
    fn with_bytes<R>(&self, addr: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if !range_ok(addr, len) {
            return None;
        }
        // SAFETY: as in `copy`.
        Some(f(unsafe {
            std::slice::from_raw_parts(addr as *const u8, len)
        }))
    }
}

/// Reads that report an unreadable address instead of faulting: `process_vm_readv` on our own pid, or, where
/// that is refused (seccomp), a write of the memory into a pipe (`EFAULT`) and a read back.
pub(super) struct Safe {
    pid: libc::pid_t,
    pipe: std::cell::Cell<Option<[c_int; 2]>>,
}

impl Safe {
    pub(super) fn new() -> Safe {
        Safe {
            // SAFETY: no preconditions.
            pid: unsafe { libc::getpid() },
            pipe: std::cell::Cell::new(None),
        }
    }

    pub(super) fn vm_readv(&self, addr: usize, dst: &mut [u8]) -> Result<bool, ()> {
        let local = libc::iovec {
            iov_base: dst.as_mut_ptr().cast(),
            iov_len: dst.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: dst.len(),
        };
        // SAFETY: `local` is our buffer; the kernel checks `remote`.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n >= 0 {
            return Ok(n as usize == dst.len());
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EPERM) | Some(libc::EACCES) => Err(()),
            _ => Ok(false),
        }
    }

    pub(super) fn through_pipe(&self, addr: usize, dst: &mut [u8]) -> bool {
        let fds = match self.pipe.get() {
            Some(fds) => fds,
            None => {
                let mut fds = [0 as c_int; 2];
                // SAFETY: fds has room for two descriptors.
                if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0
                {
                    return false;
                }
                self.pipe.set(Some(fds));
                fds
            }
        };
        for (i, chunk) in dst.chunks_mut(4096).enumerate() {
            let from = addr + i * 4096;
            // SAFETY: the kernel reads `from` on our behalf and fails with EFAULT where it cannot.
            let w = unsafe { libc::write(fds[1], from as *const c_void, chunk.len()) };
            if w != chunk.len() as isize {
                if w > 0 {
                    let mut sink = [0u8; 4096];
                    // SAFETY: draining what was written into our buffer.
                    unsafe { libc::read(fds[0], sink.as_mut_ptr().cast(), w as usize) };
                }
                return false;
            }
            // SAFETY: reading back into `chunk`.
            let r = unsafe { libc::read(fds[0], chunk.as_mut_ptr().cast(), chunk.len()) };
            if r != chunk.len() as isize {
                return false;
            }
        }
        true
    }
}

impl Drop for Safe {
    fn drop(&mut self) {
        if let Some([r, w]) = self.pipe.get() {
            // SAFETY: our own descriptors.
            unsafe {
                libc::close(r);
                libc::close(w);
            }
        }
    }
}

impl Mem for Safe {
    fn copy(&self, addr: usize, dst: &mut [u8]) -> bool {
        if !range_ok(addr, dst.len()) {
            return false;
        }
        if dst.is_empty() {
            return true;
        }
        match self.vm_readv(addr, dst) {
            Ok(ok) => ok,
            Err(()) => self.through_pipe(addr, dst),
        }
    }
}
