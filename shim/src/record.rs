//! Recording: the calling thread stamps a fixed-size event and offers it to a bounded channel, never waiting;
//! a sender thread, started at the first tracked call, drains the channel in batches and writes them to the
//! collector's socket. A full channel drops the event and counts it; the count reaches the trace.
//!
//! Lifecycle: nothing happens before the first tracked call. That call connects to the collector and says hello
//! from the calling thread (non-blocking, at most 200 ms), before anything is stamped, then starts the sender. `fork` leaves the child without our sender thread
//! (only the forking thread survives) and possibly with the channel mid-operation, so the child abandons the
//! parent's recorder and builds its own at its next tracked call. At `exit` the recorder flushes, briefly.
//!
//! Call sites (`stacks`) travel in the same channel: a new stack is queued before the first event naming it,
//! and the sender, before it sends a stack, sends the process's loaded objects (`objects`) when they changed.

use std::cell::Cell;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use vramtrace_format::{codec, Api, Event, Hello, Oom, Record, Stack, OOM_ACK, OOM_NAK};

/// Events the channel holds before the calling threads start dropping them. The sender drains continuously,
/// so this only absorbs bursts; each slot is about 56 bytes.
const CHANNEL_EVENTS: usize = 16 * 1024;
/// The most events per frame.
const BATCH: usize = 4096;
/// How often an idle sender tells the collector it is alive (lets the collector order events across processes).
const TICK: Duration = Duration::from_millis(100);
/// The sender polls the channel rather than blocking on it: a blocked receiver would make every `try_send` pay
/// a futex wake-up (measured: 3 us per alloc/free pair on an H200). It naps this long when there was work...
const NAP_MIN: Duration = Duration::from_millis(1);
/// ...doubling while idle up to this, and is woken early only when the channel passes a quarter full.
const NAP_MAX: Duration = Duration::from_millis(16);
const WAKE_AT: usize = CHANNEL_EVENTS / 4;
/// How long `exit` waits, at most, for the last events to reach the collector. Normally microseconds; the bound
/// only matters for a process that exits right after its first tracked call (its sender may still be
/// connecting) on a loaded machine (500 ms lost a forked child's events once), or a collector that hangs.
const EXIT_FLUSH: Duration = Duration::from_secs(2);
/// How long the first tracked call waits, at most, for room in the collector's backlog.
const CONNECT_WAIT: Duration = Duration::from_millis(200);
/// How long an allocation that ran out of memory waits for the collector to hold the evidence.
const OOM_WAIT: Duration = Duration::from_secs(1);
/// The sender stops draining and writes once its buffer holds this much (stacks can be large).
const BUF_MAX: usize = 1 << 20;

enum Msg {
    Event(Event),
    /// Send everything queued, say goodbye, and confirm through `Recorder::flushed`.
    Flush,
    /// Send everything queued, then this record (an out-of-memory record, or a bridge record asking for it);
    /// tell the waiting thread once the collector has acknowledged it.
    Sync(Box<Record>, Sender<()>),
    /// A record from the Python bridge, sent in its place among the events.
    Record(Box<Record>),
    /// A call site, queued before the first event naming it.
    Stack(Box<Stack>),
    /// A note for the report: (time, text).
    Note(u64, String),
}

pub(crate) struct Recorder {
    tx: Sender<Msg>,
    /// The sender thread, to wake when the channel fills.
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// `CONNECTING`, `CONNECTED`, or `GONE` (no collector, or it went away: callers stop offering events).
    link: AtomicU8,
    dropped: AtomicU64,
    flushed: AtomicBool,
    pid: u32,
    /// This process's call sites (a forked child's new recorder starts with none).
    stacks: crate::stacks::Table,
}

const CONNECTING: u8 = 0;
const CONNECTED: u8 = 1;
const GONE: u8 = 2;

/// This process's recorder (leaked: a forked child abandons its parent's, which another thread may be using).
static RECORDER: crate::lazy::Lazy<&'static Recorder> = crate::lazy::Lazy::new();
/// The socket to the collector, so a forked child can close its copy.
static SOCKET_FD: AtomicI32 = AtomicI32::new(-1);
/// Bumped in every forked child: thread-id caches from before the fork are stale.
static FORK_GEN: AtomicU32 = AtomicU32::new(0);
static HANDLERS: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// (fork generation, tid): `gettid` is a system call, too slow for every event.
    static TID: Cell<(u32, u32)> = const { Cell::new((u32::MAX, 0)) };
    /// Events this thread offered, to sample the channel's fill level.
    static PUSHES: Cell<u32> = const { Cell::new(0) };
}

/// CLOCK_MONOTONIC in ns (a vDSO read, no system call); the collector's clock is the same.
#[inline]
pub fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
pub(crate) fn tid() -> u32 {
    let gen = FORK_GEN.load(Ordering::Relaxed);
    TID.with(|c| {
        let (g, t) = c.get();
        if g == gen {
            return t;
        }
        // The system call, not glibc's wrapper: `gettid()` only exists since glibc 2.30 (the shim targets 2.17).
        let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        c.set((gen, t));
        t
    })
}

/// Offers one event to the sender. Never blocks; a no-op when nothing is recording. `stack`: the call site's
/// id from `stacks::site` (0: none), whose stack is already queued.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn push(
    api: Api,
    flags: u8,
    device: u32,
    result: u32,
    addr: u64,
    size: u64,
    aux: u64,
    ts_ns: u64,
    stack: u32,
) {
    let Some(r) = recorder() else { return };
    if r.link.load(Ordering::Relaxed) == GONE {
        return;
    }
    let e = Event {
        ts_ns,
        tid: tid(),
        api,
        flags,
        device,
        result,
        addr,
        size,
        aux,
        stack,
    };
    match r.tx.try_send(Msg::Event(e)) {
        Ok(()) => {
            // Reading the fill level touches the sender's cache line: only every 64th event of a thread does.
            if PUSHES.with(|c| {
                let n = c.get().wrapping_add(1);
                c.set(n);
                n % 64 == 0
            }) && r.tx.len() >= WAKE_AT
            {
                r.wake();
            }
        }
        Err(TrySendError::Full(_)) => {
            r.dropped.fetch_add(1, Ordering::Relaxed);
            r.wake();
        }
        Err(TrySendError::Disconnected(_)) => {}
    }
}

impl Recorder {
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn stacks(&self) -> &crate::stacks::Table {
        &self.stacks
    }

    /// Queues a new call site, never waiting. Whether it was queued.
    pub(crate) fn offer_stack(&self, s: Box<Stack>) -> bool {
        self.tx.try_send(Msg::Stack(s)).is_ok()
    }

    /// Queues a note for the report, never waiting.
    pub(crate) fn note(&self, text: String) {
        let _ = self.tx.try_send(Msg::Note(now(), text));
    }
}

/// Starts the recorder if this is the process's first tracked call (an atomic load otherwise).
#[inline]
pub(crate) fn start_now() {
    let _ = recorder();
}

/// The recorder of this process if it is recording (or still connecting), starting it at the first call.
#[inline]
pub(crate) fn live() -> Option<&'static Recorder> {
    recorder().filter(|r| r.link.load(Ordering::Relaxed) != GONE)
}

#[inline]
fn recorder() -> Option<&'static Recorder> {
    // First tracked call of this process (or of a forked child): settings, handlers, channel, sender thread.
    // Concurrent first calls wait for the one that won; a fork while it runs leaves the child able to start
    // its own (crate::lazy).
    RECORDER.get_or_init(build).copied()
}

fn build() -> Option<&'static Recorder> {
    let settings = crate::settings::get();
    if !HANDLERS.swap(true, Ordering::AcqRel) {
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
            libc::atexit(flush_at_exit);
        }
    }
    let path = settings.socket.clone()?;
    // Connected and announced from the calling thread, before its first event is stamped: the collector then
    // knows of this process before any of its events exist (see `hooks::Busy::enter`).
    let pid = std::process::id();
    let Some(sock) = Socket::connect(&path) else {
        crate::debug!("cannot connect to the collector; not recording");
        return None;
    };
    let mut buf = Vec::with_capacity(1024);
    codec::put_record(&mut buf, &Record::Hello(hello(pid)));
    if !sock.send_all(&buf) {
        crate::debug!("the collector closed the connection; not recording");
        return None;
    }
    let (tx, rx) = crossbeam_channel::bounded(CHANNEL_EVENTS);
    // Leaked on purpose: a forked child abandons it rather than touch a channel another thread may have held.
    let rec: &'static Recorder = Box::leak(Box::new(Recorder {
        tx,
        thread: std::sync::OnceLock::new(),
        link: AtomicU8::new(CONNECTED),
        dropped: AtomicU64::new(0),
        flushed: AtomicBool::new(false),
        pid: std::process::id(),
        stacks: crate::stacks::Table::default(),
    }));
    let spawned = std::thread::Builder::new()
        .name("vramtrace".into())
        .stack_size(256 << 10)
        .spawn(move || sender(rec, rx, sock));
    match spawned {
        Ok(handle) => {
            let _ = rec.thread.set(handle.thread().clone());
            Some(rec)
        }
        Err(e) => {
            crate::debug!("cannot start the sender thread ({e}); not recording");
            None
        }
    }
}

/// In a forked child: forget the parent's recorder (its thread did not survive) and close our copy of its
/// socket, so the collector sees the parent's connection end when the parent does. Only atomic stores and
/// `close`, both safe here.
extern "C" fn after_fork_in_child() {
    RECORDER.forget();
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
    let fd = SOCKET_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        unsafe { libc::close(fd) };
    }
}

/// At `exit`: ask the sender to send what is queued and say goodbye; wait a bounded moment for it.
extern "C" fn flush_at_exit() {
    let Some(&r) = RECORDER.peek() else {
        return;
    };
    if r.pid != std::process::id() || r.link.load(Ordering::Acquire) == GONE {
        return;
    }
    let deadline = Instant::now() + EXIT_FLUSH;
    if r.tx.send_timeout(Msg::Flush, EXIT_FLUSH).is_err() {
        return;
    }
    r.wake();
    while !r.flushed.load(Ordering::Acquire)
        && r.link.load(Ordering::Acquire) != GONE
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether events reach a collector. Waits (briefly) for a connection still being made.
pub fn active() -> bool {
    let Some(r) = recorder() else { return false };
    let deadline = Instant::now() + Duration::from_millis(200);
    while r.link.load(Ordering::Acquire) == CONNECTING && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    r.link.load(Ordering::Acquire) == CONNECTED
}

/// Hands an out-of-memory record to the collector and waits, at most `OOM_WAIT` in all, until it is in the
/// trace: the program's next instruction may be its death. Everything the process recorded before it goes
/// first, in order. Returns whether the collector confirmed.
pub fn oom(o: Oom) -> bool {
    send_sync(Record::Oom(o))
}

/// Sends `rec` after everything queued before it and waits, at most `OOM_WAIT` in all, for the collector to
/// acknowledge it (an `Oom` record, or a `Bridge` record with `ack` set). Whether it did.
pub(crate) fn send_sync(rec: Record) -> bool {
    let Some(r) = recorder() else { return false };
    if r.link.load(Ordering::Acquire) == GONE {
        return false;
    }
    let deadline = Instant::now() + OOM_WAIT;
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    if r.tx
        .send_timeout(Msg::Sync(Box::new(rec), done_tx), OOM_WAIT)
        .is_err()
    {
        return false;
    }
    done_rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .is_ok()
}

/// What became of a record offered without waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offered {
    Queued,
    /// Nothing is recording in this process (no collector, or it went away).
    NotRecording,
    /// The channel was full: counted as dropped.
    Dropped,
}

/// Offers a record (from the Python bridge) to the sender, never waiting; it travels in its place among the
/// events. Starts the recorder if this is the process's first record.
pub(crate) fn offer(rec: Record) -> Offered {
    let Some(r) = live() else {
        return Offered::NotRecording;
    };
    match r.tx.try_send(Msg::Record(Box::new(rec))) {
        Ok(()) => Offered::Queued,
        Err(TrySendError::Full(_)) => {
            r.dropped.fetch_add(1, Ordering::Relaxed);
            r.wake();
            Offered::Dropped
        }
        Err(TrySendError::Disconnected(_)) => Offered::NotRecording,
    }
}

/// A connected Unix stream socket, written with `MSG_NOSIGNAL`: a collector that went away must never raise
/// SIGPIPE in the host.
struct Socket {
    fd: i32,
    /// The socket's identity (device, inode) when it was made: a host that closes our descriptor and gets the
    /// number back for a file or socket of its own must never receive our bytes, nor have its data read.
    id: (u64, u64),
}

impl Socket {
    fn connect(path: &OsString) -> Option<Socket> {
        let bytes = path.as_bytes();
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
            if unsafe { libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error().raw_os_error();
            if e == Some(libc::EINTR) {
                continue;
            }
            if e != Some(libc::EAGAIN) || Instant::now() >= deadline {
                unsafe { libc::close(fd) };
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
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
    fn ours(&self) -> bool {
        identity(self.fd) == Some(self.id)
    }

    fn send_all(&self, mut buf: &[u8]) -> bool {
        if !self.ours() {
            return false;
        }
        while !buf.is_empty() {
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

    /// Waits until `deadline` for the collector's answer to the `nth` record sent that waits for one (counting
    /// from 1; `answered` counts the answers read so far on this connection). Answers come one per such record,
    /// in order, so a late answer to an earlier record (one that gave up waiting) is skipped, never taken for
    /// this one. Whether this record's answer says it is in the trace.
    fn await_ack(&self, nth: u64, answered: &mut u64, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.ours() {
                return false;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
                continue;
            }
            let mut b = 0u8;
            let n =
                unsafe { libc::recv(self.fd, (&mut b as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
            if n == 0 {
                return false;
            }
            if n == 1 && (b == OOM_ACK || b == OOM_NAK) {
                *answered += 1;
                if *answered == nth {
                    return b == OOM_ACK;
                }
            }
        }
    }
}

/// (device, inode) of an open descriptor.
fn identity(fd: i32) -> Option<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

fn hello(pid: u32) -> Hello {
    let cmdline = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut host = [0u8; 256];
    let hostname = if unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len()) } == 0 {
        let end = host.iter().position(|c| *c == 0).unwrap_or(host.len());
        String::from_utf8_lossy(&host[..end]).into_owned()
    } else {
        String::new()
    };
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse().ok());
    Hello {
        pid,
        ppid: unsafe { libc::getppid() } as u32,
        ts_ns: now(),
        cmdline,
        hostname,
        rank: num("RANK"),
        local_rank: num("LOCAL_RANK"),
        slurm_procid: num("SLURM_PROCID"),
        shim_version: env!("CARGO_PKG_VERSION").to_string(),
        extra: bridge_loaded(pid),
    }
}

/// The Python bridge marks the processes it loaded in (`os.putenv`, so the program's `os.environ` is
/// unchanged): the report can then name the Python processes it did not run in.
fn bridge_loaded(pid: u32) -> Vec<(String, String)> {
    match std::env::var("VRAMTRACE_BRIDGE_PID") {
        Ok(v) if v.trim().parse::<u32>().ok() == Some(pid) => {
            vec![("python_bridge".to_string(), "1".to_string())]
        }
        _ => Vec::new(),
    }
}

/// The sender thread: connect, announce, then batches until the channel closes or the collector goes away.
fn sender(rec: &'static Recorder, rx: Receiver<Msg>, sock: Socket) {
    crate::hooks::mark_own_thread();
    let stop = |why: &str| {
        rec.link.store(GONE, Ordering::Release);
        crate::debug!("{why}; not recording");
    };
    let pid = rec.pid;
    let mut buf = Vec::with_capacity(64 << 10);
    let mut batch: Vec<Event> = Vec::with_capacity(BATCH);
    // Records sent that wait for the collector's answer, and answers read: matched in order (`await_ack`).
    let (mut syncs_sent, mut answered) = (0u64, 0u64);
    let mut objects = crate::objects::Tracker::default();
    let mut nap = NAP_MIN;
    let mut last_sent = Instant::now();
    loop {
        buf.clear();
        batch.clear();
        let mut flush = false;
        let mut idle = false;
        let mut oom = None;
        let mut next = match rx.try_recv() {
            Ok(m) => Some(m),
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                if last_sent.elapsed() < TICK {
                    std::thread::park_timeout(nap);
                    nap = (nap * 2).min(NAP_MAX);
                    continue;
                }
                idle = true;
                None
            }
        };
        nap = NAP_MIN;
        last_sent = Instant::now();
        // Drain in channel order: a stack or a note ends the batch before it, so each reaches the collector
        // exactly where it was queued.
        while let Some(m) = next.take() {
            match m {
                Msg::Event(e) => batch.push(e),
                Msg::Flush => flush = true,
                Msg::Sync(o, done) => oom = Some((o, done)),
                Msg::Record(rec) => {
                    if !batch.is_empty() {
                        codec::put_events(&mut buf, pid, &batch);
                        batch.clear();
                    }
                    codec::put_record(&mut buf, &rec);
                }
                Msg::Stack(st) => {
                    if !batch.is_empty() {
                        codec::put_events(&mut buf, pid, &batch);
                        batch.clear();
                    }
                    if let Some(objects) = objects.changed() {
                        codec::put_record(
                            &mut buf,
                            &Record::Objects(vramtrace_format::Objects {
                                pid,
                                ts_ns: now(),
                                objects,
                            }),
                        );
                    }
                    codec::put_record(&mut buf, &Record::Stack(*st));
                }
                Msg::Note(ts_ns, text) => {
                    if !batch.is_empty() {
                        codec::put_events(&mut buf, pid, &batch);
                        batch.clear();
                    }
                    codec::put_record(&mut buf, &Record::Note { pid, ts_ns, text });
                }
            }
            if flush || oom.is_some() || batch.len() >= BATCH || buf.len() >= BUF_MAX {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() {
            codec::put_events(&mut buf, pid, &batch);
        }
        let dropped = rec.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            codec::put_record(
                &mut buf,
                &Record::Dropped {
                    pid,
                    ts_ns: now(),
                    count: dropped,
                },
            );
        }
        if idle {
            codec::put_record(&mut buf, &Record::Tick { pid, ts_ns: now() });
        }
        if let Some((o, _)) = &oom {
            codec::put_record(&mut buf, o);
        }
        if flush {
            codec::put_record(&mut buf, &Record::Goodbye { pid, ts_ns: now() });
        }
        if !buf.is_empty() && !sock.send_all(&buf) {
            return stop("the collector closed the connection");
        }
        if let Some((_, done)) = oom {
            syncs_sent += 1;
            if sock.await_ack(syncs_sent, &mut answered, Instant::now() + OOM_WAIT) {
                let _ = done.send(());
            }
        }
        if flush {
            rec.flushed.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod ack_tests {
    use super::*;

    fn pair() -> (Socket, i32) {
        let mut fds = [0i32; 2];
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) },
            0
        );
        let id = identity(fds[0]).unwrap();
        (Socket { fd: fds[0], id }, fds[1])
    }

    fn answer(fd: i32, b: u8) {
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
        unsafe {
            libc::close(sock.fd);
            libc::close(peer);
        }
    }
}
