//! Reading a connection with the descriptors that ride on it (`SCM_RIGHTS`): the ring comes with the hello.

use std::io::{self};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::limits::RESERVE_WAIT;

/// `recvmsg` into `buf`, with any descriptors that came attached (`SCM_RIGHTS`), owned, and whether some were
/// lost on the way (`MSG_CTRUNC`: the kernel had no descriptor free for them here, or no room in our buffer).
/// Reads what comes before and with the hello, the ring's descriptor among it, without losing the ring to a
/// full descriptor table. A descriptor the kernel cannot place is dropped with the message that carried it
/// (`MSG_CTRUNC`), and another of the collector's threads may take the place the reserve left between its
/// release and the read. So the message is looked at first (`MSG_PEEK` installs copies of its descriptors and
/// leaves it queued): with no place for the ring, it stays queued and `None` says to look again, for at most
/// `RESERVE_WAIT` from the first such look (`since`); after that it is read as it is, and the hello names its
/// process untraced. Once the look has the ring, the same bytes are read for good (the second copy of the
/// descriptor, if the kernel could place it, is closed).
pub(super) fn take_hello(
    stream: &UnixStream,
    buf: &mut [u8],
    since: &mut Option<Instant>,
) -> io::Result<Option<(usize, Vec<OwnedFd>, bool)>> {
    let (n, fds, lost) = recv_with_fds(stream, buf, libc::MSG_PEEK)?;
    if n == 0 {
        return Ok(Some((0, fds, lost)));
    }
    if lost && since.get_or_insert_with(Instant::now).elapsed() < RESERVE_WAIT {
        return Ok(None);
    }
    let (taken, again, lost_again) = recv_with_fds(stream, &mut buf[..n], 0)?;
    Ok(Some(if lost {
        (taken, again, lost_again)
    } else {
        (taken, fds, false)
    }))
}

pub(super) fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 32];
    // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: `msg` points at a local iovec and control buffer that outlive the call; the socket is open.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled by recvmsg above with a control buffer of ours; the CMSG macros walk only inside it,
    // and each descriptor SCM_RIGHTS delivered is new to this process, owned once by its OwnedFd.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<i32>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, fds, msg.msg_flags & libc::MSG_CTRUNC != 0))
}
