//! What the Python bridge saw inside the frameworks' allocators (frame kinds 12 and 13), replayed beside the
//! driver's events: per process and device the allocator's own figures (allocated versus reserved), per device
//! the job's sums over time, every framework out-of-memory error with the figures and settings at that moment,
//! and what the bridge could not do.
//!
//! The records go through the same time-ordered merge as the driver's events (model.rs), so a figure is
//! applied exactly when the events before it have been. A process's figures stop counting when it ends (its
//! cache goes with it).

use std::collections::HashMap;

use vramtrace_format::{Bridge, Framework, FrameworkSample, NO_DEVICE};

use crate::model::growth::growth_sampled;
use crate::model::timeline::{Timeline, TimelineBuilder};
use crate::model::LeakTrend;

/// Arming changes of the allocation history kept, all processes together.
pub const MAX_HISTORY_CHANGES: usize = 64;

/// The bridge armed or disarmed PyTorch's allocation history (a `history` record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryChange {
    pub pid: u32,
    pub device: Option<u32>,
    /// Relative ns.
    pub time_ns: u64,
    pub armed: bool,
    /// `requested` (`--torch-history`), `retry` (a cache flush), `pressure` (allocated near the limit),
    /// `growth` (a rising floor), `pressure_gone`.
    pub reason: String,
    pub entries: u64,
    pub allocated: Option<u64>,
    pub limit: Option<u64>,
}

/// Notes kept from the bridge, all processes together.
pub const MAX_BRIDGE_NOTES: usize = 64;

/// One reading of a framework allocator's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Bytes in tensors (PyTorch `allocated_bytes`; JAX `bytes_in_use`).
    pub allocated: u64,
    /// Bytes the allocator holds from the driver (PyTorch `reserved_bytes`).
    pub reserved: u64,
    pub active: u64,
    /// Free bytes in segments that cannot be released (PyTorch `inactive_split_bytes`).
    pub inactive_split: u64,
    pub requested: u64,
    /// The allocator flushed its cache and retried a driver allocation this many times (PyTorch).
    pub alloc_retries: u64,
    pub ooms: u64,
}

impl Figures {
    fn of(s: &FrameworkSample) -> Figures {
        Figures {
            allocated: s.allocated,
            reserved: s.reserved,
            active: s.active,
            inactive_split: s.inactive_split,
            requested: s.requested,
            alloc_retries: s.alloc_retries,
            ooms: s.ooms,
        }
    }

    /// Reserved but not allocated: the allocator's cache.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

/// One process's framework figures on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFramework {
    pub framework: Framework,
    pub device: u32,
    pub samples: u64,
    /// The last reading (at exit, for a process that ended normally).
    pub last: Figures,
    pub last_time_ns: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

/// The job's framework figures on one device: sums over its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFramework {
    pub device: u32,
    /// `pytorch`, `jax`, or both joined by `+`.
    pub frameworks: String,
    pub processes: u64,
    pub allocated: Timeline,
    pub reserved: Timeline,
    pub peak_allocated: u64,
    pub peak_allocated_time_ns: Option<u64>,
    pub peak_reserved: u64,
    /// Cache flushes and retries, all processes (the guides' early warning).
    pub alloc_retries: u64,
    pub ooms: u64,
    /// Allocated bytes growing step after step (which the cache hides from the driver).
    pub leak: Option<LeakTrend>,
    /// With a growth: the live tensors at exit of the snapshot a process kept (the bridge dumps one when its
    /// allocation history is armed at exit), grouped by the line that allocated them: the lines that grew.
    pub kept: Option<SnapshotReading>,
}

pub use crate::torch_snapshot::{KeptLine, SnapshotReading};

/// A framework's out-of-memory error, from its own observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameworkOom {
    pub framework: Framework,
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: Option<u32>,
    /// The OS name of the failing thread (`pt_autograd_0`: autograd's backward thread).
    pub thread: Option<String>,
    /// The bytes the allocator tried to get (PyTorch: the rounded segment size).
    pub requested_bytes: u64,
    /// PyTorch: the per-process fraction's limit if one is set, else the device's total.
    pub allowed_or_total_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    pub figures: Figures,
    pub backend: Option<String>,
    pub alloc_conf: Option<String>,
    pub expandable_segments: Option<bool>,
    pub garbage_collection_threshold: Option<String>,
    /// Blocks larger than this are never split (PyTorch; none when unlimited).
    pub max_split_size: Option<u64>,
    pub segments: Option<u64>,
    pub largest_free_block: Option<u64>,
    /// Free bytes inside segments that hold a live block: they cannot go back to the driver.
    pub free_in_live_segments: Option<u64>,
    pub snapshot_path: Option<String>,
    pub snapshot: Option<SnapshotReading>,
}

impl FrameworkOom {
    fn from_bridge(b: &Bridge, t: u64) -> FrameworkOom {
        let num = |k: &str| b.num(k);
        let text = |k: &str| b.field(k).filter(|v| !v.is_empty()).map(str::to_string);
        let framework = match b.field("framework") {
            Some("jax") => Framework::Jax,
            _ => Framework::Torch,
        };
        let figures = if framework == Framework::Jax {
            Figures {
                allocated: num("bytes_in_use").unwrap_or(0),
                reserved: num("bytes_reserved").or(num("bytes_limit")).unwrap_or(0),
                ..Figures::default()
            }
        } else {
            Figures {
                allocated: num("allocated").unwrap_or(0),
                reserved: num("reserved").unwrap_or(0),
                active: num("active").unwrap_or(0),
                inactive_split: num("inactive_split").unwrap_or(0),
                requested: num("requested_current").unwrap_or(0),
                alloc_retries: num("alloc_retries").unwrap_or(0),
                ooms: num("ooms").unwrap_or(0),
            }
        };
        let largest = num("largest_free_block").or(num("largest_free_block_bytes"));
        // PyTorch reports "unlimited" as SIZE_MAX (or -1 through a signed cast).
        let max_split = b
            .field("max_split_size")
            .and_then(|v| v.trim().parse::<i128>().ok())
            .filter(|&v| v > 0 && v < i64::MAX as i128)
            .map(|v| v as u64);
        FrameworkOom {
            framework,
            time_ns: t,
            pid: b.pid,
            tid: b.tid,
            device: (b.device != NO_DEVICE).then_some(b.device),
            thread: text("thread"),
            requested_bytes: num("requested").unwrap_or(0),
            allowed_or_total_bytes: num("allowed_or_total"),
            device_free_bytes: num("device_free"),
            figures,
            backend: text("backend"),
            alloc_conf: text("alloc_conf"),
            expandable_segments: b
                .field("expandable_segments")
                .map(|v| v.trim().eq_ignore_ascii_case("true"))
                .or_else(|| b.field("segments_expandable").map(|v| v.trim() == "1")),
            garbage_collection_threshold: text("garbage_collection_threshold"),
            max_split_size: max_split,
            segments: num("segments"),
            largest_free_block: largest,
            free_in_live_segments: num("free_in_live_segments"),
            snapshot_path: text("snapshot"),
            snapshot: None,
        }
    }

    /// The thread was autograd's backward thread (PyTorch names its device threads `pt_autograd_N`).
    pub fn on_backward_thread(&self) -> bool {
        self.thread
            .as_deref()
            .is_some_and(|t| t.starts_with("pt_autograd"))
    }
}

/// A process where the bridge attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeProcess {
    pub pid: u32,
    pub framework: Framework,
    pub framework_version: Option<String>,
    pub python: Option<String>,
    pub backend: Option<String>,
    pub alloc_conf: Option<String>,
    pub sample_ms: Option<u64>,
    pub history_entries: u64,
    /// What it could not do (no observer for this backend, history refused, ...).
    pub problems: Vec<String>,
}

/// The bridge's side of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BridgeSummary {
    pub attached: Vec<BridgeProcess>,
    /// (pid, time, text), at most [`MAX_BRIDGE_NOTES`].
    pub notes: Vec<(u32, u64, String)>,
    /// Snapshots kept at exit: (pid, path).
    pub exit_snapshots: Vec<(u32, String)>,
    /// When the bridge armed and disarmed PyTorch's allocation history by itself (or at the start, when
    /// asked), at most [`MAX_HISTORY_CHANGES`]: what the tensors' lines can cover.
    pub history: Vec<HistoryChange>,
    /// Samples received, all processes.
    pub samples: u64,
}

#[derive(Default)]
struct ProcDev {
    framework: Option<Framework>,
    samples: u64,
    last: Figures,
    last_t: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    /// Counted in its device's sums (until the process ends).
    counted: bool,
}

struct Dev {
    device: u32,
    frameworks: Vec<Framework>,
    allocated: u64,
    reserved: u64,
    tl_allocated: TimelineBuilder,
    tl_reserved: TimelineBuilder,
    peak_allocated: u64,
    peak_allocated_t: Option<u64>,
    peak_reserved: u64,
    /// Retries and out-of-memory counts of processes that ended, plus the live ones' at the end.
    retries_done: u64,
    ooms_done: u64,
}

/// The replay's state for bridge records.
#[derive(Default)]
pub(crate) struct FwReplay {
    procs: HashMap<(usize, u32), ProcDev>,
    devs: Vec<Dev>,
    summary: BridgeSummary,
}

impl FwReplay {
    fn dev(&mut self, device: u32) -> &mut Dev {
        let i = match self.devs.iter().position(|d| d.device == device) {
            Some(i) => i,
            None => {
                self.devs.push(Dev {
                    device,
                    frameworks: Vec::new(),
                    allocated: 0,
                    reserved: 0,
                    tl_allocated: TimelineBuilder::default(),
                    tl_reserved: TimelineBuilder::default(),
                    peak_allocated: 0,
                    peak_allocated_t: None,
                    peak_reserved: 0,
                    retries_done: 0,
                    ooms_done: 0,
                });
                self.devs.len() - 1
            }
        };
        &mut self.devs[i]
    }

    /// A sample of process slot `slot`, at relative time `t`.
    pub fn on_sample(&mut self, slot: usize, s: &FrameworkSample, t: u64) {
        self.summary.samples += 1;
        let f = Figures::of(s);
        let p = self.procs.entry((slot, s.device)).or_default();
        let (old_a, old_r) = if p.counted {
            (p.last.allocated, p.last.reserved)
        } else {
            (0, 0)
        };
        p.framework = Some(s.framework);
        p.samples += 1;
        p.last = f;
        p.last_t = t;
        p.peak_allocated = p.peak_allocated.max(f.allocated);
        p.peak_reserved = p.peak_reserved.max(f.reserved);
        p.counted = true;
        let d = self.dev(s.device);
        if !d.frameworks.contains(&s.framework) {
            d.frameworks.push(s.framework);
        }
        d.allocated = d
            .allocated
            .saturating_sub(old_a)
            .saturating_add(f.allocated);
        d.reserved = d.reserved.saturating_sub(old_r).saturating_add(f.reserved);
        Self::moved(d, t);
    }

    fn moved(d: &mut Dev, t: u64) {
        d.tl_allocated.set(t, d.allocated);
        d.tl_reserved.set(t, d.reserved);
        if d.allocated > d.peak_allocated {
            d.peak_allocated = d.allocated;
            d.peak_allocated_t = Some(t);
        }
        d.peak_reserved = d.peak_reserved.max(d.reserved);
    }

    /// Process slot `slot` ended at `t`: its allocator's memory went with it.
    pub fn on_process_end(&mut self, slot: usize, t: u64) {
        let mut gone = Vec::new();
        for ((s, device), p) in self.procs.iter_mut() {
            if *s == slot && p.counted {
                p.counted = false;
                gone.push((*device, p.last));
            }
        }
        for (device, f) in gone {
            let d = self.dev(device);
            d.allocated = d.allocated.saturating_sub(f.allocated);
            d.reserved = d.reserved.saturating_sub(f.reserved);
            d.retries_done = d.retries_done.saturating_add(f.alloc_retries);
            d.ooms_done = d.ooms_done.saturating_add(f.ooms);
            Self::moved(d, t);
        }
    }

    /// Any other bridge record of slot `slot`; an out-of-memory record comes back to be attached to a
    /// snapshot.
    pub fn on_bridge(&mut self, b: Bridge, t: u64) -> Option<FrameworkOom> {
        match b.what.as_str() {
            "oom" => return Some(FrameworkOom::from_bridge(&b, t)),
            "attach" => {
                let framework = if b.field("jax").is_some() {
                    Framework::Jax
                } else {
                    Framework::Torch
                };
                let mut problems: Vec<(String, String)> = b
                    .fields
                    .iter()
                    .filter(|(k, _)| k.starts_with("problem."))
                    .cloned()
                    .collect();
                problems.sort();
                let text = |k: &str| b.field(k).filter(|v| !v.is_empty()).map(str::to_string);
                if !self.summary.attached.iter().any(|a| a.pid == b.pid) {
                    self.summary.attached.push(BridgeProcess {
                        pid: b.pid,
                        framework,
                        framework_version: text("torch").or(text("jax")),
                        python: text("python"),
                        backend: text("backend"),
                        alloc_conf: text("alloc_conf"),
                        sample_ms: b.num("sample_ms"),
                        history_entries: b.num("history_entries").unwrap_or(0),
                        problems: problems.into_iter().map(|(_, v)| v).collect(),
                    });
                }
            }
            "history" if self.summary.history.len() < MAX_HISTORY_CHANGES => {
                self.summary.history.push(HistoryChange {
                    pid: b.pid,
                    device: (b.device != NO_DEVICE).then_some(b.device),
                    time_ns: t,
                    armed: b.field("state") == Some("armed"),
                    reason: b.field("reason").unwrap_or("").to_string(),
                    entries: b.num("entries").unwrap_or(0),
                    allocated: b.num("allocated"),
                    limit: b.num("limit"),
                });
            }
            "note" if self.summary.notes.len() < MAX_BRIDGE_NOTES => {
                let text = b.field("text").unwrap_or("").to_string();
                if !self.summary.notes.iter().any(|(_, _, x)| *x == text) {
                    self.summary.notes.push((b.pid, t, text));
                }
            }
            "snapshot" => {
                if let Some(p) = b.field("path") {
                    if b.field("at") == Some("exit") {
                        self.summary.exit_snapshots.push((b.pid, p.to_string()));
                    }
                }
            }
            _ => {}
        }
        None
    }

    /// The last figures of slot `slot` on `device`, if it sent any.
    pub fn figures(&self, slot: usize, device: u32) -> Option<Figures> {
        self.procs
            .get(&(slot, device))
            .filter(|p| p.samples > 0)
            .map(|p| p.last)
    }

    /// The job's allocated bytes on `device` now, if any process sent figures for it.
    pub fn job_allocated(&self, device: u32) -> Option<(u64, u64)> {
        self.devs
            .iter()
            .find(|d| d.device == device)
            .map(|d| (d.allocated, d.reserved))
    }

    /// Allocated bytes growing step after step on `device` up to `t` ([`growth`]).
    pub fn leak_until(&self, device: u32, t: u64) -> Option<LeakTrend> {
        let d = self.devs.iter().find(|d| d.device == device)?;
        growth_sampled(&d.tl_allocated.clone().finish(t), t)
    }

    /// Per slot, its figures per device; per device, the job's.
    pub fn finish(
        self,
        end: u64,
    ) -> (
        HashMap<usize, Vec<ProcessFramework>>,
        Vec<DeviceFramework>,
        BridgeSummary,
    ) {
        let mut per_slot: HashMap<usize, Vec<ProcessFramework>> = HashMap::new();
        let mut live_retries: HashMap<u32, (u64, u64, u64)> = HashMap::new();
        for ((slot, device), p) in &self.procs {
            let Some(framework) = p.framework else {
                continue;
            };
            if p.counted {
                let e = live_retries.entry(*device).or_default();
                e.0 = e.0.saturating_add(p.last.alloc_retries);
                e.1 = e.1.saturating_add(p.last.ooms);
            }
            live_retries.entry(*device).or_default().2 += 1;
            per_slot.entry(*slot).or_default().push(ProcessFramework {
                framework,
                device: *device,
                samples: p.samples,
                last: p.last,
                last_time_ns: p.last_t,
                peak_allocated: p.peak_allocated,
                peak_reserved: p.peak_reserved,
            });
        }
        for v in per_slot.values_mut() {
            v.sort_by_key(|p| p.device);
        }
        let mut devices: Vec<DeviceFramework> = self
            .devs
            .into_iter()
            .map(|d| {
                let (r, o, n) = live_retries.get(&d.device).copied().unwrap_or_default();
                // Growth is read up to the last rise: what follows (an error's unwinding, exit) is not it.
                let allocated = d.tl_allocated.finish(end);
                let leak = growth_sampled(&allocated, end);
                DeviceFramework {
                    device: d.device,
                    frameworks: d
                        .frameworks
                        .iter()
                        .map(|f| f.name())
                        .collect::<Vec<_>>()
                        .join("+"),
                    processes: n,
                    allocated,
                    reserved: d.tl_reserved.finish(end),
                    peak_allocated: d.peak_allocated,
                    peak_allocated_time_ns: d.peak_allocated_t,
                    peak_reserved: d.peak_reserved,
                    alloc_retries: d.retries_done.saturating_add(r),
                    ooms: d.ooms_done.saturating_add(o),
                    leak,
                    kept: None,
                }
            })
            .collect();
        devices.sort_by_key(|d| d.device);
        (per_slot, devices, self.summary)
    }
}
