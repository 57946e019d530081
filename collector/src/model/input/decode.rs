//! The trace's frames, read and decoded on a thread of their own, ahead of the replay.
//!
//! Why: decoding (varints, bincode) is about a quarter of a report's time and needs nothing of the replay's
//! state. On a thread of its own it overlaps the merge and the replay, which see the same entries in the same
//! order (the file's). Batches go through a bounded channel, so the decoder is never more than a few batches
//! ahead (memory stays bounded). Each frame's events are handed over as a buffer of their own: the merge takes
//! it to its thread ([`crate::model::input::merge_link`]).

use std::io::Read;
use std::sync::mpsc::sync_channel;
use std::sync::Mutex;
use std::thread;

use vramtrace_format::codec::{self, kind};
use vramtrace_format::reader::TraceReader;
use vramtrace_format::{Event, Record};

/// One frame, as the replay takes it.
pub(in crate::model) enum Entry {
    Events(u32, Vec<Event>),
    Record(Record),
    /// A frame of a kind this version does not know.
    Unknown,
}

/// One frame, decoded.
enum Decoded {
    Events(u32, Vec<Event>),
    Record(Record),
    Unknown,
}

/// A batch holds this many events at least, or `MAX_ITEMS` frames.
const BATCH_EVENTS: usize = 16 << 10;
const MAX_ITEMS: usize = 512;
/// Batches the decoder may be ahead by. Why 16, not 4: on two cores the three threads (decode, merge, replay)
/// take turns, and a deeper queue lets each run longer before it waits (the 10 M-event report about 6% faster;
/// memory: 16 batches, each about 1 MB of events for typical frames).
const AHEAD: usize = 16;

/// Reads `reader` to its end (or its first corrupt frame) on a scoped thread, handing each frame to `apply` in
/// file order on the calling thread. Returns the reader, to say how it stopped. Without a thread to be had, it
/// decodes inline.
pub(in crate::model) fn decode_ahead<R: Read + Send>(
    reader: TraceReader<R>,
    mut apply: impl FnMut(Entry),
) -> TraceReader<R> {
    let (tx, rx) = sync_channel::<Vec<Decoded>>(AHEAD);
    // Taken by the decoder thread, or left for an inline decode if none could start.
    let cell = Mutex::new(Some(reader));
    let cell_ref = &cell;
    let threaded = thread::scope(|s| {
        // Owned here: if `apply` panics, it drops as it unwinds, and a decoder blocked on a full channel returns
        // (the scope waits for it before the panic goes on).
        let rx = rx;
        // The sender moves into the thread: the batches end when it does.
        let decoder = thread::Builder::new()
            .name("vramtrace-decode".into())
            .spawn_scoped(s, move || {
                let reader = cell_ref.lock().ok()?.take()?;
                Some(decode(reader, |b| tx.send(b).is_ok()))
            });
        let Ok(decoder) = decoder else {
            return None;
        };
        for batch in rx.iter() {
            for d in batch {
                apply(d.entry());
            }
        }
        Some(decoder.join())
    });
    match threaded {
        Some(Ok(Some(reader))) => return reader,
        // A panic in the decoder is a bug: it goes on as one.
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        // No thread, or one that could not take the reader: it is still here.
        Some(Ok(None)) | None => {}
    }
    let Some(reader) = cell.into_inner().ok().flatten() else {
        unreachable!("a decoder that did not return the reader never took it")
    };
    decode(reader, |batch| {
        for d in batch {
            apply(d.entry());
        }
        true
    })
}

impl Decoded {
    fn entry(self) -> Entry {
        match self {
            Decoded::Events(pid, v) => Entry::Events(pid, v),
            Decoded::Record(r) => Entry::Record(r),
            Decoded::Unknown => Entry::Unknown,
        }
    }
}

/// Decodes frames into batches for `sink` (false: stop) until the end or broken framing; a whole frame that does
/// not decode is skipped, and the reader counts it.
/// One frame of kind `k`, decoded: every reader of frames (the file's, the live metrics') reads them so.
pub(in crate::model) fn frame(k: u8, payload: &[u8]) -> Result<Entry, String> {
    if k == kind::EVENTS || k == kind::EVENTS_STACKS {
        let mut v = Vec::new();
        codec::decode_events_of(k, payload, &mut v)
            .map(|pid| Entry::Events(pid, v))
            .map_err(|e| e.to_string())
    } else {
        match codec::decode_record(k, payload) {
            Ok(Some(rec)) => Ok(Entry::Record(rec)),
            Ok(None) => Ok(Entry::Unknown),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn decode<R: Read>(
    mut reader: TraceReader<R>,
    mut sink: impl FnMut(Vec<Decoded>) -> bool,
) -> TraceReader<R> {
    let mut batch = Vec::with_capacity(MAX_ITEMS);
    let mut events = 0usize;
    while let Some((k, payload)) = reader.next_frame() {
        let d = match frame(k, payload) {
            Ok(Entry::Events(pid, v)) => {
                events += v.len();
                Decoded::Events(pid, v)
            }
            Ok(Entry::Record(r)) => Decoded::Record(r),
            Ok(Entry::Unknown) => Decoded::Unknown,
            Err(e) => {
                reader.mark_bad(e);
                continue;
            }
        };
        batch.push(d);
        if events >= BATCH_EVENTS || batch.len() >= MAX_ITEMS {
            if !sink(std::mem::replace(&mut batch, Vec::with_capacity(MAX_ITEMS))) {
                return reader;
            }
            events = 0;
        }
    }
    if !batch.is_empty() {
        sink(batch);
    }
    reader
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;
    use vramtrace_format::codec::{encode_header, put_events};
    use vramtrace_format::{Api, TraceHeader};

    fn trace(frames: usize) -> Vec<u8> {
        let h = TraceHeader {
            start_unix_ns: 0,
            start_mono_ns: 0,
            command: vec!["t".into()],
            hostname: "h".into(),
            vramtrace_version: "t".into(),
            extra: vec![],
        };
        let mut t = encode_header(&h);
        let e = Event {
            ts_ns: 1,
            tid: 1,
            api: Api::MemAlloc,
            flags: 0,
            device: 0,
            result: 0,
            addr: 0x1000,
            size: 1,
            aux: 0,
            stack: 0,
        };
        for i in 0..frames {
            put_events(
                &mut t,
                1,
                &vec![
                    Event {
                        ts_ns: i as u64,
                        ..e
                    };
                    4096
                ],
            );
        }
        t
    }

    #[test]
    fn every_frame_reaches_apply_in_file_order() {
        let bytes = trace(100);
        let (reader, _) = TraceReader::open(&bytes[..]).unwrap();
        let mut seen = Vec::new();
        let reader = decode_ahead(reader, |e| {
            if let Entry::Events(_, v) = e {
                seen.push(v[0].ts_ns);
            }
        });
        assert!(reader.stop().is_clean());
        assert_eq!(seen, (0..100).collect::<Vec<u64>>());
    }

    #[test]
    fn a_panic_in_apply_is_a_panic_not_a_hang() {
        // Far more batches than the channel holds: the decoder is blocked on it when `apply` panics.
        let bytes = trace(400);
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(move || {
                let (reader, _) = TraceReader::open(&bytes[..]).unwrap();
                decode_ahead(reader, |_| panic!("a bug in the replay"));
            });
            let _ = done_tx.send(r.is_err());
        });
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(20)), Ok(true));
    }
}
