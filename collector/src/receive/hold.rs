//! A process's records in the order it made them: blobs from its ring checked frame by frame, records with a
//! time of their own held behind what came before them, and the collector's own loss records and notes.

use vramtrace_format::codec::{self, kind, FrameSplitter};
use vramtrace_format::{LossCause, Record};

use super::connections::Connections;
use super::ingest::{self, Refusal, Refused, Speaker};
use super::limits::CLOCK_MARGIN_NS;
use super::reaped;

/// Appends a blob from a ring to `out` if it is whole frames, each checked (`ingest`: refused ones are
/// counted in `refused`); a goodbye is held back (its time kept).
pub(super) fn blob_into(
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
            if let Err(why) = reaped::admit(payload, who, conns.map(|c| &c.reaps)) {
                refused.add(why);
            }
            continue;
        }
        let admitted = match ingest::admit(k, payload, who) {
            Ok(_) if k != kind::GOODBYE && !refused.charge(k, payload.len()) => continue,
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
pub(super) const SOCKET_HOLD_NS: u64 = 5_000;

/// Where a process's records with a time of their own are held (`hold_frame`).
pub(super) struct Hold {
    /// The latest time of the process's entries written so far.
    pub(super) last: u64,
    /// Its last promise: nothing of it may go before.
    pub(super) promised: u64,
    /// The collector's clock when the records were taken: a time past it (and the margin) is not this clock's.
    pub(super) now: u64,
    /// The most a record is moved later to stay behind `last` (`None`: as far as it takes, for records in the
    /// ring's causal order).
    pub(super) most: Option<u64>,
}

impl Hold {
    /// `ts` held, and the hold raised to it. A time on another clock (far ahead of ours: a caller's own, through
    /// the bridge) is left as it is and raises nothing, so it cannot drag the process's later entries along.
    pub(super) fn record(&mut self, ts: u64) -> u64 {
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
pub(super) fn hold_frame(out: &mut Vec<u8>, k: u8, payload: &[u8], hold: &mut Hold) {
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
pub(super) fn put_loss(out: &mut Vec<u8>, pid: u32, ts_ns: u64, count: u64, cause: LossCause) {
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

pub(super) fn put_note(out: &mut Vec<u8>, pid: u32, ts_ns: u64, text: String) {
    codec::put_record(out, &Record::Note { pid, ts_ns, text });
}
