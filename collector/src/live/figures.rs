//! The live figures: the report's own replay (`model::stream`) read at the moment asked ([`Stream::now`]), so
//! what `/metrics` and `top` show is what the report says of the same moment. Bytes, peaks and allocations are
//! its memory observers', refusals and errors its decisions' (`observe/calls.rs`), caps and totals its rule
//! (`HeaderDevice`). Nothing is counted here: a process's series go when the replay ends it, so the label set
//! stays bounded by the processes running.
//!
//! [`Stream::now`]: crate::model::stream::Stream::now

use std::collections::BTreeMap;

pub use crate::model::stream::{DeviceNow as Dev, Now, ProcessNow as Proc};

/// The figures, as the replay says them now.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct Figures {
    pub(super) now: Now,
}

impl From<Now> for Figures {
    fn from(now: Now) -> Figures {
        Figures { now }
    }
}

impl Figures {
    /// Processes with a series now.
    pub fn processes(&self) -> usize {
        self.now.processes.len()
    }

    /// Each running process, in the replay's order of slots.
    pub(super) fn procs(&self) -> &[Proc] {
        &self.now.processes
    }

    /// Bytes live now on `device`, all processes.
    pub fn device_used(&self, device: u32) -> u64 {
        self.now.devices.get(&device).map_or(0, |d| d.used)
    }

    /// Out-of-memory errors so far (the report's `oom_records` once the trace is whole).
    pub fn errors(&self) -> u64 {
        self.now.errors
    }

    /// Out-of-memory refusals (the driver's records), recovered from or not.
    pub fn refusals(&self) -> u64 {
        self.now.refusals
    }

    /// Allocations the cap refused.
    pub fn cap_refusals(&self) -> u64 {
        self.now.cap_refusals
    }

    /// Successful allocations, on any device or none.
    pub fn allocations(&self) -> u64 {
        self.now.allocations
    }

    /// Events the shims dropped.
    pub fn dropped(&self) -> u64 {
        self.now.dropped
    }

    /// Each GPU's figures, by ordinal.
    pub fn gpus(&self) -> &BTreeMap<u32, Dev> {
        &self.now.devices
    }

    /// Each ordinal's GPU for the job as the processes named it (`None`: two named different ones).
    pub(super) fn uuids(&self) -> &BTreeMap<u32, Option<String>> {
        &self.now.uuids
    }

    /// Each running process's (pid, GPU, bytes live now, peak), in the replay's order of slots.
    pub fn process_gpus(&self) -> Vec<(u32, u32, u64, u64)> {
        self.now
            .processes
            .iter()
            .flat_map(|p| {
                p.devices
                    .iter()
                    .map(|(d, pd)| (p.pid, *d, pd.live, pd.peak))
            })
            .collect()
    }
}
