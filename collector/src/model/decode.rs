//! The trace's frames, read and decoded on a thread of their own, ahead of the replay.
//!
//! Why: decoding (varints, bincode) is about a quarter of a report's time and needs nothing of the replay's
//! state. On a thread of its own it overlaps the merge and the replay, which see the same entries in the same
//! order (the file's). Batches go through a bounded channel, so the decoder is never more than a few batches
//! ahead (memory stays bounded), and the event buffers come back to it to be reused.

use std::io::Read;
use std::sync::mpsc::{channel, sync_channel, Receiver};
use std::sync::Mutex;
use std::thread;

use vramtrace_format::codec::{self, kind};
use vramtrace_format::reader::TraceReader;
use vramtrace_format::{Event, Record};

/// One frame, as the replay takes it.
pub(super) enum Entry<'a> {
    Events(u32, &'a [Event]),
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
/// Batches the decoder may be ahead by.
const AHEAD: usize = 4;

/// Reads `reader` to its end (or its first corrupt frame) on a scoped thread, handing each frame to `apply` in
/// file order on the calling thread. Returns the reader, to say how it stopped. Without a thread to be had, it
/// decodes inline.
pub(super) fn decode_ahead<R: Read + Send>(
    reader: TraceReader<R>,
    mut apply: impl FnMut(Entry),
) -> TraceReader<R> {
    let (tx, rx) = sync_channel::<Vec<Decoded>>(AHEAD);
    let (back_tx, back_rx) = channel::<Vec<Event>>();
    // Taken by the decoder thread, or left for an inline decode if none could start.
    let cell = Mutex::new(Some(reader));
    let cell_ref = &cell;
    let threaded = thread::scope(|s| {
        // The sender moves into the thread: the batches end when it does.
        let decoder = thread::Builder::new()
            .name("vramtrace-decode".into())
            .spawn_scoped(s, move || {
                let reader = cell_ref.lock().ok()?.take()?;
                Some(decode(reader, Some(&back_rx), |b| tx.send(b).is_ok()))
            });
        let Ok(decoder) = decoder else {
            return None;
        };
        for batch in rx.iter() {
            for d in batch {
                match d {
                    Decoded::Events(pid, v) => {
                        apply(Entry::Events(pid, &v));
                        let _ = back_tx.send(v);
                    }
                    Decoded::Record(r) => apply(Entry::Record(r)),
                    Decoded::Unknown => apply(Entry::Unknown),
                }
            }
        }
        decoder.join().ok().flatten()
    });
    if let Some(reader) = threaded {
        return reader;
    }
    let reader = cell
        .into_inner()
        .ok()
        .flatten()
        .expect("the reader stays here when no decoder thread took it");
    decode(reader, None, |batch| {
        for d in batch {
            match d {
                Decoded::Events(pid, v) => apply(Entry::Events(pid, &v)),
                Decoded::Record(r) => apply(Entry::Record(r)),
                Decoded::Unknown => apply(Entry::Unknown),
            }
        }
        true
    })
}

/// Decodes frames into batches for `sink` (false: stop) until the end or a corrupt frame, which the reader is
/// told of. `back`: event buffers to reuse.
fn decode<R: Read>(
    mut reader: TraceReader<R>,
    back: Option<&Receiver<Vec<Event>>>,
    mut sink: impl FnMut(Vec<Decoded>) -> bool,
) -> TraceReader<R> {
    let mut batch = Vec::with_capacity(MAX_ITEMS);
    let mut events = 0usize;
    while let Some((k, payload)) = reader.next_frame() {
        let d = if k == kind::EVENTS || k == kind::EVENTS_STACKS {
            let mut v = back.and_then(|b| b.try_recv().ok()).unwrap_or_default();
            v.clear();
            match codec::decode_events_of(k, payload, &mut v) {
                Ok(pid) => {
                    events += v.len();
                    Decoded::Events(pid, v)
                }
                Err(e) => {
                    reader.mark_corrupt(e.to_string());
                    break;
                }
            }
        } else {
            match codec::decode_record(k, payload) {
                Ok(Some(rec)) => Decoded::Record(rec),
                Ok(None) => Decoded::Unknown,
                Err(e) => {
                    reader.mark_corrupt(e.to_string());
                    break;
                }
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
