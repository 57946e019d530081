//! Replaying one event: what an allocation, a free, a refusal or an address-space call changes.

use super::*;

impl Replay<'_> {
    #[inline]
    pub(super) fn dev_index(&mut self, device: u32) -> usize {
        if let Some(&i) = self.dev_ids.get(&device) {
            return i;
        }
        if device >= crate::model::analysis::MAX_DEVICE_ORDINAL
            && device != NO_DEVICE
            && device != HOST_DEVICE
        {
            self.implausible_devices += 1;
            return self.dev_index(NO_DEVICE);
        }
        self.dev_ids.insert(device, self.devs.len());
        self.devs.push(Dev {
            device,
            info: None,
            room: None,
            oom_total: None,
            oom_cap: None,
        });
        self.mem.add_device();
        self.devs.len() - 1
    }

    /// [`Replay::dev_index`] for an allocation of process `s`, through its hint.
    #[inline(always)]
    pub(super) fn dev_of(&mut self, s: usize, device: u32) -> usize {
        let (hinted, i) = self.procs[s].dev_hint;
        if hinted == device && i < self.devs.len() {
            return i;
        }
        let i = self.dev_index(device);
        self.procs[s].dev_hint = (device, i);
        i
    }

    #[inline]
    pub(super) fn apply(&mut self, s: usize, e: &Event) {
        let t = self.rel(e.ts_ns);
        match book::act(e) {
            Act::Alloc { handle, device } => self.alloc(s, e, handle, device, t),
            Act::Free { handle } => self.free(s, e, handle, t),
            Act::Refused { device } => self.refused(s, e, device),
            Act::Undo { handle } => self.undo_release(s, e.tid, e.addr, handle, t),
            Act::None => match e.api.effect() {
                Effect::AddressSpace => self.address_space(s, e, t),
                Effect::Info if e.result == 0 => {
                    let d = self.dev_index(e.device);
                    self.devs[d].info = Some((e.addr, e.size));
                    let held = self.mem.peaks.get(d).cur;
                    self.devs[d].room = Some(e.size.saturating_add(held).min(e.addr));
                }
                // A refused query says nothing; a release the driver refused with nothing published changes no
                // allocation (`book::act`).
                Effect::Info
                | Effect::AllocPtr
                | Effect::FreePtr
                | Effect::CreateHandle
                | Effect::ReleaseHandle => {}
            },
        }
    }

    /// A successful allocation (`handle`: a `cuMemCreate`) of process `s` on `device`.
    #[inline(always)]
    pub(super) fn alloc(&mut self, s: usize, e: &Event, handle: bool, device: u32, t: u64) {
        if e.flags & flags::CAP_EXCEEDED != 0 {
            self.calls.cap_exceeded(s);
        }
        if self.procs[s].open_oom {
            self.recovered(s, e.tid, device, t);
        }
        let d = self.dev_of(s, device);
        let site = if e.stack != 0 {
            self.cs.site_for(
                &mut self.procs[s].cs,
                &mut self.mem.sites,
                s,
                e.stack,
                d as u16,
            )
        } else {
            NO_SITE
        };
        let live = Live {
            size: e.size,
            ts: t,
            tid: e.tid,
            site,
            dev: d as u16,
            api: e.api,
            flags: e.flags,
        };
        let p = &mut self.procs[s];
        if let Some(old) = p.book.alloc(handle, e.addr, live) {
            self.calls.lost(s);
            self.take(s, &old, t);
            self.tap_live(Change::Free, s, handle, e.addr, &old, t);
        }
        self.give(s, d, e.size, t, site);
        if self.tap.is_some() {
            self.tap_step(
                Change::Alloc,
                s,
                d,
                handle,
                e.addr,
                e.size,
                e.stack,
                e.flags,
                t,
                false,
            );
        }
    }

    /// A successful release of a pointer or (`handle`) a handle by process `s`.
    #[inline(always)]
    pub(super) fn free(&mut self, s: usize, e: &Event, handle: bool, t: u64) {
        // `cuMemFree(0)` is the driver's no-op, as `free(NULL)` is libc's: PyTorch calls it (seen on every real
        // trace, twice a process), and it names no allocation that went unrecorded.
        if e.addr == 0 && !handle {
            return;
        }
        let p = &mut self.procs[s];
        match p.book.free(e.tid, handle, e.addr) {
            Some(old) => {
                self.calls.freed(s);
                self.take(s, &old, t);
                self.tap_live(Change::Free, s, handle, e.addr, &old, t);
                if e.api == Api::MemFreeAsync {
                    self.mem.recent_frees.freed(old.dev as usize, t, old.size);
                }
            }
            None => self.calls.unmatched(s),
        }
    }

    /// An allocation the driver or the cap refused.
    pub(super) fn refused(&mut self, s: usize, e: &Event, device: u32) {
        if e.stack != 0 {
            let d = self.dev_index(device);
            let site = self.cs.site_for(
                &mut self.procs[s].cs,
                &mut self.mem.sites,
                s,
                e.stack,
                d as u16,
            );
            self.procs[s].last_failed = Some((e.tid, e.size, site));
        }
        self.calls.refused(
            s,
            ordinal(device),
            e.result == CUDA_OOM,
            e.flags & flags::CAP_REFUSED != 0,
        );
    }

    /// Address reservations and mappings (`cuMemAddressReserve`, `cuMemMap`...): their own figures, no
    /// allocation.
    pub(super) fn address_space(&mut self, s: usize, e: &Event, t: u64) {
        let done = e.result == 0;
        self.calls
            .address_space(s, e.api, e.size, done, e.flags & flags::UNDONE != 0);
        if done && self.tap.is_some() && matches!(e.api, Api::MemMap | Api::MemUnmap) {
            self.tap_map(s, e, t);
        }
    }

    /// What a change of `size` bytes on device index `d` by process `s` at `t` is to the observers.
    #[inline(always)]
    pub(super) fn change(
        &self,
        s: usize,
        d: usize,
        size: u64,
        t: u64,
        site: u32,
    ) -> memory::Change {
        memory::Change {
            slot: s,
            dev: d,
            size,
            t,
            site,
            on_host: self.devs[d].device == HOST_DEVICE,
        }
    }

    /// `size` bytes allocated on device `d` by process `s`. Inlined (as `take`): once per event.
    #[inline(always)]
    pub(super) fn give(&mut self, s: usize, d: usize, size: u64, t: u64, site: u32) {
        let c = self.change(s, d, size, t, site);
        self.mem.give(c);
    }

    #[inline(always)]
    pub(super) fn take(&mut self, s: usize, l: &Live, t: u64) {
        let c = self.change(s, l.dev as usize, l.size, t, l.site);
        self.mem.take(c);
    }
}

/// Releases the driver refused ([`book::Undone`]): the replay's side.
impl Replay<'_> {
    /// The driver refused thread `tid`'s release of `addr` in process `s`, at `t` (relative ns): what the release
    /// took out is live again, as if it had never been released.
    pub(super) fn undo_release(&mut self, s: usize, tid: u32, addr: u64, handle: bool, t: u64) {
        let p = &mut self.procs[s];
        let l = match p.book.undo(tid, handle, addr) {
            Undone::Back(l) => l,
            Undone::Nothing => {
                // Nothing was live there (a double free, a wrong pointer): the unmatched free it counted was none.
                self.calls.release_undone(s, false);
                return;
            }
            Undone::Stale => return,
        };
        self.calls.release_undone(s, true);
        self.give(s, l.dev as usize, l.size, t, l.site);
        // Back, not allocated anew: the counts of allocations stay as they were.
        let c = self.change(s, l.dev as usize, l.size, t, l.site);
        self.mem.uncount(c);
        let d = l.dev as usize;
        if self.tap.is_some() {
            // Live again, not a new allocation (the live metrics count allocations).
            let stack = self.site_stack(l.site);
            self.tap_step(Change::Alloc, s, d, handle, addr, l.size, stack, 0, t, true);
        }
    }
}
