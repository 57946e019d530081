//! The driver's own log of its memory calls (`FAKECUDA_LOG`): the truth the shim's traces are compared with.
//!
//! One line per call, written with a single `write(2)` on an `O_APPEND` descriptor, so lines from many
//! threads and processes never interleave:
//!
//! ```text
//! <pid> <tid> <function-as-called> <result-code> <addr-hex> <size-decimal> <aux-hex>
//! 4242 4243 cuMemAllocAsync_ptsz 0 0x600000500000 4194304 0x10000
//! ```
//!
//! Columns per function (failed allocations log addr `0x0`):
//! - allocations (`cuMemAlloc[_v2]`, `cuMemAllocPitch[_v2]`, `cuMemAllocManaged`, `cuMemAllocAsync[_ptsz]`,
//!   `cuMemAllocFromPoolAsync[_ptsz]`): addr = the pointer returned, size = bytes requested (pitch x height
//!   for the pitched ones), aux = the pitch (pitched), the flags (managed), the stream (stream-ordered), else 0.
//! - frees (`cuMemFree[_v2]`, `cuMemFreeAsync[_ptsz]`): addr = the pointer given, size = the bytes it held
//!   (0 when it was not an allocation), aux = the stream (stream-ordered) else 0.
//! - `cuMemCreate`: addr = the handle, size, aux = the device (`u32::MAX` for pinned host memory). `cuMemRelease`: addr = the handle,
//!   size = its size (0 if unknown), aux 0.
//! - `cuMemAddressReserve`: addr = the range returned, size, aux = the alignment asked for.
//!   `cuMemAddressFree`, `cuMemUnmap`: addr, size, aux 0. `cuMemMap`: addr, size, aux = the handle.
//!   `cuMemSetAccess`: addr, size, aux = number of descriptors.
//!   `cuMemRetainAllocationHandle`: addr = the address given, size = the handle's size, aux = the handle.
//! - `cuMemGetInfo[_v2]`: addr = total, size = free, aux = the device.
//! - `cuMemPoolCreate`: addr = the pool, size 0, aux = the device; `cuMemPoolDestroy`: addr = the pool;
//!   `cuMemPoolTrimTo`: addr = the pool, size = minBytesToKeep.
//!
//! When `FAKECUDA_LOG` is unset the cost is one relaxed atomic load per call.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

use crate::types::CUresult;

const UNSET: i32 = -2;
static FD: AtomicI32 = AtomicI32::new(UNSET);
static OPEN: Once = Once::new();

fn fd() -> i32 {
    let fd = FD.load(Ordering::Relaxed);
    if fd != UNSET {
        return fd;
    }
    OPEN.call_once(|| {
        let fd = match &crate::config::get().log_path {
            Some(path) => match CString::new(path.as_os_str().as_bytes()) {
                Ok(c) => {
                    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC;
                    // SAFETY: a valid NUL-terminated path.
                    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
                    if fd < 0 {
                        eprintln!("fakecuda: cannot open FAKECUDA_LOG {}", path.display());
                    }
                    fd.max(-1)
                }
                Err(_) => -1,
            },
            None => -1,
        };
        FD.store(fd, Ordering::Release);
    });
    FD.load(Ordering::Acquire)
}

/// A line being formatted on the stack.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Appends one line for a memory call (see the module comment for the columns).
pub fn call(name: &str, rc: CUresult, addr: u64, size: u64, aux: u64) {
    let fd = fd();
    if fd < 0 {
        return;
    }
    // SAFETY: plain syscalls.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    if writeln!(line, "{pid} {tid} {name} {rc} {addr:#x} {size} {aux:#x}").is_ok() {
        // SAFETY: writing our own buffer; one write(2) per line keeps lines whole under O_APPEND.
        unsafe { libc::write(fd, line.buf.as_ptr().cast(), line.len) };
    }
}
