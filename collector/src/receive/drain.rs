//! A process's ring, drained: its events into frames, the records beside them in the ring's causal order,
//! and the promises (ticks) that let the report's merge go on while the process is quiet. What the merge may
//! rely on is kept here: a tick never promises past what the ring could still hand out.

use std::sync::Mutex;
use std::time::Duration;

use vramtrace_format::codec;
use vramtrace_format::ring::Item;
use vramtrace_format::{Event, LossCause, Record};

use super::connections::Connections;
use super::hold::{blob_into, put_loss, put_note, Hold};
use super::ingest::{Refused, Speaker};
use super::limits::CLOCK_MARGIN_NS;
use super::peer::*;
use super::writer::TraceWriter;
use crate::names::ticks::mono_ns;
use crate::process::hangup;

/// A ring is drained at least this often while its process runs, and whenever it passes a quarter full.
pub(super) const NAP_MIN: Duration = Duration::from_millis(1);
pub(super) const NAP_MAX: Duration = Duration::from_millis(50);
/// A record reserved and not published for this long will not be finished (its thread was cancelled, or a signal
/// handler never returned): the drain skips it and counts it, rather than let the ring fill behind it.
pub(super) const STUCK_NS: u64 = 2_000_000_000;
/// A collector that has not drained a ring for this long was stalled (stopped, or starved of CPU): the records
/// the ring could not hold meanwhile are said to be lost for that reason.
pub(super) const STALL: Duration = Duration::from_millis(500);
/// How often, at most, an empty ring's drain promises that nothing older is still to come from its process.
pub(super) const TICK_NS: u64 = 10_000_000;

impl Conn {
    /// Takes what the ring holds into the trace, with what was lost since the last drain. `dead`: the process
    /// is gone (records it left half-written are skipped, the goodbye it published is written). Whether
    /// anything was taken.
    pub(super) fn drain(&mut self, trace: &Mutex<TraceWriter>, dead: bool) -> bool {
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
        let mut goodbye = None;
        let taken = d.take_records(dead, who, promise, &mut goodbye, refused, conns);
        if !dead
            && taken == 0
            && d.consumer.ring().used() == 0
            && promise >= d.last_tick + TICK_NS
            // A process that hung up and is not stamped yet (the watcher is late): no promise past its end.
            && (hung_up.is_some() || !self.open || !peer_hung_up(&self.stream))
        {
            d.put_tick(pid, promise, hung_up);
        }
        put_batch(&mut d.out, pid, &mut d.batch);
        if goodbye.is_some() {
            self.goodbye = goodbye;
        }
        if !dead {
            d.watch_stuck(promise);
        }
        let ts = mono_ns();
        d.say_drops(pid, ts, stalled);
        d.say_torn(pid, ts);
        d.say_corrupt(pid, ts);
        if dead {
            if let Some(bye) = self.goodbye {
                // Never older than a tick already written (the process lived on after its goodbye).
                let ts_ns = bye.max(d.last_ts).max(d.promised);
                codec::put_record(&mut d.out, &Record::Goodbye { pid, ts_ns });
            }
        }
        if !d.out.is_empty() {
            if let Ok(mut w) = trace.lock() {
                w.write(pid, &d.out);
            }
            d.out.clear();
        }
        self.put_refused(trace);
        taken > 0
    }
}

/// The events gathered so far into one frame of `out`, when there are any: kept in one place so that events
/// and the records between them stay in the ring's order.
#[inline]
fn put_batch(out: &mut Vec<u8>, pid: u32, batch: &mut Vec<Event>) {
    if !batch.is_empty() {
        codec::put_events(out, pid, batch);
        batch.clear();
    }
}

impl Drain {
    /// The drain's taking: every record the ring holds, events in frames of at most `BATCH` and the records
    /// (blobs) between them in the ring's causal order, into `out`. `now`: when this drain looked. Returns the
    /// records taken.
    #[inline]
    fn take_records(
        &mut self,
        dead: bool,
        who: Speaker,
        now: u64,
        goodbye: &mut Option<u64>,
        refused: &mut Refused,
        conns: Option<&Connections>,
    ) -> u64 {
        let pid = who.kernel;
        let Drain {
            consumer,
            batch,
            out,
            last_ts,
            promised,
            ticks,
            ..
        } = self;
        // Events stamped with the counter: converted by the collector's one line (format's `ticks`).
        let line = ticks.then(crate::names::ticks::line);
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
                put_batch(out, pid, batch);
                // In the ring's causal order, like the events around it.
                let mut hold = Hold {
                    last: *last_ts,
                    promised: *promised,
                    now,
                    most: None,
                };
                blob_into(out, bytes, goodbye, &mut hold, who, refused, conns);
                *last_ts = hold.last;
            }
        };
        let taken = consumer.drain(dead, &mut take);
        put_batch(out, pid, batch);
        taken
    }

    /// A promise that nothing older is still to come, for a process that is quiet: what its producers reserve
    /// after it is held at no less than it (`take_records`). Never past `hung_up`, the process's end.
    fn put_tick(&mut self, pid: u32, now: u64, hung_up: Option<u64>) {
        self.last_tick = now;
        if let Some(t) = self.consumer.ring().promise(mono_ns) {
            // A margin for the events' converted ticks against the collector's clock (`CLOCK_MARGIN_NS`).
            let ts_ns = t
                .min(hung_up.unwrap_or(u64::MAX))
                .saturating_sub(CLOCK_MARGIN_NS);
            self.promised = self.promised.max(ts_ns);
            codec::put_record(&mut self.out, &Record::Tick { pid, ts_ns });
        }
    }

    /// Follows a record reserved and not published: one waiting at the same place for `STUCK_NS` is skipped
    /// (its thread will not finish it), so that the ring does not fill behind it.
    fn watch_stuck(&mut self, now: u64) {
        let consumer = &mut self.consumer;
        self.stuck = match (consumer.waiting_at(), self.stuck) {
            (Some(at), Some((was, since))) if at == was => {
                if now.saturating_sub(since) >= STUCK_NS {
                    consumer.skip_stuck();
                    None
                } else {
                    Some((was, since))
                }
            }
            (Some(at), _) => Some((at, now)),
            (None, _) => None,
        };
    }

    /// What the ring's drop count says was lost since the last drain, by cause (a stalled collector, or a
    /// full ring), or that the process wrote the count itself.
    fn say_drops(&mut self, pid: u32, ts: u64, stalled: bool) {
        let consumer = &mut self.consumer;
        let out = &mut self.out;
        let dropped = consumer.ring().dropped();
        // The count is shared memory the process can scribble on: a jump no ring could drop between two looks
        // (more than 2^40 records) is not counted, and the ring is taken for corrupt.
        if dropped.saturating_sub(self.dropped_seen) > MAX_PLAUSIBLE_DROPS {
            consumer.corrupt = true;
            self.dropped_seen = dropped;
        }
        if dropped > self.dropped_seen {
            let count = dropped - self.dropped_seen;
            self.dropped_seen = dropped;
            // A shim drops only into a full ring, so a ring whose head never reached its size dropped nothing:
            // its count was written by the process itself, and is said as that, never as events lost.
            if !consumer.ever_full() {
                if !self.drops_forged_said {
                    self.drops_forged_said = true;
                    put_note(
                        out,
                        pid,
                        ts,
                        format!(
                            "the drop count in the process's ring rose by {count}, yet its ring was never full: \
                             written over by the process itself, not events lost"
                        ),
                    );
                }
            } else {
                let cause = if stalled {
                    LossCause::CollectorStalled
                } else {
                    LossCause::RingFull
                };
                put_loss(out, pid, ts, count, cause);
            }
        }
    }

    /// The records the consumer counted torn since the last drain: events lost, or records that were no events.
    fn say_torn(&mut self, pid: u32, ts: u64) {
        let consumer = &self.consumer;
        let out = &mut self.out;
        if consumer.torn > self.torn_seen {
            let count = consumer.torn - self.torn_seen;
            self.torn_seen = consumer.torn;
            // Those its ring's intent words named as blobs (only ever counted once the process is dead): no events.
            let others = (consumer.torn_blobs - self.torn_blobs).min(count);
            self.torn_blobs = consumer.torn_blobs;
            let events = count - others;
            if events > 0 {
                put_loss(out, pid, ts, events, LossCause::DiedMidRecord);
            }
            if others > 0 {
                codec::put_record(
                    out,
                    &Record::Lost {
                        pid,
                        ts_ns: ts,
                        count: others,
                        cause: LossCause::DiedMidNonEvent,
                    },
                );
            }
        }
    }

    /// A ring that held something no shim writes, said once.
    fn say_corrupt(&mut self, pid: u32, ts: u64) {
        if self.consumer.corrupt && !self.corrupt_said {
            // Said once; the consumer keeps refusing (`corrupt` stays set) and sleeps between its looks.
            self.corrupt_said = true;
            put_note(
                &mut self.out,
                pid,
                ts,
                "the process's ring held something no shim writes; the rest of it was not read"
                    .into(),
            );
            self.consumer.torn = u64::MAX / 2;
            self.torn_seen = self.consumer.torn;
        }
    }
}
