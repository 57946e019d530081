//! The live figures: an observer of the report's own replay (`model::stream`), so what `/metrics` and `top`
//! show is what the report says of the same moment: bytes and peaks are the replay's, allocations are its
//! allocations, errors are its decisions (`Tap::error`). It keeps per process and GPU the bytes live now and
//! their peak, per GPU the job's total and its peak, and the counts the metrics serve. A process's series go
//! when the replay ends it, so the label set stays bounded by the processes running.

use std::collections::BTreeMap;

use vramtrace_format::keys;
use vramtrace_format::{flags, Event, FrameworkSample, Hello, TraceHeader, NO_DEVICE};

use crate::model::tap::{Change, ErrorStep, OomStep, Step, Tap};

#[derive(Default, Clone)]
pub(super) struct ProcDev {
    pub live: u64,
    pub peak: u64,
    /// The framework allocator's last figures here (the Python bridge's samples): (framework, allocated,
    /// reserved).
    pub framework: Option<(vramtrace_format::Framework, u64, u64)>,
}

#[derive(Default, Clone)]
pub(super) struct Proc {
    pub pid: u32,
    pub rank: Option<u32>,
    /// Its command line as `top` shows it (`command_line`).
    pub cmd: String,
    pub dev: BTreeMap<u32, ProcDev>,
    /// Which GPU each of its ordinals is, by its driver (`Record::Devices`): its image's own, so an exec of the
    /// same pid keeps its names.
    pub uuids: BTreeMap<u32, String>,
}

/// One GPU's figures for the whole job.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dev {
    pub used: u64,
    pub peak: u64,
    pub cap: Option<u64>,
    pub total: Option<u64>,
    pub allocations: u64,
    pub cap_refusals: u64,
    /// Out-of-memory refusals, all of them, and the errors (the replay's decisions).
    pub refusals: u64,
    pub ooms: u64,
}

/// The figures, as the replay last told them.
#[derive(Default, Clone)]
pub struct Figures {
    /// By the replay's slot (a pid reused or exec'd is another process).
    pub(super) procs: BTreeMap<usize, Proc>,
    pub(super) devs: BTreeMap<u32, Dev>,
    /// All processes, whatever the device (those on none are served under `gpu=""`).
    pub(super) allocations: u64,
    pub(super) cap_refusals: u64,
    pub(super) refusals: u64,
    pub(super) ooms: u64,
    pub(super) dropped: u64,
    /// Each ordinal's GPU as the processes named it: `None` once two named different ones (processes with
    /// their own `CUDA_VISIBLE_DEVICES`), as the report's replay decides (each process's own: `Proc::uuids`).
    pub(super) uuids: BTreeMap<u32, Option<String>>,
}

impl Figures {
    fn dev(&mut self, d: u32) -> &mut Dev {
        self.devs.entry(d).or_default()
    }

    fn proc(&mut self, slot: usize, pid: u32) -> &mut Proc {
        self.procs.entry(slot).or_insert_with(|| Proc {
            pid,
            ..Proc::default()
        })
    }

    /// Processes with a series now.
    pub fn processes(&self) -> usize {
        self.procs.len()
    }

    /// Bytes live now on `device`, all processes.
    pub fn device_used(&self, device: u32) -> u64 {
        self.devs.get(&device).map_or(0, |d| d.used)
    }

    /// Out-of-memory errors so far (the report's `oom_records` once the trace is whole).
    pub fn errors(&self) -> u64 {
        self.ooms
    }

    /// Out-of-memory refusals (the driver's records), recovered from or not.
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// Allocations the cap refused.
    pub fn cap_refusals(&self) -> u64 {
        self.cap_refusals
    }

    /// Successful allocations, on any device or none.
    pub fn allocations(&self) -> u64 {
        self.allocations
    }

    /// Events the shims dropped.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Each GPU's figures, by ordinal.
    pub fn gpus(&self) -> &BTreeMap<u32, Dev> {
        &self.devs
    }

    /// Each running process's (pid, GPU, bytes live now, peak), in the replay's order of slots.
    pub fn process_gpus(&self) -> Vec<(u32, u32, u64, u64)> {
        self.procs
            .values()
            .flat_map(|p| p.dev.iter().map(|(d, pd)| (p.pid, *d, pd.live, pd.peak)))
            .collect()
    }
}

/// A process's driver named its GPUs: its own names, and the job's (an ordinal two processes named
/// differently, with their own `CUDA_VISIBLE_DEVICES`, names none for the job), as the report's replay decides.
pub(super) fn name_gpus(
    job: &mut BTreeMap<u32, Option<String>>,
    own: &mut BTreeMap<u32, String>,
    uuids: &[(u32, [u8; 16])],
) {
    for (ordinal, u) in uuids {
        let u = vramtrace_format::gpu_uuid(u);
        let known = job.entry(*ordinal).or_insert_with(|| Some(u.clone()));
        if known.as_deref() != Some(u.as_str()) {
            *known = None;
        }
        own.insert(*ordinal, u);
    }
}

impl Tap for Figures {
    /// The caps and device sizes the trace header records (`cap_bytes.N`, `device_total.N`).
    fn start(&mut self, h: &TraceHeader) {
        for (k, v) in &h.extra {
            let Ok(v) = v.parse::<u64>() else { continue };
            if let Some(d) = keys::header::device_of(keys::header::CAP_BYTES, k) {
                self.dev(d).cap = Some(v);
            } else if let Some(d) = keys::header::device_of(keys::header::DEVICE_TOTAL, k) {
                self.dev(d).total = Some(v);
            }
        }
    }

    fn step(&mut self, s: &Step) {
        let new = match s.change {
            Change::Alloc => !s.back,
            Change::Free | Change::Released => false,
            Change::Map | Change::Unmap => return,
        };
        self.allocations += new as u64;
        // On no GPU (`cuMemCreate` with a host location: NCCL's host buffers) or on a GPU the shim could not
        // tell: in no GPU's series.
        let Some(d) = s.device.filter(|_| !s.on_host) else {
            return;
        };
        let pd = self.proc(s.slot, s.process.pid).dev.entry(d).or_default();
        pd.live = s.process_device_bytes;
        pd.peak = pd.peak.max(pd.live);
        let dv = self.dev(d);
        dv.allocations += new as u64;
        dv.used = s.device_bytes;
        dv.peak = dv.peak.max(dv.used);
    }

    fn oom(&mut self, o: &OomStep) {
        if o.framework {
            return;
        }
        self.refusals += 1;
        if o.oom.device != NO_DEVICE && !o.on_host {
            let d = self.dev(o.oom.device);
            d.refusals += 1;
            if o.oom.cap_bytes.is_some() {
                d.cap = o.oom.cap_bytes;
            }
            if o.oom.device_total_bytes.is_some() {
                d.total = o.oom.device_total_bytes;
            }
        }
    }

    fn error(&mut self, e: &ErrorStep) {
        self.ooms += 1;
        if let Some(d) = e.device {
            self.dev(d).ooms += 1;
        }
    }

    fn refused(&mut self, _slot: usize, device: Option<u32>, e: &Event) {
        if e.flags & flags::CAP_REFUSED != 0 {
            self.cap_refusals += 1;
            if let Some(d) = device {
                self.dev(d).cap_refusals += 1;
            }
        }
    }

    fn hello(&mut self, slot: usize, h: &Hello) {
        let p = self.proc(slot, h.pid);
        p.rank = h.rank.or(h.slurm_procid);
        p.cmd = super::command_line(&h.cmdline);
    }

    fn ended(&mut self, slot: usize, _t_ns: u64) {
        self.procs.remove(&slot);
    }

    fn dropped(&mut self, _slot: usize, count: u64) {
        self.dropped = self.dropped.saturating_add(count);
    }

    fn framework(&mut self, slot: usize, f: &FrameworkSample) {
        if f.device == NO_DEVICE {
            return;
        }
        let pd = self.proc(slot, f.pid).dev.entry(f.device).or_default();
        pd.framework = Some((f.framework, f.allocated, f.reserved));
    }

    fn devices(&mut self, slot: usize, pid: u32, uuids: &[(u32, [u8; 16])]) {
        let own = self.procs.entry(slot).or_insert_with(|| Proc {
            pid,
            ..Proc::default()
        });
        name_gpus(&mut self.uuids, &mut own.uuids, uuids);
    }

    fn device_total(&mut self, device: u32, total: u64) {
        self.dev(device).total = Some(total);
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
