//! Telling the tap of each change, as it is applied, with the figures of that moment.

use super::*;

impl Replay<'_> {
    /// Tells the tap of a change to allocation `l` (already applied). Inlined down to the check: a report has
    /// no tap, and this is on every free's path.
    #[inline(always)]
    pub(super) fn tap_live(
        &mut self,
        change: Change,
        s: usize,
        handle: bool,
        addr: u64,
        l: &Live,
        t: u64,
    ) {
        if self.tap.is_some() {
            self.tap_live_now(change, s, handle, addr, l, t);
        }
    }

    #[cold]
    pub(super) fn tap_live_now(
        &mut self,
        change: Change,
        s: usize,
        handle: bool,
        addr: u64,
        l: &Live,
        t: u64,
    ) {
        let stack = self.site_stack(l.site);
        self.tap_step(
            change,
            s,
            l.dev as usize,
            handle,
            addr,
            l.size,
            stack,
            0,
            t,
            false,
        );
    }

    /// The stack id of call-site aggregate `site` (0: none).
    pub(super) fn site_stack(&self, site: u32) -> u32 {
        if site == NO_SITE {
            0
        } else {
            self.mem.sites[site as usize].stack
        }
    }

    /// A successful `cuMemMap`/`cuMemUnmap`: the device and call site are the mapped handle's (a map names
    /// its handle; an unmap is found by the tap from its address).
    pub(super) fn tap_map(&mut self, s: usize, e: &Event, t: u64) {
        let (d, stack) = match e.api {
            Api::MemMap => match self.procs[s].book.handle(e.aux) {
                Some(l) => (Some(l.dev as usize), self.site_stack(l.site)),
                None => (None, 0),
            },
            _ => (None, 0),
        };
        let change = if e.api == Api::MemMap {
            Change::Map
        } else {
            Change::Unmap
        };
        let device = d.and_then(|d| {
            let dv = &self.devs[d];
            ordinal(dv.device)
        });
        let on_host = d.is_some_and(|d| self.devs[d].device == HOST_DEVICE);
        let (device_bytes, process_device_bytes) = match d {
            Some(d) => (
                self.mem.peaks.get(d).cur,
                self.mem.procs.dev(s, d).map_or(0, |pd| pd.cur),
            ),
            None => (0, 0),
        };
        let step = Step {
            change,
            t_ns: t,
            slot: s,
            process: &self.procs[s].s,
            device,
            on_host,
            handle: false,
            addr: e.addr,
            size: e.size,
            stack,
            flags: e.flags,
            back: false,
            device_bytes,
            process_device_bytes,
        };
        if let Some(tap) = self.tap.as_mut() {
            tap.step(&step);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn tap_step(
        &mut self,
        change: Change,
        s: usize,
        d: usize,
        handle: bool,
        addr: u64,
        size: u64,
        stack: u32,
        flags: u8,
        t: u64,
        back: bool,
    ) {
        let dv = &self.devs[d];
        let p = &self.procs[s];
        let step = Step {
            change,
            t_ns: t,
            slot: s,
            process: &p.s,
            device: ordinal(dv.device),
            on_host: dv.device == HOST_DEVICE,
            handle,
            addr,
            size,
            stack,
            flags,
            back,
            device_bytes: self.mem.peaks.get(d).cur,
            process_device_bytes: self.mem.procs.dev(s, d).map_or(0, |pd| pd.cur),
        };
        if let Some(tap) = self.tap.as_mut() {
            tap.step(&step);
        }
    }
}
