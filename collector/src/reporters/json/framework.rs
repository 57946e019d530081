//! The JSON of the frameworks' allocators (the Python bridge): per device, per process, and what the bridge
//! attached to (docs/JSON-SCHEMA.md).

use serde::Serialize;

use super::shared::{timeline, Bucket};
use super::trends::Leak;
use crate::model::KeptLine;
use crate::model::{self, Analysis, DeviceFramework, ProcessFramework};

/// A framework allocator's figures.
#[derive(Serialize)]
struct Figures {
    allocated_bytes: u64,
    reserved_bytes: u64,
    active_bytes: u64,
    inactive_split_bytes: u64,
    requested_bytes: u64,
    alloc_retries: u64,
    num_ooms: u64,
}

impl Figures {
    fn of(f: &model::Figures) -> Self {
        Figures {
            allocated_bytes: f.allocated,
            reserved_bytes: f.reserved,
            active_bytes: f.active,
            inactive_split_bytes: f.inactive_split,
            requested_bytes: f.requested,
            alloc_retries: f.alloc_retries,
            num_ooms: f.ooms,
        }
    }
}

/// A device's `framework`.
#[derive(Serialize)]
pub struct Device<'a> {
    frameworks: &'a str,
    processes: u64,
    peak_allocated_bytes: u64,
    peak_allocated_time_ns: Option<u64>,
    peak_reserved_bytes: u64,
    alloc_retries: u64,
    num_ooms: u64,
    allocated_leak: Option<Leak<'a>>,
    /// Without a growth, something small kept at every step: `{pid, steps, rise_bytes, per_step_bytes}`.
    small_growth: Option<SmallGrowth>,
    kept_lines: Option<KeptLines<'a>>,
    allocated_timeline_bucket_ns: u64,
    allocated_timeline: Vec<Bucket>,
    reserved_timeline_bucket_ns: u64,
    reserved_timeline: Vec<Bucket>,
}

/// What a framework snapshot kept beside the trace says: live tensors by the line that allocated them.
#[derive(Serialize)]
struct KeptLines<'a> {
    snapshot: &'a str,
    lines: Vec<Kept<'a>>,
}

/// Live tensors of one line (also the out-of-memory error's `framework.kept`).
#[derive(Serialize)]
pub struct Kept<'a> {
    label: &'a str,
    bytes: u64,
    count: u64,
    during_rise_bytes: u64,
}

impl<'a> Kept<'a> {
    pub fn list(v: &'a [KeptLine]) -> Vec<Self> {
        v.iter()
            .map(|k| Kept {
                label: &k.label,
                bytes: k.bytes,
                count: k.count,
                during_rise_bytes: k.during_rise_bytes,
            })
            .collect()
    }
}

impl<'a> Device<'a> {
    pub fn of(f: &'a DeviceFramework) -> Self {
        Device {
            frameworks: &f.frameworks,
            processes: f.processes,
            peak_allocated_bytes: f.peak_allocated,
            peak_allocated_time_ns: f.peak_allocated_time_ns,
            peak_reserved_bytes: f.peak_reserved,
            alloc_retries: f.alloc_retries,
            num_ooms: f.ooms,
            allocated_leak: f.leak.as_ref().map(|l| Leak::of(l, false)),
            small_growth: f.small_growth.map(|(pid, steps, rise)| SmallGrowth {
                pid,
                steps,
                rise_bytes: rise,
                per_step_bytes: rise / steps.max(1),
            }),
            kept_lines: f.kept.as_ref().map(|k| KeptLines {
                snapshot: &k.path,
                lines: Kept::list(&k.kept),
            }),
            allocated_timeline_bucket_ns: f.allocated.bucket_ns,
            allocated_timeline: timeline(&f.allocated),
            reserved_timeline_bucket_ns: f.reserved.bucket_ns,
            reserved_timeline: timeline(&f.reserved),
        }
    }
}

/// One of a process's `framework` entries: its allocator on one device.
#[derive(Serialize)]
pub struct Process {
    framework: &'static str,
    device: u32,
    samples: u64,
    last_time_ns: u64,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    last: Figures,
}

pub fn process(v: &[ProcessFramework]) -> Vec<Process> {
    v.iter()
        .map(|p| Process {
            framework: p.framework.name(),
            device: p.device,
            samples: p.samples,
            last_time_ns: p.last_time_ns,
            peak_allocated_bytes: p.peak_allocated,
            peak_reserved_bytes: p.peak_reserved,
            last: Figures::of(&p.last),
        })
        .collect()
}

#[derive(Serialize)]
struct SmallGrowth {
    pid: u32,
    steps: u64,
    rise_bytes: u64,
    per_step_bytes: u64,
}

/// `bridge`: what the Python bridge attached to, said and armed, and the cache it left.
#[derive(Serialize)]
pub struct Bridge<'a> {
    attached: Vec<Attached<'a>>,
    messages: Vec<Message<'a>>,
    history: Vec<History<'a>>,
    /// What held the tensors at exit (after a growth) or when asked.
    walks: Vec<super::holders::HoldersJson<'a>>,
    samples: u64,
    cache_at_end_bytes: u64,
    cache_at_end_tensor_bytes: u64,
    /// Processes that ended themselves at a step's boundary, as `run --stop-after-steps` asked.
    stopped_after_steps: Vec<Stopped>,
}

#[derive(Serialize)]
struct Stopped {
    pid: u32,
    steps: u64,
}

#[derive(Serialize)]
struct Attached<'a> {
    pid: u32,
    framework: &'static str,
    version: Option<&'a str>,
    python: Option<&'a str>,
    backend: Option<&'a str>,
    alloc_conf: Option<&'a str>,
    sample_ms: Option<u64>,
    history_entries: u64,
    problems: &'a [String],
}

#[derive(Serialize)]
struct Message<'a> {
    pid: u32,
    time_ns: u64,
    text: &'a str,
}

/// The allocation history armed or disarmed.
#[derive(Serialize)]
struct History<'a> {
    pid: u32,
    device: Option<u32>,
    time_ns: u64,
    state: &'static str,
    reason: &'a str,
    entries: u64,
    allocated_bytes: Option<u64>,
    limit_bytes: Option<u64>,
}

impl<'a> Bridge<'a> {
    pub fn of(a: &'a Analysis) -> Self {
        let b = &a.bridge;
        let (held, tensors) = crate::reporters::text::framework::cache_at_end(a);
        Bridge {
            attached: b
                .attached
                .iter()
                .map(|p| Attached {
                    pid: p.pid,
                    framework: p.framework.name(),
                    version: p.framework_version.as_deref(),
                    python: p.python.as_deref(),
                    backend: p.backend.as_deref(),
                    alloc_conf: p.alloc_conf.as_deref(),
                    sample_ms: p.sample_ms,
                    history_entries: p.history_entries,
                    problems: &p.problems,
                })
                .collect(),
            stopped_after_steps: b
                .stopped
                .iter()
                .map(|&(pid, steps)| Stopped { pid, steps })
                .collect(),
            messages: b
                .notes
                .iter()
                .map(|(pid, t, text)| Message {
                    pid: *pid,
                    time_ns: *t,
                    text,
                })
                .collect(),
            walks: b
                .walks
                .iter()
                .map(super::holders::HoldersJson::of)
                .collect(),
            history: b
                .history
                .iter()
                .map(|h| History {
                    pid: h.pid,
                    device: h.device,
                    time_ns: h.time_ns,
                    state: if h.armed { "armed" } else { "disarmed" },
                    reason: &h.reason,
                    entries: h.entries,
                    allocated_bytes: h.allocated,
                    limit_bytes: h.limit,
                })
                .collect(),
            samples: b.samples,
            cache_at_end_bytes: held,
            cache_at_end_tensor_bytes: tensors,
        }
    }
}
