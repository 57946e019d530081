//! Each process's calls, counted as the replay decides them: releases (matched, naming nothing, or of memory
//! already replaced), refusals (the driver's, out-of-memory ones, the cap's, and those the program recovered
//! from), allocations the cap let past in its warning mode, events its shim dropped, what its torn-down contexts
//! freed, and its address space (reserved and mapped) with their peaks. An observer of the core's decisions, by
//! process slot: the core says what happened, this keeps the count. Allocations and the bytes they move are the
//! memory observers' (`memory.rs`).

use vramtrace_format::Api;

/// One process's counts.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calls {
    pub frees: u64,
    pub unmatched_frees: u64,
    /// Allocations at an address still live in the book: the release between them never reached the trace.
    pub lost_frees: u64,
    pub failed_allocations: u64,
    pub oom_results: u64,
    pub recovered_refusals: u64,
    pub cap_refusals: u64,
    pub cap_exceeded: u64,
    pub dropped_events: u64,
    pub context_freed_bytes: u64,
    pub address_reserved_peak_bytes: u64,
    pub mapped_peak_bytes: u64,
    /// Address space reserved and mapped now.
    reserved: u64,
    mapped: u64,
}

impl Calls {
    fn reserve(&mut self, size: u64) {
        self.reserved = self.reserved.saturating_add(size);
        self.address_reserved_peak_bytes = self.address_reserved_peak_bytes.max(self.reserved);
    }

    fn map(&mut self, size: u64) {
        self.mapped = self.mapped.saturating_add(size);
        self.mapped_peak_bytes = self.mapped_peak_bytes.max(self.mapped);
    }
}

/// One GPU's refusals and errors, all processes.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCalls {
    /// The driver's out-of-memory refusals (its records), recovered from or not.
    pub refusals: u64,
    pub cap_refusals: u64,
    /// Out-of-memory errors: refusals never recovered from, and the frameworks' own.
    pub errors: u64,
}

/// Every process's counts, by slot, and each GPU's refusals and errors.
#[derive(Default)]
pub struct CallCounts {
    procs: Vec<Calls>,
    /// By GPU ordinal; `None`: on no GPU, or on one the shim could not tell.
    devices: std::collections::BTreeMap<Option<u32>, DeviceCalls>,
}

impl CallCounts {
    /// The next slot has counts (all zero).
    pub fn add_process(&mut self) {
        self.procs.push(Calls::default());
    }

    pub fn get(&self, s: usize) -> &Calls {
        &self.procs[s]
    }

    /// The job's total of one count.
    pub fn total(&self, count: impl Fn(&Calls) -> u64) -> u64 {
        self.procs
            .iter()
            .fold(0u64, |n, c| n.saturating_add(count(c)))
    }

    /// A release that found its allocation.
    #[inline(always)]
    pub fn freed(&mut self, s: usize) {
        self.procs[s].frees += 1;
    }

    /// A release that named nothing live (a double free, a wrong pointer, an allocation never recorded).
    pub fn unmatched(&mut self, s: usize) {
        self.procs[s].unmatched_frees += 1;
    }

    /// An allocation at an address still live: the release between them was lost.
    pub fn lost(&mut self, s: usize) {
        self.procs[s].lost_frees += 1;
    }

    /// The driver refused a release the replay had applied: it was none. `matched`: it had found its allocation
    /// (now live again), else it had counted as unmatched.
    pub fn release_undone(&mut self, s: usize, matched: bool) {
        let c = &mut self.procs[s];
        if matched {
            c.frees = c.frees.saturating_sub(1);
        } else {
            c.unmatched_frees = c.unmatched_frees.saturating_sub(1);
        }
    }

    /// Each GPU's refusals and errors (`None`: on no GPU), in the order of their ordinals.
    pub fn devices(&self) -> impl Iterator<Item = (Option<u32>, &DeviceCalls)> {
        self.devices.iter().map(|(g, c)| (*g, c))
    }

    /// An allocation on GPU `device` refused (`oom`: with the driver's out-of-memory result; `by_cap`: by the
    /// cap).
    pub fn refused(&mut self, s: usize, device: Option<u32>, oom: bool, by_cap: bool) {
        let c = &mut self.procs[s];
        c.failed_allocations += 1;
        c.oom_results += oom as u64;
        c.cap_refusals += by_cap as u64;
        if by_cap {
            self.devices.entry(device).or_default().cap_refusals += 1;
        }
    }

    /// The driver's (or the cap's) out-of-memory record of a refusal on GPU `device`.
    pub fn refusal(&mut self, device: Option<u32>) {
        self.devices.entry(device).or_default().refusals += 1;
    }

    /// An out-of-memory error on GPU `device`, decided.
    pub fn error(&mut self, device: Option<u32>) {
        self.devices.entry(device).or_default().errors += 1;
    }

    /// An out-of-memory refusal the program went on from.
    pub fn recovered(&mut self, s: usize) {
        self.procs[s].recovered_refusals += 1;
    }

    /// An allocation past the cap, let through (the cap's warning mode).
    #[inline(always)]
    pub fn cap_exceeded(&mut self, s: usize) {
        self.procs[s].cap_exceeded += 1;
    }

    /// `count` events its shim could not record.
    pub fn dropped(&mut self, s: usize, count: u64) {
        let c = &mut self.procs[s];
        c.dropped_events = c.dropped_events.saturating_add(count);
    }

    /// A context torn down freed `bytes` of its allocations.
    pub fn context_freed(&mut self, s: usize, bytes: u64) {
        let c = &mut self.procs[s];
        c.context_freed_bytes = c.context_freed_bytes.saturating_add(bytes);
    }

    /// An address-space call of `size` bytes that the driver did (`done`), or refused after it was published
    /// (`undone`: a refused unmap or address free, taken back). Other calls change nothing here.
    pub fn address_space(&mut self, s: usize, api: Api, size: u64, done: bool, undone: bool) {
        let c = &mut self.procs[s];
        match (api, done, undone) {
            (Api::MemAddressReserve, true, _) | (Api::MemAddressFree, false, true) => {
                c.reserve(size)
            }
            (Api::MemMap, true, _) | (Api::MemUnmap, false, true) => c.map(size),
            (Api::MemAddressFree, true, _) => c.reserved = c.reserved.saturating_sub(size),
            (Api::MemUnmap, true, _) => c.mapped = c.mapped.saturating_sub(size),
            // Any other call, or one the driver refused: nothing changed.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_release_is_taken_back_from_what_it_counted() {
        let mut c = CallCounts::default();
        c.add_process();
        c.add_process();
        c.freed(1);
        c.freed(1);
        c.unmatched(1);
        c.release_undone(1, true);
        c.release_undone(1, false);
        let p = c.get(1);
        assert_eq!((p.frees, p.unmatched_frees), (1, 0));
        assert_eq!(c.get(0), &Calls::default());
        c.unmatched(0);
        assert_eq!(c.total(|p| p.unmatched_frees), 1);
    }

    #[test]
    fn refusals_are_counted_by_kind() {
        let mut c = CallCounts::default();
        c.add_process();
        c.refused(0, Some(1), true, false);
        c.refused(0, Some(1), true, true);
        c.refused(0, None, false, false);
        c.refusal(Some(1));
        c.error(None);
        c.recovered(0);
        let p = c.get(0);
        assert_eq!(
            (
                p.failed_allocations,
                p.oom_results,
                p.cap_refusals,
                p.recovered_refusals
            ),
            (3, 2, 1, 1)
        );
        let by_device: Vec<_> = c.devices().map(|(g, d)| (g, *d)).collect();
        assert_eq!(
            by_device,
            vec![
                (
                    None,
                    DeviceCalls {
                        errors: 1,
                        ..DeviceCalls::default()
                    }
                ),
                (
                    Some(1),
                    DeviceCalls {
                        refusals: 1,
                        cap_refusals: 1,
                        errors: 0
                    }
                ),
            ]
        );
    }

    #[test]
    fn address_space_peaks_follow_what_the_driver_did() {
        let mut c = CallCounts::default();
        c.add_process();
        c.address_space(0, Api::MemAddressReserve, 100, true, false);
        c.address_space(0, Api::MemMap, 40, true, false);
        c.address_space(0, Api::MemMap, 40, true, false);
        c.address_space(0, Api::MemUnmap, 40, true, false);
        // A refused unmap, published first: the mapping stands again.
        c.address_space(0, Api::MemUnmap, 40, false, true);
        c.address_space(0, Api::MemMap, 10, true, false);
        // A refused map, and a refused reserve: nothing happened.
        c.address_space(0, Api::MemMap, 1_000, false, false);
        c.address_space(0, Api::MemAddressReserve, 1_000, false, true);
        c.address_space(0, Api::MemAddressFree, 100, true, false);
        c.address_space(0, Api::MemAddressFree, 100, false, true);
        c.address_space(0, Api::MemAddressReserve, 50, true, false);
        let p = c.get(0);
        assert_eq!(
            (p.mapped_peak_bytes, p.address_reserved_peak_bytes),
            (90, 150)
        );
    }
}
