//! What is known of one process's connection (`Conn`): who it speaks for, its ring, its hello, how it ended.
//! The connection's doings are in `conn` (frames), `drain` (the ring) and `hello`; they all stand on this.

use super::budget::Claim;
use super::connections::Connections;
use super::ingest::Refused;
use super::ring_map::Mapping;
use crate::names::ticks::mono_ns;
use crate::process::hangup::ClosedAt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vramtrace_format::codec::FrameSplitter;
use vramtrace_format::ring::{Consumer, Ring};
use vramtrace_format::Event;

/// Events per frame written from a ring.
pub(super) const BATCH: usize = 4096;

/// More records than a ring could drop between two looks: a scribbled count.
pub(super) const MAX_PLAUSIBLE_DROPS: u64 = 1 << 40;

/// A connection that has sent nothing for this long after it was accepted (and is not waiting for a
/// descriptor for its ring) is not a shim: closed, and named from what the kernel said of it.
pub(super) const SILENT_WAIT: Duration = Duration::from_secs(5);

/// Who a connection speaks for, as it goes: nobody until its first frame, then a process of the trace (the kernel's
/// pid, and the pid its hello said; none when the collector named it) or a reporter of its children's exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Who {
    Unknown,
    Process { pid: u32, said: Option<u32> },
    Reporter { said: u32 },
}

/// One process's connection and ring: whole frames go to the trace as they come; when it closes, the ring is
/// drained to its end and the end is recorded.
pub(super) struct Conn {
    pub(super) stream: UnixStream,
    pub(super) split: FrameSplitter,
    /// Who the connection speaks for: nobody yet, a process of the trace, or a reporter of exits.
    pub(super) who: Who,
    /// The goodbye the process published at `exit`, held back until its ring is drained (an atexit handler
    /// that runs after ours may still free memory), then written with the time of its last record.
    pub(super) goodbye: Option<u64>,
    pub(super) open: bool,
    pub(super) ring: Option<Drain>,
    /// A ring came that could not be used: said once in the trace.
    pub(super) bad_ring: Option<String>,
    /// When the process hung up, stamped by the watcher (`hangup`): the time of its end unless it outlived it.
    pub(super) closed_at: Option<ClosedAt>,
    /// When the process was found gone, if it went on after closing its socket.
    pub(super) gone_at: Option<u64>,
    /// A peer of another user that was gone before it was checked: judged on its hello.
    pub(super) gone: Option<GonePeer>,
    /// A descriptor held for the ring until the hello comes, let go just before each read: the ring always
    /// has a place to land (the kernel drops a passed descriptor it cannot place: `MSG_CTRUNC`).
    pub(super) reserve: Option<OwnedFd>,
    /// Since when the ring first had no place: no reserve could be had, or a look at the hello found none
    /// (`take_hello`). Either waits, in all, at most `RESERVE_WAIT` from then.
    pub(super) no_place_since: Option<Instant>,
    /// The peer as the kernel and /proc knew it when accepted: (pid, command line, parent).
    pub(super) peer: Option<(u32, Vec<String>, u32)>,
    /// Counted in `Connections::unannounced` until its hello comes (or it ends).
    pub(super) unannounced: Option<Arc<Connections>>,
    /// The peer's pid by the kernel (`SO_PEERCRED`): the process this connection speaks for.
    pub(super) kernel_pid: Option<u32>,
    /// What it sent that it may not say (`ingest`).
    pub(super) refused: Refused,
    /// Its claim on the budget for unfinished frames (`budget`); none in tests.
    pub(super) claim: Option<Claim>,
    /// Bytes of a refused frame still to come, skipped as they arrive.
    pub(super) skip: u64,
    /// The job's token (`VRAMTRACE_JOB_TOKEN`): a gone peer of another user is of the job only with it.
    pub(super) job_token: Arc<str>,
    /// The job's settings line, answered to the hello (empty: none to send).
    pub(super) settings: Arc<[u8]>,
    /// When it was accepted (`SILENT_WAIT`).
    pub(super) accepted: Instant,
    /// Closed for sending nothing (`SILENT_WAIT`).
    pub(super) mute: bool,
    /// The job's connections (parents known, exits reported); none in tests.
    pub(super) conns: Option<Arc<Connections>>,
    /// Answers owed to out-of-memory records dropped unfinished (`budget_unfinished`), sent after those owed
    /// to the records before them.
    pub(super) late_naks: usize,
    /// Why a peer was turned away before anything of it was written, said under pid 0.
    pub(super) turned_away: Option<String>,
}

/// What judging a gone peer on its hello takes (the job's token, `Conn::hello`): the peer's user, and the job's
/// connections (the refusals counted).
pub(super) struct GonePeer {
    pub(super) uid: u32,
    pub(super) conns: Arc<Connections>,
}

/// Whether the peer of `stream` has closed its end (without waiting).
pub(super) fn peer_hung_up(stream: &UnixStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one local pollfd, as the count says.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

/// A mapped ring and what its drains have said so far.
pub(super) struct Drain {
    /// Keeps the ring mapped while the consumer reads it.
    pub(super) _map: Mapping,
    pub(super) consumer: Consumer,
    pub(super) dropped_seen: u64,
    pub(super) torn_seen: u64,
    /// The consumer's `torn_blobs` already told.
    pub(super) torn_blobs: u64,
    /// When this ring was last drained (CLOCK_MONOTONIC), or when its process said hello.
    pub(super) last_ns: u64,
    pub(super) last_tick: u64,
    /// The latest time a tick promised: the process's end is never older.
    pub(super) promised: u64,
    /// The latest time of anything of this process written: a later event or record, or its goodbye, is held
    /// at no less.
    pub(super) last_ts: u64,
    /// Its events carry counter ticks (read once, when the ring was mapped: the process can write its header).
    pub(super) ticks: bool,
    /// The ring held something no shim writes: said once in the trace.
    pub(super) corrupt_said: bool,
    /// A drop count the ring could not have reached (never full) was said once.
    pub(super) drops_forged_said: bool,
    /// Where the drain has been waiting for a record to be published, and since when.
    pub(super) stuck: Option<(u64, u64)>,
    /// The ring's memfd inode: while the process maps it, it may still write to it.
    pub(super) ino: u64,
    pub(super) batch: Vec<Event>,
    pub(super) out: Vec<u8>,
}

impl Drain {
    pub(super) fn new(map: Mapping, ring: Ring, ino: u64) -> Drain {
        Drain {
            ticks: ring.ticks(),
            _map: map,
            consumer: Consumer::new(ring),
            dropped_seen: 0,
            torn_seen: 0,
            torn_blobs: 0,
            last_ns: mono_ns(),
            last_tick: 0,
            promised: 0,
            last_ts: 0,
            stuck: None,
            corrupt_said: false,
            drops_forged_said: false,
            ino,
            batch: Vec::with_capacity(BATCH),
            out: Vec::with_capacity(64 << 10),
        }
    }
}
