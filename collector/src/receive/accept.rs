//! The acceptor: takes each connection of the job from the socket's backlog (the peer checked: the job's own
//! processes only), hands it to `take` (its hello into the trace, then a receiver thread), and promises, when
//! every connection is announced, that no process still to come has anything older. When descriptors run out it
//! keeps one in reserve, so that each connection it takes can be given one for its ring; what it cannot take
//! by the job's end is said.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vramtrace_format::codec;
use vramtrace_format::Record;

use super::connections::Connections;
use super::hold::put_note;
use super::limits::CLOCK_MARGIN_NS;
use super::peer::{Conn, GonePeer};
use super::writer::TraceWriter;
use crate::names::ticks::mono_ns;
use crate::process::hangup::Hangups;

/// How long, once the job is over, the acceptor keeps trying to take what waits when it has no descriptor free
/// and has taken nothing: the receivers of processes that ended close theirs as they finish.
const STARVED_WAIT: Duration = Duration::from_secs(1);
/// The acceptor's pause between looks while it can take nothing.
const STARVED_NAP: Duration = Duration::from_millis(5);
/// What the trace and the summary say when the job ended with connections the acceptor could not take.
pub(crate) const STARVED_NOTE: &str =
    "connections still waiting when the job ended were not taken, so \
    their processes are not in the trace: the collector ran out of file descriptors";

/// Starts the acceptor's thread on `listener` (none: no thread).
pub(crate) fn spawn_acceptor(
    listener: Option<UnixListener>,
    trace: Arc<Mutex<TraceWriter>>,
    conns: Arc<Connections>,
) -> Option<thread::JoinHandle<()>> {
    let listener = listener?;
    listener.set_nonblocking(true).ok()?;
    // A test hook: an acceptor this late loses, before the fix, every process that exits at once.
    let delay = std::env::var("VRAMTRACE_TEST_ACCEPT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    let me = std::process::id();
    // SAFETY: no arguments and no preconditions; it cannot fail.
    let uid = unsafe { libc::geteuid() };
    let hangups = Hangups::start();
    let acceptor = Acceptor {
        spare: None,
        stopped_at: None,
        last_tick: 0,
        conns,
        delay,
        listener,
        me,
        uid,
        trace,
        hangups,
    };
    thread::Builder::new()
        .name("vramtrace-accept".into())
        .spawn(move || acceptor.run())
        .ok()
}

/// The acceptor's thread: what it was given, and what it keeps from one round to the next. Its round (`run`),
/// the taking of what waits in the backlog and the promises it writes are apart, each a method.
struct Acceptor {
    /// A descriptor held in reserve (a clone of the listener's), so that a connection taken can always be
    /// given one for its ring.
    spare: Option<UnixListener>,
    /// When the job was found over, or the last connection taken since.
    stopped_at: Option<Instant>,
    /// When the last newcomer promise was written.
    last_tick: u64,
    conns: Arc<Connections>,
    /// A test hook: each round this late (`VRAMTRACE_TEST_ACCEPT_DELAY_MS`).
    delay: Option<Duration>,
    listener: UnixListener,
    /// vramtrace's pid and user, for the peer check.
    me: u32,
    uid: u32,
    trace: Arc<Mutex<TraceWriter>>,
    hangups: Option<Arc<Hangups>>,
}

impl Acceptor {
    /// Rounds until the job is over and nothing more waits (or can be taken): each takes the backlog, then
    /// promises what it can for the processes still to come, then waits for the next connection.
    fn run(mut self) {
        loop {
            let stopping = self.conns.stop.load(Ordering::Acquire);
            if stopping && self.stopped_at.is_none() {
                self.stopped_at = Some(Instant::now());
            }
            if !stopping {
                if let Some(d) = self.delay {
                    thread::sleep(d);
                }
            }
            // A round: the time, then everything waiting in the backlog, each with its hello in the trace.
            let round = mono_ns();
            let (all_announced, starved) = self.take_waiting(stopping);
            if !all_announced {
                // Nothing to gain from looking again at once (the listener stays readable).
                thread::sleep(STARVED_NAP);
            }
            if stopping {
                // The backlog is empty and the job is over; or nothing more can be taken (said in the
                // summary and the trace) once nothing has been for a while.
                if starved && self.stopped_at.is_some_and(|t| t.elapsed() < STARVED_WAIT) {
                    continue;
                }
                if starved {
                    self.say_starved();
                }
                return;
            }
            if all_announced {
                self.promise_newcomers(round);
            }
            poll_listener(&self.listener, 20);
        }
    }

    /// Takes everything waiting in the backlog, each connection with its hello in the trace if it is there
    /// (`take`), while a descriptor can be held in reserve. Returns whether every connection taken was
    /// announced with none left waiting, and whether one waits that no descriptor was left for.
    fn take_waiting(&mut self, stopping: bool) -> (bool, bool) {
        let mut all_announced = true;
        let mut starved = false;
        loop {
            // A descriptor held in reserve: an accepted connection can always be given one of its own
            // for the ring that comes with its hello (`Conn::reserve`), even when accepting it took the
            // last. Without one, connections wait in the backlog (their processes recording meanwhile)
            // until descriptors free up.
            if self.spare.is_none() {
                self.spare = self.listener.try_clone().ok();
                if self.spare.is_none() {
                    // Starved only if a connection is waiting.
                    if poll_listener(&self.listener, 0) > 0 {
                        starved = true;
                        all_announced = false;
                    }
                    break;
                }
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // Room for the peer check's reads of /proc; then taken back for this connection.
                    drop(self.spare.take());
                    let gone = match peer_of_job(&stream, self.me, self.uid, &self.conns) {
                        Peer::Job => None,
                        Peer::Gone(uid) => Some(GonePeer {
                            uid,
                            conns: self.conns.clone(),
                        }),
                        Peer::NotJob => continue,
                    };
                    let reserve = self.listener.try_clone().ok().map(OwnedFd::from);
                    all_announced &= take(
                        stream,
                        &self.trace,
                        &self.conns,
                        self.hangups.as_deref(),
                        gone,
                        reserve,
                    );
                    if stopping {
                        self.stopped_at = Some(Instant::now());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // Out of descriptors (or kernel memory): the connection waits in the backlog.
                    starved = matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    );
                    all_announced = false;
                    break;
                }
            }
        }
        (all_announced, starved)
    }

    /// The job ended with connections that could not be taken: said to `run` and in the trace.
    fn say_starved(&self) {
        self.conns.starved.store(true, Ordering::Release);
        let mut buf = Vec::new();
        put_note(&mut buf, 0, mono_ns(), STARVED_NOTE.into());
        if let Ok(mut w) = self.trace.lock() {
            w.write(0, &buf);
        }
    }

    /// Every process that connects from now on connected after `round`, and the shim stamps nothing
    /// before it has connected: no process still to come has anything older (less the margin for
    /// its converted ticks). The model holds its merge to this. Written when every connection taken is
    /// announced, at most every `NEWCOMER_TICK_NS`.
    fn promise_newcomers(&mut self, round: u64) {
        if self.conns.unannounced.load(Ordering::Acquire) == 0
            && round >= self.last_tick + NEWCOMER_TICK_NS
        {
            self.last_tick = round;
            let mut buf = Vec::new();
            codec::put_record(
                &mut buf,
                &Record::Tick {
                    pid: 0,
                    ts_ns: round.saturating_sub(CLOCK_MARGIN_NS),
                },
            );
            if let Ok(mut w) = self.trace.lock() {
                w.write(0, &buf);
            }
        }
    }
}

/// Waits up to `ms` milliseconds (0: only looks) for a connection waiting in the listener's backlog. Returns
/// poll's answer: above 0 when one waits.
fn poll_listener(listener: &UnixListener, ms: i32) -> i32 {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one local pollfd, as the count says.
    unsafe { libc::poll(&mut pfd, 1, ms) }
}

/// How often, at most, the acceptor promises that no new process has anything older (`Tick` of pid 0).
const NEWCOMER_TICK_NS: u64 = 10_000_000;

/// What the peer check found.
#[derive(Debug, PartialEq)]
enum Peer {
    /// A process of the job: ours (same user; the directory's name is known only to the job through its
    /// environment), or another user's that descends from vramtrace (a job process that dropped its
    /// privileges).
    Job,
    /// Another user's process that is gone already (its /proc entry with it, reaped by a parent of its own on a
    /// busy machine), or whose /proc could not be read (no descriptor free in a burst of connections): of the
    /// job only if its hello carries the job's token. Its user.
    Gone(u32),
    /// Anything else: turned away and counted.
    NotJob,
}

/// The peer's credentials as the kernel took them when it connected (`SO_PEERCRED`).
fn peer_cred(stream: &UnixStream) -> Option<libc::ucred> {
    // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a local ucred and `len` its size, as SO_PEERCRED writes; the socket is open (borrowed from
    // `stream`).
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// Whether the peer is a process of the job (see [`Peer`]).
fn peer_of_job(stream: &UnixStream, me: u32, uid: u32, conns: &Connections) -> Peer {
    let Some(cred) = peer_cred(stream) else {
        return Peer::NotJob;
    };
    if cred.uid == uid {
        return Peer::Job;
    }
    let pid = cred.pid as u32;
    // Of the job by /proc, and /proc's process is the peer (the same user: a pid reused since the connect by
    // a process of the job would not be). A pid vramtrace reaped is no exemption: a process of the job that
    // was gone before this check carries the job's token instead.
    match (descends_from(pid, me), effective_uid(pid)) {
        (Ok(true), Ok(Some(u))) if u == cred.uid => return Peer::Job,
        // /proc could not be read (the collector out of descriptors, in a burst of connections): no verdict
        // from it. Judged like a peer gone before the check: of the job only with the job's token.
        (Err(_), _) | (_, Err(_)) => return Peer::Gone(cred.uid),
        _ => {}
    }
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Peer::Gone(cred.uid);
    }
    if let Ok(mut r) = conns.refused.lock() {
        r.push((pid, cred.uid));
    }
    Peer::NotJob
}

/// `pid`'s effective user (as `SO_PEERCRED` gives it), by /proc.
fn effective_uid(pid: u32) -> Result<Option<u32>, io::Error> {
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok()))
}

/// Whether `pid`'s chain of parents (by /proc) reaches `ancestor`.
pub(crate) fn descends_from(mut pid: u32, ancestor: u32) -> Result<bool, io::Error> {
    for _ in 0..4096 {
        if pid == ancestor {
            return Ok(true);
        }
        if pid <= 1 {
            return Ok(false);
        }
        match read_parent(pid)? {
            Some(ppid) => pid = ppid,
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// The peer's pid (`SO_PEERCRED`), command line and parent (/proc), for naming it if it never says hello.
pub(super) fn peer_identity(stream: &UnixStream) -> Option<(u32, Vec<String>, u32)> {
    let cred = peer_cred(stream).filter(|c| c.pid > 0)?;
    let pid = cred.pid as u32;
    Some((pid, cmdline_of(pid), parent_of(pid).unwrap_or(0)))
}

/// `pid`'s command line, by /proc (empty when it is gone).
pub(crate) fn cmdline_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `pid`'s parent, by /proc.
fn parent_of(pid: u32) -> Option<u32> {
    read_parent(pid).ok().flatten()
}

/// `pid`'s parent, by /proc: `None` when there is no such process (or its entry cannot be parsed), an error
/// when /proc could not be read (no descriptor free, say).
fn read_parent(pid: u32) -> Result<Option<u32>, io::Error> {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
    Ok(stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
        .and_then(|p| p.parse().ok()))
}

/// Takes an accepted connection of the job: its hello into the trace if it is there already, then a receiver
/// thread for the rest (the acceptor never waits on a connection: one that stays silent would hold every
/// other). Whether its hello is in the trace.
pub(super) fn take(
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
    conn.job_token = conns.job_token.clone();
    conn.settings = conns.settings.clone();
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
    conn.claim = Some(conns.unfinished.claim(conn.kernel_pid.unwrap_or(0)));
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
        if conn.pid().is_some() || !conn.open || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    if conn.pid().is_none() && !conn.open && conn.gone.is_none() && conn.peer.is_some() {
        // Hung up already: named and ended now, before any newcomer promise could pass them. Its receiver
        // ends with nothing to do (its sender dropped).
        conn.finish(trace);
        if receiver.is_none() {
            conns.open.fetch_sub(1, Ordering::AcqRel);
        }
        return true;
    }
    let announced = conn.pid().is_some();
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

/// How many times, 2 ms apart, the acceptor tries to start a connection's receiver.
const SPAWN_TRIES: usize = 50;

/// How long the acceptor waits for a new connection's hello when no receiver thread could be had for it.
const HELLO_WAIT: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_that_cannot_be_read_is_no_verdict() {
        let me = std::process::id();
        assert!(matches!(descends_from(me, me), Ok(true)));
        assert!(matches!(descends_from(me, u32::MAX - 7), Ok(false)));
        assert!(matches!(effective_uid(me), Ok(Some(_))));
        assert!(matches!(effective_uid(u32::MAX - 7), Ok(None)));
        // Out of descriptors: an error, never a verdict (a forked child, whose limit is its own).
        // SAFETY: in a test: the child only makes system calls on locals and reads /proc before `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
            let mut l: libc::rlimit = unsafe { std::mem::zeroed() };
            // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) };
            l.rlim_cur = 0;
            // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
                // SAFETY: in the forked test child: `_exit` ends it at once, running nothing of the parent's state.
                unsafe { libc::_exit(9) };
            }
            // SAFETY: no arguments and no preconditions; it cannot fail.
            let parent = unsafe { libc::getppid() } as u32;
            let a = descends_from(std::process::id(), parent).is_err();
            let b = effective_uid(std::process::id()).is_err();
            // SAFETY: in the forked test child: `_exit` ends it at once, running nothing of the parent's state.
            unsafe {
                libc::_exit(if a && b {
                    0
                } else {
                    1 + i32::from(a) + 2 * i32::from(b)
                })
            };
        }
        let mut status = 0;
        // SAFETY: `status` is a local int the call writes; the pid is an integer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status:x}"
        );
    }
}
