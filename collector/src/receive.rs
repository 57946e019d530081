//! Receiving: the acceptor (`receive/accept.rs`) takes each process's connection (its hello, with its
//! shared-memory ring attached), and a receiver thread per process drains the ring and reads the socket into the
//! trace, in whole frames, until the process is gone; then it drains the ring to the end (a process that
//! `_exit`ed or was killed leaves its events there) and records how the connection ended.
//!
//! What was lost is said where it was lost: records the ring had no room for (counted by the shim in the shared
//! memory, so even a SIGKILL cannot take the count), told apart by cause (the collector stalled, or the
//! program outran it), records a process died in the middle of writing, and frames the disk would not take.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vramtrace_format::codec::{self, kind, FrameSplitter};
use vramtrace_format::ring::{self, Consumer, Item, Ring};
use vramtrace_format::{EndKind, Event, LossCause, Record, OOM_ACK, OOM_NAK};

mod accept;
mod budget;
mod ingest;
mod reaped;

use accept::peer_identity;
pub(crate) use accept::{hostname, spawn_acceptor, Connections, STARVED_NOTE};
use budget::Claim;
use ingest::{Refusal, Refused, Speaker};
pub(crate) use reaped::write as write_reaped;

use crate::hangup::{self, ClosedAt, Hangups};
use crate::ticks::mono_ns;

/// The trace file, written in whole frames. When a write fails (a full disk), the file is cut back to its last
/// whole frame and nothing more is written: what arrives after is counted per process, so the summary can say
/// plainly what was lost.
#[doc(hidden)]
pub struct TraceWriter {
    pub(crate) file: File,
    /// Bytes in the file that are whole frames, for readers behind the writer (`live`, `--metrics`).
    pub written: Arc<std::sync::atomic::AtomicU64>,
    /// Bytes in the file, all whole frames.
    at: u64,
    failed: Option<io::Error>,
    /// After the failure: (frames, events) lost per pid, and the records of processes' ends lost.
    lost: std::collections::BTreeMap<u32, (u64, u64)>,
    lost_bytes: u64,
}

impl TraceWriter {
    pub fn new(file: File, at: u64) -> TraceWriter {
        TraceWriter {
            file,
            written: Arc::new(at.into()),
            at,
            failed: None,
            lost: Default::default(),
            lost_bytes: 0,
        }
    }

    /// Appends whole frames of process `pid`. Whether they are in the file.
    pub fn write(&mut self, pid: u32, frames: &[u8]) -> bool {
        if self.failed.is_none() {
            match self.file.write_all(frames) {
                Ok(()) => {
                    self.at += frames.len() as u64;
                    self.written.store(self.at, Ordering::Release);
                    return true;
                }
                Err(e) => {
                    // A frame half written would end the readable trace early: cut it off.
                    let _ = self.file.set_len(self.at);
                    self.failed = Some(e);
                }
            }
        }
        let l = self.lost.entry(pid).or_default();
        for (k, payload) in codec::frames(frames) {
            l.0 += 1;
            if k == kind::EVENTS || k == kind::EVENTS_STACKS {
                l.1 += events_in(payload);
            }
        }
        self.lost_bytes += frames.len() as u64;
        false
    }

    /// What the summary says when the trace could not be written to its end.
    pub(crate) fn loss_report(&self) -> String {
        let Some(e) = &self.failed else {
            return String::new();
        };
        let why = match e.raw_os_error() {
            Some(libc::ENOSPC) => "the disk is full".to_string(),
            Some(libc::EFBIG) => "the file-size limit (ulimit -f) was reached".to_string(),
            _ => e.to_string(),
        };
        let events: u64 = self.lost.values().map(|l| l.1).sum();
        let frames: u64 = self.lost.values().map(|l| l.0).sum();
        let mut m = format!(
            "THE TRACE IS INCOMPLETE: writing it failed after {} bytes ({why}); lost after that: {} events in {} \
             records ({} bytes) from {} process(es)",
            self.at,
            events,
            frames,
            self.lost_bytes,
            self.lost.keys().filter(|pid| **pid != 0).count()
        );
        // Pid 0 is the collector's own records (its promises for processes still to come), no process.
        let per: Vec<String> = self
            .lost
            .iter()
            .filter(|(pid, _)| **pid != 0)
            .take(8)
            .map(|(pid, (_, ev))| format!("pid {pid}: {ev} events"))
            .collect();
        if !per.is_empty() {
            m.push_str(&format!(" ({})", per.join(", ")));
        }
        m.push_str(". The figures above cover only what was written.\n");
        m
    }
}

/// The event count of an events frame's payload (its second varint), 0 if unreadable.
fn events_in(payload: &[u8]) -> u64 {
    let mut it = payload.iter();
    let mut varint = || {
        let (mut v, mut shift) = (0u64, 0);
        for &b in it.by_ref() {
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
        None
    };
    varint().and_then(|_| varint()).unwrap_or(0)
}

/// Takes an accepted connection of the job: its hello into the trace if it is there already, then a receiver
/// thread for the rest (the acceptor never waits on a connection: one that stays silent would hold every
/// other). Whether its hello is in the trace.
fn take(
    stream: UnixStream,
    trace: &Arc<Mutex<TraceWriter>>,
    conns: &Arc<Connections>,
    hangups: Option<&Hangups>,
    gone: Option<GonePeer>,
    reserve: Option<OwnedFd>,
) -> bool {
    let _ = stream.set_nonblocking(true);
    let closed_at = hangups.map(|h| h.watch_fd(stream.as_raw_fd()));
    let mut conn = Conn::new(stream);
    conn.closed_at = closed_at;
    conn.gone = gone;
    conn.reserve = reserve;
    conn.claim = Some(conns.unfinished.claim());
    conn.job_token = conns.job_token.clone();
    conn.conns = Some(conns.clone());
    // The receiver's thread first, waiting for its connection: one that cannot be had (a container's pids
    // limit, which counts the job's threads too) marks the hello untraced, with why, rather than leave a
    // process in the trace that seems to have allocated nothing.
    conns.open.fetch_add(1, Ordering::AcqRel);
    let receiver = receiver_thread(trace, conns);
    if receiver.is_none() {
        conn.bad_ring = Some("no thread could be started to receive it".into());
    }
    // Who it is, while /proc still knows: named from this if it hangs up without a hello. Its pid is the
    // kernel's, whatever its hello says.
    conn.peer = peer_identity(&conn.stream);
    conn.kernel_pid = conn.peer.as_ref().map(|p| p.0);
    // One look for its hello (usually there already); waited for only when no receiver could be had, so that
    // the process is still named.
    let deadline = Instant::now()
        + if receiver.is_some() {
            Duration::ZERO
        } else {
            HELLO_WAIT
        };
    loop {
        conn.pump(trace);
        if conn.pid.is_some() || !conn.open || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    if conn.pid.is_none() && !conn.open && conn.gone.is_none() && conn.peer.is_some() {
        // Hung up already: named and ended now, before any newcomer promise could pass them. Its receiver
        // ends with nothing to do (its sender dropped).
        conn.finish(trace);
        if receiver.is_none() {
            conns.open.fetch_sub(1, Ordering::AcqRel);
        }
        return true;
    }
    let announced = conn.pid.is_some();
    if !announced {
        conns.unannounced.fetch_add(1, Ordering::AcqRel);
        conn.unannounced = Some(conns.clone());
    }
    match receiver {
        Some(tx) => {
            let _ = tx.send(conn);
        }
        None => {
            conn.announced();
            conns.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
    announced
}

/// Starts a connection's receiver, which waits for the connection to be handed to it: the sender, or `None`
/// if no thread could be had (tried again for a while).
fn receiver_thread(
    trace: &Arc<Mutex<TraceWriter>>,
    conns: &Arc<Connections>,
) -> Option<std::sync::mpsc::Sender<Conn>> {
    // A test hook: no receiver thread can be had.
    static NO_THREADS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *NO_THREADS.get_or_init(|| std::env::var_os("VRAMTRACE_TEST_NO_CONN_THREADS").is_some()) {
        return None;
    }
    for _ in 0..SPAWN_TRIES {
        let (tx, rx) = std::sync::mpsc::channel::<Conn>();
        let (trace, conns) = (trace.clone(), conns.clone());
        let spawned = thread::Builder::new()
            .name("vramtrace-conn".into())
            .spawn(move || {
                if let Ok(mut conn) = rx.recv() {
                    conn.run(&trace);
                    conn.finish(&trace);
                }
                conns.open.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_ok() {
            return Some(tx);
        }
        thread::sleep(Duration::from_millis(2));
    }
    None
}

/// More records than a ring could drop between two looks: a scribbled count.
const MAX_PLAUSIBLE_DROPS: u64 = 1 << 40;
/// How many times, 2 ms apart, the acceptor tries to start a connection's receiver.
const SPAWN_TRIES: usize = 50;

/// How long the acceptor waits for a new connection's hello when no receiver thread could be had for it.
const HELLO_WAIT: Duration = Duration::from_millis(100);
/// A connection that has sent nothing for this long after it was accepted (and is not waiting for a
/// descriptor for its ring) is not a shim: closed, and named from what the kernel said of it.
const SILENT_WAIT: Duration = Duration::from_secs(5);

/// One process's connection and ring: whole frames go to the trace as they come; when it closes, the ring is
/// drained to its end and the end is recorded.
struct Conn {
    stream: UnixStream,
    split: FrameSplitter,
    pid: Option<u32>,
    /// The goodbye the process published at `exit`, held back until its ring is drained (an atexit handler
    /// that runs after ours may still free memory), then written with the time of its last record.
    goodbye: Option<u64>,
    open: bool,
    ring: Option<Drain>,
    /// A ring came that could not be used: said once in the trace.
    bad_ring: Option<String>,
    /// When the process hung up, stamped by the watcher (`hangup`): the time of its end unless it outlived it.
    closed_at: Option<ClosedAt>,
    /// When the process was found gone, if it went on after closing its socket.
    gone_at: Option<u64>,
    /// A peer of another user that was gone before it was checked: judged on its hello.
    gone: Option<GonePeer>,
    /// A descriptor held for the ring until the hello comes, let go just before each read: the ring always
    /// has a place to land (the kernel drops a passed descriptor it cannot place: `MSG_CTRUNC`).
    reserve: Option<OwnedFd>,
    /// Since when the ring first had no place: no reserve could be had, or a look at the hello found none
    /// (`take_hello`). Either waits, in all, at most `RESERVE_WAIT` from then.
    no_place_since: Option<Instant>,
    /// The peer as the kernel and /proc knew it when accepted: (pid, command line, parent).
    peer: Option<(u32, Vec<String>, u32)>,
    /// Counted in `Connections::unannounced` until its hello comes (or it ends).
    unannounced: Option<Arc<Connections>>,
    /// The peer's pid by the kernel (`SO_PEERCRED`): the process this connection speaks for.
    kernel_pid: Option<u32>,
    /// The pid its hello said (another in a pid namespace of its own): its records must carry it.
    said_pid: Option<u32>,
    /// What it sent that it may not say (`ingest`).
    refused: Refused,
    /// Its claim on the budget for unfinished frames (`budget`); none in tests.
    claim: Option<Claim>,
    /// Bytes of a refused frame still to come, skipped as they arrive.
    skip: u64,
    /// The job's token (`VRAMTRACE_JOB_TOKEN`): a gone peer of another user is of the job only with it.
    job_token: Arc<str>,
    /// When it was accepted (`SILENT_WAIT`).
    accepted: Instant,
    /// Closed for sending nothing (`SILENT_WAIT`).
    mute: bool,
    /// The job's connections (parents known, exits reported); none in tests.
    conns: Option<Arc<Connections>>,
    /// A connection that only reports the exits of children its process reaped (`reaped`): no hello, no
    /// ring; it names no process.
    report_only: bool,
}

/// How long a connection whose ring has not come waits to read until a descriptor is free for it.
const RESERVE_WAIT: Duration = Duration::from_secs(2);

/// What judging a gone peer on its hello takes (the job's token, `Conn::hello`): the peer's user, and the job's
/// connections (the refusals counted).
struct GonePeer {
    uid: u32,
    conns: Arc<Connections>,
}

const READ: usize = 256 << 10;
/// A ring is drained at least this often while its process runs, and whenever it passes a quarter full.
const NAP_MIN: Duration = Duration::from_millis(1);
const NAP_MAX: Duration = Duration::from_millis(50);
/// A record reserved and not published for this long will not be finished (its thread was cancelled, or a signal
/// handler never returned): the drain skips it and counts it, rather than let the ring fill behind it.
const STUCK_NS: u64 = 2_000_000_000;
/// A collector that has not drained a ring for this long was stalled (stopped, or starved of CPU): the records
/// the ring could not hold meanwhile are said to be lost for that reason.
const STALL: Duration = Duration::from_millis(500);
/// Events per frame written from a ring.
const BATCH: usize = 4096;
/// How far behind its own clock the collector promises. Events' counter ticks, converted by its line (format's
/// `ticks`), can be tens of ns off its `clock_gettime`, more when converted long after; a promise this far back
/// rarely needs an event held for it, and covers a new process's first events, which nothing holds.
const CLOCK_MARGIN_NS: u64 = 50_000;
/// How often, at most, an empty ring's drain promises that nothing older is still to come from its process.
const TICK_NS: u64 = 10_000_000;

/// A mapped ring and what its drains have said so far.
struct Drain {
    /// Keeps the ring mapped while the consumer reads it.
    _map: Mapping,
    consumer: Consumer,
    dropped_seen: u64,
    torn_seen: u64,
    /// When this ring was last drained (CLOCK_MONOTONIC), or when its process said hello.
    last_ns: u64,
    last_tick: u64,
    /// The latest time a tick promised: the process's end is never older.
    promised: u64,
    /// The latest time of anything of this process written: a later event or record, or its goodbye, is held
    /// at no less.
    last_ts: u64,
    /// Its events carry counter ticks (read once, when the ring was mapped: the process can write its header).
    ticks: bool,
    /// The ring held something no shim writes: said once in the trace.
    corrupt_said: bool,
    /// Where the drain has been waiting for a record to be published, and since when.
    stuck: Option<(u64, u64)>,
    /// The ring's memfd inode: while the process maps it, it may still write to it.
    ino: u64,
    batch: Vec<Event>,
    out: Vec<u8>,
}

/// A shared mapping of a ring's memory, unmapped when dropped.
struct Mapping {
    base: *mut libc::c_void,
    len: usize,
}

unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Maps a ring's descriptor as it came from a process: only sealed memory (a process that shrank it would make
/// the collector fault), of a size its header agrees with.
fn map_ring(fd: &OwnedFd) -> Result<(Mapping, Ring, u64), String> {
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("its memory is not sealed against shrinking".into());
    }
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || st.st_size <= 0 {
        return Err("its size cannot be read".into());
    }
    let len = st.st_size as usize;
    if len > ring::bytes_for(ring::MAX_SLOTS) {
        return Err(format!("it is too large ({len} bytes)"));
    }
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

impl Conn {
    fn new(stream: UnixStream) -> Conn {
        Conn {
            stream,
            split: FrameSplitter::new(),
            pid: None,
            goodbye: None,
            open: true,
            ring: None,
            bad_ring: None,
            closed_at: None,
            gone_at: None,
            gone: None,
            reserve: None,
            no_place_since: None,
            peer: None,
            unannounced: None,
            kernel_pid: None,
            said_pid: None,
            refused: Refused::default(),
            claim: None,
            skip: 0,
            job_token: Arc::from(""),
            accepted: Instant::now(),
            mute: false,
            conns: None,
            report_only: false,
        }
    }

    /// Who its records must speak for, once its hello came (or, on a report connection, its first report).
    fn speaker(&self) -> Option<Speaker> {
        let kernel = if self.report_only {
            self.kernel_pid
        } else {
            self.pid
        };
        Some(Speaker {
            kernel: kernel?,
            said: self.said_pid?,
        })
    }

    /// The receiver's loop: drain the ring, read what the socket holds, sleep on the ring (or the socket
    /// before a ring came) until woken or the nap ends. Returns when the process is gone.
    fn run(&mut self, trace: &Mutex<TraceWriter>) {
        let mut nap = NAP_MIN;
        while self.open {
            // Before the drain: a wake during it (an out-of-memory record on the socket) ends the nap below.
            let seen = self.ring.as_ref().map(|d| d.consumer.wake_seen());
            let took = self.drain(trace, false);
            let read = self.pump(trace);
            if self.pid.is_none() && self.open && self.accepted.elapsed() >= SILENT_WAIT {
                self.mute = true;
                self.open = false;
            }
            if !self.open {
                break;
            }
            nap = if took || read {
                NAP_MIN
            } else {
                (nap * 2).min(NAP_MAX)
            };
            match &self.ring {
                Some(d) => d
                    .consumer
                    .sleep_since(seen.unwrap_or_else(|| d.consumer.wake_seen()), nap),
                None => {
                    let mut pfd = libc::pollfd {
                        fd: self.stream.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                }
            }
        }
        // The socket is gone. Usually the process is too; but a process that closed our descriptor itself
        // (`close_range`, a daemon's clean-up) goes on writing to its ring: drain it while it maps it.
        if let (Some(pid), Some(ino)) = (self.pid, self.ring.as_ref().map(|d| d.ino)) {
            while maps_inode(pid, ino) {
                self.drain(trace, false);
                thread::sleep(NAP_MAX);
                self.gone_at = Some(mono_ns());
            }
        }
        // Gone: everything it published is in the ring; a record it died writing is skipped and counted.
        self.drain(trace, true);
    }

    /// Reads what the socket holds (once) and appends what is whole. Whether anything came.
    fn pump(&mut self, trace: &Mutex<TraceWriter>) -> bool {
        // The reserve is let go just before the read (kept until then: other threads open files too), and
        // taken back after it while the ring has not come. Without one (none was free), the read waits for
        // one, for a while: a ring read with no place to land would be lost.
        if self.open && self.awaiting_ring() && self.reserve.is_none() {
            self.reserve = self.stream.try_clone().ok().map(OwnedFd::from);
            if self.reserve.is_none() {
                let since = *self.no_place_since.get_or_insert_with(Instant::now);
                if since.elapsed() < RESERVE_WAIT {
                    thread::sleep(Duration::from_millis(1));
                    return false;
                }
            }
        }
        let held = self.reserve.take().is_some();
        let took = self.pump_once(trace);
        if held && self.open && self.awaiting_ring() {
            self.reserve = self.stream.try_clone().ok().map(OwnedFd::from);
        }
        if self.pid.is_some() {
            self.announced();
        }
        took
    }

    /// Before the hello: the ring rides on it, and must find a place (`reserve`, `take_hello`).
    fn awaiting_ring(&self) -> bool {
        self.pid.is_none() && self.ring.is_none() && self.bad_ring.is_none() && !self.report_only
    }

    fn pump_once(&mut self, trace: &Mutex<TraceWriter>) -> bool {
        if !self.open {
            return false;
        }
        let before_hello = self.awaiting_ring();
        let buf = self.split.spare(READ);
        let got = if before_hello {
            take_hello(&self.stream, buf, &mut self.no_place_since)
        } else {
            recv_with_fds(&self.stream, buf, 0).map(Some)
        };
        let (n, fds, lost_fds) = match got {
            Ok(Some(r)) => r,
            Ok(None) => {
                // The ring found no place this time and is still queued: looked at again after a nap.
                self.split.filled(READ, 0);
                thread::sleep(Duration::from_millis(1));
                return false;
            }
            Err(e) => {
                self.split.filled(READ, 0);
                // A timeout (while the acceptor waits for a hello) or nothing to read leaves it open.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) {
                    self.open = false;
                }
                return false;
            }
        };
        self.split.filled(READ, n);
        for fd in fds {
            if self.ring.is_none() && self.bad_ring.is_none() {
                match map_ring(&fd) {
                    Ok((map, ring, ino)) => {
                        self.ring = Some(Drain {
                            ticks: ring.ticks(),
                            _map: map,
                            consumer: Consumer::new(ring),
                            dropped_seen: 0,
                            torn_seen: 0,
                            last_ns: mono_ns(),
                            last_tick: 0,
                            promised: 0,
                            last_ts: 0,
                            stuck: None,
                            corrupt_said: false,
                            ino,
                            batch: Vec::with_capacity(BATCH),
                            out: Vec::with_capacity(64 << 10),
                        })
                    }
                    Err(why) => self.bad_ring = Some(why),
                }
            }
            // Any other descriptor is closed as it drops.
        }
        // The kernel could not give us the ring it carried (no descriptor free): the process's events are out of
        // reach, and the trace must say so rather than show a process that allocated nothing.
        if lost_fds && self.ring.is_none() && self.bad_ring.is_none() {
            self.bad_ring = Some(format!(
                "no file descriptor was free to receive it (the collector's limit: {})",
                crate::fdlimit::soft().map_or("unknown".into(), |n| n.to_string())
            ));
        }
        if n == 0 {
            self.open = false;
            return false;
        }
        // What is left of a refused frame goes as it comes.
        if self.skip > 0 {
            let k = (self.skip as usize).min(self.split.pending());
            self.split.consume(k);
            self.skip -= k as u64;
        }
        let whole = match self.split.whole() {
            Ok(w) => w.len(),
            // Not our protocol: stop listening to this peer; what it sent before stays in the trace.
            Err(_) => {
                self.open = false;
                return false;
            }
        };
        let frames: Vec<u8> = self.split_whole(whole);
        self.budget_unfinished();
        if whole == 0 {
            self.put_refused(trace);
            return true;
        }
        let mut acks = 0usize;
        let mut hello = false;
        let mut out = Vec::with_capacity(frames.len() + 128);
        for (k, payload) in codec::frames(&frames) {
            // The shim waits for one answer per record that asks for one, whatever becomes of the record.
            match k {
                kind::OOM => acks += 1,
                kind::BRIDGE => {
                    if let Ok(Some(Record::Bridge(b))) = codec::decode_record(k, payload) {
                        acks += usize::from(b.ack);
                    }
                }
                _ => {}
            }
            if k == kind::HELLO && self.pid.is_none() {
                match self.hello(payload) {
                    Some(h) => {
                        codec::put_record(&mut out, &Record::Hello(h));
                        hello = true;
                    }
                    // Turned away (a gone peer not of the job), or not a hello: nothing of it is written.
                    None => {
                        self.open = false;
                        return false;
                    }
                }
                continue;
            }
            if k == kind::REAPED && self.pid.is_none() && self.said_pid.is_none() {
                // A process with no connection of its own reports what it reaped. Another user's that is gone
                // already cannot be placed in the job: turned away.
                if self.gone.is_some() || self.kernel_pid.is_none() {
                    self.open = false;
                    return false;
                }
                if let Ok(Some(Record::Reaped { pid, .. })) = codec::decode_record(k, payload) {
                    self.report_only = true;
                    self.said_pid = Some(pid);
                    self.announced();
                }
            }
            let Some(who) = self.speaker() else {
                self.refused.add(Refusal::BeforeHello(k));
                continue;
            };
            if k == kind::REAPED {
                if let Err(why) = reaped::admit(payload, who, self.conns.as_deref()) {
                    self.refused.add(why);
                }
                continue;
            }
            match ingest::admit(k, payload, who) {
                Ok(a) => ingest::put_admitted(&mut out, k, payload, &a),
                Err(why) => self.refused.add(why),
            }
        }
        let frames = out;
        // What the process published before these records goes first; they are held at no less than it.
        let frames = if hello {
            frames
        } else {
            self.drain(trace, false);
            match self.ring.as_mut() {
                Some(d) => {
                    // Not in the ring's causal order: the drain above took what other threads published
                    // after this record was stamped (its thread waits for our answer, theirs go on). Held
                    // only across the clocks' error.
                    let mut hold = Hold {
                        last: d.last_ts,
                        promised: d.promised,
                        now: mono_ns(),
                        most: Some(SOCKET_HOLD_NS),
                    };
                    let mut held = Vec::with_capacity(frames.len());
                    for (k, payload) in codec::frames(&frames) {
                        hold_frame(&mut held, k, payload, &mut hold);
                    }
                    d.last_ts = hold.last;
                    held
                }
                None => frames,
            }
        };
        let written = frames.is_empty()
            || trace
                .lock()
                .is_ok_and(|mut w| w.write(self.pid.unwrap_or(0), &frames));
        if hello {
            if let (Some(why), Some(pid)) = (self.bad_ring.take(), self.pid) {
                let note = Record::Note {
                    pid,
                    ts_ns: mono_ns(),
                    text: format!(
                        "no events of this process are in the trace: its event ring was not usable: {why}"
                    ),
                };
                let mut buf = Vec::new();
                codec::put_record(&mut buf, &note);
                if let Ok(mut w) = trace.lock() {
                    w.write(pid, &buf);
                }
            }
        }
        self.put_refused(trace);
        // The shim holds the failing allocation (or the bridge its record) until the evidence is in the file:
        // one answer per record waiting, in order, so the shim matches each to its own record. Nothing is
        // acknowledged that the file does not hold.
        if acks > 0 {
            let answer = if written { OOM_ACK } else { OOM_NAK };
            let _ = (&self.stream).write_all(&vec![answer; acks]);
        }
        true
    }

    /// Takes the hello: the process is who the kernel says it is (its pid and parent then), whatever the hello
    /// says; what it said is kept beside. A peer of another user that was gone before it could be checked is of
    /// the job only if its hello carries the job's token (the job's environment, which other users cannot
    /// read). The token never reaches the trace. `None`: turned away, or no hello at all.
    fn hello(&mut self, payload: &[u8]) -> Option<vramtrace_format::Hello> {
        let Ok(Some(Record::Hello(mut h))) = codec::decode_record(kind::HELLO, payload) else {
            return None;
        };
        let token = h
            .extra
            .iter()
            .position(|(k, _)| k == ingest::TOKEN_KEY)
            .map(|i| h.extra.remove(i).1);
        h.extra.retain(|(k, _)| k != ingest::TOKEN_KEY);
        if let Some(g) = &self.gone {
            if !token.is_some_and(|t| ingest::same_token(&self.job_token, &t)) {
                if let Ok(mut r) = g.conns.refused.lock() {
                    r.push((self.kernel_pid.unwrap_or(h.pid), g.uid));
                }
                return None;
            }
        }
        self.gone = None;
        // No pid from the kernel (a peer outside our pid namespace): nobody the trace can name.
        let kernel = self.kernel_pid?;
        self.said_pid = Some(h.pid);
        if h.pid != kernel {
            h.extra
                .push(("pid_in_its_namespace".into(), h.pid.to_string()));
            h.pid = kernel;
        }
        if let Some(ppid) = self.peer.as_ref().map(|p| p.2).filter(|p| *p != 0) {
            h.ppid = ppid;
        }
        self.pid = Some(kernel);
        if let Some(c) = &self.conns {
            if let Ok(mut p) = c.reaps.parents.lock() {
                p.insert(kernel, h.ppid);
            }
        }
        // A process that connected while the collector was stopped waited since its hello.
        if let Some(d) = self.ring.as_mut() {
            d.last_ns = d.last_ns.min(h.ts_ns);
        }
        if let Some((_, why)) = h.extra.iter().find(|(k, _)| k == "no_ring") {
            self.bad_ring = Some(why.clone());
        } else {
            if self.ring.is_none() && self.bad_ring.is_none() {
                // The shim sends its ring with the hello's first byte.
                self.bad_ring = Some("its hello came without it".into());
            }
            // Marked untraced, with why, so that the report names the process (never one that allocated
            // nothing).
            if let Some(why) = &self.bad_ring {
                h.extra.push((
                    "no_ring".into(),
                    format!("the collector could not take its event ring: {why}"),
                ));
            }
        }
        Some(h)
    }

    /// The unfinished frame left in the buffer, against the budget: what it needs beyond the connection's
    /// free room is claimed from the pool; refused (or made to give way to a smaller one), the frame is
    /// dropped, counted, and the rest of it skipped as it comes. With none left, the room a large frame took
    /// is given back.
    fn budget_unfinished(&mut self) {
        let evicted = self.claim.as_ref().is_some_and(|c| c.evicted());
        match self.split.first_frame_bytes() {
            Some(bytes) => {
                let need = (bytes as usize).saturating_sub(budget::FREE);
                let granted = !evicted && self.claim.as_mut().is_none_or(|c| c.need(need));
                if !granted {
                    let have = self.split.pending() as u64;
                    self.split.consume(have as usize);
                    self.skip = bytes.saturating_sub(have);
                    self.refused.add(Refusal::TooLarge { bytes });
                    if let Some(c) = self.claim.as_mut() {
                        c.need(0);
                    }
                    self.split.trim(2 * READ);
                }
            }
            None => {
                if let Some(c) = self.claim.as_mut() {
                    c.need(0);
                }
                self.split.trim(2 * READ);
            }
        }
    }

    /// Writes what was refused since the last time, once the process is named: a `Lost` record (cause
    /// `Refused`) and, the first time, a note saying what was refused. Stamped where the process's entries
    /// stand, so that nothing of it goes out of order.
    fn put_refused(&mut self, trace: &Mutex<TraceWriter>) {
        let Some(pid) = self.pid else {
            return;
        };
        let Some((count, first)) = self.refused.take_new() else {
            return;
        };
        let ts_ns = self
            .ring
            .as_ref()
            .map_or_else(mono_ns, |d| d.last_ts.max(d.promised));
        let mut buf = Vec::new();
        if let Some(what) = first {
            put_note(
                &mut buf,
                pid,
                ts_ns,
                format!("records this process sent were refused, the first: {what}"),
            );
        }
        codec::put_record(
            &mut buf,
            &Record::Lost {
                pid,
                ts_ns,
                count,
                cause: LossCause::Refused,
            },
        );
        if let Ok(mut w) = trace.lock() {
            w.write(pid, &buf);
        }
    }

    fn split_whole(&mut self, n: usize) -> Vec<u8> {
        let v = self
            .split
            .whole()
            .map(|w| w[..n].to_vec())
            .unwrap_or_default();
        self.split.consume(n);
        v
    }

    /// Takes what the ring holds into the trace, with what was lost since the last drain. `dead`: the process
    /// is gone (records it left half-written are skipped, the goodbye it published is written). Whether
    /// anything was taken.
    fn drain(&mut self, trace: &Mutex<TraceWriter>, dead: bool) -> bool {
        let (Some(who), Some(d)) = (self.speaker(), self.ring.as_mut()) else {
            return false;
        };
        let pid = who.kernel;
        let refused = &mut self.refused;
        let conns = self.conns.as_deref();
        // When this drain looked (the stall and the tick's pace; the tick's promise itself is stamped in the ring).
        let promise = mono_ns();
        // A process that hung up ends at its hang-up (`finish`): nothing promised goes past it, or its end would
        // come after its own promise (and be merged late). Once the receiver saw the hang-up, a process that
        // lives on (it closed its socket itself) ends when it is found gone: no cap then.
        let hung_up = if self.open {
            hangup::closed_at(&self.closed_at)
        } else {
            None
        };
        let stalled = promise.saturating_sub(d.last_ns) >= STALL.as_nanos() as u64;
        d.last_ns = promise;
        let Drain {
            consumer,
            batch,
            out,
            last_ts,
            promised,
            last_tick,
            ticks,
            ..
        } = d;
        let mut goodbye = None;
        // Events stamped with the counter: converted by the collector's one line (format's `ticks`).
        let line = ticks.then(crate::ticks::line);
        let mut take = |item: Item| match item {
            Item::Event(mut e) => {
                if let Some(l) = &line {
                    e.ts_ns = l.to_ns(e.ts_ns);
                }
                // The ring holds its events in causal order, stamped just before they were reserved: a time
                // behind one before it, or behind a promise, is a writer pre-empted between its stamp and its
                // reservation (or a clock's error of a microsecond). Held there, so that nothing is out of order
                // (ring.rs, `Ring::try_event`).
                e.ts_ns = e.ts_ns.max(*last_ts).max(*promised);
                *last_ts = e.ts_ns;
                batch.push(e);
                if batch.len() >= BATCH {
                    codec::put_events(out, pid, batch);
                    batch.clear();
                }
            }
            Item::Blob(bytes) => {
                if !batch.is_empty() {
                    codec::put_events(out, pid, batch);
                    batch.clear();
                }
                // In the ring's causal order, like the events around it.
                let mut hold = Hold {
                    last: *last_ts,
                    promised: *promised,
                    now: promise,
                    most: None,
                };
                blob_into(out, bytes, &mut goodbye, &mut hold, who, refused, conns);
                *last_ts = hold.last;
            }
        };
        let taken = consumer.drain(dead, &mut take);
        if !batch.is_empty() {
            codec::put_events(out, pid, batch);
            batch.clear();
        }
        // A promise that nothing older is still to come, for a process that is quiet: what its producers reserve
        // after it is held at no less than it (above).
        if !dead
            && taken == 0
            && consumer.ring().used() == 0
            && promise >= *last_tick + TICK_NS
            // A process that hung up and is not stamped yet (the watcher is late): no promise past its end.
            && (hung_up.is_some() || !self.open || !peer_hung_up(&self.stream))
        {
            *last_tick = promise;
            if let Some(t) = consumer.ring().promise(mono_ns) {
                // A margin for the events' converted ticks against the collector's clock (`CLOCK_MARGIN_NS`).
                let ts_ns = t
                    .min(hung_up.unwrap_or(u64::MAX))
                    .saturating_sub(CLOCK_MARGIN_NS);
                *promised = (*promised).max(ts_ns);
                codec::put_record(out, &Record::Tick { pid, ts_ns });
            }
        }
        if !batch.is_empty() {
            codec::put_events(out, pid, batch);
            batch.clear();
        }
        if goodbye.is_some() {
            self.goodbye = goodbye;
        }
        if !dead {
            d.stuck = match (consumer.waiting_at(), d.stuck) {
                (Some(at), Some((was, since))) if at == was => {
                    if promise.saturating_sub(since) >= STUCK_NS {
                        consumer.skip_stuck();
                        None
                    } else {
                        Some((was, since))
                    }
                }
                (Some(at), _) => Some((at, promise)),
                (None, _) => None,
            };
        }
        let ts = mono_ns();
        let dropped = consumer.ring().dropped();
        // The count is shared memory the process can scribble on: a jump no ring could drop between two looks
        // (more than 2^40 records) is not counted, and the ring is taken for corrupt.
        if dropped.saturating_sub(d.dropped_seen) > MAX_PLAUSIBLE_DROPS {
            consumer.corrupt = true;
            d.dropped_seen = dropped;
        }
        if dropped > d.dropped_seen {
            let count = dropped - d.dropped_seen;
            d.dropped_seen = dropped;
            let cause = if stalled {
                LossCause::CollectorStalled
            } else {
                LossCause::RingFull
            };
            put_loss(out, pid, ts, count, cause);
        }
        if consumer.torn > d.torn_seen {
            let count = consumer.torn - d.torn_seen;
            d.torn_seen = consumer.torn;
            put_loss(out, pid, ts, count, LossCause::DiedMidRecord);
        }
        if consumer.corrupt && !d.corrupt_said {
            // Said once; the consumer keeps refusing (`corrupt` stays set) and sleeps between its looks.
            d.corrupt_said = true;
            put_note(
                out,
                pid,
                ts,
                "the process's ring held something no shim writes; the rest of it was not read"
                    .into(),
            );
            consumer.torn = u64::MAX / 2;
            d.torn_seen = consumer.torn;
        }
        if dead {
            if let Some(bye) = self.goodbye {
                // Never older than a tick already written (the process lived on after its goodbye).
                let ts_ns = bye.max(*last_ts).max(d.promised);
                codec::put_record(out, &Record::Goodbye { pid, ts_ns });
            }
        }
        if !out.is_empty() {
            if let Ok(mut w) = trace.lock() {
                w.write(pid, out);
            }
            out.clear();
        }
        self.put_refused(trace);
        taken > 0
    }

    /// Its hello is in the trace (or it ended): no longer holds the newcomer promise back.
    fn announced(&mut self) {
        if let Some(c) = self.unannounced.take() {
            c.unannounced.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A process of the job that connected and hung up without a hello (its shim could not send it: the ring
    /// it passes with it refused, e.g. `ETOOMANYREFS`): named untraced in the trace, from what the kernel and
    /// /proc said of it when it was accepted (`Conn::peer`), rather than passed over.
    fn name_silent(&mut self, trace: &Mutex<TraceWriter>) {
        let Some((pid, cmdline, ppid)) = self.peer.take() else {
            return;
        };
        let hello = vramtrace_format::Hello {
            pid,
            ppid,
            ts_ns: hangup::closed_at(&self.closed_at).unwrap_or_else(mono_ns),
            cmdline,
            hostname: hostname(),
            rank: None,
            local_rank: None,
            slurm_procid: None,
            shim_version: String::new(),
            extra: vec![(
                "no_ring".into(),
                if self.mute {
                    "it connected, then sent nothing for 5 s: not a shim's connection; closed"
                        .into()
                } else {
                    "it connected, then hung up without saying hello (its shim could not pass its event ring)"
                        .into()
                },
            )],
        };
        let mut buf = Vec::new();
        codec::put_record(&mut buf, &Record::Hello(hello));
        if let Ok(mut w) = trace.lock() {
            w.write(pid, &buf);
        }
        self.pid = Some(pid);
    }

    /// The connection closed: record how.
    fn finish(mut self, trace: &Mutex<TraceWriter>) {
        if self.report_only {
            self.announced();
            return;
        }
        // Not a peer of another user still to be judged on its hello (or turned away on it).
        if self.pid.is_none() && self.gone.is_none() {
            self.name_silent(trace);
        }
        let Some(pid) = self.pid else {
            self.announced();
            return;
        };
        self.put_refused(trace);
        let end = if self.split.pending() > 0 {
            EndKind::CutMidFrame {
                partial_bytes: self.split.pending() as u32,
            }
        } else if self.goodbye.is_some() {
            EndKind::Goodbye
        } else {
            EndKind::Vanished
        };
        // When the driver released what it held: as its descriptors closed (the hang-up), unless it outlived
        // its socket; never before its last record.
        let ts_ns = self
            .gone_at
            .or(hangup::closed_at(&self.closed_at))
            .unwrap_or_else(mono_ns)
            .max(self.ring.as_ref().map_or(0, |d| d.last_ts.max(d.promised)));
        let mut buf = Vec::new();
        codec::put_record(
            &mut buf,
            &Record::ProcessEnd {
                pid,
                ts_ns,
                kind: end,
            },
        );
        if let Ok(mut w) = trace.lock() {
            w.write(pid, &buf);
        }
        // Only now: a newcomer promise must not pass this end, written at the hang-up's time.
        self.announced();
    }
}

/// Whether the peer of `stream` has closed its end (without waiting).
fn peer_hung_up(stream: &UnixStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

/// Whether process `pid` still maps the file with inode `ino` (its ring): false once it exited or exec'd, or
/// when its maps cannot be read.
fn maps_inode(pid: u32, ino: u64) -> bool {
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

/// Appends a blob from a ring to `out` if it is whole frames, each checked (`ingest`: refused ones are
/// counted in `refused`); a goodbye is held back (its time kept).
fn blob_into(
    out: &mut Vec<u8>,
    bytes: &[u8],
    goodbye: &mut Option<u64>,
    hold: &mut Hold,
    who: Speaker,
    refused: &mut Refused,
    conns: Option<&Connections>,
) {
    let mut split = FrameSplitter::new();
    split.push(bytes);
    match split.whole() {
        Ok(w) if w.len() == bytes.len() => {}
        _ => {
            refused.add(Refusal::Undecodable(bytes.get(4).copied().unwrap_or(0)));
            return;
        }
    }
    let mut one = Vec::new();
    for (k, payload) in codec::frames(bytes) {
        if k == kind::REAPED {
            if let Err(why) = reaped::admit(payload, who, conns) {
                refused.add(why);
            }
            continue;
        }
        let admitted = match ingest::admit(k, payload, who) {
            Ok(a) => a,
            Err(why) => {
                refused.add(why);
                continue;
            }
        };
        if k == kind::GOODBYE {
            if let Ok(Some(Record::Goodbye { ts_ns, .. })) = codec::decode_record(k, payload) {
                *goodbye = Some(ts_ns);
            }
            continue;
        }
        match admitted {
            ingest::Admitted::AsItCame => hold_frame(out, k, payload, hold),
            rewritten => {
                one.clear();
                ingest::put_admitted(&mut one, k, payload, &rewritten);
                if let Some((k, payload)) = codec::frames(&one).next() {
                    hold_frame(out, k, payload, hold);
                }
            }
        }
    }
}

/// How far a record that came on the socket may be held later than its own time: the clocks' error (its
/// CLOCK_MONOTONIC against events' converted ticks, tens of ns), with room to spare, and far less than the
/// milliseconds by which other threads' events drained before it may be later than it.
const SOCKET_HOLD_NS: u64 = 5_000;

/// Where a process's records with a time of their own are held (`hold_frame`).
struct Hold {
    /// The latest time of the process's entries written so far.
    last: u64,
    /// Its last promise: nothing of it may go before.
    promised: u64,
    /// The collector's clock when the records were taken: a time past it (and the margin) is not this clock's.
    now: u64,
    /// The most a record is moved later to stay behind `last` (`None`: as far as it takes, for records in the
    /// ring's causal order).
    most: Option<u64>,
}

impl Hold {
    /// `ts` held, and the hold raised to it. A time on another clock (far ahead of ours: a caller's own, through
    /// the bridge) is left as it is and raises nothing, so it cannot drag the process's later entries along.
    fn record(&mut self, ts: u64) -> u64 {
        if ts > self.now.saturating_add(CLOCK_MARGIN_NS) {
            return ts;
        }
        let behind = match self.most {
            Some(m) => self.last.min(ts.saturating_add(m)),
            None => self.last,
        };
        let t = ts.max(behind).max(self.promised);
        self.last = self.last.max(t);
        t
    }
}

/// One frame of a process into `out`. A record with a time of its own (an out-of-memory record, a note, the
/// bridge's, a context torn down) is held (`Hold::record`): a process's entries keep the order it made them in,
/// though its events carry counter ticks the collector converts and these records CLOCK_MONOTONIC, a few ns
/// apart (an out-of-memory record never goes before its failed allocation).
fn hold_frame(out: &mut Vec<u8>, k: u8, payload: &[u8], hold: &mut Hold) {
    if Record::has_process_time(k) {
        if let Ok(Some(mut r)) = codec::decode_record(k, payload) {
            if let Some(ts) = r.process_time_mut() {
                let held = hold.record(*ts);
                if held != *ts {
                    *ts = held;
                    codec::put_record(out, &r);
                    return;
                }
            }
        }
    }
    out.extend_from_slice(&(payload.len() as u32 + 1).to_le_bytes());
    out.push(k);
    out.extend_from_slice(payload);
}

/// `count` records lost, and why: the count as older readers know it, then the cause.
fn put_loss(out: &mut Vec<u8>, pid: u32, ts_ns: u64, count: u64, cause: LossCause) {
    codec::put_record(out, &Record::Dropped { pid, ts_ns, count });
    codec::put_record(
        out,
        &Record::Lost {
            pid,
            ts_ns,
            count,
            cause,
        },
    );
}

fn put_note(out: &mut Vec<u8>, pid: u32, ts_ns: u64, text: String) {
    codec::put_record(out, &Record::Note { pid, ts_ns, text });
}

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
fn take_hello(
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

fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 32];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `buf` on `s` with descriptor `fd` attached (as the shim sends its hello and ring).
    fn send_with_fd(s: &UnixStream, buf: &[u8], fd: i32) {
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; 8];
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            libc::CMSG_DATA(c).cast::<i32>().write_unaligned(fd);
            assert_eq!(libc::sendmsg(s.as_raw_fd(), &msg, 0), buf.len() as isize);
        }
    }

    fn hello(pid: u32) -> Record {
        Record::Hello(vramtrace_format::Hello {
            pid,
            ppid: 1,
            ts_ns: 1,
            cmdline: vec!["worker".into()],
            hostname: "h".into(),
            rank: None,
            local_rank: None,
            slurm_procid: None,
            shim_version: "test".into(),
            extra: vec![],
        })
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
                let mut was: libc::rlimit = unsafe { std::mem::zeroed() };
                unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut was) };
                let limit = |n: Option<u64>| {
                    let l = libc::rlimit {
                        rlim_cur: n.map_or(was.rlim_cur, |n| n as libc::rlim_t),
                        rlim_max: was.rlim_max,
                    };
                    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) };
                };
                case(&mut conn, &trace, &limit, &path)
            }))
            .unwrap_or(false);
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
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
            .and_then(|h| h.extra.iter().find(|(k, _)| k == "no_ring"))
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
            let waited = !early && conn.pid.is_none() && conn.no_place_since.is_some();
            let mut later = false;
            for _ in 0..100 {
                later |= conn.pump(trace);
                if conn.pid.is_some() {
                    break;
                }
            }
            // It arrived: no ring but a socket here, so the mapping's refusal is what the hello says.
            waited && later && conn.pid == Some(4242) && untraced_why(path).contains("not sealed")
        });
    }

    #[test]
    fn a_ring_that_never_finds_a_place_leaves_its_process_named_untraced() {
        // No place for `RESERVE_WAIT`: the hello is read as it is (the ring lost), and names its process.
        in_child_with_hello("ctrunc", |conn, trace, limit, path| {
            conn.reserve = conn.stream.try_clone().ok().map(OwnedFd::from);
            let start = Instant::now();
            limit(Some(0));
            while conn.pid.is_none() && start.elapsed() < RESERVE_WAIT * 5 {
                conn.pump(trace);
            }
            limit(None);
            start.elapsed() >= RESERVE_WAIT
                && conn.ring.is_none()
                && conn.pid == Some(4242)
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
            let waited = !early && conn.pid.is_none();
            let later = conn.pump(trace);
            let why = untraced_why(path);
            // Once the hello is read, no descriptor is held for it any more.
            waited
                && later
                && conn.pid == Some(4242)
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
