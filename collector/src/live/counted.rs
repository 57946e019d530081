//! What the trace says each process holds now, for the cap's check against the GPU's own count
//! (`cap_check.rs`): read as the frames arrive, each process's records in its own order, not after the
//! replay's merge. Why not the replay's figures: the merge waits until every process has promised, and a
//! process whose ring is stuck holds it back for seconds (`receive/conn.rs`, `STUCK_NS`), while the GPU's
//! count moves on; a count that lags by seconds would stop a healthy job that allocates. Bytes per process
//! need no order across processes, and the book (`model/replay/book.rs`) is the replay's own.

use std::collections::BTreeMap;

use vramtrace_format::keys;
use vramtrace_format::{Event, Record, NO_DEVICE};

use crate::model::replay::book::{self, Act, Book, Undone, HOST_DEVICE};
use crate::model::replay::name_gpu;
use crate::model::stream::Frame;
use crate::names::fasthash::FastMap;

/// What the trace says of one process of the job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counted {
    pub pid: u32,
    pub argv: Vec<String>,
    /// The cap its shim applies, by its hello: (spec, mode, given the job's ledger). `None`: no cap.
    pub cap: Option<(String, String, bool)>,
    /// Some of its records were lost: `bytes` may be too high (a free that never arrived).
    pub lossy: bool,
    /// Bytes its shim counted, live now, by GPU UUID (an ordinal whose UUID is not known: `None`).
    pub bytes: Vec<(Option<String>, u32, u64)>,
}

#[derive(Default)]
struct Proc {
    announced: bool,
    argv: Vec<String>,
    cap: Option<(String, String, bool)>,
    lossy: bool,
    uuids: BTreeMap<u32, [u8; 16]>,
    book: Book<(u32, u64)>,
    /// Bytes live now per GPU ordinal.
    bytes: BTreeMap<u32, u64>,
}

impl Proc {
    fn give(&mut self, d: u32, size: u64) {
        if d != NO_DEVICE && d != HOST_DEVICE {
            *self.bytes.entry(d).or_default() += size;
        }
    }

    fn take(&mut self, (d, size): (u32, u64)) {
        if let Some(b) = self.bytes.get_mut(&d) {
            *b = b.saturating_sub(size);
        }
    }

    fn apply(&mut self, e: &Event) {
        match book::act(e) {
            Act::Alloc { handle, device } => {
                if let Some(old) = self.book.alloc(handle, e.addr, (device, e.size)) {
                    self.take(old);
                }
                self.give(device, e.size);
            }
            Act::Free { handle } => {
                if let Some(took) = self.book.free(e.tid, handle, e.addr) {
                    self.take(took);
                }
            }
            Act::Undo { handle } => {
                if let Undone::Back((d, size)) = self.book.undo(e.tid, handle, e.addr) {
                    self.give(d, size);
                }
            }
            Act::Refused { .. } | Act::None => {}
        }
    }
}

/// Each process's count, as its frames arrive.
#[derive(Default)]
pub(super) struct CapView {
    procs: FastMap<u32, Proc>,
    /// Each ordinal's GPU for the job: `None` once two processes named different ones.
    uuids: BTreeMap<u32, Option<[u8; 16]>>,
}

impl CapView {
    pub fn look(&mut self, f: Frame) {
        match f {
            Frame::Events(pid, batch) => {
                let p = self.procs.entry(pid).or_default();
                for e in batch {
                    p.apply(e);
                }
            }
            Frame::Record(r) => self.record(r),
        }
    }

    fn record(&mut self, r: &Record) {
        match r {
            Record::Hello(h) => {
                let p = self.procs.entry(h.pid).or_default();
                p.announced = true;
                let get = |k: &str| h.extra.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                p.cap = get(keys::hello::CAP).map(|c| {
                    (
                        c,
                        get(keys::hello::CAP_MODE).unwrap_or_default(),
                        get(keys::hello::CAP_LEDGER).as_deref() == Some("1"),
                    )
                });
                p.argv.clone_from(&h.cmdline);
            }
            // Records of a process that never reached the trace (dropped, refused, torn at its death): its
            // live bytes may miss a free.
            Record::Dropped { pid, .. } | Record::Lost { pid, .. } => {
                self.procs.entry(*pid).or_default().lossy = true;
            }
            Record::ProcessEnd { pid, .. } => {
                self.procs.remove(pid);
            }
            // A process that never connected ends with its reaping (one that did, with its connection).
            Record::Exit(x) if self.procs.get(&x.pid).is_some_and(|p| !p.announced) => {
                self.procs.remove(&x.pid);
            }
            Record::ContextGone { pid, device, .. } => {
                if let Some(p) = self.procs.get_mut(pid) {
                    for (_, v) in p.book.context_gone(|&(d, _)| d == *device) {
                        p.take(v);
                    }
                }
            }
            Record::Devices { pid, uuids, .. } => {
                let p = self.procs.entry(*pid).or_default();
                for &(ordinal, u) in uuids {
                    name_gpu(&mut self.uuids, ordinal, u);
                    p.uuids.insert(ordinal, u);
                }
            }
            // Events come as frames of their own ([`CapView::look`]); the rest move no byte the cap counts.
            Record::Events { .. }
            | Record::Exit(_)
            | Record::Goodbye { .. }
            | Record::Tick { .. }
            | Record::Oom(_)
            | Record::Stack(_)
            | Record::Objects(_)
            | Record::Note { .. }
            | Record::FrameworkSample(_)
            | Record::Bridge(_)
            | Record::End { .. }
            | Record::Reaped { .. }
            | Record::FrameNames(_) => {}
        }
    }

    /// Each process the trace has seen and not seen end, with what its shim counted live now, by GPU.
    pub fn counted(&self) -> Vec<Counted> {
        self.procs
            .iter()
            .map(|(pid, p)| Counted {
                pid: *pid,
                argv: p.argv.clone(),
                cap: p.cap.clone(),
                lossy: p.lossy,
                bytes: p
                    .bytes
                    .iter()
                    .map(|(d, b)| {
                        let uuid = p
                            .uuids
                            .get(d)
                            .or_else(|| self.uuids.get(d)?.as_ref())
                            .map(vramtrace_format::gpu_uuid);
                        (uuid, *d, *b)
                    })
                    .collect(),
            })
            .collect()
    }
}
