//! Out-of-memory snapshots: what the replay knew when it reached an out-of-memory record, and a framework's
//! own out-of-memory record folded into the driver's.

use vramtrace_format::{flags, Api, Oom, NO_DEVICE};

use crate::callsites::{SiteBytes, SITES_LISTED};
use crate::model::analysis::*;
use crate::model::observe::framework::FrameworkOom;
use crate::model::observe::growth::{fill_what_grew, growth, judged as judged_growth};
use crate::model::observe::leak::site_ref;
use crate::model::observe::timeline::{Bucket, Timeline};
use crate::model::replay::site_store::NO_SITE;
use crate::model::replay::{ordinal, Replay};

impl Replay<'_> {
    /// Tells the tap of out-of-memory record `o` of slot `s`, replayed at `ts`.
    fn tap_oom(&mut self, s: usize, o: &Oom, ts: u64, framework: bool) {
        let stack = match self.procs[s].last_failed {
            Some((tid, size, site))
                if tid == o.tid && size == o.requested_bytes && site != NO_SITE =>
            {
                self.mem.sites[site as usize].stack
            }
            _ => 0,
        };
        let on_host = o.api == Api::MemCreate as u8 && o.device == NO_DEVICE;
        let key = if on_host {
            crate::model::replay::HOST_DEVICE
        } else {
            o.device
        };
        let device_bytes = self
            .dev_ids
            .get(&key)
            .map_or(0, |&d| self.mem.peaks.get(d).cur);
        let step = crate::model::observe::tap::OomStep {
            t_ns: self.rel(ts),
            slot: s,
            process: &self.procs[s].s,
            oom: o,
            on_host,
            stack,
            device_bytes,
            framework,
        };
        if let Some(tap) = self.tap.as_mut() {
            tap.oom(&step);
        }
    }

    /// Attaches a framework's out-of-memory record to the driver's snapshot of the same error (the last
    /// failed request of its thread on that device not recovered from, or of the process there within
    /// [`FOLD_NS`]; earlier ones were the allocator's retries and fold into it), or snapshots it on its own when
    /// the driver saw no failure (PyTorch's
    /// per-process memory fraction refuses before asking the driver).
    pub(in crate::model) fn fold_framework_oom(
        &mut self,
        s: usize,
        pid: u32,
        tid: u32,
        ts: u64,
        fo: FrameworkOom,
    ) {
        let t = fo.time_ns;
        // One error, however many of the driver's requests failed behind it.
        self.error(fo.device);
        // The error's refusals: those of its thread still open (not recovered from: the thread allocated
        // nothing on the device since), however long the framework took to say so (its snapshot of a large
        // cache takes seconds), and any of the process on the device within FOLD_NS.
        let same: Vec<usize> = self
            .ooms
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                // A snapshot still here without a framework record is of a refusal still open: one recovered
                // from gave its snapshot back.
                o.pid == pid
                    && fo.device.is_none_or(|d| o.device == Some(d))
                    && !o.on_host
                    && o.framework.is_none()
                    && crate::model::replay::folds_into(o.tid, o.time_ns, tid, t)
            })
            .map(|(i, _)| i)
            .collect();
        let at = match same.last() {
            Some(&last) => {
                let folded = same.len() as u32 - 1;
                let keep = self.ooms.remove(last);
                for &i in same[..same.len() - 1].iter().rev() {
                    self.ooms.remove(i);
                }
                self.ooms.push(keep);
                let i = self.ooms.len() - 1;
                self.ooms[i].driver_ooms_folded = folded;
                i
            }
            None => {
                if self.ooms.len() >= MAX_OOM_SNAPSHOTS {
                    // Past the snapshots held: still the one error, the refusals behind it its own.
                    self.raised(s, tid, fo.device, t);
                    return;
                }
                let o = Oom {
                    pid,
                    tid,
                    ts_ns: ts,
                    device: fo.device.unwrap_or(NO_DEVICE),
                    api: 0,
                    flags: 0,
                    requested_bytes: fo.requested_bytes,
                    result: CUDA_OOM,
                    device_free_bytes: fo.device_free_bytes,
                    // The framework's record says only what was free: the device's size is the driver's, as
                    // it last reported it (a device's size does not change), so that what was outside the job
                    // is known.
                    device_total_bytes: fo
                        .device
                        .and_then(|g| self.dev_ids.get(&g))
                        .and_then(|&d| self.devs[d].total()),
                    cap_bytes: None,
                    job_used_bytes: None,
                    process_used_bytes: None,
                    extra: Vec::new(),
                };
                let before = self.ooms.len();
                self.snapshot(s, &o, ts, false);
                if self.ooms.len() == before {
                    self.raised(s, tid, fo.device, t);
                    return;
                }
                self.ooms.len() - 1
            }
        };
        self.raised(s, tid, fo.device, t);
        let o = &mut self.ooms[at];
        o.framework_figures = Some(fo.figures);
        if let Some(dev) = fo.device {
            o.framework_job = self.fw.job_allocated(dev);
            o.framework_leak = self.fw.leak_until(s, dev, t);
            o.steps_counted = self.fw.counts_steps(s, dev);
            let need = fo.figures.allocated.saturating_add(fo.requested_bytes);
            o.step_need = self.fw.step_need(s, dev, Some(need));
        }
        o.framework = Some(fo);
    }

    /// The replay reached out-of-memory record `o` of process `s` (at absolute time `ts`): everything up to
    /// then is applied. `refusal`: the driver's (or the cap's) refusal, open until it is told recovered, raised
    /// or an error; else a framework's own error, already counted.
    pub(in crate::model) fn snapshot(&mut self, s: usize, o: &Oom, ts: u64, refusal: bool) {
        if refusal {
            let on_host = o.api == Api::MemCreate as u8 && o.device == NO_DEVICE;
            self.calls
                .refusal((!on_host).then_some(o.device).and_then(ordinal));
        }
        if self.tap.is_some() {
            self.tap_oom(s, o, ts, !refusal);
        }
        let t = self.rel(ts);
        // The first ones still standing get a snapshot (a refusal found recovered gives its place back); the
        // rest are counted.
        if self.ooms.len() >= MAX_OOM_SNAPSHOTS {
            if refusal {
                self.open_oom(s, o, t, None);
            }
            return;
        }
        self.oom_seq += 1;
        let seq = self.oom_seq;
        if refusal {
            self.open_oom(s, o, t, Some(seq));
        }
        // A `cuMemCreate` on no device asked for host memory: its figures are the host device's, and the GPU
        // figures the record may carry (shims before 2026-11-22 attached the current GPU's) describe another
        // memory.
        let on_host = o.api == Api::MemCreate as u8 && o.device == NO_DEVICE;
        let key = if on_host {
            crate::model::replay::HOST_DEVICE
        } else {
            o.device
        };
        let d = self.dev_ids.get(&key).copied();
        let device = (o.device != NO_DEVICE).then_some(o.device);
        let (device_free, device_total) = if on_host {
            (None, None)
        } else {
            (o.device_free_bytes, o.device_total_bytes)
        };
        if let Some(d) = d.filter(|_| !on_host) {
            let dv = &mut self.devs[d];
            if let Some(total) = o.device_total_bytes {
                dv.oom_total = Some(dv.oom_total.map_or(total, |x| x.max(total)));
            }
            if o.cap_bytes.is_some() {
                dv.oom_cap = o.cap_bytes;
            }
        }
        let (job_live, job_peak, job_peak_t, async_recent) = match d {
            Some(d) => {
                let pk = self.mem.peaks.get(d);
                let recent = self.mem.recent_frees.recent(d, t);
                (pk.cur, pk.peak, pk.peak_t, recent)
            }
            None => (0, 0, None, 0),
        };
        let full = d
            .map(|d| self.mem.timelines.at(d, 0, t))
            .unwrap_or_default();
        // The failing process's own cycles first (time-free: a leak of a few steps in a second counts), else
        // the device's timeline in wall-clock windows.
        // Where the cycles of every process on the device still holding memory are enough to judge, they
        // decide: no growth in them is none (observe/steps.rs). One without leaves it to the timeline.
        let figs = &self.mem.procs;
        let own = d.and_then(|d| figs.dev(s, d));
        let judged = d.is_some_and(|d| {
            let live = self.procs.iter().enumerate().filter(|(_, p)| !p.released);
            figs.cycles_judge(live.map(|(i, _)| i), d)
        });
        let cycles = own.and_then(|pd| {
            pd.troughs
                .growth(GrowthUnit::Cycles, self.procs[s].s.pid, true)
        });
        let mut leak = judged_growth(cycles, judged, || growth(&full, t));
        let timeline = window(&full, t.saturating_sub(OOM_WINDOW_NS), OOM_TIMELINE_POINTS);
        drop(full);

        // Processes.
        let devs = &self.devs;
        let dev_of = |i: usize| crate::model::replay::ordinal(devs[i].device);
        let mut processes = Vec::new();
        let mut on_device = 0u64;
        for (i, p) in self.procs.iter().enumerate() {
            if p.released {
                continue;
            }
            let used =
                i == s || d.is_some_and(|d| figs.dev(i, d).is_some_and(|pd| pd.allocations > 0));
            on_device += used as u64;
            let mut per_device: Vec<(Option<u32>, u64)> = figs
                .get(i)
                .devs()
                .iter()
                .map(|(di, pd)| (*di, pd))
                // GPUs only: host memory (a host OOM's own figure is `device_live_bytes`) is no GPU's.
                .filter(|(di, pd)| {
                    pd.cur > 0 && devs[*di].device != crate::model::replay::HOST_DEVICE
                })
                .map(|(di, pd)| (dev_of(di), pd.cur))
                .collect();
            if per_device.is_empty() && i != s {
                continue;
            }
            per_device.sort_by_key(|(dv, _)| dv.unwrap_or(u32::MAX));
            processes.push(OomProcess {
                slot: i,
                pid: p.s.pid,
                announced: p.s.announced,
                rank: p.s.rank,
                cmdline: p.s.cmdline.clone(),
                device_live_bytes: d.and_then(|d| figs.dev(i, d)).map_or(0, |pd| pd.cur),
                per_device,
                on_device: used,
            });
        }

        // One pass over the live set of the device.
        let mut classes: Vec<SizeClass> = SIZE_CLASSES
            .iter()
            .enumerate()
            .map(|(i, &(label, max))| SizeClass {
                label,
                min_bytes: if i == 0 { 0 } else { SIZE_CLASSES[i - 1].1 },
                max_bytes: (max != u64::MAX).then_some(max),
                count: 0,
                bytes: 0,
            })
            .collect();
        let mut top: Vec<OomAlloc> = Vec::new();
        // The smallest size still in the top list after the last trim: anything smaller cannot get in.
        let mut floor = 0u64;
        let mut live_count = 0u64;
        if let Some(d) = d {
            for p in self.procs.iter().filter(|p| !p.released) {
                for (&addr, l) in p.book.iter() {
                    if l.dev as usize != d {
                        continue;
                    }
                    live_count += 1;
                    let c = SIZE_CLASSES
                        .iter()
                        .position(|&(_, max)| l.size < max)
                        .unwrap_or(SIZE_CLASSES.len() - 1);
                    classes[c].count += 1;
                    classes[c].bytes = classes[c].bytes.saturating_add(l.size);
                    if l.size < floor {
                        continue;
                    }
                    top.push(OomAlloc {
                        pid: p.s.pid,
                        tid: l.tid,
                        device,
                        api: l.api,
                        ptsz: l.flags & flags::PTSZ != 0,
                        address: addr,
                        bytes: l.size,
                        alloc_time_ns: l.ts,
                        age_ns: t.saturating_sub(l.ts),
                        site: site_ref(l.site),
                    });
                    if top.len() >= 8 * OOM_TOP_LIVE {
                        trim_top(&mut top);
                        floor = top[top.len() - 1].bytes;
                    }
                }
            }
        }
        trim_top(&mut top);
        // What grew: made during the rise and live now.
        if let (Some(l), Some(d)) = (leak.as_mut(), d) {
            let live = self
                .procs
                .iter()
                .filter(|p| !p.released)
                .flat_map(|p| p.book.iter().map(|(_, l)| l))
                .filter(|l| l.dev as usize == d)
                .map(|l| (l.api, l.size, l.site, l.ts));
            fill_what_grew(l, live);
        }
        // Live bytes by call site on the device.
        let (mut by_site, mut site_total) = (Vec::new(), 0u64);
        if let Some(d) = d {
            for (i, a) in self.mem.sites.iter().enumerate() {
                if a.dev as usize == d && a.cur > 0 {
                    site_total = site_total.saturating_add(a.cur);
                    by_site.push(SiteBytes {
                        site: i,
                        count: a.live_count,
                        bytes: a.cur,
                    });
                }
            }
        }
        by_site.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
        by_site.truncate(SITES_LISTED);
        let listed = by_site.iter().fold(0u64, |x, b| x.saturating_add(b.bytes));
        // The request's own site: the process's last failed allocation, made by the same thread for as much.
        let request_site = match self.procs[s].last_failed {
            Some((tid, size, site)) if tid == o.tid && size == o.requested_bytes => site_ref(site),
            _ => None,
        };
        self.ooms.push(OomSnapshot {
            time_ns: t,
            pid: o.pid,
            tid: o.tid,
            device,
            api: Api::from_u8(o.api),
            api_code: o.api,
            ptsz: o.flags & flags::PTSZ != 0,
            cap_refused: o.flags & flags::CAP_REFUSED != 0,
            requested_bytes: o.requested_bytes,
            result: o.result,
            request_site,
            on_host,
            device_free_bytes: device_free,
            device_total_bytes: device_total,
            cap_bytes: o.cap_bytes,
            ledger_job_bytes: o.job_used_bytes,
            ledger_process_bytes: o.process_used_bytes,
            job_live_trace_bytes: job_live,
            job_peak_bytes: job_peak,
            job_peak_time_ns: job_peak_t,
            job_processes_on_device: on_device,
            processes,
            live_count,
            top_live: top,
            size_classes: classes,
            timeline,
            async_freed_recent_bytes: async_recent,
            leak,
            by_site,
            by_site_unlisted_bytes: site_total.saturating_sub(listed),
            no_site_bytes: job_live.saturating_sub(site_total),
            dropped_events: self.calls.total(|c| c.dropped_events),
            framework: None,
            framework_figures: (o.device != NO_DEVICE)
                .then(|| self.fw.figures(s, o.device))
                .flatten(),
            framework_job: (o.device != NO_DEVICE)
                .then(|| self.fw.job_allocated(o.device))
                .flatten(),
            framework_leak: (o.device != NO_DEVICE)
                .then(|| self.fw.leak_until(s, o.device, t))
                .flatten(),
            holders: None,
            steps_counted: o.device != NO_DEVICE && self.fw.counts_steps(s, o.device),
            step_need: (o.device != NO_DEVICE)
                .then(|| self.fw.step_need(s, o.device, None))
                .flatten(),
            driver_ooms_folded: 0,
            seq,
        });
    }
}

/// Keeps the largest [`OOM_TOP_LIVE`], largest first, then oldest, then by pid and address.
pub(in crate::model) fn trim_top(v: &mut Vec<OomAlloc>) {
    v.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.alloc_time_ns.cmp(&b.alloc_time_ns))
            .then(a.pid.cmp(&b.pid))
            .then(a.address.cmp(&b.address))
    });
    v.truncate(OOM_TOP_LIVE);
}

/// The part of `tl` from `from` on, with neighbouring buckets merged until at most `points` remain.
pub(in crate::model) fn window(tl: &Timeline, from: u64, points: usize) -> Timeline {
    let w = tl.bucket_ns;
    let kept: Vec<Bucket> = tl
        .buckets
        .iter()
        .filter(|b| b.t_ns.saturating_add(w) > from)
        .copied()
        .collect();
    let k = kept.len().div_ceil(points.max(1)).max(1);
    Timeline {
        bucket_ns: w.saturating_mul(k as u64),
        buckets: kept
            .chunks(k)
            .map(|c| Bucket {
                t_ns: c[0].t_ns,
                max_bytes: c.iter().map(|b| b.max_bytes).max().unwrap_or(0),
                last_bytes: c[c.len() - 1].last_bytes,
            })
            .collect(),
    }
}
