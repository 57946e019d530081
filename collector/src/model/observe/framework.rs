//! What the Python bridge saw inside the frameworks' allocators (frame kinds 12 and 13), replayed beside the
//! driver's events: per process and device the allocator's own figures (allocated versus reserved), per device
//! the job's sums over time, every framework out-of-memory error with the figures and settings at that moment,
//! and what the bridge could not do.
//!
//! The records go through the same time-ordered merge as the driver's events (`input/merge.rs`), so a figure is
//! applied exactly when the events before it have been. A process's figures stop counting when it ends (its
//! cache goes with it).
//!
//! Peaks: the samples alone miss whatever lives between two of them (a step's activations, freed within
//! milliseconds). The allocator's own peak counters (PyTorch `allocated_bytes.all.peak`/`reserved_bytes.all.peak`,
//! what `max_memory_allocated()`/`max_memory_reserved()` say; JAX `peak_bytes_in_use`), which the bridge sends in
//! `peak`, `steps`, `oom` and `exit` records, raise them: a process's peak is the most of its samples and of its
//! counters over the run (a program's `reset_peak_memory_stats()` lowers the counter, never this), and a device's
//! is the job's sum with that process at its peak and every other at its last figures, as samples are summed.
//! Such a peak is placed in time (and in the timelines) only where the bridge sends `peak` records: its
//! counters are then read at every sample, and a peak rose at most a sampling period before the record.

use std::collections::HashMap;

use vramtrace_format::{Framework, FrameworkSample};

use crate::model::analysis::bridge::{BridgeRecord, StepReading};
use crate::model::analysis::holders::{Holders, MAX_WALKS};
use crate::model::analysis::{GrowthUnit, LeakTrend, StepSource};
use crate::model::observe::growth::growth_sampled;
use crate::model::observe::steps::{StepSeries, MIN_RISES};
use crate::model::observe::timeline::Timelines;

pub use crate::model::analysis::framework::*;

#[derive(Default)]
struct ProcDev {
    framework: Option<Framework>,
    samples: u64,
    last: Figures,
    last_t: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    /// It sends `peak` records: its bridge reads the counters at every sample, so a higher one met in any
    /// record rose within a sampling period before it (the bridges before sent them at an error only, which may
    /// come long after the peak).
    streams_peaks: bool,
    /// Counted in its device's sums (until the process ends).
    counted: bool,
    /// Its allocated bytes' floor per step, once the bridge counted a step: the least of the sampler's
    /// readings in each step, and the bridge's own reading at the step's boundary (`exact`), when it took one.
    steps: StepSeries,
    exact: StepSeries,
    /// PyTorch's allocated peak counter read at its latest step boundaries: (step, peak), the last
    /// [`NEED_READINGS`] (the counter is the most since the start, so it rises at a boundary only where a step
    /// needed more than any before).
    need: std::collections::VecDeque<(u64, u64)>,
}

/// Boundary readings of the peak counter kept per process and device, and the least that tell a step's need
/// rising: the counter above the reading before by [`NEED_RISE_BYTES`] at least in half the windows or more (a
/// need that grows a token at a time rises in the allocator's block sizes: a few boundaries flat, then a jump).
const NEED_READINGS: usize = 16;
const NEED_MIN_READINGS: usize = 6;
const NEED_RISE_BYTES: u64 = 1 << 20;
/// The iteration at the error outgrew every earlier one: it held and asked half again more than the most any
/// needed before it (at least [`OUTGREW_BYTES`] more), after at least [`OUTGREW_MIN_READINGS`] boundaries.
const OUTGREW_BYTES: u64 = 64 << 20;
const OUTGREW_MIN_READINGS: usize = 3;

/// Exit snapshots kept (one a process): past this many, counted and not read.
const MAX_EXIT_SNAPSHOTS: usize = 256;

/// What a bridge record tells the replay to place itself ([`FwReplay::on_bridge`]).
pub enum Told {
    Oom(Box<FrameworkOom>),
    Holders(Holders),
}

/// A process's count of its own iterations (the bridge's `steps` records).
#[derive(Clone, Copy)]
struct Steps {
    pid: u32,
    source: StepSource,
    count: u64,
}

struct Dev {
    device: u32,
    frameworks: Vec<Framework>,
    allocated: u64,
    reserved: u64,
    peak_allocated: u64,
    peak_allocated_t: Option<u64>,
    peak_reserved: u64,
    /// Retries and out-of-memory counts of processes that ended, plus the live ones' at the end.
    retries_done: u64,
    ooms_done: u64,
}

/// The index of a device's timeline of allocated bytes, and of reserved bytes, in `FwReplay::tls`.
const ALLOCATED: usize = 0;
const RESERVED: usize = 1;

/// The replay's state for bridge records.
#[derive(Default)]
pub(crate) struct FwReplay {
    procs: HashMap<(usize, u32), ProcDev>,
    /// Per process slot, its step count, once it sent one.
    steps: HashMap<usize, Steps>,
    devs: Vec<Dev>,
    /// Each device's allocated and reserved bytes over time (`ALLOCATED`, `RESERVED`), by index in `devs`.
    tls: Timelines<2>,
    /// Each device's index in `devs`, by its number.
    dev_ids: crate::names::fasthash::FastMap<u32, usize>,
    summary: BridgeSummary,
}

impl FwReplay {
    /// Device `device`'s index in `devs`, made on first use.
    fn dev(&mut self, device: u32) -> usize {
        let i = match self.dev_ids.get(&device) {
            Some(&i) => i,
            None => {
                self.dev_ids.insert(device, self.devs.len());
                self.tls.add_device();
                self.devs.push(Dev {
                    device,
                    frameworks: Vec::new(),
                    allocated: 0,
                    reserved: 0,
                    peak_allocated: 0,
                    peak_allocated_t: None,
                    peak_reserved: 0,
                    retries_done: 0,
                    ooms_done: 0,
                });
                self.devs.len() - 1
            }
        };
        i
    }

    /// A sample of process slot `slot`, at relative time `t`.
    pub fn on_sample(&mut self, slot: usize, s: &FrameworkSample, t: u64) {
        self.summary.samples += 1;
        if s.device >= crate::model::analysis::MAX_DEVICE_ORDINAL {
            self.summary.implausible_devices += 1;
            return;
        }
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
        if let Some(st) = self.steps.get(&slot) {
            p.steps.observe(st.count, t, f.allocated);
        }
        let i = self.dev(s.device);
        let d = &mut self.devs[i];
        if !d.frameworks.contains(&s.framework) {
            d.frameworks.push(s.framework);
        }
        d.allocated = d
            .allocated
            .saturating_sub(old_a)
            .saturating_add(f.allocated);
        d.reserved = d.reserved.saturating_sub(old_r).saturating_add(f.reserved);
        self.moved(i, t);
    }

    fn moved(&mut self, i: usize, t: u64) {
        let d = &mut self.devs[i];
        self.tls.set(i, ALLOCATED, t, d.allocated);
        self.tls.set(i, RESERVED, t, d.reserved);
        if d.allocated > d.peak_allocated {
            d.peak_allocated = d.allocated;
            d.peak_allocated_t = Some(t);
        }
        d.peak_reserved = d.peak_reserved.max(d.reserved);
    }

    /// Each (process slot, device)'s framework and its last figures, for those that sent a sample.
    pub fn lasts(&self) -> impl Iterator<Item = (usize, u32, Framework, Figures)> + '_ {
        self.procs
            .iter()
            .filter_map(|((s, d), p)| Some((*s, *d, p.framework?, p.last)))
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
            let i = self.dev(device);
            let d = &mut self.devs[i];
            d.allocated = d.allocated.saturating_sub(f.allocated);
            d.reserved = d.reserved.saturating_sub(f.reserved);
            d.retries_done = d.retries_done.saturating_add(f.alloc_retries);
            d.ooms_done = d.ooms_done.saturating_add(f.ooms);
            self.moved(i, t);
        }
    }

    /// Any other bridge record of slot `slot` (process `pid`), every kind handled here (the one room that places
    /// them); what the replay must place itself comes back: an out-of-memory record, to be attached to a
    /// snapshot, and a walk of what holds the tensors, to its error or to the run's walks.
    pub fn on_bridge(&mut self, slot: usize, pid: u32, rec: BridgeRecord, t: u64) -> Option<Told> {
        if let Some((device, allocated, reserved)) = rec.peaks() {
            let streams = matches!(rec, BridgeRecord::Peak(_));
            self.on_peaks(slot, device, allocated, reserved, streams, t);
        }
        match rec {
            BridgeRecord::Oom(fo, _) => return Some(Told::Oom(fo)),
            BridgeRecord::Holders(h) => return Some(Told::Holders(h)),
            BridgeRecord::Steps(reading) => self.on_steps(slot, pid, reading, t),
            BridgeRecord::Attach(a) => {
                if !self.summary.attached.iter().any(|x| x.pid == a.pid) {
                    self.summary.attached.push(a);
                }
            }
            BridgeRecord::History(h) => {
                if self.summary.history.len() < MAX_HISTORY_CHANGES {
                    self.summary.history.push(h);
                }
            }
            BridgeRecord::Note(text) => {
                if self.summary.notes.len() < MAX_BRIDGE_NOTES
                    && !self.summary.notes.iter().any(|(_, _, x)| *x == text)
                {
                    self.summary.notes.push((pid, t, text));
                }
            }
            BridgeRecord::Stopped { steps } => {
                if !self.summary.stopped.iter().any(|(p, _)| *p == pid) {
                    self.summary.stopped.push((pid, steps));
                }
            }
            BridgeRecord::ExitSnapshot(p) => {
                // One a process (a process dumps one at its exit), each file once, a bounded number in all: a
                // program that repeats the record must not make every reader read one file a thousand times.
                let known = self
                    .summary
                    .exit_snapshots
                    .iter()
                    .any(|(q, path)| *q == pid || *path == p);
                if !known {
                    if self.summary.exit_snapshots.len() < MAX_EXIT_SNAPSHOTS {
                        self.summary.exit_snapshots.push((pid, p));
                    } else {
                        self.summary.exit_snapshots_dropped += 1;
                    }
                }
            }
            // Their peaks were taken above; the rest of their figures come with the samples.
            BridgeRecord::Peak(_) | BridgeRecord::Exit(_) => {}
        }
        None
    }

    /// A `steps` record: the process's iteration count (one counter per process, so a change of counter restarts
    /// its series: `StepSeries::observe`), and the bridge's reading at the boundary, the same moment of every
    /// iteration (the samples may come late, or rarely, on a busy host: the readings do not wait for them).
    fn on_steps(&mut self, slot: usize, pid: u32, reading: StepReading, t: u64) {
        let (source, count) = reading.counter();
        if let (Some(dev), Some(alloc)) = (reading.device, reading.allocated) {
            if count > 0 {
                let p = self.procs.entry((slot, dev)).or_default();
                p.exact.observe(count, t, alloc);
                if let Some(peak) = reading.peaks.allocated {
                    // A new counter (or a fork's) starts again.
                    if p.need.back().is_some_and(|&(c, _)| c >= count) {
                        p.need.clear();
                    }
                    p.need.push_back((count, peak));
                    if p.need.len() > NEED_READINGS {
                        p.need.pop_front();
                    }
                }
            }
        }
        if count > 0 {
            self.steps.insert(slot, Steps { pid, source, count });
        }
    }

    /// The allocator's own peaks for process `slot` on `device`, read at `t`, from a `peak` record or another
    /// (see the module's doc). Only for a device the process sent samples for: its figures are summed from
    /// those.
    fn on_peaks(
        &mut self,
        slot: usize,
        device: u32,
        allocated: Option<u64>,
        reserved: Option<u64>,
        peak_record: bool,
        t: u64,
    ) {
        let Some(p) = self
            .procs
            .get_mut(&(slot, device))
            .filter(|p| p.samples > 0)
        else {
            return;
        };
        p.streams_peaks |= peak_record;
        let when = p.streams_peaks.then_some(t);
        let (own_a, own_r) = if p.counted {
            (p.last.allocated, p.last.reserved)
        } else {
            (0, 0)
        };
        let allocated = allocated.unwrap_or(0);
        let reserved = reserved.unwrap_or(0);
        p.peak_allocated = p.peak_allocated.max(allocated);
        p.peak_reserved = p.peak_reserved.max(reserved);
        let Some(&i) = self.dev_ids.get(&device) else {
            return;
        };
        let d = &mut self.devs[i];
        // A peak that raises the device's, placed in time, is a moment of its timeline too (its most is its
        // peak), then the figures are back where the samples left them. Not placed: when is not known.
        let at_peak = d.allocated.saturating_sub(own_a).saturating_add(allocated);
        if at_peak > d.peak_allocated {
            d.peak_allocated = at_peak;
            d.peak_allocated_t = when;
            if let Some(t) = when {
                self.tls.set(i, ALLOCATED, t, at_peak);
                self.tls.set(i, ALLOCATED, t, d.allocated);
            }
        }
        let at_peak = d.reserved.saturating_sub(own_r).saturating_add(reserved);
        if at_peak > d.peak_reserved {
            d.peak_reserved = at_peak;
            if let Some(t) = when {
                self.tls.set(i, RESERVED, t, at_peak);
                self.tls.set(i, RESERVED, t, d.reserved);
            }
        }
    }

    /// A walk of what held the tensors that belongs to no error (at exit, on request).
    pub fn walk(&mut self, h: Holders) {
        if self.summary.walks.len() < MAX_WALKS {
            self.summary.walks.push(h);
        }
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
        let d = &self.devs[*self.dev_ids.get(&device)?];
        Some((d.allocated, d.reserved))
    }

    /// Allocated bytes growing step after step on `device` up to `t`: counted in process `slot`'s own steps
    /// when the bridge counted enough of them (steps.rs), else read from the job's allocated bytes on the
    /// device in wall-clock windows ([`growth_sampled`]).
    pub fn leak_until(&self, slot: usize, device: u32, t: u64) -> Option<LeakTrend> {
        if let Some(g) = self.step_growth(slot, device) {
            return g;
        }
        let i = *self.dev_ids.get(&device)?;
        growth_sampled(&self.tls.at(i, ALLOCATED, t), t)
    }

    /// Process `slot`'s iterations on `device` needed more and more, while its steps were counted: either the
    /// latest needed more than any before them (PyTorch's peak counter rose at most of the latest boundaries),
    /// or the one at the error outgrew every earlier one (`need_at_error`, its allocated bytes and the request,
    /// against the counter at the last boundary).
    pub fn step_need(
        &self,
        slot: usize,
        device: u32,
        need_at_error: Option<u64>,
    ) -> Option<crate::model::analysis::StepNeed> {
        let st = self.steps.get(&slot)?;
        let p = self.procs.get(&(slot, device))?;
        let r: Vec<(u64, u64)> = p.need.iter().copied().collect();
        let unit = GrowthUnit::Steps(st.source);
        // The more telling of the two first: one iteration far past the rest says what to bound more plainly
        // than a rise the earlier ones also show (requests of random lengths raise the counter now and then).
        if let (Some(need), Some(&(step, before))) = (need_at_error, r.last()) {
            if r.len() >= OUTGREW_MIN_READINGS
                && need >= before.saturating_add(before / 2)
                && need >= before.saturating_add(OUTGREW_BYTES)
            {
                return Some(crate::model::analysis::StepNeed {
                    unit,
                    first_step: step,
                    first_peak: before,
                    last_step: step,
                    last_peak: need,
                    outgrew: true,
                });
            }
        }
        if r.len() < NEED_MIN_READINGS {
            return None;
        }
        let rises = r
            .windows(2)
            .filter(|w| w[1].1 >= w[0].1.saturating_add(NEED_RISE_BYTES))
            .count();
        // And the iteration at the error needed more than the latest reading says any before it did: where it
        // needed no more (a padded batch as long as one that fitted), the counter's early rises were the data's
        // record lengths, not a need that keeps rising (padded GPT-2 on an H200: "rising" at a step that asked
        // what step 6 had needed).
        let last = r[r.len() - 1].1;
        if need_at_error.is_some_and(|need| need < last.saturating_add(NEED_RISE_BYTES)) {
            return None;
        }
        (2 * rises >= r.len() - 1).then(|| crate::model::analysis::StepNeed {
            unit,
            first_step: r[0].0,
            first_peak: r[0].1,
            last_step: r[r.len() - 1].0,
            last_peak: r[r.len() - 1].1,
            outgrew: false,
        })
    }

    /// Process `slot` counted enough of its steps on `device` to say whether it grew.
    pub fn counts_steps(&self, slot: usize, device: u32) -> bool {
        self.step_series(slot, device).is_some()
    }

    /// The series process `slot`'s growth on `device` is read from, with its count and whether its points are
    /// exact: the boundary readings when there are enough, else the sampler's floors; `None` when neither has
    /// enough points to say.
    fn step_series(&self, slot: usize, device: u32) -> Option<(&StepSeries, &Steps, bool)> {
        let st = self.steps.get(&slot)?;
        let p = self.procs.get(&(slot, device))?;
        if p.exact.points().len() > MIN_RISES {
            return Some((&p.exact, st, true));
        }
        (p.steps.points().len() > MIN_RISES).then_some((&p.steps, st, false))
    }

    /// Process `slot`'s growth on `device` in its own steps: `Some(None)` when it counted enough steps to say
    /// and saw none; `None` when it could not say (no step counted, or too few).
    fn step_growth(&self, slot: usize, device: u32) -> Option<Option<LeakTrend>> {
        self.step_series(slot, device)
            .map(|(s, st, exact)| s.growth(GrowthUnit::Steps(st.source), st.pid, exact))
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
                steps: self.steps.get(slot).map(|st| (st.source, st.count)),
            });
        }
        for v in per_slot.values_mut() {
            v.sort_by_key(|p| p.device);
        }
        // Per device, the processes' growths in their own steps (the largest), and whether every process with
        // figures there could say (then the wall-clock rule is not asked).
        let mut small: HashMap<u32, (u32, u64, u64)> = HashMap::new();
        for (&(slot, device), p) in &self.procs {
            if let (Some(st), Some((steps, rise))) = (
                self.steps.get(&slot),
                crate::model::observe::steps::small_growth(p.exact.points()),
            ) {
                let e = small.entry(device).or_insert((st.pid, steps, rise));
                if rise > e.2 {
                    *e = (st.pid, steps, rise);
                }
            }
        }
        let mut by_steps: HashMap<u32, (Option<LeakTrend>, bool)> = HashMap::new();
        for &(slot, device) in self.procs.keys() {
            let e = by_steps.entry(device).or_insert((None, true));
            match self.step_growth(slot, device) {
                Some(g) => {
                    if let Some(g) =
                        g.filter(|g| e.0.as_ref().is_none_or(|o| g.rise_bytes > o.rise_bytes))
                    {
                        e.0 = Some(g);
                    }
                }
                None => e.1 = false,
            }
        }
        let mut devices: Vec<DeviceFramework> = self
            .devs
            .into_iter()
            .zip(self.tls.finish(end))
            .map(|(d, [allocated, reserved])| {
                let (r, o, n) = live_retries.get(&d.device).copied().unwrap_or_default();
                // Growth is read up to the last rise: what follows (an error's unwinding, exit) is not it.
                let leak = match by_steps.remove(&d.device) {
                    Some((Some(g), _)) => Some(g),
                    Some((None, true)) => None,
                    _ => growth_sampled(&allocated, end),
                };
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
                    reserved,
                    peak_allocated: d.peak_allocated,
                    peak_allocated_time_ns: d.peak_allocated_t,
                    peak_reserved: d.peak_reserved,
                    alloc_retries: d.retries_done.saturating_add(r),
                    ooms: d.ooms_done.saturating_add(o),
                    small_growth: small.get(&d.device).copied().filter(|_| leak.is_none()),
                    leak,
                    kept: None,
                }
            })
            .collect();
        devices.sort_by_key(|d| d.device);
        (per_slot, devices, self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_format::keys::bridge::what;
    use vramtrace_format::{Bridge, NO_DEVICE};

    const GIB: u64 = 1 << 30;

    /// Reads `b` as the replay does, and hands it to `r`.
    fn feed(r: &mut FwReplay, slot: usize, b: Bridge, t: u64) -> Option<Told> {
        let rec = BridgeRecord::read(&b, t)?;
        r.on_bridge(slot, b.pid, rec, t)
    }

    fn sample(pid: u32, device: u32, allocated: u64, reserved: u64) -> FrameworkSample {
        FrameworkSample {
            pid,
            ts_ns: 0,
            framework: Framework::Torch,
            device,
            allocated,
            reserved,
            active: allocated,
            inactive_split: 0,
            requested: allocated,
            alloc_retries: 0,
            ooms: 0,
        }
    }

    use crate::model::analysis::bridge::record;

    fn peak(pid: u32, allocated: u64, reserved: u64) -> Bridge {
        record(
            pid,
            what::PEAK,
            0,
            &[("allocated_peak", allocated), ("reserved_peak", reserved)],
        )
    }

    /// A `steps` record with a boundary reading on device 0 at step `step`: 1 GiB allocated, and the peaks.
    fn reading(pid: u32, step: u64, allocated_peak: u64, reserved_peak: u64) -> Bridge {
        let fields = [
            ("optimizer", step),
            ("device", 0),
            ("allocated", GIB),
            ("allocated_peak", allocated_peak),
            ("reserved_peak", reserved_peak),
        ];
        record(pid, what::STEPS, NO_DEVICE, &fields)
    }

    /// (per-process peaks of slot 0 on device 0, the device's peaks and the time of its allocated one).
    fn finished(r: FwReplay) -> ((u64, u64), (u64, u64, Option<u64>)) {
        let (procs, devs, _) = r.finish(1_000);
        let p = &procs[&0][0];
        let d = &devs[0];
        (
            (p.peak_allocated, p.peak_reserved),
            (d.peak_allocated, d.peak_reserved, d.peak_allocated_time_ns),
        )
    }

    /// Readings of PyTorch's peak counter at steps 1.. (`peaks`, MiB), fed to a fresh replay.
    fn readings(peaks: &[u64]) -> FwReplay {
        let mut r = FwReplay::default();
        for (i, &p) in peaks.iter().enumerate() {
            feed(
                &mut r,
                0,
                reading(7, i as u64 + 1, p << 20, p << 20),
                10 * i as u64 + 10,
            );
        }
        r
    }

    /// A need that grows a token at a time rises in the allocator's blocks: flat at some boundaries, then a
    /// jump. That is a rising need; a counter that rose early and then stayed is not, nor one that rose now and
    /// then (batches of random lengths).
    #[test]
    fn a_need_rising_in_blocks_rises_and_one_that_stopped_does_not() {
        let blocks = [
            1000, 1002, 1004, 1004, 1004, 1006, 1008, 1010, 1010, 1010, 1012, 1014,
        ];
        let n = readings(&blocks)
            .step_need(0, 0, None)
            .expect("rising in blocks");
        // At an error, only if that step needed more than the latest reading: one that asked no more than an
        // earlier step needed is not the need rising.
        assert!(readings(&blocks)
            .step_need(0, 0, Some(1016 << 20))
            .is_some());
        assert!(readings(&blocks)
            .step_need(0, 0, Some(1014 << 20))
            .is_none());
        assert!(!n.outgrew);
        assert_eq!((n.first_step, n.last_step), (1, 12));
        assert_eq!((n.first_peak, n.last_peak), (1000 << 20, 1014 << 20));
        let stopped = [
            500, 900, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000,
        ];
        assert!(readings(&stopped).step_need(0, 0, None).is_none());
        let now_and_then = [
            500, 500, 520, 520, 520, 530, 530, 530, 530, 545, 545, 545, 545, 545,
        ];
        assert!(readings(&now_and_then).step_need(0, 0, None).is_none());
        // Too few readings to say.
        assert!(readings(&blocks[..5]).step_need(0, 0, None).is_none());
    }

    /// The iteration at the error held and asked far more than any before it (one request much longer than the
    /// others): it outgrew them, whatever the counter did before. An error at the need of the earlier ones, or a
    /// little past it, is no such thing.
    #[test]
    fn the_iteration_at_the_error_outgrew_the_rest() {
        let r = readings(&[300, 300, 310, 310]);
        let n = r.step_need(0, 0, Some(1900 << 20)).expect("outgrew");
        assert!(n.outgrew);
        assert_eq!(
            (n.first_step, n.first_peak, n.last_peak),
            (4, 310 << 20, 1900 << 20)
        );
        // Half again more is not enough without 64 MiB more, nor 64 MiB more without half again.
        assert!(r.step_need(0, 0, Some(460 << 20)).is_none());
        let big = readings(&[4000, 4000, 4000, 4000]);
        assert!(big.step_need(0, 0, Some(4100 << 20)).is_none());
        // Two boundaries are too few to know what the iterations need.
        assert!(readings(&[300, 300])
            .step_need(0, 0, Some(1900 << 20))
            .is_none());
    }

    /// The case: a GPT-2 step's activations live between two samples; PyTorch's counter has them.
    #[test]
    fn a_peak_between_samples_is_the_allocators_own() {
        let mut r = FwReplay::default();
        r.on_sample(0, &sample(7, 0, 2 * GIB, 9 * GIB), 10);
        feed(&mut r, 0, peak(7, 8 * GIB, 9 * GIB), 20);
        r.on_sample(0, &sample(7, 0, 3 * GIB, 9 * GIB), 30);
        assert_eq!(
            finished(r),
            ((8 * GIB, 9 * GIB), (8 * GIB, 9 * GIB, Some(20)))
        );
    }

    /// `reset_peak_memory_stats()` takes PyTorch's counter back; the run's peak stays what it was, from any of
    /// the records that carry the counters.
    #[test]
    fn a_reset_counter_never_lowers_the_peak() {
        let mut r = FwReplay::default();
        r.on_sample(0, &sample(7, 0, GIB, 2 * GIB), 10);
        feed(&mut r, 0, peak(7, 5 * GIB, 6 * GIB), 20);
        feed(&mut r, 0, reading(7, 3, 2 * GIB, 2 * GIB), 30);
        let exit = [
            ("allocated", GIB),
            ("allocated_peak", 3 * GIB),
            ("reserved_peak", 3 * GIB),
        ];
        feed(&mut r, 0, record(7, what::EXIT, 0, &exit), 40);
        assert_eq!(
            finished(r),
            ((5 * GIB, 6 * GIB), (5 * GIB, 6 * GIB, Some(20)))
        );
    }

    /// A boundary reading's peaks and an out-of-memory record's raise the figures as a `peak` record does;
    /// they are placed in time (and in the timeline) only from a bridge that sends `peak` records: an earlier
    /// one sent them at an error only, which may come long after the peak.
    #[test]
    fn steps_exit_and_oom_records_carry_peaks_too() {
        let oom = [
            ("allocated", GIB),
            ("allocated_peak", 6 * GIB),
            ("reserved_peak", 7 * GIB),
        ];
        let mut r = FwReplay::default();
        r.on_sample(0, &sample(7, 0, GIB, 2 * GIB), 10);
        feed(&mut r, 0, peak(7, GIB, 2 * GIB), 10);
        feed(&mut r, 0, reading(7, 1, 4 * GIB, 5 * GIB), 20);
        assert!(matches!(
            feed(&mut r, 0, record(7, what::OOM, 0, &oom), 30),
            Some(Told::Oom(_))
        ));
        let (procs, devs, _) = r.finish(1_000);
        assert_eq!(
            (procs[&0][0].peak_allocated, procs[&0][0].peak_reserved),
            (6 * GIB, 7 * GIB)
        );
        let d = &devs[0];
        assert_eq!(
            (d.peak_allocated, d.peak_reserved, d.peak_allocated_time_ns),
            (6 * GIB, 7 * GIB, Some(30))
        );
        assert_eq!(d.allocated.max_between(0, 1_000), Some(6 * GIB));
        assert_eq!(d.reserved.max_between(0, 1_000), Some(7 * GIB));

        // An earlier bridge's error: PyTorch's peak, at a time not known.
        let mut r = FwReplay::default();
        r.on_sample(0, &sample(7, 0, GIB, 2 * GIB), 10);
        assert!(matches!(
            feed(&mut r, 0, record(7, what::OOM, 0, &oom), 30),
            Some(Told::Oom(_))
        ));
        let (_, devs, _) = r.finish(1_000);
        let d = &devs[0];
        assert_eq!(
            (d.peak_allocated, d.peak_reserved, d.peak_allocated_time_ns),
            (6 * GIB, 7 * GIB, None)
        );
        assert_eq!(d.allocated.max_between(0, 1_000), Some(GIB));

        // JAX says `peak_bytes_in_use` at exit.
        let mut r = FwReplay::default();
        let mut s = sample(8, 0, GIB, 2 * GIB);
        s.framework = Framework::Jax;
        r.on_sample(0, &s, 10);
        let exit = [("peak_bytes_in_use", 3 * GIB)];
        feed(&mut r, 0, record(8, what::EXIT, 0, &exit), 20);
        assert_eq!(finished(r), ((3 * GIB, 2 * GIB), (3 * GIB, 2 * GIB, None)));
    }

    /// Several processes on one device: the job's sum with the one at its peak and the others at their last
    /// figures, as the samples are summed; a process's own peak is its own.
    #[test]
    fn a_device_shared_by_processes_sums_one_peak_with_the_others_last_figures() {
        let mut r = FwReplay::default();
        r.on_sample(0, &sample(7, 0, GIB, 2 * GIB), 10);
        r.on_sample(1, &sample(9, 0, 2 * GIB, 3 * GIB), 11);
        feed(&mut r, 1, peak(9, 5 * GIB, 6 * GIB), 20);
        let (procs, devs, _) = r.finish(1_000);
        assert_eq!(procs[&1][0].peak_allocated, 5 * GIB);
        assert_eq!(procs[&0][0].peak_allocated, GIB);
        assert_eq!(
            (devs[0].peak_allocated, devs[0].peak_reserved),
            (6 * GIB, 8 * GIB)
        );
    }

    /// Peaks for a device the process sent no sample for (none reserved there) make no figures of their own.
    #[test]
    fn peaks_without_samples_make_nothing() {
        let mut r = FwReplay::default();
        feed(&mut r, 0, peak(7, 5 * GIB, 6 * GIB), 20);
        let (procs, devs, _) = r.finish(1_000);
        assert!(procs.is_empty() && devs.is_empty());
    }
}
