//! What Rust's standard library links to that glibc 2.17 (the manylinux2014 baseline) does not have, defined here
//! for the binaries of the wheel (`scripts/build-wheel.sh` builds them with the `glibc217` feature, against zig's
//! glibc 2.17 stubs). Each is the system call glibc's own function makes, with glibc's conventions (-1 and
//! `errno`), so a process on a newer glibc behaves the same whichever definition it binds to.
//!
//! Only `getrandom` (glibc 2.25): std seeds its hash maps with it, and takes ENOSYS (kernels before 3.17) as
//! its cue to read /dev/urandom instead.

use std::ffi::{c_uint, c_void};

/// `getrandom(2)`.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes, as for glibc's.
#[no_mangle]
pub unsafe extern "C" fn getrandom(buf: *mut c_void, len: usize, flags: c_uint) -> isize {
    // SAFETY: the caller's contract; the kernel checks the buffer and fails with EFAULT rather than write
    // outside it.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as isize }
}

/// Makes sure a binary that depends on this crate links it (call once, anywhere: it does nothing).
#[inline(never)]
pub fn link() {
    std::hint::black_box(getrandom as unsafe extern "C" fn(*mut c_void, usize, c_uint) -> isize);
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_fills_a_buffer_as_glibcs_does() {
        let mut a = [0u8; 64];
        // SAFETY: `a` is a local buffer of `a.len()` bytes, as the call is told.
        let n = unsafe { super::getrandom(a.as_mut_ptr().cast(), a.len(), 0) };
        assert_eq!(n, 64);
        assert_ne!(a, [0u8; 64]);
        // A bad buffer: -1 and EFAULT, nothing written.
        // SAFETY: the bad address is the point: the kernel refuses it (EFAULT) before writing anything.
        let n = unsafe { super::getrandom(8 as *mut _, 16, 0) };
        assert_eq!(n, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EFAULT)
        );
    }
}
