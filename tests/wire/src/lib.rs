//! The shim's side of the collector's socket protocol (docs/TRACE-FORMAT.md), for tests that speak it by hand
//! (the forger, the collector's receiver tests, the e2e tests that read what a shim sent). One copy, so that a
//! change to the protocol is made once and every test follows it.
//!
//! Test code: failures panic with what went wrong.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use vramtrace_format::ring::{self, Consumer, Item, Ring};
use vramtrace_format::{codec, Hello, Record};

/// Sends `buf` on `s` with descriptor `fd` attached (`SCM_RIGHTS`), as the shim sends its hello and ring.
/// Panics unless all of `buf` went in one `sendmsg`.
pub fn send_with_fd(s: &UnixStream, buf: &[u8], fd: i32) {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: `msghdr` is integers and pointers, valid all zero; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
    // SAFETY: `cbuf` (64 bytes) holds one control message of one descriptor; CMSG_FIRSTHDR points into it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
        libc::CMSG_DATA(c).cast::<i32>().write_unaligned(fd);
        assert_eq!(libc::sendmsg(s.as_raw_fd(), &msg, 0), buf.len() as isize);
    }
}

/// A ring as the shim makes one: a sealed memfd of `slots` slots for process `pid`, mapped shared. Returns the
/// ring and its descriptor (to pass with the hello). The mapping lives as long as the process.
pub fn memfd_ring(pid: u32, slots: u64) -> (Ring, i32) {
    let len = ring::bytes_for(slots);
    // SAFETY: plain system calls on a descriptor made here; the mapping is checked before it is used.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_memfd_create,
            c"vramtrace-test-ring".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        ) as i32;
        assert!(fd >= 0, "memfd_create");
        assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
        assert_eq!(
            libc::fcntl(
                fd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL
            ),
            0
        );
        let base = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(base, libc::MAP_FAILED);
        (Ring::init(base.cast(), slots, pid, 0), fd)
    }
}

/// A hello as a shim would say it: process `pid` of parent `ppid`, running `cmd`, stamped `ts_ns`.
pub fn hello(pid: u32, ppid: u32, ts_ns: u64, cmd: &str) -> Record {
    Record::Hello(Hello {
        pid,
        ppid,
        ts_ns,
        cmdline: vec![cmd.into()],
        hostname: "h".into(),
        rank: None,
        local_rank: None,
        slurm_procid: None,
        shim_version: "test".into(),
        extra: vec![],
    })
}

/// Every record published in the ring behind `fd` (its process is gone), in ring order.
pub fn ring_records(fd: i32) -> Vec<Record> {
    // SAFETY: `stat` is integers, valid all zero; fstat fills it for a descriptor the caller holds.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is the local stat above, which the call writes; `fd` is the caller's open descriptor.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    let len = st.st_size as usize;
    // SAFETY: maps the whole file behind `fd`, checked below, unmapped before returning.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: `base` maps `len` bytes of a ring's memory file.
    let ring = unsafe { Ring::open(base.cast(), len) }.expect("a ring");
    let mut c = Consumer::new(ring);
    let mut out = Vec::new();
    c.drain(true, |it| {
        if let Item::Blob(b) = it {
            for (k, p) in codec::frames(b) {
                if let Ok(Some(r)) = codec::decode_record(k, p) {
                    out.push(r);
                }
            }
        }
    });
    // SAFETY: the mapping made above; `ring` and `c` are not used after.
    unsafe { libc::munmap(base, len) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_and_its_ring_arrive_together_and_the_ring_reads_back() {
        let (a, b) = UnixStream::pair().unwrap();
        let (ring, fd) = memfd_ring(7, 1 << 10);
        let mut frame = Vec::new();
        codec::put_record(&mut frame, &hello(7, 1, 5, "t"));
        send_with_fd(&a, &frame, fd);
        // The other end gets the bytes and a descriptor of the same ring.
        let mut buf = [0u8; 512];
        let mut cbuf = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: a C struct of integers and pointers: all zeroes (null pointers) is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: `msg` points at a local iovec and control buffer that outlive the call; the socket is open.
        let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, 0) };
        assert_eq!(n as usize, frame.len());
        // SAFETY: recvmsg filled the control buffer with one SCM_RIGHTS message (the whole frame came, checked
        // above): its first header and data lie inside the buffer.
        let got = unsafe {
            libc::CMSG_DATA(libc::CMSG_FIRSTHDR(&msg))
                .cast::<i32>()
                .read_unaligned()
        };
        let (k, p) = codec::frames(&buf[..n as usize]).next().unwrap();
        assert_eq!(
            codec::decode_record(k, p).unwrap(),
            Some(hello(7, 1, 5, "t"))
        );
        let mut note = Vec::new();
        let rec = Record::Note {
            pid: 7,
            ts_ns: 9,
            text: "x".into(),
        };
        codec::put_record(&mut note, &rec);
        assert!(ring.try_blob(&note));
        assert_eq!(ring_records(got), vec![rec]);
    }
}
