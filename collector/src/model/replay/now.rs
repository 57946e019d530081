//! The replay's figures at this moment, for a reader that looks while it runs (the live metrics, `top`): each
//! read from the observer that keeps it (`memory`, `calls`, the framework's), with the report's rules (a
//! device's cap and total: [`Dev::total`], [`HeaderDevice`]), so a scrape says what the report says of the
//! trace up to the same record. Nothing here is kept between two looks.

use std::collections::BTreeMap;

use vramtrace_format::Framework;

use super::*;

/// One GPU, for the whole job.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceNow {
    /// Bytes live now, all processes, and their peak.
    pub used: u64,
    pub peak: u64,
    pub allocations: u64,
    pub cap: Option<u64>,
    pub total: Option<u64>,
    /// Allocations the cap refused.
    pub cap_refusals: u64,
    /// The driver's out-of-memory refusals, recovered from or not.
    pub refusals: u64,
    /// Out-of-memory errors (refusals never recovered from, and the frameworks' errors).
    pub errors: u64,
}

/// One process on one GPU.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessDeviceNow {
    pub live: u64,
    pub peak: u64,
    /// Its framework allocator's last sample here: (framework, allocated, reserved).
    pub framework: Option<(Framework, u64, u64)>,
}

/// A process not yet ended.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct ProcessNow {
    pub slot: usize,
    pub pid: u32,
    /// Its rank, or its Slurm task's number.
    pub rank: Option<u32>,
    pub cmdline: Vec<String>,
    /// By GPU ordinal.
    pub devices: BTreeMap<u32, ProcessDeviceNow>,
    /// Which GPU each of its ordinals is, by its own driver.
    pub uuids: BTreeMap<u32, String>,
}

/// The job now.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct Now {
    /// By ordinal: every GPU the trace has named.
    pub devices: BTreeMap<u32, DeviceNow>,
    /// In the order of their slots.
    pub processes: Vec<ProcessNow>,
    /// On any device or none.
    pub allocations: u64,
    pub cap_refusals: u64,
    pub refusals: u64,
    pub errors: u64,
    pub dropped: u64,
    /// Each ordinal's GPU for the job: `None` once two processes named different ones.
    pub uuids: BTreeMap<u32, Option<String>>,
}

impl Replay<'_> {
    /// The figures now: what the records applied so far say.
    pub(in crate::model) fn now(&self) -> Now {
        let mut n = Now {
            dropped: self.calls.total(|c| c.dropped_events),
            uuids: self
                .uuids
                .iter()
                .map(|(g, u)| (*g, u.as_ref().map(vramtrace_format::gpu_uuid)))
                .collect(),
            ..Now::default()
        };
        for (g, h) in &self.header_devices {
            let d = n.devices.entry(*g).or_default();
            d.cap = h.cap(None);
            d.total = h.total(None);
        }
        for (i, dv) in self.devs.iter().enumerate() {
            let pk = self.mem.peaks.get(i);
            n.allocations = n.allocations.saturating_add(pk.allocations);
            let Some(g) = ordinal(dv.device) else {
                continue;
            };
            let h = self.header_devices.get(&g).copied().unwrap_or_default();
            let d = n.devices.entry(g).or_default();
            d.used = pk.cur;
            d.peak = pk.peak;
            d.allocations = pk.allocations;
            d.cap = h.cap(dv.oom_cap);
            d.total = h.total(dv.total());
        }
        for (g, c) in self.calls.devices() {
            n.cap_refusals = n.cap_refusals.saturating_add(c.cap_refusals);
            n.refusals = n.refusals.saturating_add(c.refusals);
            n.errors = n.errors.saturating_add(c.errors);
            if let Some(g) = g {
                let d = n.devices.entry(g).or_default();
                d.cap_refusals = c.cap_refusals;
                d.refusals = c.refusals;
                d.errors = c.errors;
            }
        }
        let mut slots: BTreeMap<usize, usize> = BTreeMap::new();
        for (s, p) in self.procs.iter().enumerate() {
            if p.released {
                continue;
            }
            let mut devices = BTreeMap::new();
            for (i, pd) in self.mem.procs.get(s).devs() {
                let dv = &self.devs[*i];
                if let Some(g) = ordinal(dv.device) {
                    devices.insert(
                        g,
                        ProcessDeviceNow {
                            live: pd.cur,
                            peak: pd.peak,
                            framework: None,
                        },
                    );
                }
            }
            slots.insert(s, n.processes.len());
            n.processes.push(ProcessNow {
                slot: s,
                pid: p.s.pid,
                rank: p.s.rank.or(p.s.slurm_procid),
                cmdline: p.s.cmdline.clone(),
                devices,
                uuids: p
                    .uuids
                    .iter()
                    .map(|(g, u)| (*g, vramtrace_format::gpu_uuid(u)))
                    .collect(),
            });
        }
        for (s, g, framework, f) in self.fw.lasts() {
            if let Some(&i) = slots.get(&s) {
                let pd = n.processes[i].devices.entry(g).or_default();
                pd.framework = Some((framework, f.allocated, f.reserved));
            }
        }
        n
    }
}
