//! The trace is replayed: what was live at each process's end, and the figures put together as an
//! [`Analysis`].

use super::*;

impl Replay<'_> {
    /// Everything process `s` still holds at `t` is live at its end; with `release`, CUDA gives it back at `t`.
    pub(super) fn collect_live(&mut self, s: usize, t: u64, release: bool) {
        let p = &mut self.procs[s];
        let pid = p.s.pid;
        for (addr, l, handle) in p.book.take_all().collect::<Vec<_>>() {
            let c = self.change(s, l.dev as usize, l.size, t, l.site);
            self.mem.kept(c);
            let on_host = c.on_host;
            let p = &mut self.procs[s];
            // A process's figures are of GPU memory, as its peak; host memory is in its device's (and listed).
            if !on_host {
                p.s.live_bytes_at_end = p.s.live_bytes_at_end.saturating_add(l.size);
                p.s.live_allocations_at_end += 1;
            }
            let dv = &self.devs[l.dev as usize];
            let a = LiveAlloc {
                pid,
                device: ordinal(dv.device),
                on_host,
                api: l.api,
                ptsz: l.flags & flags::PTSZ != 0,
                address: addr,
                bytes: l.size,
                alloc_time_ns: l.ts,
                age_ns: t.saturating_sub(l.ts),
                site: site_ref(l.site),
            };
            self.live_end.add(a, l.dev, l.site);
            if release {
                self.take(s, &l, t);
                self.tap_live(Change::Released, s, handle, addr, &l, t);
            }
        }
    }

    pub(in crate::model) fn finish(
        mut self,
        header: TraceHeader,
        sym: Option<&mut Symbolizer>,
    ) -> Analysis {
        let merge_inexact_events = self.drain();
        let end = self.rel(self.last_ts);
        for s in 0..self.procs.len() {
            let p = &mut self.procs[s];
            if !p.end_queued && p.goodbye {
                p.s.ended = Ended::Goodbye;
            }
            let at = p.s.end_ns.unwrap_or(end);
            self.collect_live(s, at, false);
        }
        self.live_end.finish();
        // Each reaped status to the latest image of its pid that started before it.
        for x in std::mem::take(&mut self.exits) {
            let slot = (0..self.procs.len())
                .rev()
                .find(|&s| self.procs[s].s.pid == x.pid && self.procs[s].start_abs <= x.ts_ns);
            if let Some(s) = slot {
                self.procs[s].s.exit = Some(x.status);
            }
        }
        let mut sym = sym;
        if let Some(mut tap) = self.tap.take() {
            let (cs, procs) = (&self.cs, &self.procs);
            tap.finish(&mut |slot: usize, stack: u32| {
                cs.frames(&procs.get(slot)?.cs, stack, sym.as_deref_mut())
            });
        }
        // Each device's timeline, and its growth with what grew (before call sites are resolved: they name it).
        let mut mem = std::mem::take(&mut self.mem);
        let timelines: Vec<Timeline> = mem
            .timelines
            .finish(end)
            .into_iter()
            .map(|[tl]| tl)
            .collect();
        // A device whose processes lost events is not judged: a lost free looks exactly like memory kept.
        // Each process's devices once, and what was kept per device once: never every device against every
        // process or every allocation kept (a trace can name a million devices).
        let mut lossy = vec![false; self.devs.len()];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); self.devs.len()];
        for slot in 0..self.procs.len() {
            for (d, pd) in mem.procs.get(slot).devs() {
                users[*d].push(slot);
                if self.calls.get(slot).dropped_events > 0 && pd.allocations > 0 {
                    lossy[*d] = true;
                }
            }
        }
        let kept_on = self.live_end.kept_by_device(self.devs.len());
        self.growths = timelines
            .iter()
            .enumerate()
            .map(|(i, tl)| {
                if lossy[i] {
                    return None;
                }
                // The largest growth of one of the device's processes in its own cycles (observe/steps.rs: a
                // leak that fills the device in a second is one too), else its timeline in wall-clock windows.
                let g = users[i]
                    .iter()
                    .filter_map(|&slot| {
                        let pd = mem.procs.dev(slot, i)?;
                        pd.troughs
                            .growth(GrowthUnit::Cycles, self.procs[slot].s.pid, true)
                    })
                    .max_by_key(|g| g.rise_bytes);
                // One without enough cycles (a leaker that never frees, beside a steady neighbour) leaves it to the
                // device's timeline.
                let judged = mem.procs.cycles_judge(users[i].iter().copied(), i);
                let mut g = crate::model::observe::growth::judged(g, judged, || {
                    crate::model::observe::growth::growth(tl, end)
                })?;
                crate::model::observe::growth::fill_what_grew(&mut g, kept_on[i].iter().copied());
                Some(g)
            })
            .collect();
        let call_sites = self.call_sites(&mut mem.sites, &mem.peaks, sym);
        let fw = std::mem::take(&mut self.fw);
        let (mut fw_procs, fw_devs, bridge) = fw.finish(end);
        let fw_implausible = bridge.implausible_devices;
        let devs = &self.devs;
        let dev_of = |d: usize| ordinal(devs[d].device);
        let processes: Vec<ProcessStats> = self
            .procs
            .iter()
            .enumerate()
            .map(|(slot, p)| {
                let mut s = p.s.clone();
                s.framework = fw_procs.remove(&slot).unwrap_or_default();
                let figs = mem.procs.get(slot);
                s.peak_bytes = figs.peak;
                s.peak_time_ns = figs.peak_t;
                s.allocations = figs.allocations();
                s.largest_allocation_bytes = figs.largest;
                let c = self.calls.get(slot);
                s.frees = c.frees;
                s.unmatched_frees = c.unmatched_frees;
                s.lost_frees = c.lost_frees;
                s.failed_allocations = c.failed_allocations;
                s.oom_results = c.oom_results;
                s.recovered_refusals = c.recovered_refusals;
                s.cap_refusals = c.cap_refusals;
                s.cap_exceeded = c.cap_exceeded;
                s.dropped_events = c.dropped_events;
                s.context_freed_bytes = c.context_freed_bytes;
                s.address_reserved_peak_bytes = c.address_reserved_peak_bytes;
                s.mapped_peak_bytes = c.mapped_peak_bytes;
                s.per_device = figs
                    .devs()
                    .iter()
                    .filter(|(_, pd)| pd.allocations > 0)
                    .map(|&(d, ref pd)| ProcessDevice {
                        device: dev_of(d),
                        on_host: devs[d].device == HOST_DEVICE,
                        peak_bytes: pd.peak,
                        live_bytes_at_end: pd.live_end,
                        allocations: pd.allocations,
                    })
                    .collect();
                s.per_device.sort_by_key(|pd| pd.device.unwrap_or(u32::MAX));
                s
            })
            .collect();
        let mut devices: Vec<DeviceStats> = self
            .devs
            .into_iter()
            .zip(mem.peaks.into_vec())
            .zip(timelines.into_iter().zip(std::mem::take(&mut self.growths)))
            .map(|((d, pk), (timeline, growth))| DeviceStats {
                device: ordinal(d.device),
                on_host: d.device == HOST_DEVICE,
                peak_bytes: pk.peak,
                peak_time_ns: pk.peak_t,
                live_bytes_at_end: pk.live_end,
                in_use_bytes_at_end: pk.cur,
                allocations: pk.allocations,
                largest_allocation_bytes: pk.largest,
                driver_total_bytes: d.info.map(|i| i.0),
                driver_free_bytes: d.info.map(|i| i.1),
                room_bytes: d.room,
                total_bytes: d.total(),
                cap_bytes: d.oom_cap,
                timeline,
                growth,
                framework: None,
                uuid: None,
            })
            .collect();
        for d in devices.iter_mut() {
            d.uuid = d
                .device
                .and_then(|g| self.uuids.get(&g).copied().flatten())
                .map(|u| vramtrace_format::gpu_uuid(&u));
        }
        // By number, once: never a search of every device for each (a trace can name a million).
        let mut by_number: FastMap<u32, usize> = FastMap::default();
        for (i, d) in devices.iter().enumerate() {
            if let Some(n) = d.device {
                by_number.entry(n).or_insert(i);
            }
        }
        for f in fw_devs {
            match by_number.get(&f.device).map(|&i| &mut devices[i]) {
                Some(d) => d.framework = Some(f),
                None => devices.push(DeviceStats {
                    device: Some(f.device),
                    on_host: false,
                    peak_bytes: 0,
                    peak_time_ns: None,
                    live_bytes_at_end: 0,
                    in_use_bytes_at_end: 0,
                    allocations: 0,
                    largest_allocation_bytes: 0,
                    driver_total_bytes: None,
                    driver_free_bytes: None,
                    room_bytes: None,
                    total_bytes: None,
                    cap_bytes: None,
                    timeline: Timeline::default(),
                    growth: None,
                    framework: Some(f),
                    uuid: None,
                }),
            }
        }
        devices.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
        for d in &mut devices {
            let h = d
                .device
                .and_then(|g| self.header_devices.get(&g).copied())
                .unwrap_or_default();
            d.total_bytes = h.total(d.total_bytes);
            d.cap_bytes = h.cap(d.cap_bytes);
        }
        let mut ooms = self.ooms;
        ooms.sort_by_key(|o| o.time_ns);
        // Who each process is, from its hello, read wherever it was in the file (a process's hello may come
        // after entries of it that were already replayed): the same whenever the snapshot was taken.
        for p in ooms.iter_mut().flat_map(|o| o.processes.iter_mut()) {
            if let Some(pr) = self.procs.get(p.slot) {
                p.announced = pr.s.announced;
                p.rank = pr.s.rank;
                p.cmdline.clone_from(&pr.s.cmdline);
            }
        }
        let first = self.first_ts.map(|f| f.saturating_sub(self.start));
        Analysis {
            header,
            format_version: 0,
            partial: false,
            stopped: None,
            no_end_record: false,
            frames: 0,
            unknown_frames: 0,
            bad_frames: 0,
            first_bad_frame: None,
            events: self.events,
            dropped_events: self.calls.total(|c| c.dropped_events),
            unmatched_frees: self.calls.total(|c| c.unmatched_frees),
            implausible_devices: self.implausible_devices + fw_implausible,
            lost_frees: self.calls.total(|c| c.lost_frees),
            first_ns: first,
            end_ns: end,
            duration_ns: self.first_ts.map_or(0, |f| self.last_ts.saturating_sub(f)),
            devices,
            processes,
            live_at_end: self.live_end.list,
            live_at_end_count: self.live_end.count,
            live_at_end_bytes: self.live_end.bytes,
            oom_records: self.calls.devices().map(|(_, c)| c.errors).sum(),
            refusals: self.refusals,
            refusals_recovered: self.refusals_recovered,
            refusal_stall_ns: self.refusal_stall_ns,
            merge_inexact_events,
            bridge,
            ooms,
            call_sites,
        }
    }
}
