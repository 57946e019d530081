//! One process's connection: its hello (the kernel's pid, the job's token for a gone peer), the ring that came
//! with it and its drains, every frame checked at ingest (`ingest`, `reaped`) and held in its process's order
//! (`hold`), and, when it closes, how it ended.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use vramtrace_format::keys;

use vramtrace_format::codec::{self, kind, FrameSplitter};
use vramtrace_format::{EndKind, LossCause, Record, OOM_ACK, OOM_NAK};

use super::budget::{self};
use super::drain::{NAP_MAX, NAP_MIN};
use super::fds::{recv_with_fds, take_hello};
use super::hello::{cap_from, hostname};
use super::hold::{hold_frame, put_note, Hold, SOCKET_HOLD_NS};
use super::ingest::{self, Refusal, Refused, Speaker};
use super::limits::{READ, RESERVE_WAIT};
use super::peer::*;
use super::reaped;
use super::ring_map::{map_ring, maps_inode};
use super::writer::TraceWriter;
use crate::names::ticks::mono_ns;
use crate::process::hangup::{self};

/// What one read's frames came to: what is to be written, the answers owed (admitted or not, in order),
/// whether the hello was among them.
struct Admitted {
    out: Vec<u8>,
    answers: Vec<bool>,
    hello: bool,
}

impl Conn {
    pub(super) fn new(stream: UnixStream) -> Conn {
        Conn {
            stream,
            split: FrameSplitter::new(),
            who: Who::Unknown,
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
            refused: Refused::default(),
            claim: None,
            skip: 0,
            job_token: Arc::from(""),
            settings: Arc::from(Vec::new()),
            accepted: Instant::now(),
            mute: false,
            conns: None,
            late_naks: 0,
            turned_away: None,
        }
    }

    /// Who its records must speak for, once its hello came (or, on a report connection, its first report).
    pub(super) fn speaker(&self) -> Option<Speaker> {
        match self.who {
            Who::Process {
                pid,
                said: Some(said),
            } => Some(Speaker { kernel: pid, said }),
            Who::Reporter { said } => Some(Speaker {
                kernel: self.kernel_pid?,
                said,
            }),
            _ => None,
        }
    }

    /// The process this connection is, once it said hello (or was named by the collector).
    pub(super) fn pid(&self) -> Option<u32> {
        match self.who {
            Who::Process { pid, .. } => Some(pid),
            _ => None,
        }
    }

    /// A report connection: it names no process.
    pub(super) fn reporter(&self) -> bool {
        matches!(self.who, Who::Reporter { .. })
    }

    /// The receiver's loop: drain the ring, read what the socket holds, sleep on the ring (or the socket
    /// before a ring came) until woken or the nap ends. Returns when the process is gone.
    pub(super) fn run(&mut self, trace: &Mutex<TraceWriter>) {
        let mut nap = NAP_MIN;
        while self.open {
            // Before the drain: a wake during it (an out-of-memory record on the socket) ends the nap below.
            let seen = self.ring.as_ref().map(|d| d.consumer.wake_seen());
            let took = self.drain(trace, false);
            let read = self.pump(trace);
            // Told to give way while nothing came: the buffer goes now, not at the next read.
            if self.claim.as_ref().is_some_and(|c| c.evicted()) {
                self.budget_unfinished();
                self.answer(&[], true);
            }
            if self.who == Who::Unknown && self.open && self.accepted.elapsed() >= SILENT_WAIT {
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
                    // SAFETY: one local pollfd, as the count says.
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                }
            }
        }
        // The socket is gone. Usually the process is too; but a process that closed our descriptor itself
        // (`close_range`, a daemon's clean-up) goes on writing to its ring: drain it while it maps it.
        if let (Some(pid), Some(ino)) = (self.pid(), self.ring.as_ref().map(|d| d.ino)) {
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
    pub(super) fn pump(&mut self, trace: &Mutex<TraceWriter>) -> bool {
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
        if self.pid().is_some() {
            self.announced();
        }
        took
    }

    /// Before the hello: the ring rides on it, and must find a place (`reserve`, `take_hello`).
    pub(super) fn awaiting_ring(&self) -> bool {
        self.who == Who::Unknown && self.ring.is_none() && self.bad_ring.is_none()
    }

    /// One read of the socket: what is whole goes through ingest, in its process's order, into the trace, and
    /// the records that wait for an answer get it. Whether anything came.
    pub(super) fn pump_once(&mut self, trace: &Mutex<TraceWriter>) -> bool {
        if !self.read_once() {
            return false;
        }
        let Some(frames) = self.whole_frames() else {
            return false;
        };
        if frames.is_empty() {
            self.put_refused(trace);
            return true;
        }
        let Some(Admitted {
            out,
            answers,
            hello,
        }) = self.admit_frames(&frames)
        else {
            if let Some(why) = self.turned_away.take() {
                let mut buf = Vec::new();
                put_note(&mut buf, 0, mono_ns(), why);
                if let Ok(mut w) = trace.lock() {
                    w.write(0, &buf);
                }
            }
            // Turned away (a gone peer not of the job, a report from one), or no hello at all: nothing of it
            // is written.
            self.open = false;
            return false;
        };
        // What the process published before these records goes first; they are held at no less than it.
        let out = if hello {
            out
        } else {
            self.behind_the_ring(trace, out)
        };
        let written = out.is_empty()
            || trace
                .lock()
                .is_ok_and(|mut w| w.write(self.pid().unwrap_or(0), &out));
        if hello {
            self.note_bad_ring(trace);
        }
        self.put_refused(trace);
        self.answer(&answers, written);
        true
    }

    /// Reads what the socket holds into the splitter, taking the ring that may ride on it. False when nothing
    /// came (the connection is then closed unless it was only a timeout or nothing to read).
    fn read_once(&mut self) -> bool {
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
                // A timeout or nothing to read leaves it open.
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
        self.take_ring(fds, lost_fds);
        if n == 0 {
            self.open = false;
            return false;
        }
        true
    }

    /// The ring among the descriptors that came (the first one that maps; any other is closed as it drops), or
    /// why there is none usable.
    fn take_ring(&mut self, fds: Vec<OwnedFd>, lost_fds: bool) {
        for fd in fds {
            if self.ring.is_none() && self.bad_ring.is_none() {
                match map_ring(&fd) {
                    Ok((map, ring, ino)) => self.ring = Some(Drain::new(map, ring, ino)),
                    Err(why) => self.bad_ring = Some(why),
                }
            }
        }
        // The kernel could not give us the ring it carried (no descriptor free): the process's events are out of
        // reach, and the trace must say so rather than show a process that allocated nothing.
        if lost_fds && self.ring.is_none() && self.bad_ring.is_none() {
            self.bad_ring = Some(format!(
                "no file descriptor was free to receive it (the collector's limit: {})",
                crate::process::fdlimit::soft().map_or("unknown".into(), |n| n.to_string())
            ));
        }
    }

    /// The whole frames buffered (none: an empty vector), past what is left of a refused frame, with the
    /// unfinished one held to the budget. `None`: not our protocol (closed; what it sent before stays).
    fn whole_frames(&mut self) -> Option<Vec<u8>> {
        if self.skip > 0 {
            let k = (self.skip as usize).min(self.split.pending());
            self.split.consume(k);
            self.skip -= k as u64;
        }
        let whole = match self.split.whole() {
            Ok(w) => w.len(),
            Err(_) => {
                self.open = false;
                return None;
            }
        };
        let frames = self.split_whole(whole);
        self.budget_unfinished();
        Some(frames)
    }

    /// Every frame through ingest: the hello taken (`hello`), a reporter's first report making this a report
    /// connection (reports only, from then on), exits reported kept for the end (`reaped`), the rest admitted
    /// or refused (`ingest`). Each record that waits for an answer gets one, in order: yes only if it was
    /// admitted (and, later, written). `None`: turned away.
    fn admit_frames(&mut self, frames: &[u8]) -> Option<Admitted> {
        let mut answers = Vec::new();
        let mut hello = false;
        let mut out = Vec::with_capacity(frames.len() + 128);
        for (k, payload) in codec::frames(frames) {
            let asks = match k {
                kind::OOM => true,
                // Kind 13 is an older shim's bridge record: read as today's, acknowledged alike.
                kind::BRIDGE | kind::BRIDGE_PAIRS => matches!(
                    codec::decode_record(k, payload),
                    Ok(Some(Record::Bridge(b))) if b.ack
                ),
                _ => false,
            };
            let admitted = self.admit_one(k, payload, &mut out, &mut hello)?;
            if asks {
                answers.push(admitted);
            }
        }
        Some(Admitted {
            out,
            answers,
            hello,
        })
    }

    /// One frame through ingest, into `out` if admitted. Whether it was; `None`: turned away.
    fn admit_one(
        &mut self,
        k: u8,
        payload: &[u8],
        out: &mut Vec<u8>,
        hello: &mut bool,
    ) -> Option<bool> {
        if k == kind::HELLO && self.who == Who::Unknown {
            let mut h = self.hello(payload)?;
            if let Some(job) = vramtrace_format::settings::JobSettings::decode(&self.settings) {
                cap_from(&mut h, &job, mono_ns());
            }
            codec::put_record(out, &Record::Hello(h));
            *hello = true;
            // The job's settings, which the shim waits for before its first call goes on: the cap it applies
            // is the job's, whatever the process's own environment says. A few hundred bytes into a fresh
            // socket's empty buffer: the write does not wait.
            if !self.settings.is_empty() {
                let _ = (&self.stream).write_all(&self.settings);
            }
            return Some(true);
        }
        if k == kind::REAPED && self.who == Who::Unknown {
            // A process with no connection of its own reports what it reaped. Another user's that is gone
            // already cannot be placed in the job: turned away.
            if self.gone.is_some() || self.kernel_pid.is_none() {
                return None;
            }
            if let Ok(Some(Record::Reaped { pid, .. })) = codec::decode_record(k, payload) {
                self.who = Who::Reporter { said: pid };
                self.announced();
            }
        }
        let Some(who) = self.speaker() else {
            self.refused.add(Refusal::BeforeHello(k));
            return Some(false);
        };
        if k == kind::REAPED {
            return Some(
                match reaped::admit(payload, who, self.conns.as_deref().map(|c| &c.reaps)) {
                    Ok(()) => true,
                    Err(why) => {
                        self.refused.add(why);
                        false
                    }
                },
            );
        }
        if self.reporter() {
            // A report connection carries reports only.
            self.refused.add(Refusal::NotAProcessKind(k));
            return Some(false);
        }
        Some(match ingest::admit(k, payload, who) {
            Ok(_) if !self.refused.charge(k, payload.len()) => false,
            Ok(a) => {
                ingest::put_admitted(out, k, payload, &a);
                true
            }
            Err(why) => {
                self.refused.add(why);
                false
            }
        })
    }

    /// Records from the socket, after what the ring holds: not in the ring's causal order (the drain first
    /// takes what other threads published after these were stamped: their thread waits for our answer, theirs
    /// go on), so held behind it only across the clocks' error.
    fn behind_the_ring(&mut self, trace: &Mutex<TraceWriter>, frames: Vec<u8>) -> Vec<u8> {
        self.drain(trace, false);
        let Some(d) = self.ring.as_mut() else {
            return frames;
        };
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

    /// Said once the hello is written: why none of the process's events are in the trace, if its ring was not
    /// usable.
    fn note_bad_ring(&mut self, trace: &Mutex<TraceWriter>) {
        if let (Some(why), Some(pid)) = (self.bad_ring.take(), self.pid()) {
            let mut buf = Vec::new();
            put_note(
                &mut buf,
                pid,
                mono_ns(),
                format!("no events of this process are in the trace: its event ring was not usable: {why}"),
            );
            if let Ok(mut w) = trace.lock() {
                w.write(pid, &buf);
            }
        }
    }

    /// The shim holds the failing allocation (or the bridge its record) until the evidence is in the file: one
    /// answer per record waiting, in order, so the shim matches each to its own record: yes for one admitted
    /// and in the file, no otherwise. Then the no owed to an out-of-memory record dropped unfinished after
    /// them (`budget_unfinished`).
    fn answer(&mut self, answers: &[bool], written: bool) {
        let mut bytes: Vec<u8> = answers
            .iter()
            .map(|ok| if *ok && written { OOM_ACK } else { OOM_NAK })
            .collect();
        bytes.extend(std::iter::repeat_n(
            OOM_NAK,
            std::mem::take(&mut self.late_naks),
        ));
        if !bytes.is_empty() {
            let _ = (&self.stream).write_all(&bytes);
        }
    }

    /// The buffer against the budget: room past twice what it needs is given back, and what it holds, or will
    /// need for the frame it is receiving, beyond its own room is claimed from the pool. Refused (or made to
    /// give way and not granted again), the frame is dropped, counted, and the rest of it skipped as it comes;
    /// an out-of-memory record dropped so is answered no, after the records before it.
    pub(super) fn budget_unfinished(&mut self) {
        let keep = (2 * READ).max(self.split.pending() + READ);
        if self.split.footprint() > 2 * keep {
            self.split.trim(keep);
        }
        let Some(claim) = self.claim.as_mut() else {
            return;
        };
        let frame = self.split.first_frame_bytes().unwrap_or(0) as usize;
        let holds = self.split.footprint().max(frame.saturating_add(READ));
        if claim.need(holds.saturating_sub(budget::FREE)) {
            return;
        }
        // Dropped: what came of it, and what is still to come.
        let bytes = frame as u64;
        let have = self.split.pending();
        if self.split.first_kind() == Some(kind::OOM) {
            self.late_naks += 1;
        }
        self.split.consume(have);
        self.skip = bytes.saturating_sub(have as u64);
        self.refused.add(Refusal::TooLarge { bytes });
        self.split.trim(2 * READ);
        claim.need(self.split.footprint().saturating_sub(budget::FREE));
    }

    /// Writes what was refused since the last time, once the process is named: a `Lost` record (cause
    /// `Refused`) and, the first time, a note saying what was refused. Stamped where the process's entries
    /// stand, so that nothing of it goes out of order.
    pub(super) fn put_refused(&mut self, trace: &Mutex<TraceWriter>) {
        let Some(pid) = self.pid() else {
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

    pub(super) fn split_whole(&mut self, n: usize) -> Vec<u8> {
        let v = self
            .split
            .whole()
            .map(|w| w[..n].to_vec())
            .unwrap_or_default();
        self.split.consume(n);
        v
    }

    /// Its hello is in the trace (or it ended): no longer holds the newcomer promise back.
    pub(super) fn announced(&mut self) {
        if let Some(c) = self.unannounced.take() {
            c.unannounced.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A process of the job that connected and hung up without a hello (its shim could not send it: the ring
    /// it passes with it refused, e.g. `ETOOMANYREFS`): named untraced in the trace, from what the kernel and
    /// /proc said of it when it was accepted (`Conn::peer`), rather than passed over.
    pub(super) fn name_silent(&mut self, trace: &Mutex<TraceWriter>) {
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
                keys::hello::NO_RING.into(),
                if self.mute {
                    "it connected, then said no hello for 5 s: not a shim's connection; closed"
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
        // Named by the collector: it said nothing it could speak for.
        self.who = Who::Process { pid, said: None };
    }

    /// The connection closed: record how.
    pub(super) fn finish(mut self, trace: &Mutex<TraceWriter>) {
        if self.reporter() {
            self.announced();
            return;
        }
        // Not a peer of another user still to be judged on its hello (or turned away on it).
        if self.who == Who::Unknown && self.gone.is_none() {
            self.name_silent(trace);
        }
        let Some(pid) = self.pid() else {
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
