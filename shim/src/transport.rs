//! The two ways out of the process: the shared-memory ring (`vramtrace_format::ring`) that carries every
//! event and record the moment it is made, and the Unix socket to the collector that carries the hello (with
//! the ring's descriptor, passed by `SCM_RIGHTS`), the records that wait for an answer (out-of-memory), and the
//! answers. The ring lives in a sealed memfd: once the collector holds it, the process can die at any
//! instruction and what it published is still there to drain.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use vramtrace_format::ring::{self, Ring};
use vramtrace_format::{OOM_ACK, OOM_NAK};

/// How long the first tracked call waits, at most, for room in the collector's backlog.
const CONNECT_WAIT: Duration = Duration::from_millis(200);

/// The socket to the collector, so a forked child can close its copy.
pub(crate) static SOCKET_FD: AtomicI32 = AtomicI32::new(-1);

/// A ring mapped in this process. Never unmapped: a forked child abandons its parent's recorder (and its ring)
/// rather than pull memory from under a pointer it cannot see.
pub(crate) struct Mapped {
    pub ring: Ring,
    pub fd: i32,
}

/// Makes the ring: a memfd sealed against shrinking (the collector maps it and must never fault on it),
/// mapped shared, laid out for `slots` slots. The descriptor stays open until it is passed to the collector.
pub(crate) fn make_ring(slots: u64, pid: u32, flags: u32) -> Result<Mapped, String> {
    let name = b"vramtrace-ring\0";
    // SAFETY: `name` is NUL-terminated and outlives the call; the flags are memfd_create's own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    } as i32;
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    let len = ring::bytes_for(slots);
    let fail = |what: &str| {
        let e = format!("{what}: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is the memfd made above, used by nothing else; every path that calls `fail` returns, so
        // it is closed once.
        unsafe { libc::close(fd) };
        Err(e)
    };
    // A file-size limit (`ulimit -f`) below the ring's size would refuse the sizing with SIGXFSZ, which kills.
    if !fits_file_limit(len) {
        // SAFETY: the memfd made above, used by nothing else, closed once on this way out.
        unsafe { libc::close(fd) };
        return Err(format!(
            "the process's file-size limit (ulimit -f) is below the ring's {len} bytes"
        ));
    }
    // SAFETY: integer arguments on our own memfd; the file-size limit was checked (no SIGXFSZ).
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        return fail("sizing the ring");
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS takes an integer; `fd` is our own memfd.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
        return fail("sealing the ring");
    }
    // SAFETY: a new mapping where the kernel chooses (null hint): it replaces nothing. The memfd is `len` bytes
    // long and sealed against shrinking, so no page of the mapping can fault.
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
    if base == libc::MAP_FAILED {
        return fail("mapping the ring");
    }
    // SAFETY: a fresh shared mapping of `len` zeroed bytes, page-aligned, never unmapped.
    let ring = unsafe { Ring::init(base.cast(), slots, pid, flags) };
    Ok(Mapped { ring, fd })
}

/// Whether RLIMIT_FSIZE lets a file grow to `len` bytes: sizing past it would raise SIGXFSZ in the host,
/// whose default action kills it.
fn fits_file_limit(len: usize) -> bool {
    // SAFETY: `rlimit` is two integers: all zeroes is valid.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a local the call writes.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } != 0 {
        return true;
    }
    lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= len as libc::rlim_t
}

/// A connected Unix stream socket, written with `MSG_NOSIGNAL`: a collector that went away must never raise
/// SIGPIPE in the host.
pub(crate) struct Socket {
    pub fd: i32,
    /// The socket's identity (device, inode) when it was made: a host that closes our descriptor and gets the
    /// number back for a file or socket of its own must never receive our bytes, nor have its data read.
    id: (u64, u64),
}

impl Socket {
    pub fn connect(path: &OsString) -> Option<Socket> {
        let bytes = path.as_bytes();
        // SAFETY: `sockaddr_un` is integers and a byte array: all zeroes is valid (and keeps the path
        // NUL-terminated, as only `len - 1` bytes are copied in).
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            return None;
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // CLOEXEC: a program this process execs must not hold our connection open. Non-blocking while
        // connecting: a collector that stopped (a full backlog) must not hang the program's first CUDA call.
        // SAFETY: integer arguments only.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return None;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        let deadline = Instant::now() + CONNECT_WAIT;
        loop {
            // SAFETY: `addr` is a whole local `sockaddr_un`, of the length given; `fd` is the socket made above.
            if unsafe { libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error().raw_os_error();
            if e == Some(libc::EINTR) {
                continue;
            }
            if e != Some(libc::EAGAIN) || Instant::now() >= deadline {
                // SAFETY: the socket made above, used by nothing else, closed once on this way out.
                unsafe { libc::close(fd) };
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: F_GETFL and F_SETFL take and give integers; `fd` is our own socket.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        // Out of the way of the host's own low descriptors (close-on-exec kept).
        let fd = crate::fds::high_fd(fd);
        let id = identity(fd)?;
        SOCKET_FD.store(fd, Ordering::Release);
        Some(Socket { fd, id })
    }

    /// Whether the descriptor is still the socket we made.
    pub fn ours(&self) -> bool {
        identity(self.fd) == Some(self.id)
    }

    /// Sends `buf` with descriptor `pass` attached to its first byte (`SCM_RIGHTS`). On failure, the error of
    /// the `sendmsg` that carried the descriptor (`None`: not ours, or it went and the rest did not).
    pub fn send_with_fd(&self, buf: &[u8], pass: i32) -> Result<(), Option<i32>> {
        if !self.ours() || buf.is_empty() {
            return Err(None);
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
        let mut cbuf = [0u64; 8]; // aligned room for one descriptor's control message
        debug_assert!(space <= std::mem::size_of_val(&cbuf));
        // SAFETY: `msghdr` is integers and raw pointers: all zeroes is valid (null pointers, zero lengths).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg_controllen` (CMSG_SPACE of one descriptor, 24 bytes on LP64) covers a `cmsghdr`, so
        // CMSG_FIRSTHDR returns `cbuf`'s start: 8-aligned, inside the 64-byte local, which also holds the
        // descriptor CMSG_DATA points to (written unaligned regardless).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            libc::CMSG_DATA(c).cast::<i32>().write_unaligned(pass);
        }
        let n = loop {
            // SAFETY: `msg` points at `iov` (the caller's `buf`, read only) and `cbuf`, locals alive for the
            // call.
            let n = unsafe { libc::sendmsg(self.fd, &msg, libc::MSG_NOSIGNAL) };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break n;
        };
        if n <= 0 {
            return Err(std::io::Error::last_os_error().raw_os_error());
        }
        // The descriptor went with the first byte; the rest is plain data.
        if self.send_all(&buf[n as usize..]) {
            Ok(())
        } else {
            Err(None)
        }
    }

    pub fn send_all(&self, mut buf: &[u8]) -> bool {
        if !self.ours() {
            return false;
        }
        while !buf.is_empty() {
            // SAFETY: `buf` is a live slice of `buf.len()` bytes, only read.
            let n =
                unsafe { libc::send(self.fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return false;
            }
            buf = &buf[n as usize..];
        }
        true
    }

    /// Whether the collector closed its end (checked without waiting; answers it sent are left unread).
    pub fn closed(&self) -> bool {
        if !self.ours() {
            return true;
        }
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one local `pollfd`, as the count says.
        if unsafe { libc::poll(&mut pfd, 1, 0) } <= 0 {
            return false;
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return true;
        }
        let mut b = 0u8;
        // SAFETY: `b` is a local byte, the one byte the call may write.
        let n = unsafe {
            libc::recv(
                self.fd,
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_PEEK,
            )
        };
        n == 0
    }

    /// The next byte the collector sends, waited for until `deadline`. `None`: the deadline passed, the
    /// connection ended, or the descriptor is no longer our socket.
    fn next_byte(&self, deadline: Instant) -> Option<u8> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.ours() {
                return None;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one local `pollfd`, as the count says.
            if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
                continue;
            }
            let mut b = 0u8;
            // SAFETY: `b` is a local byte, the one byte the call may write.
            let n =
                unsafe { libc::recv(self.fd, (&mut b as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
            match n {
                1 => return Some(b),
                0 => return None,
                _ if matches!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EAGAIN | libc::EINTR)
                ) => {}
                _ => return None,
            }
        }
    }

    /// One line the collector sent (the job's settings, in answer to the hello), waited for until `deadline`; at
    /// most `settings::MAX_LINE` bytes. Read a byte at a time: nothing after the line is taken from the socket
    /// (the answers to records that wait come later, read by `await_ack`).
    pub fn read_line(&self, deadline: Instant) -> Option<Vec<u8>> {
        let mut line = Vec::new();
        while line.len() < vramtrace_format::settings::MAX_LINE {
            match self.next_byte(deadline)? {
                b'\n' => return Some(line),
                b => line.push(b),
            }
        }
        None
    }

    /// Waits until `deadline` for the collector's answer to the `nth` record sent that waits for one (counting
    /// from 1; `answered` counts the answers read so far on this connection). Answers come one per such record,
    /// in order, so a late answer to an earlier record (one that gave up waiting) is skipped, never taken for
    /// this one (as is a settings line that came after its wait). Whether this record's answer says it is in
    /// the trace.
    pub fn await_ack(&self, nth: u64, answered: &mut u64, deadline: Instant) -> bool {
        while let Some(b) = self.next_byte(deadline) {
            if b == OOM_ACK || b == OOM_NAK {
                *answered += 1;
                if *answered == nth {
                    return b == OOM_ACK;
                }
            }
        }
        false
    }
}

/// (device, inode) of an open descriptor.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: `stat` is integers and padding: all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a local the call writes; a bad `fd` only makes it fail.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Socket, i32) {
        let mut fds = [0i32; 2];
        assert_eq!(
            // SAFETY: `fds` has room for the two descriptors the call writes.
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) },
            0
        );
        let id = identity(fds[0]).unwrap();
        (Socket { fd: fds[0], id }, fds[1])
    }

    fn answer(fd: i32, b: u8) {
        // SAFETY: one byte read from the local `b`.
        assert_eq!(unsafe { libc::write(fd, (&b as *const u8).cast(), 1) }, 1);
    }

    #[test]
    fn each_record_gets_its_own_answer_never_an_earlier_ones() {
        let (sock, peer) = pair();
        let soon = || Instant::now() + Duration::from_millis(50);
        let mut answered = 0;
        // The first record gave up waiting; its answer arrives late, while the second waits: not the second's.
        answer(peer, OOM_ACK);
        assert!(!sock.await_ack(2, &mut answered, soon()));
        assert_eq!(answered, 1);
        answer(peer, OOM_ACK);
        assert!(sock.await_ack(2, &mut answered, soon()));
        // A record the collector could not write is answered "not in the trace".
        answer(peer, OOM_NAK);
        assert!(!sock.await_ack(3, &mut answered, soon()));
        assert_eq!(answered, 3);
        assert!(!sock.closed());
        // SAFETY: the test's own end of the pair, closed once.
        unsafe { libc::close(peer) };
        assert!(sock.closed());
        // SAFETY: `sock`'s descriptor, closed once; `sock` is not used again (`Socket` has no `Drop`).
        unsafe { libc::close(sock.fd) };
    }

    #[test]
    fn the_ring_travels_with_the_first_byte_and_is_sealed() {
        let (sock, peer) = pair();
        let m = make_ring(ring::MIN_SLOTS, 42, 0).expect("memfd");
        assert!(m.ring.try_event(&vramtrace_format::Event {
            ts_ns: 5,
            tid: 1,
            api: vramtrace_format::Api::MemAlloc,
            flags: 0,
            device: 0,
            result: 0,
            addr: 9,
            size: 10,
            aux: 0,
            stack: 0,
        }));
        assert!(sock.send_with_fd(b"hello", m.fd).is_ok());
        // Receive it as the collector does, and map what came.
        let mut data = [0u8; 16];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: `msghdr` is integers and raw pointers: all zeroes is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: `msg` points at `iov` (over `data`) and `cbuf`, locals of the sizes it gives.
        let n = unsafe { libc::recvmsg(peer, &mut msg, 0) };
        assert_eq!(&data[..n as usize], b"hello");
        // SAFETY: `msg` is the header recvmsg filled; CMSG_FIRSTHDR reads only its control fields.
        let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        assert!(!c.is_null());
        // SAFETY: `c` is non-null, so a whole `cmsghdr` lies in `cbuf`; the kernel wrote one descriptor after it
        // (SCM_RIGHTS, as sent), read unaligned.
        let fd = unsafe { libc::CMSG_DATA(c).cast::<i32>().read_unaligned() };
        // SAFETY: integer arguments only.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0);
        // SAFETY: integer arguments; the seal makes it fail.
        assert_eq!(unsafe { libc::ftruncate(fd, 4096) }, -1, "sealed");
        let len = ring::bytes_for(ring::MIN_SLOTS);
        // SAFETY: a new mapping where the kernel chooses (null hint): it replaces nothing.
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
        // SAFETY: `base` maps the `len` bytes of the sealed memfd, page-aligned, never unmapped. MAP_FAILED is
        // not checked first: were the mapping refused, this would read from address -1 (test code only).
        let r = unsafe { Ring::open(base.cast(), len) }.unwrap();
        assert_eq!(r.pid(), 42);
        let mut c = ring::Consumer::new(r);
        let mut got = vec![];
        c.drain(false, |it| {
            if let ring::Item::Event(e) = it {
                got.push(e.addr)
            }
        });
        assert_eq!(got, vec![9]);
    }
}
