//! Receiving: the acceptor (`receive/accept.rs`) takes each process's connection (its hello, with its
//! shared-memory ring attached), and a receiver thread per process drains the ring and reads the socket into the
//! trace, in whole frames, until the process is gone; then it drains the ring to the end (a process that
//! `_exit`ed or was killed leaves its events there) and records how the connection ended.
//!
//! What was lost is said where it was lost: records the ring had no room for (counted by the shim in the shared
//! memory, so even a SIGKILL cannot take the count), told apart by cause (the collector stalled, or the
//! program outran it), records a process died in the middle of writing, and frames the disk would not take.

mod accept;
mod budget;
mod conn;
mod connections;
mod drain;
mod fds;
mod hello;
mod hold;
mod ingest;
mod limits;
mod peer;
mod reaped;
mod ring_map;
mod writer;

pub(crate) use accept::{cmdline_of, descends_from, spawn_acceptor, STARVED_NOTE};
pub(crate) use connections::Connections;
pub(crate) use hello::hostname;
pub use writer::TraceWriter;

#[cfg(test)]
mod tests {
    use super::accept::take;
    use super::hold::{blob_into, Hold, SOCKET_HOLD_NS};
    use super::ingest::{Refused, Speaker};
    use super::limits::RESERVE_WAIT;
    use super::peer::Conn;
    use super::*;
    use std::fs::File;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use vramtrace_format::codec::{self, kind};
    use vramtrace_format::{keys, Record};

    use vramtrace_test_wire::send_with_fd;

    fn hello(pid: u32) -> Record {
        vramtrace_test_wire::hello(pid, 1, 1, "worker")
    }

    /// The hellos a trace's bytes hold.
    fn hellos_in(bytes: &[u8]) -> Vec<vramtrace_format::Hello> {
        codec::frames(bytes)
            .filter_map(|(k, p)| match codec::decode_record(k, p) {
                Ok(Some(Record::Hello(h))) => Some(h),
                _ => None,
            })
            .collect()
    }

    /// Runs `case` in a child process (whose descriptor limit is its own) on a connection whose peer has sent
    /// a hello with a descriptor attached (a socket: no ring), writing to a trace file; passes if it returns
    /// true. `limit(n)` sets the child's soft descriptor limit (`None`: back to what it was).
    fn in_child_with_hello(
        name: &str,
        case: impl FnOnce(
            &mut Conn,
            &Mutex<TraceWriter>,
            &dyn Fn(Option<u64>),
            &std::path::Path,
        ) -> bool,
    ) {
        let dir = std::env::temp_dir().join(format!("vramtrace-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.vtrace");
        // SAFETY: in a test: the child only makes system calls (getrlimit, setrlimit) on locals before `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let (ours, theirs) = UnixStream::pair().unwrap();
                let trace = Mutex::new(TraceWriter::new(File::create(&path).unwrap(), 0));
                let mut buf = Vec::new();
                codec::put_record(&mut buf, &hello(4242));
                send_with_fd(&theirs, &buf, theirs.as_raw_fd());
                let mut conn = Conn::new(ours);
                // As the kernel would say of the process that sent the hello.
                conn.kernel_pid = Some(4242);
                // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
                let mut was: libc::rlimit = unsafe { std::mem::zeroed() };
                // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
                unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut was) };
                let limit = |n: Option<u64>| {
                    let l = libc::rlimit {
                        rlim_cur: n.map_or(was.rlim_cur, |n| n as libc::rlim_t),
                        rlim_max: was.rlim_max,
                    };
                    // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
                    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) };
                };
                case(&mut conn, &trace, &limit, &path)
            }))
            .unwrap_or(false);
            // SAFETY: in the forked test child: `_exit` ends it at once, running nothing of the parent's state.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `status` is a local int the call writes; the pid is an integer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        let hellos = hellos_in(&std::fs::read(&path).unwrap_or_default());
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "status {status}: {hellos:?}"
        );
    }

    /// Why the first hello in the trace file at `path` says its process is untraced ("" if it does not).
    fn untraced_why(path: &std::path::Path) -> String {
        hellos_in(&std::fs::read(path).unwrap_or_default())
            .first()
            .and_then(|h| h.extra.iter().find(|(k, _)| k == keys::hello::NO_RING))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_ring_with_no_place_is_looked_at_again_and_arrives_once_a_place_frees() {
        // The reserve let go, and its place taken before the read (here: a limit of 0, so no place at all): the
        // kernel would drop the passed descriptor (MSG_CTRUNC). Looked at first, it stays queued instead.
        in_child_with_hello("peek", |conn, trace, limit, path| {
            conn.reserve = conn.stream.try_clone().ok().map(OwnedFd::from);
            limit(Some(0));
            let early = conn.pump(trace);
            limit(None);
            let waited = !early && conn.pid().is_none() && conn.no_place_since.is_some();
            let mut later = false;
            for _ in 0..100 {
                later |= conn.pump(trace);
                if conn.pid().is_some() {
                    break;
                }
            }
            // It arrived: no ring but a socket here, so the mapping's refusal is what the hello says.
            waited && later && conn.pid() == Some(4242) && untraced_why(path).contains("not sealed")
        });
    }

    #[test]
    fn a_ring_that_never_finds_a_place_leaves_its_process_named_untraced() {
        // No place for `RESERVE_WAIT`: the hello is read as it is (the ring lost), and names its process.
        in_child_with_hello("ctrunc", |conn, trace, limit, path| {
            conn.reserve = conn.stream.try_clone().ok().map(OwnedFd::from);
            let start = Instant::now();
            limit(Some(0));
            while conn.pid().is_none() && start.elapsed() < RESERVE_WAIT * 5 {
                conn.pump(trace);
            }
            limit(None);
            start.elapsed() >= RESERVE_WAIT
                && conn.ring.is_none()
                && conn.pid() == Some(4242)
                && untraced_why(path).contains("no file descriptor was free")
        });
    }

    #[test]
    fn a_hello_is_not_read_until_its_ring_has_a_place() {
        // No reserve could be had (no descriptor free): the read waits rather than lose the ring; once one is
        // free, the ring arrives (here no ring but a socket, so the mapping's refusal is what is said).
        in_child_with_hello("wait", |conn, trace, limit, path| {
            limit(Some(0));
            let early = conn.pump(trace);
            limit(None);
            let waited = !early && conn.pid().is_none();
            let later = conn.pump(trace);
            let why = untraced_why(path);
            // Once the hello is read, no descriptor is held for it any more.
            waited
                && later
                && conn.pid() == Some(4242)
                && why.contains("not sealed")
                && conn.reserve.is_none()
                && conn.stream.set_nonblocking(true).is_ok()
                && !conn.pump(trace)
                && conn.reserve.is_none()
        });
    }

    #[test]
    fn a_silent_connection_does_not_hold_the_acceptor() {
        // A peer that connects and says nothing: handed to its receiver at once (it counts as unannounced, so
        // no newcomer promise passes it), where it used to hold the acceptor for the hello's wait.
        let dir = std::env::temp_dir().join(format!("vramtrace-silent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = Arc::new(Mutex::new(TraceWriter::new(
            File::create(dir.join("t.vtrace")).unwrap(),
            0,
        )));
        let conns = Arc::new(Connections::default());
        let mut peers = Vec::new();
        let start = Instant::now();
        for _ in 0..10 {
            let (ours, theirs) = UnixStream::pair().unwrap();
            peers.push(theirs);
            assert!(!take(ours, &trace, &conns, None, None, None));
        }
        let took = start.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(took < Duration::from_millis(100), "{took:?} for 10");
        assert_eq!(conns.unannounced.load(Ordering::Acquire), 10);
    }

    #[test]
    fn a_ring_that_cannot_be_mapped_is_named_in_the_hello() {
        // The other side of the test above: with room for the descriptor, it arrives; it is no ring (a socket),
        // so the mapping's refusal is what the hello says.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let dir = std::env::temp_dir().join(format!("vramtrace-ring-ok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.vtrace");
        let trace = Mutex::new(TraceWriter::new(File::create(&path).unwrap(), 0));
        let mut buf = Vec::new();
        codec::put_record(&mut buf, &hello(4243));
        send_with_fd(&theirs, &buf, theirs.as_raw_fd());
        let mut conn = Conn::new(ours);
        conn.kernel_pid = Some(4243);
        assert!(conn.pump(&trace));
        let hellos = hellos_in(&std::fs::read(&path).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
        let why = &hellos[0].extra[0].1;
        assert!(
            why.contains("not sealed") && !why.contains("no file descriptor"),
            "{why}"
        );
    }

    #[test]
    fn a_processs_own_records_are_held_behind_what_came_before_and_raise_the_hold() {
        // Records carry CLOCK_MONOTONIC, events the counter converted here: a note stamped a little before the
        // event the collector last took from the ring goes after it, and a later record moves the hold on.
        let note = |ts_ns, text: &str| Record::Note {
            pid: 7,
            ts_ns,
            text: text.to_string(),
        };
        let mut blob = Vec::new();
        codec::put_record(&mut blob, &note(100, "before"));
        codec::put_record(
            &mut blob,
            &Record::ContextGone {
                pid: 7,
                ts_ns: 300,
                device: 0,
                how: "cuCtxDestroy".to_string(),
            },
        );
        codec::put_record(&mut blob, &note(250, "after"));
        codec::put_record(&mut blob, &Record::Goodbye { pid: 7, ts_ns: 50 });
        let mut hold = Hold {
            last: 200,
            promised: 0,
            now: 1_000,
            most: None,
        };
        let (mut out, mut goodbye) = (Vec::new(), None);
        let mut refused = Refused::default();
        let who = Speaker { kernel: 7, said: 7 };
        blob_into(
            &mut out,
            &blob,
            &mut goodbye,
            &mut hold,
            who,
            &mut refused,
            None,
        );
        assert_eq!(refused.count(), 0);
        let times: Vec<(u8, u64)> = codec::frames(&out)
            .map(|(k, p)| {
                let mut r = codec::decode_record(k, p).unwrap().unwrap();
                (k, *r.process_time_mut().unwrap())
            })
            .collect();
        assert_eq!(
            times,
            [
                (kind::NOTE, 200),
                (kind::CONTEXT_GONE, 300),
                (kind::NOTE, 300)
            ]
        );
        assert_eq!(hold.last, 300);
        assert_eq!(goodbye, Some(50), "the goodbye is held where it is written");
    }

    #[test]
    fn a_record_from_the_socket_is_held_only_across_the_clocks_error() {
        // An out-of-memory record comes on the socket after a drain that took other threads' later events: held
        // behind them by at most SOCKET_HOLD_NS, never behind its process's promise.
        let mut h = Hold {
            last: 9_000_000,
            promised: 100,
            now: 10_000_000,
            most: Some(SOCKET_HOLD_NS),
        };
        assert_eq!(h.record(1_000_000), 1_000_000 + SOCKET_HOLD_NS);
        assert_eq!(h.record(8_999_990), 9_000_000, "a few ns behind: held");
        h.promised = 20_000;
        assert_eq!(h.record(50), 20_000, "never before the promise");
        assert_eq!(h.last, 9_000_000);
        // A time on another clock, far ahead: left alone, and the process's later entries are not dragged.
        let far = 1_795_392_033_881_848_015;
        assert_eq!(h.record(far), far);
        assert_eq!(h.last, 9_000_000);
        // In the ring's order (no bound), held as far as it takes.
        h.most = None;
        assert_eq!(h.record(1_000_000), 9_000_000);
    }
}
