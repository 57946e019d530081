//! Recording: the calling thread stamps a fixed-size event and publishes it in the process's shared-memory ring
//! (`vramtrace_format::ring`) with one atomic store: no system call, no lock, no wake-up. The collector maps the
//! same memory, so an event is out of the process the moment the call that made it returns: a process that
//! `_exit`s, is killed or crashes on its next instruction loses nothing. A full ring drops the event and counts
//! it in the shared memory (where the collector reads the count even after a SIGKILL); with `--lossless`
//! (`VRAMTRACE_LOSSLESS=1`) the thread waits for room instead.
//!
//! Call sites, notes and the Python bridge's records go through the same ring, as blobs of encoded records,
//! from the thread that made them: a stack seen once is in the trace even if the process dies next. A courier
//! thread (the cold path, a crossbeam channel) does what may wait: the loaded objects (`dl_iterate_phdr`, kept
//! off the host's threads), the records that wait for the collector's answer (out-of-memory), and noticing that
//! the collector went away.
//!
//! Lifecycle: nothing happens before the first tracked call. That call makes the ring, connects to the
//! collector and says hello with the ring's descriptor attached (non-blocking, at most 200 ms), before anything
//! is stamped. `fork` leaves the child without our courier (only the forking thread survives), so the child
//! abandons the parent's recorder and builds its own ring at its next tracked call. At `exit` a goodbye goes in
//! the ring; nothing waits: the collector drains the ring once the process is gone.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};
use vramtrace_format::keys;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use vramtrace_format::ring::Ring;
use vramtrace_format::{codec, ticks, Api, Event, Hello, Oom, Record, Stack};

use crate::prefault::Prefault;
use crate::transport::{self, Socket, SOCKET_FD};

/// How long an allocation that ran out of memory waits for the collector to hold the evidence.
const OOM_WAIT: Duration = Duration::from_secs(1);
/// How long `exit` waits, at most, for room in a full ring for its goodbye (lossless: for its events too).
const EXIT_ROOM: Duration = Duration::from_millis(50);
const EXIT_ROOM_LOSSLESS: Duration = Duration::from_secs(2);
/// How often the courier looks whether the collector is still there.
const HEARTBEAT: Duration = Duration::from_millis(100);
/// How long the first tracked call waits, at most, for the courier to publish the loaded objects.
const OBJECTS_WAIT: Duration = Duration::from_millis(100);
/// How long the first tracked call tries, at most, to pass its ring while the kernel says too many are in flight.
const PASS_WAIT: Duration = Duration::from_millis(200);
/// A lossless writer facing a full ring naps this long between looks.
const LOSSLESS_NAP: Duration = Duration::from_micros(20);

/// The courier's work: what may wait, off the host's threads.
enum Cold {
    /// A new call site was published: send the loaded objects if they changed.
    Objects,
    /// Send this record on the socket after everything published before it (an out-of-memory record, or a
    /// bridge record asking for it); tell the waiting thread once the collector has acknowledged it.
    Sync(Box<Record>, Sender<()>),
    /// A writer's event landed at this position, near the end of what is faulted in (`prefault`).
    Prefault(u64),
}

pub(crate) struct Recorder {
    ring: Ring,
    cold: Sender<Cold>,
    /// `--lossless`, while the courier can tell that the collector is there (a waiter must never outlive it).
    lossless: AtomicBool,
    /// A `Cold::Objects` is queued and not yet handled.
    objects_asked: AtomicBool,
    pid: u32,
    /// This process's call sites (a forked child's new recorder starts with none).
    stacks: crate::stack_table::Table,
    /// The ring's pages, faulted in ahead of the writers by the courier.
    prefault: Prefault,
}

const CONNECTED: u8 = 1;
const GONE: u8 = 2;

/// This process's recorder (leaked: a forked child abandons its parent's, which another thread may be using).
static RECORDER: crate::lazy::Lazy<&'static Recorder> = crate::lazy::Lazy::new();
/// `RECORDER`'s answer once it has one, without its box on the heap between: the recorder, or null for none
/// (valid while `LIVE_SET`; cleared in a forked child with `RECORDER`).
#[link_section = ".vramtrace.hotdata"]
static LIVE: AtomicPtr<Recorder> = AtomicPtr::new(std::ptr::null_mut());
#[link_section = ".vramtrace.hotdata"]
static LIVE_SET: AtomicBool = AtomicBool::new(false);
/// The recorder's link to the collector: `CONNECTED`, or `GONE` (the collector went away: callers stop offering
/// events). With the ring's parts and whether events carry ticks, what every event reads of the recorder, kept
/// here rather than in it (on the heap: a page walk more an event when the caches are cold). One recorder per
/// process (a forked child's `build` sets them afresh before its recorder is published).
#[link_section = ".vramtrace.hotdata"]
static LINK: AtomicU8 = AtomicU8::new(0);
/// Events carry the time-stamp counter (the ring's `FLAG_TICKS`).
#[link_section = ".vramtrace.hotdata"]
static TICKS: AtomicBool = AtomicBool::new(false);
#[link_section = ".vramtrace.hotdata"]
static RING_BASE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
#[link_section = ".vramtrace.hotdata"]
static RING_SLOTS: AtomicU64 = AtomicU64::new(0);
/// Bumped in every forked child: thread-id caches from before the fork are stale.
#[link_section = ".vramtrace.hotdata"]
static FORK_GEN: AtomicU32 = AtomicU32::new(0);
static HANDLERS: AtomicBool = AtomicBool::new(false);

/// CLOCK_MONOTONIC in ns, the collector's clock: the time of records other than events (cold paths).
#[inline]
pub fn now() -> u64 {
    ticks::monotonic()
}

#[inline]
#[link_section = ".vramtrace.hot"]
pub(crate) fn tid() -> u32 {
    // Cached with the fork generation it was read in (plus one: 0 is "not read"): `gettid` is a system call,
    // too slow for every event, and a forked child's thread has a new id.
    let gen = FORK_GEN.load(Ordering::Relaxed).wrapping_add(1) as u64;
    let cache = &crate::tls::state().tid;
    let c = cache.get();
    if c >> 32 == gen {
        return c as u32;
    }
    // The system call, not glibc's wrapper: `gettid()` only exists since glibc 2.30 (the shim targets 2.17).
    // SAFETY: gettid takes no arguments and cannot fail.
    let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    cache.set(gen << 32 | t as u64);
    t
}

/// Publishes one event, stamped now. Never blocks (unless lossless); a no-op when nothing is recording.
/// `stack`: the call site's id from `stacks::site` (0: none), whose stack is already in the ring.
#[allow(clippy::too_many_arguments)]
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn push(
    api: Api,
    flags: u8,
    device: u32,
    result: u32,
    addr: u64,
    size: u64,
    aux: u64,
    stack: u32,
) {
    let Some(r) = recorder() else { return };
    if LINK.load(Ordering::Relaxed) == GONE {
        return;
    }
    // SAFETY: the parts of this process's recorder's ring (`r` is it), stored by `build` before it was published;
    // the ring's mapping is never unmapped.
    let ring = unsafe {
        Ring::from_parts(
            RING_BASE.load(Ordering::Relaxed),
            RING_SLOTS.load(Ordering::Relaxed),
        )
    };
    let tid = tid();
    // The clock last, just before the ring reserves: the shorter the window between the two, the less often
    // the collector has to hold a time at its ring's previous one (`ring::Ring::try_event`). The counter's
    // ticks where the ring says so (the collector converts them), else ns.
    let e = Event {
        ts_ns: if TICKS.load(Ordering::Relaxed) {
            ticks::read()
        } else {
            ticks::monotonic()
        },
        tid,
        api,
        flags,
        device,
        result,
        addr,
        size,
        aux,
        stack,
    };
    match ring.try_event_at(&e) {
        Some(pos) if r.prefault.wanted(pos) => r.ask_prefault(pos),
        Some(_) => {}
        None => r.event_no_room(e),
    }
}

impl Recorder {
    /// The ring was full for a record: count it as dropped, or (lossless) wait for room until `publish`
    /// succeeds, the collector goes away, or `until` passes. Whether it was published.
    #[cold]
    fn no_room(&self, publish: impl Fn() -> bool, until: Option<Instant>) -> bool {
        if self.lossless.load(Ordering::Relaxed) || until.is_some() {
            self.ring.wake_now();
            loop {
                if publish() {
                    return true;
                }
                // Stop when the collector is gone, the deadline passed, or nothing can tell us any more
                // whether the collector is there (lossless was turned off: the socket was closed under us).
                if LINK.load(Ordering::Acquire) == GONE
                    || until.is_some_and(|u| Instant::now() >= u)
                    || (until.is_none() && !self.lossless.load(Ordering::Relaxed))
                {
                    break;
                }
                std::thread::sleep(LOSSLESS_NAP);
            }
        }
        self.ring.count_drop();
        false
    }

    /// The writers are near the end of the ring's faulted-in pages: the courier faults in more.
    #[cold]
    #[inline(never)]
    fn ask_prefault(&self, pos: u64) {
        if self.prefault.claim() {
            if let Err(e) = self.cold.try_send(Cold::Prefault(pos)) {
                // Full: asked again by a later event. Gone: no courier, the writers fault pages in themselves.
                match e {
                    crossbeam_channel::TrySendError::Full(_) => self.prefault.unclaim(),
                    crossbeam_channel::TrySendError::Disconnected(_) => self.prefault.abandon(),
                }
            }
        }
    }

    /// An event the ring had no room for: counted as dropped, or (lossless) published when there is room.
    #[cold]
    #[inline(never)]
    fn event_no_room(&self, e: Event) {
        self.no_room(|| self.ring.try_event(&e), None);
    }

    /// Publishes an encoded record (never waiting, unless lossless). Whether it is in the ring.
    fn blob(&self, rec: &Record, until: Option<Instant>) -> bool {
        let mut buf = Vec::with_capacity(256);
        codec::put_record(&mut buf, rec);
        self.ring.try_blob(&buf) || self.no_room(|| self.ring.try_blob(&buf), until)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn stacks(&self) -> &crate::stack_table::Table {
        &self.stacks
    }

    /// Publishes a new call site, before the first event naming it. Whether it is in the ring.
    pub(crate) fn offer_stack(&self, s: Stack) -> bool {
        let ok = self.blob(&Record::Stack(s), None);
        // The courier sends the loaded objects, if they changed, so the collector can resolve it.
        if !self.objects_asked.swap(true, Ordering::AcqRel)
            && self.cold.try_send(Cold::Objects).is_err()
        {
            self.objects_asked.store(false, Ordering::Release);
        }
        ok
    }

    /// Publishes a note for the report, never waiting.
    pub(crate) fn note(&self, text: String) {
        let rec = Record::Note {
            pid: self.pid,
            ts_ns: now(),
            text,
        };
        self.blob(&rec, None);
    }
}

/// Publishes a whole encoded frame in this process's own ring, from any context, a signal handler included:
/// atomic loads, `getpid` and the ring's lock-free reservation (a compare-and-swap loop and at most a futex
/// wake); nothing allocated, locked or waited for, even when lossless. Whether it is in the ring: not when the
/// process has no ring of its own (none yet, or being made; after a `fork`, its parent's), the collector hung
/// up, or the ring has no room now.
pub(crate) fn publish_frame_anywhere(frame: &[u8]) -> bool {
    let Some(&r) = RECORDER.peek() else {
        return false;
    };
    // A child forked without glibc's atfork handlers (a raw `clone`) still sees its parent's recorder.
    // SAFETY: getpid has no preconditions, and is async-signal-safe.
    if r.pid != unsafe { libc::getpid() } as u32 || LINK.load(Ordering::Acquire) == GONE {
        return false;
    }
    r.ring.try_blob(frame)
}

/// Starts the recorder if this is the process's first tracked call (an atomic load otherwise).
#[inline]
pub(crate) fn start_now() {
    let _ = recorder();
}

/// The recorder of this process if it is recording, starting it at the first call.
#[inline]
pub(crate) fn live() -> Option<&'static Recorder> {
    recorder().filter(|_| LINK.load(Ordering::Relaxed) != GONE)
}

#[inline]
#[link_section = ".vramtrace.hot"]
fn recorder() -> Option<&'static Recorder> {
    if LIVE_SET.load(Ordering::Acquire) {
        // SAFETY: `LIVE` holds null or a recorder `build` leaked (never freed), stored before `LIVE_SET`.
        return unsafe { LIVE.load(Ordering::Relaxed).as_ref() };
    }
    recorder_slow()
}

/// Makes sure this process has tried to start recording (and so has the collector's settings, if any).
pub(crate) fn started() {
    let _ = recorder();
}

#[cold]
#[inline(never)]
fn recorder_slow() -> Option<&'static Recorder> {
    // First tracked call of this process (or of a forked child): settings, handlers, ring, courier.
    // Concurrent first calls wait for the one that won; a fork while it runs leaves the child able to start
    // its own (crate::lazy).
    let r = RECORDER.get_or_init(build).copied();
    LIVE.store(
        r.map_or(std::ptr::null_mut(), |r| {
            r as *const Recorder as *mut Recorder
        }),
        Ordering::Relaxed,
    );
    LIVE_SET.store(true, Ordering::Release);
    r
}

/// Sends the hello with the ring attached. A user with more descriptors in flight than its limit
/// (`ETOOMANYREFS`: connections waiting in a busy collector's backlog each hold one) is refused until the
/// collector takes some: tried again for a while.
fn pass_ring(s: &Socket, hello: &[u8], ring_fd: i32) -> Result<(), Option<i32>> {
    let deadline = Instant::now() + PASS_WAIT;
    loop {
        match s.send_with_fd(hello, ring_fd) {
            Err(Some(libc::ETOOMANYREFS)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            r => return r,
        }
    }
}

/// The longest the first tracked call waits for the collector's settings.
pub(crate) const SETTINGS_WAIT: Duration = Duration::from_millis(250);

fn build() -> Option<&'static Recorder> {
    let settings = crate::settings::get();
    if !HANDLERS.swap(true, Ordering::AcqRel) {
        // SAFETY: both register plain `extern "C"` functions of this library (never unloaded while preloaded;
        // glibc drops them should it be), once per process image (`HANDLERS`). `after_fork_in_child` does only
        // atomic stores and `close`, as a handler in a forked child must.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
            libc::atexit(goodbye_at_exit);
        }
    }
    let path = settings.socket.clone()?;
    // A safe moment (the first tracked call) to find the real wait functions, before a signal handler needs them.
    crate::waits::prepare();
    let pid = std::process::id();
    let ticks = settings.ticks;
    let flags = if settings.lossless {
        vramtrace_format::ring::FLAG_LOSSLESS
    } else {
        0
    } | if ticks {
        vramtrace_format::ring::FLAG_TICKS
    } else {
        0
    };
    let mapped = transport::make_ring(settings.ring_slots, pid, flags);
    // Connected and announced from the calling thread, before its first event is stamped: the collector then
    // knows of this process before any of its events exist (see `hooks::Busy::enter`).
    let sock = Socket::connect(&path);
    let h = hello(pid);
    let mapped = match mapped {
        Ok(m) => m,
        Err(why) => {
            crate::debug!("cannot make the event ring ({why}); not recording");
            hang_up_untraced(sock, h, Some(why));
            return None;
        }
    };
    let mut buf = Vec::with_capacity(1024);
    codec::put_record(&mut buf, &Record::Hello(h.clone()));
    let sent = sock.as_ref().map(|s| pass_ring(s, &buf, mapped.fd));
    // The collector holds the ring now (or never will): our descriptor is not needed.
    // SAFETY: `mapped.fd` is the ring's memfd, made by `make_ring` for this process and used by nothing else; it
    // is closed once, here (the mapping stays valid without it).
    unsafe { libc::close(mapped.fd) };
    let sock = match (sock, sent) {
        (Some(s), Some(Ok(()))) => {
            // The collector answers the hello with the job's settings: the cap this process applies is the
            // job's, not what its environment says. Waited for once, at most SETTINGS_WAIT (a stopped
            // collector); without an answer the environment's apply, and the collector says so.
            if let Some(j) = s
                .read_line(Instant::now() + SETTINGS_WAIT)
                .and_then(|l| vramtrace_format::settings::JobSettings::decode(&l))
            {
                crate::settings::set_job(j);
            }
            s
        }
        (other, sent) => {
            // The kernel would not pass the ring (its user has too many descriptors in flight): named, as when
            // the ring cannot be made. No socket, or no error to say: nothing is said.
            let why = match sent {
                Some(Err(Some(e))) => Some(format!(
                    "its event ring could not be passed to the collector: {}",
                    if e == libc::ETOOMANYREFS {
                        "its user had too many descriptors in flight to a busy collector (ETOOMANYREFS)"
                            .to_string()
                    } else {
                        std::io::Error::from_raw_os_error(e).to_string()
                    }
                )),
                _ => None,
            };
            hang_up_untraced(other, h, why);
            crate::debug!("cannot reach the collector; not recording");
            return None;
        }
    };
    let (cold, rx) = crossbeam_channel::bounded(64);
    LINK.store(CONNECTED, Ordering::Release);
    TICKS.store(ticks, Ordering::Relaxed);
    let (base, slots) = mapped.ring.parts();
    RING_BASE.store(base, Ordering::Relaxed);
    RING_SLOTS.store(slots, Ordering::Relaxed);
    // Leaked on purpose: a forked child abandons it rather than touch state another thread may have held.
    let rec: &'static Recorder = Box::leak(Box::new(Recorder {
        ring: mapped.ring,
        cold,
        lossless: AtomicBool::new(settings.lossless),
        objects_asked: AtomicBool::new(true),
        pid,
        stacks: crate::stack_table::Table::default(),
        prefault: Prefault::new(&mapped.ring),
    }));
    let spawned = std::thread::Builder::new()
        .name("vramtrace".into())
        .stack_size(256 << 10)
        .spawn(move || courier(rec, rx, sock));
    match spawned {
        // The loaded objects go out before this thread's first stack can (so a process that dies at once still
        // has its call sites resolved). Listing them takes the loader's lock, on the courier: a `dlopen` in
        // progress whose constructor made this very call holds that lock, so the wait is bounded.
        Ok(_) if settings.stacks_native => {
            let deadline = Instant::now() + OBJECTS_WAIT;
            while rec.objects_asked.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(_) => {}
        // Events still flow through the ring; only the objects and the acknowledged records are missing, and
        // nothing could tell a lossless writer that the collector is gone: it drops instead.
        Err(e) => {
            rec.lossless.store(false, Ordering::Release);
            crate::debug!(
                "cannot start the courier thread ({e}): no loaded objects, no acknowledgements"
            )
        }
    }
    Some(rec)
}

/// Not recording: say why in a hello of our own (the collector then names the process untraced rather than show
/// one that allocated nothing), when there is a reason to say, and close the socket.
fn hang_up_untraced(sock: Option<Socket>, mut h: Hello, why: Option<String>) {
    let Some(s) = sock else { return };
    if let Some(why) = why {
        h.extra.push((keys::hello::NO_RING.to_string(), why));
        let mut buf = Vec::with_capacity(1024);
        codec::put_record(&mut buf, &Record::Hello(h));
        s.send_all(&buf);
    }
    // Forgotten first: a fork after this closes nothing in the child, and none before the close can find a
    // number already reused.
    SOCKET_FD.store(-1, Ordering::Release);
    // SAFETY: `s` is consumed here, and `Socket` has no `Drop`: this is the only close of its descriptor.
    unsafe { libc::close(s.fd) };
}

/// In a forked child: forget the parent's recorder (its courier did not survive) and close our copy of its
/// socket, so the collector sees the parent's connection end when the parent does. Only atomic stores and
/// `close`, both safe here.
extern "C" fn after_fork_in_child() {
    RECORDER.forget();
    LIVE_SET.store(false, Ordering::Release);
    LIVE.store(std::ptr::null_mut(), Ordering::Relaxed);
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
    let fd = SOCKET_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: `fd` is our copy of the collector's socket, inherited through the fork; the swap to -1 above
        // makes this its only close.
        unsafe { libc::close(fd) };
    }
}

/// At `exit`: say goodbye in the ring (waiting briefly for room if it is full). Nothing else waits: everything
/// published is already in the collector's reach.
extern "C" fn goodbye_at_exit() {
    let Some(&r) = RECORDER.peek() else {
        return;
    };
    if r.pid != std::process::id() || LINK.load(Ordering::Acquire) == GONE {
        return;
    }
    let room = if r.lossless.load(Ordering::Relaxed) {
        EXIT_ROOM_LOSSLESS
    } else {
        EXIT_ROOM
    };
    let bye = Record::Goodbye {
        pid: r.pid,
        ts_ns: now(),
    };
    let mut buf = Vec::with_capacity(32);
    codec::put_record(&mut buf, &bye);
    // Its room is kept free by every other record; it waits only if a padding record took it.
    if !r.ring.try_last(&buf) {
        r.no_room(|| r.ring.try_last(&buf), Some(Instant::now() + room));
    }
    r.ring.wake_now();
}

/// Whether events reach a collector.
pub fn active() -> bool {
    recorder().is_some_and(|_| LINK.load(Ordering::Acquire) == CONNECTED)
}

/// Hands an out-of-memory record to the collector and waits, at most `OOM_WAIT` in all, until it is in the
/// trace: the program's next instruction may be its death. Everything the process recorded before it goes
/// first, in order. Returns whether the collector confirmed.
pub fn oom(o: Oom) -> bool {
    send_sync(Record::Oom(o))
}

/// Sends `rec` after everything published before it and waits, at most `OOM_WAIT` in all, for the collector to
/// acknowledge it (an `Oom` record, or a `Bridge` record with `ack` set). Whether it did.
pub(crate) fn send_sync(rec: Record) -> bool {
    let Some(r) = recorder() else { return false };
    if LINK.load(Ordering::Acquire) == GONE {
        return false;
    }
    let deadline = Instant::now() + OOM_WAIT;
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    if r.cold
        .send_timeout(Cold::Sync(Box::new(rec), done_tx), OOM_WAIT)
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
    /// The ring was full: counted as dropped.
    Dropped,
}

/// Publishes a record (from the Python bridge), never waiting (unless lossless); it travels in its place among
/// the events. Starts the recorder if this is the process's first record.
pub(crate) fn offer(rec: Record) -> Offered {
    let Some(r) = live() else {
        return Offered::NotRecording;
    };
    if r.blob(&rec, None) {
        Offered::Queued
    } else {
        Offered::Dropped
    }
}

/// The courier: the loaded objects first, then what the host's threads hand it, until the collector goes away.
fn courier(rec: &'static Recorder, rx: Receiver<Cold>, sock: Socket) {
    crate::tls::mark_own_thread();
    let pid = rec.pid;
    let mut objects = crate::objects::Tracker::default();
    let send_objects = |objects: &mut crate::objects::Tracker| {
        if let Some(objects) = objects.changed() {
            let o = Record::Objects(vramtrace_format::Objects {
                pid,
                ts_ns: now(),
                objects,
            });
            rec.blob(&o, None);
        }
    };
    let native = crate::settings::get().stacks_native;
    if native {
        send_objects(&mut objects);
    }
    rec.objects_asked.store(false, Ordering::Release);
    // Records sent that wait for the collector's answer, and answers read: matched in order (`await_ack`).
    let (mut syncs_sent, mut answered) = (0u64, 0u64);
    let mut buf = Vec::new();
    let mut socket_lost = false;
    let mut exiting = false;
    let mut devices_told = false;
    loop {
        // Which GPU each ordinal is, told once the driver answers (the program has initialised it): from here,
        // never on the program's threads.
        if !devices_told {
            devices_told = tell_devices(rec);
        }
        match rx.recv_timeout(HEARTBEAT) {
            Ok(Cold::Objects) => {
                rec.objects_asked.store(false, Ordering::Release);
                if native {
                    send_objects(&mut objects);
                }
            }
            // From where the writers are now, which may be well past where one asked.
            Ok(Cold::Prefault(pos)) => rec.prefault.run(pos.max(rec.ring.reserved())),
            Ok(Cold::Sync(r, done)) => {
                if socket_lost {
                    // Nobody to acknowledge it: it goes in the ring like any record, and the waiting thread
                    // gives up at once (its sender is dropped here).
                    rec.blob(&r, None);
                    continue;
                }
                buf.clear();
                codec::put_record(&mut buf, &r);
                if !sock.send_all(&buf) {
                    if !sock.ours() {
                        socket_lost = true;
                        continue;
                    }
                    break;
                }
                // The collector may be asleep on the ring: it drains the ring, then writes this record.
                rec.ring.wake_now();
                syncs_sent += 1;
                if sock.await_ack(syncs_sent, &mut answered, Instant::now() + OOM_WAIT) {
                    let _ = done.send(());
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                // The host closed our descriptor (`close_range`, a daemon's clean-up): the ring still carries
                // everything, and the collector drains it while the process maps it; only the acknowledged
                // records (and noticing the collector's end, so lossless waits stop) are lost.
                if !socket_lost && !sock.ours() {
                    socket_lost = true;
                    rec.lossless.store(false, Ordering::Release);
                    crate::debug!(
                        "the host closed the collector's socket; recording on through the ring"
                    );
                } else if !socket_lost && sock.closed() {
                    break;
                }
                // The program's threads are all gone (its main thread ended with `pthread_exit`): the process
                // would live on as long as this one. It exits (0) as glibc exits it after the program's last
                // thread, running its exit handlers (the goodbye among them), from a thread of the program's
                // kind: a full stack, and its CUDA calls recorded (this one's go straight through). This one
                // goes on meanwhile: the handlers may need it (an out-of-memory record's acknowledgement).
                if !exiting && only_thread_left() {
                    exiting = std::thread::Builder::new()
                        .stack_size(8 << 20)
                        // SAFETY: exit(3) has no preconditions; no other thread of the process is left to call
                        // `exit` at the same time (`only_thread_left`), and this courier thread never does.
                        .spawn(|| unsafe { libc::exit(0) })
                        .is_ok();
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
    LINK.store(GONE, Ordering::Release);
    crate::debug!("the collector closed the connection; not recording");
}

/// Publishes which GPU each of this process's ordinals is (`Record::Devices`), once the driver can say. Whether
/// it is done (told, or nothing to tell).
fn tell_devices(rec: &Recorder) -> bool {
    let Some(uuids) = crate::devices::uuids() else {
        return false;
    };
    let uuids: Vec<(u32, [u8; 16])> = uuids
        .iter()
        .enumerate()
        .filter_map(|(i, u)| u.map(|u| (i as u32, u)))
        .collect();
    if !uuids.is_empty() {
        let r = Record::Devices {
            pid: rec.pid,
            ts_ns: now(),
            uuids,
        };
        // Not `blob`: a ring with no room would count the record as a dropped event. It is no event; the
        // courier tries again at its next look.
        let mut buf = Vec::with_capacity(256);
        codec::put_record(&mut buf, &r);
        return rec.ring.try_blob(&buf);
    }
    true
}

/// Whether the calling thread is the only one of the process still running: alone, or beside a main thread
/// that ended with `pthread_exit` (it stays a zombie, and counted, until the process ends).
fn only_thread_left() -> bool {
    // After the command's name, which may hold anything, in parentheses: the state is field 3, the thread
    // count field 20.
    let field = |path: &str, n: usize| -> Option<String> {
        let stat = std::fs::read_to_string(path).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(n - 3).map(str::to_string)
    };
    match field("/proc/self/stat", 20).and_then(|n| n.parse::<u32>().ok()) {
        Some(1) => true,
        Some(2) => {
            let pid = std::process::id();
            // SAFETY: gettid takes no arguments and cannot fail.
            let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
            // Read the count again once the main thread is seen ended: it may have started a thread just
            // before (once it is a zombie, only this thread could start one).
            me != pid
                && field(&format!("/proc/self/task/{pid}/stat"), 3).as_deref() == Some("Z")
                && field("/proc/self/stat", 20).as_deref() == Some("2")
        }
        _ => false,
    }
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
    // SAFETY: `host` is a local buffer of `host.len()` bytes, as the call is told; an unterminated name is
    // handled (`unwrap_or`).
    let hostname = if unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len()) } == 0 {
        let end = host.iter().position(|c| *c == 0).unwrap_or(host.len());
        String::from_utf8_lossy(&host[..end]).into_owned()
    } else {
        String::new()
    };
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse().ok());
    Hello {
        pid,
        // SAFETY: getppid has no preconditions and cannot fail.
        ppid: unsafe { libc::getppid() } as u32,
        ts_ns: now(),
        cmdline,
        hostname,
        rank: num("RANK"),
        local_rank: num("LOCAL_RANK"),
        slurm_procid: num("SLURM_PROCID"),
        shim_version: env!("CARGO_PKG_VERSION").to_string(),
        extra: hello_extra(pid),
    }
}

/// What the hello says beyond its fields: whether the bridge loaded here, and the job's token (the collector
/// takes it out before the hello is written: it vouches for a process of another user that exits before the
/// collector could ask the kernel where it came from).
fn hello_extra(pid: u32) -> Vec<(String, String)> {
    let mut extra = bridge_loaded(pid);
    if let Some(t) = std::env::var(vramtrace_format::env::JOB_TOKEN)
        .ok()
        .filter(|t| !t.is_empty())
    {
        extra.push((keys::hello::JOB_TOKEN.to_string(), t));
    }
    // The cap this process applies, as it read it: a process that set its own, or lost the job's ledger, is
    // told apart when the GPU's count shows it past the job's cap.
    let s = crate::settings::get();
    if let Some(cap) = &s.cap {
        extra.push((keys::hello::CAP.to_string(), cap.clone()));
        extra.push((
            keys::hello::CAP_MODE.to_string(),
            if s.cap_warn { "warn" } else { "enforce" }.to_string(),
        ));
        extra.push((
            keys::hello::CAP_LEDGER.to_string(),
            if s.ledger.is_some() { "1" } else { "0" }.to_string(),
        ));
    }
    extra
}

/// The Python bridge marks the processes it loaded in (`os.putenv`, so the program's `os.environ` is
/// unchanged): the report can then name the Python processes it did not run in.
fn bridge_loaded(pid: u32) -> Vec<(String, String)> {
    match std::env::var("VRAMTRACE_BRIDGE_PID") {
        Ok(v) if v.trim().parse::<u32>().ok() == Some(pid) => {
            vec![(keys::hello::PYTHON_BRIDGE.to_string(), "1".to_string())]
        }
        _ => Vec::new(),
    }
}
