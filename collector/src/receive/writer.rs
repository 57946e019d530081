//! The trace file, written in whole frames; what a full disk loses is counted.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vramtrace_format::codec::{self, kind};

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
    /// The call sites and loaded objects written, for the frames' names at the end (`crate::names::frame_names`).
    pub(crate) names: crate::names::frame_names::Gather,
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
            names: Default::default(),
        }
    }

    /// Appends whole frames of process `pid`. Whether they are in the file.
    pub fn write(&mut self, pid: u32, frames: &[u8]) -> bool {
        if self.failed.is_none() {
            match self.file.write_all(frames) {
                Ok(()) => {
                    self.names.frames(frames);
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
