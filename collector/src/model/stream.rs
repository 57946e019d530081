//! The replay fed as a trace grows: the live metrics' (`crate::live`). The same [`Replay`] as a report's, with
//! the same merge (held back until every open process has promised, as the collector's ticks let it go on), so
//! every figure the live metrics read ([`Stream::now`]: the replay's own observers) follows the report's rules
//! by construction. Only the feeding differs: whole frames as they are appended, instead of a file read to its
//! end.

use vramtrace_format::codec;
use vramtrace_format::{Event, Record, TraceHeader};

use crate::model::analysis::MERGE_BOUND;
use crate::model::input::decode;
pub use crate::model::replay::now::{DeviceNow, Now, ProcessDeviceNow, ProcessNow};
use crate::model::replay::Replay;

/// A replay fed frame by frame.
pub struct Stream {
    replay: Replay<'static>,
    /// Frames that did not decode (skipped, as the file's reader skips them).
    pub bad_frames: u64,
    drained: bool,
}

/// What a frame was, for a reader that looks at it before the replay takes it.
pub enum Frame<'a> {
    Events(u32, &'a [Event]),
    Record(&'a Record),
}

impl Stream {
    /// A replay of the trace that `header` begins.
    pub fn new(header: &TraceHeader) -> Stream {
        let mut replay = Replay::new(header.start_mono_ns, MERGE_BOUND, false);
        replay.configure(header);
        Stream {
            replay,
            bad_frames: 0,
            drained: false,
        }
    }

    /// Applies whole frames (as the trace writer takes them); `look` sees each before the replay takes it.
    /// After [`Stream::drain`], nothing more is applied.
    pub fn feed(&mut self, frames: &[u8], mut look: impl FnMut(Frame)) {
        if self.drained {
            return;
        }
        for (k, payload) in codec::frames(frames) {
            match decode::frame(k, payload) {
                Ok(decode::Entry::Events(pid, batch)) => {
                    look(Frame::Events(pid, &batch));
                    self.replay.on_events(pid, batch);
                }
                Ok(decode::Entry::Record(rec)) => {
                    look(Frame::Record(&rec));
                    self.replay.on_record(rec);
                }
                Ok(decode::Entry::Unknown) => {}
                Err(_) => self.bad_frames += 1,
            }
        }
    }

    /// The job is over: everything the merge still holds is replayed, and refusals still open are errors.
    pub fn drain(&mut self) {
        if !self.drained {
            self.drained = true;
            self.replay.drain();
        }
    }

    /// The figures now, as far as the merge has gone.
    pub fn now(&self) -> Now {
        self.replay.now()
    }
}
