//! Replays the histories of a job's processes together, in time order, each through its own model of PyTorch's
//! allocator, against one limit per device (the job-wide cap, or the device's memory): a process's segment is
//! refused when the job's reserve on that device, with what the processes hold outside PyTorch's allocator, would
//! pass it, as the cap's ledger refuses it.

use std::collections::{BTreeMap, BTreeSet};

use super::async_pool::AsyncPool;
use super::history::{History, Op};
use super::native::{Model, Outcome};
use super::settings::{Backend, Settings};

/// One allocator model, of either backend.
pub enum Allocator {
    Native(Box<Model>),
    Async(AsyncPool),
}

impl Allocator {
    /// A model placing its segments at `addresses` ((size, address) in the order a run made them: a history's
    /// own, where its run's were, or another run's).
    pub fn placed(settings: &Settings, device_total: u64, addresses: &[(u64, u64)]) -> Allocator {
        let mut a = Allocator::new(settings, device_total);
        if let Allocator::Native(m) = &mut a {
            m.hint_addresses(addresses);
        }
        a
    }

    pub fn new(settings: &Settings, device_total: u64) -> Allocator {
        match settings.backend {
            Backend::Native => {
                Allocator::Native(Box::new(Model::new(settings.clone(), device_total)))
            }
            Backend::CudaMallocAsync => Allocator::Async(AsyncPool::default()),
        }
    }

    pub fn malloc(&mut self, id: u64, size: u64, stream: u64, room: u64) -> bool {
        match self {
            Allocator::Native(m) => m.malloc(id, size, stream, room),
            Allocator::Async(p) => p.malloc(id, size, room),
        }
    }

    pub fn free(&mut self, id: u64) {
        match self {
            Allocator::Native(m) => m.free(id),
            Allocator::Async(p) => p.free(id),
        }
    }

    pub fn release_cached(&mut self) {
        match self {
            Allocator::Native(m) => m.release_cached(),
            Allocator::Async(p) => p.release_cached(),
        }
    }

    pub fn reserved(&self) -> u64 {
        match self {
            Allocator::Native(m) => m.reserved(),
            Allocator::Async(p) => p.reserved(),
        }
    }

    pub fn allocated(&self) -> u64 {
        match self {
            Allocator::Native(m) => m.allocated(),
            Allocator::Async(p) => p.allocated(),
        }
    }

    pub fn outcome(&self) -> &Outcome {
        match self {
            Allocator::Native(m) => m.outcome(),
            Allocator::Async(p) => p.outcome(),
        }
    }
}

/// The job's histories, merged in time order once for every replay.
pub struct Job<'a> {
    pub histories: &'a [History],
    /// Bytes each history's process holds on its device outside PyTorch's allocator (counted against limits).
    pub outside: Vec<u64>,
    /// Each device's memory (what expandable segments reserve address space for, and fractions are of).
    pub device_total: BTreeMap<u32, u64>,
    /// Per device, bytes held by the job's processes that have no history (at most), counted against limits.
    pub others: BTreeMap<u32, u64>,
    order: Vec<(u32, u32)>,
    /// Per history, the segment addresses its model places segments at, where not the history's own
    /// ([`Job::with_addresses`]).
    addresses: Option<Vec<&'a [(u64, u64)]>>,
}

/// The first request a replay refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub history: usize,
    pub entry: usize,
    pub t_us: u64,
    pub size: u64,
    pub site: u32,
    /// The job's reserve on the device, with what is held outside PyTorch, when it was refused.
    pub job_bytes: u64,
    /// It was the request the run itself failed (an `oom` entry).
    pub the_runs_own: bool,
}

/// What one replay of the job gave.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    pub outcomes: Vec<Outcome>,
    /// Per device: the job's most bytes at once (reserves plus what is held outside), and of them allocated.
    pub device_peak: BTreeMap<u32, u64>,
    pub device_allocated_peak: BTreeMap<u32, u64>,
    pub first_failure: Option<Failure>,
    pub failed_devices: BTreeSet<u32>,
    pub failures: u64,
    /// The run's own out-of-memory requests this replay got through.
    pub passed_run_ooms: u64,
}

/// An id no history uses, for the run's failed requests.
const PHANTOM: u64 = u64::MAX;

impl<'a> Job<'a> {
    pub fn new(
        histories: &'a [History],
        outside: Vec<u64>,
        device_total: BTreeMap<u32, u64>,
        others: BTreeMap<u32, u64>,
    ) -> Job<'a> {
        let mut order: Vec<(u64, u32, u32)> =
            Vec::with_capacity(histories.iter().map(|h| h.entries.len()).sum());
        for (h, hist) in histories.iter().enumerate() {
            for (i, e) in hist.entries.iter().enumerate() {
                order.push((e.t_us, h as u32, i as u32));
            }
        }
        // Stable: a history's own entries keep their order when their times tie.
        order.sort_by_key(|&(t, h, _)| (t, h));
        Job {
            histories,
            outside,
            device_total,
            others,
            order: order.into_iter().map(|(_, h, i)| (h, i)).collect(),
            addresses: None,
        }
    }

    /// The same job with history `i`'s segments placed at `addresses[i]` (another run's), not its own: how much
    /// where the driver put them moves the reserve (`whatif::batch::addresses`).
    pub fn with_addresses(mut self, addresses: Vec<&'a [(u64, u64)]>) -> Job<'a> {
        self.addresses = Some(addresses);
        self
    }

    pub fn devices(&self) -> BTreeSet<u32> {
        self.histories.iter().map(|h| h.device).collect()
    }

    fn total(&self, device: u32) -> u64 {
        self.device_total.get(&device).copied().unwrap_or(0)
    }

    /// Replays every history, history `i` under `settings(i)`, against `limits` (a device absent: no limit).
    pub fn replay(
        &self,
        settings: &dyn Fn(usize) -> Settings,
        limits: &BTreeMap<u32, u64>,
    ) -> Replayed {
        self.replay_until(settings, limits, None)
    }

    /// [`Job::replay`], stopping once every device of `watch` has refused a request (the search for a smallest
    /// limit asks only that: a too-small limit fails early, in the run's first steps, most of the time). Its
    /// figures are then those up to there.
    pub fn replay_until(
        &self,
        settings: &dyn Fn(usize) -> Settings,
        limits: &BTreeMap<u32, u64>,
        watch: Option<&[u32]>,
    ) -> Replayed {
        let n = self.histories.len();
        let mut models: Vec<Allocator> = (0..n)
            .map(|i| {
                Allocator::placed(
                    &settings(i),
                    self.total(self.histories[i].device),
                    self.addresses
                        .as_ref()
                        .and_then(|a| a.get(i).copied())
                        .unwrap_or(&self.histories[i].segment_addresses),
                )
            })
            .collect();
        let devices: Vec<u32> = self.histories.iter().map(|h| h.device).collect();
        let width = devices.iter().copied().max().map_or(0, |d| d as usize + 1);
        let mut reserved = vec![0u64; width];
        let mut allocated = vec![0u64; width];
        let mut outside = vec![0u64; width];
        for (i, &d) in devices.iter().enumerate() {
            outside[d as usize] =
                outside[d as usize].saturating_add(self.outside.get(i).copied().unwrap_or(0));
        }
        for (&d, &b) in &self.others {
            if let Some(o) = outside.get_mut(d as usize) {
                *o = o.saturating_add(b);
            }
        }
        let limit: Vec<u64> = (0..width)
            .map(|d| limits.get(&(d as u32)).copied().unwrap_or(u64::MAX))
            .collect();
        let mut out = Replayed::default();
        let mut peak = outside.clone();
        let mut apeak = outside.clone();
        for &(h, i) in &self.order {
            let (h, i) = (h as usize, i as usize);
            let d = devices[h] as usize;
            let m = &mut models[h];
            let (r0, a0) = (m.reserved(), m.allocated());
            // What the driver (or the cap) leaves this process: the limit less everyone else's share.
            let others = outside[d].saturating_add(reserved[d].saturating_sub(r0));
            let room = limit[d].saturating_sub(others);
            let e = &self.histories[h].entries[i];
            let refused = match e.op {
                Op::Alloc { id, size, stream } => {
                    (!m.malloc(id, size, stream, room)).then_some((size, false))
                }
                Op::Free { id } => {
                    m.free(id);
                    None
                }
                Op::EmptyCache => {
                    m.release_cached();
                    None
                }
                Op::Oom { size, stream } => {
                    if m.malloc(PHANTOM, size, stream, room) {
                        // It fits here; the run got an error instead, so the block is not kept.
                        m.free(PHANTOM);
                        out.passed_run_ooms += 1;
                        None
                    } else {
                        Some((size, true))
                    }
                }
            };
            reserved[d] = reserved[d].saturating_sub(r0).saturating_add(m.reserved());
            allocated[d] = allocated[d]
                .saturating_sub(a0)
                .saturating_add(m.allocated());
            peak[d] = peak[d].max(reserved[d].saturating_add(outside[d]));
            apeak[d] = apeak[d].max(allocated[d].saturating_add(outside[d]));
            if let Some((size, the_runs_own)) = refused {
                out.failures += 1;
                out.failed_devices.insert(d as u32);
                if out.first_failure.is_none() {
                    out.first_failure = Some(Failure {
                        history: h,
                        entry: i,
                        t_us: e.t_us,
                        size,
                        site: e.site,
                        job_bytes: reserved[d].saturating_add(outside[d]),
                        the_runs_own,
                    });
                }
                if watch.is_some_and(|w| w.iter().all(|x| out.failed_devices.contains(x))) {
                    break;
                }
            }
        }
        for d in self.devices() {
            out.device_peak.insert(d, peak[d as usize]);
            out.device_allocated_peak.insert(d, apeak[d as usize]);
        }
        out.outcomes = models.iter().map(|m| m.outcome().clone()).collect();
        out
    }

    /// The smallest limit per device under which every request gets through (the run's own failed ones too),
    /// found by bisection between the allocated peak and the unlimited replay's peak, to 0.5% or 2 MiB. Tried
    /// values are checked by replay; the answer is one that fitted.
    /// `tried`: a replay under some limits already done, which brackets the search.
    pub fn smallest_limits(
        &self,
        settings: &dyn Fn(usize) -> Settings,
        unlimited: &Replayed,
        tried: Option<(&Replayed, &BTreeMap<u32, u64>)>,
    ) -> BTreeMap<u32, u64> {
        let mut lo: BTreeMap<u32, u64> = unlimited
            .device_allocated_peak
            .iter()
            .map(|(&d, &a)| (d, a.saturating_sub(1)))
            .collect();
        let mut hi: BTreeMap<u32, u64> = unlimited.device_peak.clone();
        if let Some((r, limits)) = tried {
            for (&d, &l) in limits {
                if r.failed_devices.contains(&d) {
                    if let Some(x) = lo.get_mut(&d) {
                        *x = (*x).max(l);
                    }
                } else if let Some(x) = hi.get_mut(&d) {
                    *x = (*x).min(l);
                }
            }
        }
        for _ in 0..24 {
            let open: Vec<u32> = hi
                .iter()
                .filter(|(d, &h)| {
                    let l = lo.get(d).copied().unwrap_or(0);
                    h > l && h - l > (2 << 20).max(h / 200)
                })
                .map(|(&d, _)| d)
                .collect();
            if open.is_empty() {
                break;
            }
            let mid: BTreeMap<u32, u64> = hi
                .iter()
                .map(|(&d, &h)| {
                    let l = lo.get(&d).copied().unwrap_or(0);
                    (
                        d,
                        if open.contains(&d) {
                            l + (h - l) / 2
                        } else {
                            h
                        },
                    )
                })
                .collect();
            let r = self.replay_until(settings, &mid, Some(&open));
            for d in open {
                if r.failed_devices.contains(&d) {
                    lo.insert(d, mid[&d]);
                } else {
                    hi.insert(d, mid[&d]);
                }
            }
        }
        hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::whatif::history::{Entry, NO_SITE};

    const MIB: u64 = 1 << 20;

    fn hist(pid: u32, device: u32, ops: &[(u64, Op)]) -> History {
        History {
            pid,
            device,
            entries: ops
                .iter()
                .map(|&(t_us, op)| Entry {
                    t_us,
                    op,
                    site: NO_SITE,
                })
                .collect(),
            ..History::default()
        }
    }

    fn alloc(id: u64, mib: u64) -> Op {
        Op::Alloc {
            id,
            size: mib * MIB,
            stream: 0,
        }
    }

    #[test]
    fn processes_on_one_device_share_its_limit_in_time_order() {
        // Two processes on GPU 0, 60 MiB each at different times; the first frees its tensor (cached, whole)
        // before the second asks. Unlimited, the job peaks at 120 MiB (the cache is kept). Under 100 MiB the
        // second's segment is refused, the flush is its own (it has nothing cached), so it fails: the cap is
        // job-wide and the other's cache is not its to free. A process on GPU 1 is not counted against GPU 0.
        let hs = vec![
            hist(1, 0, &[(10, alloc(1, 60)), (20, Op::Free { id: 1 })]),
            hist(2, 0, &[(30, alloc(1, 60))]),
            hist(3, 1, &[(5, alloc(1, 90))]),
        ];
        let job = Job::new(&hs, vec![0, 0, 0], BTreeMap::new(), BTreeMap::new());
        let d = |_: usize| Settings::default();
        let free = job.replay(&d, &BTreeMap::new());
        assert_eq!(free.device_peak[&0], 120 * MIB);
        assert_eq!(free.device_peak[&1], 90 * MIB);
        let capped = job.replay(&d, &BTreeMap::from([(0, 100 * MIB), (1, 100 * MIB)]));
        let f = capped.first_failure.unwrap();
        assert_eq!(
            (f.history, f.entry, f.size, f.job_bytes),
            (1, 0, 60 * MIB, 60 * MIB)
        );
        assert_eq!(capped.failed_devices, BTreeSet::from([0]));
        // The smallest caps: 120 MiB on GPU 0 (within 2 MiB), 90 MiB on GPU 1.
        let small = job.smallest_limits(&d, &free, None);
        assert!(
            small[&0] >= 120 * MIB - 2 * MIB && small[&0] <= 120 * MIB,
            "{}",
            small[&0]
        );
        assert!(small[&1] >= 88 * MIB && small[&1] <= 90 * MIB);
        // With empty_cache in the first process, 60 MiB fits.
        let hs2 = vec![
            hist(
                1,
                0,
                &[
                    (10, alloc(1, 60)),
                    (20, Op::Free { id: 1 }),
                    (21, Op::EmptyCache),
                ],
            ),
            hist(2, 0, &[(30, alloc(1, 60))]),
        ];
        let job2 = Job::new(&hs2, vec![0, 0], BTreeMap::new(), BTreeMap::new());
        let r = job2.replay(&d, &BTreeMap::from([(0, 100 * MIB)]));
        assert!(r.first_failure.is_none());
        assert_eq!(r.device_peak[&0], 60 * MIB);
    }

    #[test]
    fn bytes_outside_the_allocator_count_against_the_limit_and_the_runs_own_failure_is_tried() {
        // 40 MiB outside PyTorch, a 50 MiB tensor, then the run's own refused 30 MiB request. Under 100 MiB:
        // 40 + 50 + 30 = 120 fails again (the run's own); under 130 it gets through and is not kept.
        let hs = vec![hist(
            1,
            0,
            &[
                (1, alloc(1, 50)),
                (
                    2,
                    Op::Oom {
                        size: 30 * MIB,
                        stream: 0,
                    },
                ),
                (3, alloc(2, 10)),
            ],
        )];
        let job = Job::new(&hs, vec![40 * MIB], BTreeMap::new(), BTreeMap::new());
        let d = |_: usize| Settings::default();
        let r = job.replay(&d, &BTreeMap::from([(0, 100 * MIB)]));
        assert!(r.first_failure.as_ref().unwrap().the_runs_own);
        let r = job.replay(&d, &BTreeMap::from([(0, 130 * MIB)]));
        assert!(r.first_failure.is_none());
        assert_eq!(r.passed_run_ooms, 1);
        // The 30 MiB segment stays cached after its phantom tensor is gone, and the 10 MiB request is carved
        // from it: 40 + 50 + 30.
        assert_eq!(r.device_peak[&0], 120 * MIB);
    }
}
