//! The call sites the reports show: each device's peak by site, bytes allocated by site, and every site
//! reference turned into an index of `CallSites::sites`.

use std::collections::HashMap;

use crate::callsites::{self, CallSites, DeviceSites, SiteBytes, SITES_LISTED};
use crate::model::observe::peaks::DevicePeaks;
use crate::model::observe::sites::{Agg, SiteAggs};
use crate::model::replay::Replay;
use crate::names::symbols::Symbolizer;

impl Replay<'_> {
    /// The call sites the reports show, symbolised, with every site reference (aggregate indices until now)
    /// turned into an index of `CallSites::sites`.
    pub(in crate::model) fn call_sites(
        &mut self,
        aggs: &mut SiteAggs,
        peaks: &DevicePeaks,
        mut sym: Option<&mut Symbolizer>,
    ) -> CallSites {
        let notes = self.cs.notes();
        if !self.cs.any {
            return CallSites {
                notes,
                ..CallSites::default()
            };
        }
        let devs = &self.devs;
        aggs.settle(|d| peaks.seq(d));
        let aggs: &[Agg] = aggs;
        let mut rm = Remap::default();

        // Each device's peak.
        let mut per_dev: Vec<Vec<usize>> = vec![Vec::new(); devs.len()];
        for (i, a) in aggs.iter().enumerate() {
            if a.at_peak > 0 {
                per_dev[a.dev as usize].push(i);
            }
        }
        let mut at_peak = Vec::new();
        for (d, mut list) in per_dev.into_iter().enumerate() {
            let (dv, peak) = (&devs[d], peaks.get(d).peak);
            if peak == 0 {
                continue;
            }
            let total = list
                .iter()
                .fold(0u64, |x, &i| x.saturating_add(aggs[i].at_peak));
            let mut by_pid: HashMap<u32, u64> = HashMap::new();
            for &i in &list {
                let x = by_pid
                    .entry(self.procs[aggs[i].slot as usize].s.pid)
                    .or_default();
                *x = x.saturating_add(aggs[i].at_peak);
            }
            let mut by_process: Vec<(u32, u64)> = by_pid.into_iter().collect();
            by_process.sort_unstable();
            list.sort_unstable_by(|&a, &b| aggs[b].at_peak.cmp(&aggs[a].at_peak).then(a.cmp(&b)));
            list.truncate(SITES_LISTED);
            let sites: Vec<SiteBytes> = list
                .iter()
                .map(|&i| SiteBytes {
                    site: rm.get(aggs, i),
                    count: 0,
                    bytes: aggs[i].at_peak,
                })
                .collect();
            let listed = sites.iter().fold(0u64, |x, b| x.saturating_add(b.bytes));
            at_peak.push(DeviceSites {
                device: crate::model::replay::ordinal(dv.device),
                on_host: dv.device == crate::model::replay::HOST_DEVICE,
                peak_bytes: peak,
                sites,
                unlisted_bytes: total.saturating_sub(listed),
                no_site_bytes: peak.saturating_sub(total),
                by_process,
                tensor_lines: Vec::new(),
            });
        }
        at_peak.sort_by_key(|d| d.device.unwrap_or(u32::MAX));

        // Bytes allocated, all devices together.
        let mut allocated: HashMap<(u32, u32), u64> = HashMap::new();
        for a in aggs {
            let x = allocated.entry((a.slot, a.stack)).or_default();
            *x = x.saturating_add(a.bytes);
        }
        let mut allocated: Vec<((u32, u32), u64)> = allocated.into_iter().collect();
        allocated.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        allocated.truncate(SITES_LISTED);
        let by_allocated: Vec<usize> = allocated
            .iter()
            .filter(|(_, b)| *b > 0)
            .map(|&(k, _)| rm.key(k))
            .collect();

        // What the other lists name.
        for l in &mut self.live_end.list {
            l.site = l.site.map(|i| rm.get(aggs, i));
        }
        for o in &mut self.ooms {
            for l in &mut o.top_live {
                l.site = l.site.map(|i| rm.get(aggs, i));
            }
            o.request_site = o.request_site.map(|i| rm.get(aggs, i));
            for b in &mut o.by_site {
                b.site = rm.get(aggs, b.site);
            }
            if let Some(l) = &mut o.leak {
                for g in &mut l.sites {
                    g.site = rm.get(aggs, g.site);
                }
            }
        }
        for r in &mut self.refusals {
            r.site = r.site.map(|i| rm.get(aggs, i));
        }
        for l in self.growths.iter_mut().flatten() {
            for g in &mut l.sites {
                g.site = rm.get(aggs, g.site);
            }
        }

        // The sites, with their figures and frames.
        let mut sites: Vec<callsites::Site> = rm
            .order
            .iter()
            .map(|&(slot, stack)| {
                let p = &self.procs[slot as usize];
                callsites::Site {
                    pid: p.s.pid,
                    stack,
                    frames: Vec::new(),
                    site: None,
                    missing: true,
                    allocations: 0,
                    allocated_bytes: 0,
                    live_bytes_at_end: 0,
                    per_device: Vec::new(),
                    extra: Vec::new(),
                }
            })
            .collect();
        for a in aggs {
            let Some(&i) = rm.keys.get(&(a.slot, a.stack)) else {
                continue;
            };
            let s = &mut sites[i];
            s.allocations += a.allocations;
            s.allocated_bytes = s.allocated_bytes.saturating_add(a.bytes);
            s.live_bytes_at_end = s.live_bytes_at_end.saturating_add(a.live_end);
            let dv = &devs[a.dev as usize];
            s.per_device.push(callsites::SiteDevice {
                device: crate::model::replay::ordinal(dv.device),
                allocations: a.allocations,
                allocated_bytes: a.bytes,
                peak_bytes: a.at_peak,
                live_bytes_at_end: a.live_end,
            });
        }
        for (i, &(slot, stack)) in rm.order.iter().enumerate() {
            let s = &mut sites[i];
            s.per_device.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
            let p = &self.procs[slot as usize];
            if let Some(frames) = self.cs.frames(&p.cs, stack, sym.as_deref_mut()) {
                s.site = callsites::choose_site(&frames);
                s.frames = frames;
                s.missing = false;
            }
        }
        callsites::distinguish(&mut sites);
        let leaks = self.ooms.iter_mut().filter_map(|o| o.leak.as_mut());
        for l in leaks.chain(self.growths.iter_mut().flatten()) {
            for g in &mut l.sites {
                g.label = sites[g.site].label();
            }
        }
        CallSites {
            present: true,
            stacks: self.cs.stacks_seen,
            stacks_not_kept: self.cs.stacks_not_kept,
            sites,
            at_peak,
            by_allocated,
            notes,
        }
    }
}

/// Site references: (process slot, stack id) -> index in `CallSites::sites`, in order of first reference.
#[derive(Default)]
struct Remap {
    keys: HashMap<(u32, u32), usize>,
    order: Vec<(u32, u32)>,
}

impl Remap {
    fn key(&mut self, k: (u32, u32)) -> usize {
        let n = self.order.len();
        let i = *self.keys.entry(k).or_insert(n);
        if i == n {
            self.order.push(k);
        }
        i
    }

    fn get(&mut self, aggs: &[Agg], agg: usize) -> usize {
        let a = &aggs[agg];
        self.key((a.slot, a.stack))
    }
}
