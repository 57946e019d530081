//! The page's data (docs/EXPORTS.md, version [`DATA_VERSION`]): one JSON object per trace that
//! `assets/html/report.js` draws, built from the analysis and the timelines the tap gathered.

use std::borrow::Cow;

use serde::Serialize;

use super::stacked::Stacked;
use super::tap::{Dev, Html, NO_SITE_KEY, OTHER_SITES_KEY};
use super::whatif::WhatIfTable;
use crate::callsites::{PeakRow, Site, TENSOR_LINES_NOTE};
use crate::model::diagnose::diagnose;
use crate::model::{Analysis, FOLD_NS};
use crate::reporters::oom_text::event_text;
use crate::reporters::prose::{self, key_figures, short_findings};
use crate::reporters::text::oom_place;
use crate::reporters::text::{self, device_name, ending_label, short_command};

/// The version of the page's JSON (docs/EXPORTS.md).
pub const DATA_VERSION: u64 = 1;
/// Processes drawn on their own in a device's stack (the largest by peak); the rest are one "other processes".
pub const MAX_PROCESS_SERIES: usize = 24;
/// Call sites drawn on their own in a device's stack (the largest); the rest are one "other call sites".
pub const MAX_SITE_SERIES: usize = 10;

/// The parts' values at each bucket's maximum, added up.
fn sum_parts(s: &Stacked, parts: impl Iterator<Item = usize>) -> Vec<u64> {
    let mut v = vec![0u64; s.job.len()];
    for p in parts {
        for (x, y) in v.iter_mut().zip(&s.parts[p].at) {
            *x = x.saturating_add(*y);
        }
    }
    v
}

/// One trace's part of the page. `host` and `host_offset_ns` only among several traces of one job.
#[derive(Serialize)]
pub(super) struct Data<'a> {
    version: u64,
    made_by: &'static str,
    command: String,
    start_unix_ns: u64,
    /// From the first record to the last (kept for readers of the page's data).
    duration_ns: u64,
    /// The last record's time from the run's start: what the page and the text report call the run's length
    /// (every time on the page is from the run's start, as in the text report).
    end_ns: u64,
    events: u64,
    partial: Option<&'a str>,
    notes: Vec<String>,
    devices: Vec<Device<'a>>,
    oom_records: u64,
    refusals_recovered: u64,
    ooms: Vec<Marker>,
    ooms_not_marked: u64,
    post_mortems: Vec<PostMortem>,
    ooms_not_analysed: u64,
    processes: Vec<Process>,
    sites_at_peak: Vec<AtPeak>,
    sites_by_allocated: Vec<ByAllocated>,
    live_at_end: LiveAtEnd,
    #[serde(skip_serializing_if = "Option::is_none")]
    whatif: Option<&'a WhatIfTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host_offset_ns: Option<u64>,
}

/// An out-of-memory error's post-mortem, beside the timelines.
#[derive(Serialize)]
struct PostMortem {
    device: String,
    t_ns: u64,
    pid: u32,
    requested_bytes: u64,
    cause: &'static str,
    cause_title: &'static str,
    reason: String,
    line: Option<String>,
    /// `[name, size]` pairs.
    figures: Vec<(&'static str, String)>,
    findings: Vec<String>,
    advice: Vec<String>,
    text: String,
}

/// An out-of-memory error marked on a timeline.
#[derive(Serialize)]
struct Marker {
    device: String,
    t_ns: u64,
    pid: u32,
    slot: usize,
    requested_bytes: u64,
    cap_refused: bool,
    device_free_bytes: Option<u64>,
    call_site: Option<String>,
    /// An index into `post_mortems`.
    post_mortem: Option<usize>,
    recovered: bool,
    folded: bool,
}

#[derive(Serialize)]
struct Process {
    slot: usize,
    pid: u32,
    rank: Option<u32>,
    command: String,
    name: String,
    ended: String,
    start_ns: u64,
    end_ns: Option<u64>,
    devices: String,
    peak_bytes: u64,
    peak_time_ns: Option<u64>,
    allocations: u64,
    failed_allocations: u64,
    oom_results: u64,
    live_bytes_at_end: u64,
    live_allocations_at_end: u64,
}

/// A device's call sites at its peak.
#[derive(Serialize)]
struct AtPeak {
    device: String,
    peak_bytes: u64,
    /// The rows the text shows (`DeviceSites::rows`): call sites, and a PyTorch process's tensor lines.
    sites: Vec<SiteBytes>,
    unlisted_bytes: u64,
    no_site_bytes: u64,
    /// What the tensor lines are, when rows are.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'static str>,
}

#[derive(Serialize)]
struct SiteBytes {
    name: Option<String>,
    bytes: u64,
}

#[derive(Serialize)]
struct ByAllocated {
    name: String,
    pid: u32,
    allocations: u64,
    allocated_bytes: u64,
    live_bytes_at_end: u64,
}

#[derive(Serialize)]
struct LiveAtEnd {
    count: u64,
    bytes: u64,
    largest: Vec<Live>,
}

#[derive(Serialize)]
struct Live {
    pid: u32,
    device: String,
    api: &'static str,
    bytes: u64,
    alloc_time_ns: u64,
    age_ns: u64,
    call_site: Option<String>,
}

/// One device's timelines: the job's bytes in use, stacked by process and by call site.
#[derive(Serialize)]
struct Device<'a> {
    name: String,
    device: Option<u32>,
    bucket_ns: u64,
    peak_bytes: Option<u64>,
    peak_time_ns: Option<u64>,
    cap_bytes: Option<u64>,
    total_bytes: Option<u64>,
    headroom: Option<String>,
    /// What its processes never freed before they ended (the text's "live at end").
    live_bytes_at_end: Option<u64>,
    /// In use when the trace ends, of processes still running then.
    in_use_bytes_at_end: Option<u64>,
    allocations: Option<u64>,
    job: &'a [u64],
    framework: Option<Framework>,
    processes: Vec<Series<'a>>,
    sites: Vec<SiteSeries>,
}

/// The framework allocator's allocated and reserved bytes, on the page's buckets.
#[derive(Serialize)]
struct Framework {
    name: String,
    allocated: Vec<u64>,
    reserved: Vec<u64>,
}

/// A process's part of a device's stack (or the rest of them together, with no slot or pid).
#[derive(Serialize)]
struct Series<'a> {
    name: String,
    slot: Option<usize>,
    pid: Option<u32>,
    peak_bytes: u64,
    at: Cow<'a, [u64]>,
    /// `[bucket, bytes]`: buckets whose maximum was above the value drawn at their end.
    peaks: Vec<(usize, u64)>,
}

#[derive(Serialize)]
struct SiteSeries {
    name: String,
    at: Vec<u64>,
}

/// Host memory, or the GPU's name.
fn place(on_host: bool, device: Option<u32>) -> String {
    if on_host {
        "host memory".to_string()
    } else {
        device_name(device)
    }
}

impl Html {
    pub(super) fn data<'a>(&'a self, a: &'a Analysis, host: Option<(&'a str, u64)>) -> Data<'a> {
        let post_mortems = post_mortems(a);
        let markers = self.markers(a);
        let index = a.device_index();
        let devices = self
            .devs
            .iter()
            .map(|d| self.device(a, &index, d))
            .collect();
        let processes = processes(a);
        let at_peak = sites_at_peak(a, &index);
        let by_allocated = sites_by_allocated(a);
        let largest = largest_live(a);
        let notes = self.page_notes(a);
        Data {
            version: DATA_VERSION,
            made_by: concat!("vramtrace ", env!("CARGO_PKG_VERSION")),
            command: short_command(&a.header.command),
            start_unix_ns: a.header.start_unix_ns,
            duration_ns: a.duration_ns,
            end_ns: a.end_ns,
            events: a.events,
            partial: a.stopped.as_deref(),
            notes,
            devices,
            oom_records: a.oom_records,
            refusals_recovered: a.refusals_recovered,
            ooms: markers,
            ooms_not_marked: self.markers_left_out,
            post_mortems,
            ooms_not_analysed: a.ooms_not_snapshotted(),
            processes,
            sites_at_peak: at_peak,
            sites_by_allocated: by_allocated,
            live_at_end: LiveAtEnd {
                count: a.live_at_end_count,
                bytes: a.live_at_end_bytes,
                largest,
            },
            whatif: self.whatif.as_ref(),
            host: host.map(|(name, _)| name),
            host_offset_ns: host.map(|(_, offset)| offset),
        }
    }

    /// The refusals marked on the timelines, each tied to its error's post-mortem unless the program recovered
    /// or it is an earlier refusal folded into the error.
    fn markers(&self, a: &Analysis) -> Vec<Marker> {
        self.markers
            .iter()
            .map(|m| {
                // Its post-mortem: the snapshot of the same process and device at (or, for retries folded
                // into one error, just after) its time.
                let pm = a
                    .ooms
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| {
                        s.pid == m.pid
                            && s.device == m.device
                            && s.on_host == m.on_host
                            && s.time_ns.abs_diff(m.t_ns) <= FOLD_NS
                    })
                    .min_by_key(|(_, s)| s.time_ns.abs_diff(m.t_ns))
                    .map(|(i, _)| i);
                let site = (m.stack != 0)
                    .then(|| self.labels.get(&(m.slot, m.stack)).cloned())
                    .flatten();
                // A refusal the program recovered from (its thread allocated there again): not an error, and
                // not the post-mortem of an error near it.
                let recovered = a
                    .refusals
                    .iter()
                    .any(|r| r.pid == m.pid && r.device == m.device && r.time_ns == m.t_ns);
                let pm = pm.filter(|_| !recovered);
                // The driver's earlier refusals of one error (the allocator's retry) point at its post-mortem
                // too; only the one nearest the error's own time is the error.
                let folded = pm.is_some_and(|i| {
                    let at = a.ooms[i].time_ns;
                    self.markers.iter().any(|o| {
                        o.pid == m.pid
                            && o.device == m.device
                            && o.t_ns.abs_diff(at) < m.t_ns.abs_diff(at)
                    })
                });
                Marker {
                    device: place(m.on_host, m.device),
                    t_ns: m.t_ns,
                    pid: m.pid,
                    slot: m.slot,
                    requested_bytes: m.requested,
                    cap_refused: m.cap_refused,
                    device_free_bytes: m.free,
                    call_site: site,
                    post_mortem: pm,
                    recovered,
                    folded,
                }
            })
            .collect()
    }

    /// The trace's notes, the call sites', and what the merge and the lost events mean for the figures.
    fn page_notes(&self, a: &Analysis) -> Vec<String> {
        let mut notes = self.notes();
        notes.extend(a.call_sites.notes.iter().map(|n| n.text.clone()));
        if a.merge_inexact_events > 0 {
            notes.push(format!(
                "{} events arrived after the merge had replayed later ones (their process broke its \
                 promise of order): they were replayed where they arrived",
                a.merge_inexact_events
            ));
        }
        if a.dropped_events > 0 {
            notes.push(format!(
                "{}: the figures miss them",
                crate::reporters::prose::events_lost(a)
            ));
        }
        notes
    }

    fn device<'a>(
        &'a self,
        a: &Analysis,
        index: &crate::names::fasthash::FastMap<(Option<u32>, bool), usize>,
        d: &'a Dev,
    ) -> Device<'a> {
        // The series are of GPU memory (host memory is not in them): never the host's figures.
        let stats = index.get(&(d.device, false)).map(|&i| &a.devices[i]);
        let series = process_series(a, d);
        let sites = self.site_series(d);
        // PyTorch's allocated and reserved bytes (the bridge's samples), on this page's buckets: each the most
        // its timeline held in the bucket, so they draw beside the driver's bytes.
        let on_grid = |tl: &crate::model::Timeline| -> Vec<u64> {
            let w = d.s.width.max(1);
            (0..d.s.job.len() as u64)
                // Saturating: times near 2^64 make buckets as wide.
                .map(|i| {
                    tl.max_between(i.saturating_mul(w), (i + 1).saturating_mul(w))
                        .unwrap_or(0)
                })
                .collect()
        };
        Device {
            name: stats.map_or_else(|| device_name(d.device), text::device_label),
            device: d.device,
            bucket_ns: d.s.width,
            peak_bytes: stats.map(|s| s.peak_bytes),
            peak_time_ns: stats.and_then(|s| s.peak_time_ns),
            cap_bytes: stats.and_then(|s| s.cap_bytes),
            total_bytes: stats.and_then(|s| s.total_bytes),
            headroom: stats.and_then(text::headroom_line),
            live_bytes_at_end: stats.map(|s| s.live_bytes_at_end),
            in_use_bytes_at_end: stats.map(|s| s.in_use_bytes_at_end),
            allocations: stats.map(|s| s.allocations),
            job: &d.s.job,
            framework: stats.and_then(|s| s.framework.as_ref()).map(|f| Framework {
                name: text::framework::title(&f.frameworks),
                allocated: on_grid(&f.allocated),
                reserved: on_grid(&f.reserved),
            }),
            processes: series,
            sites,
        }
    }

    /// The call sites' series, by label (the same line in two processes is one site here): the largest on their
    /// own, the rest summed, and what has no call site.
    fn site_series(&self, d: &Dev) -> Vec<SiteSeries> {
        let mut sites = Vec::new();
        if d.sites.keys().any(|k| k.0 != usize::MAX) {
            let mut by_label: Vec<(String, Vec<usize>)> = Vec::new();
            let (mut none, mut other) = (Vec::new(), Vec::new());
            for (k, &part) in &d.sites {
                if *k == NO_SITE_KEY {
                    none.push(part);
                } else if *k == OTHER_SITES_KEY {
                    other.push(part);
                } else {
                    let label = self
                        .labels
                        .get(k)
                        .cloned()
                        .unwrap_or_else(|| format!("stack {} of slot {}", k.1, k.0));
                    match by_label.iter_mut().find(|(l, _)| *l == label) {
                        Some((_, v)) => v.push(part),
                        None => by_label.push((label, vec![part])),
                    }
                }
            }
            let mut summed: Vec<(String, Vec<u64>)> = by_label
                .into_iter()
                .map(|(l, parts)| (l, sum_parts(&d.s, parts.into_iter())))
                .collect();
            summed.sort_by(|x, y| {
                let (mx, my) = (x.1.iter().max(), y.1.iter().max());
                my.cmp(&mx).then(x.0.cmp(&y.0))
            });
            let rest = summed.split_off(summed.len().min(MAX_SITE_SERIES));
            let n_rest = rest.len() + usize::from(!other.is_empty());
            for (name, at) in summed {
                sites.push(SiteSeries { name, at });
            }
            if n_rest > 0 {
                let mut v = sum_parts(&d.s, other.into_iter());
                for (_, r) in rest {
                    for (x, y) in v.iter_mut().zip(r) {
                        *x = x.saturating_add(y);
                    }
                }
                sites.push(SiteSeries {
                    name: "other call sites".into(),
                    at: v,
                });
            }
            if !none.is_empty() {
                let v = sum_parts(&d.s, none.into_iter());
                if v.iter().any(|&x| x > 0) {
                    sites.push(SiteSeries {
                        name: "no call site (below the threshold)".into(),
                        at: v,
                    });
                }
            }
        }
        sites
    }
}

/// Each error's post-mortem, in the words the text report uses.
fn post_mortems(a: &Analysis) -> Vec<PostMortem> {
    a.ooms
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let d = diagnose(a, s);
            PostMortem {
                device: oom_place(s),
                t_ns: s.time_ns,
                pid: s.pid,
                requested_bytes: s.requested_bytes,
                cause: d.cause.key(),
                cause_title: prose::cause_title(d.cause),
                reason: prose::reason(&d),
                line: d.growth_line.as_ref().map(|g| g.label.clone()),
                figures: key_figures(s, &d)
                    .into_iter()
                    .map(|(k, v)| (k, crate::names::units::bytes(v)))
                    .collect(),
                findings: short_findings(&d).map(prose::finding).collect(),
                advice: prose::advice(&d),
                text: event_text(a, s, &d, i + 1),
            }
        })
        .collect()
}

/// The processes' table: each with its devices, peak, allocations and what it left live.
fn processes(a: &Analysis) -> Vec<Process> {
    a.processes
        .iter()
        .enumerate()
        .map(|(slot, p)| {
            let devs: Vec<String> = p
                .per_device
                .iter()
                .map(|d| place(d.on_host, d.device))
                .collect();
            Process {
                slot,
                pid: p.pid,
                rank: p.rank,
                command: short_command(&p.cmdline),
                name: super::super::process_name(p),
                ended: ending_label(p),
                start_ns: p.start_ns,
                end_ns: p.end_ns,
                devices: devs.join(", "),
                peak_bytes: p.peak_bytes,
                peak_time_ns: p.peak_time_ns,
                allocations: p.allocations,
                failed_allocations: p.failed_allocations,
                oom_results: p.oom_results,
                live_bytes_at_end: p.live_bytes_at_end,
                live_allocations_at_end: p.live_allocations_at_end,
            }
        })
        .collect()
}

/// A site's name; a site of a process with PyTorch's caching allocator grew the cache, said beside it.
fn named(a: &Analysis, s: &Site) -> String {
    if a.caching_allocator(s.pid) {
        format!("{} (grew PyTorch's cache)", s.label())
    } else {
        s.label()
    }
}

/// The name of the site at `i` in the call sites' table.
fn site_name(a: &Analysis, i: usize) -> Option<String> {
    a.call_sites.sites.get(i).map(|s| named(a, s))
}

/// Per device, the bytes each call site held at its peak, with what is unlisted or has no site.
fn sites_at_peak(
    a: &Analysis,
    index: &crate::names::fasthash::FastMap<(Option<u32>, bool), usize>,
) -> Vec<AtPeak> {
    a.call_sites
        .at_peak
        .iter()
        .map(|d| {
            let rows = d.rows(&a.call_sites.sites);
            let bytes_of =
                |f: fn(&PeakRow) -> bool| rows.iter().find(|r| f(r)).map_or(0, PeakRow::bytes);
            AtPeak {
                device: index
                    .get(&(d.device, d.on_host))
                    .map(|&i| &a.devices[i])
                    .map_or_else(|| device_name(d.device), text::device_label),
                peak_bytes: d.peak_bytes,
                sites: rows
                    .iter()
                    .filter_map(|r| match r {
                        PeakRow::Site { site, bytes } => Some(SiteBytes {
                            name: site_name(a, *site),
                            bytes: *bytes,
                        }),
                        _ => r.label().map(|l| SiteBytes {
                            name: Some(match r.pid() {
                                Some(pid) if a.processes.len() > 1 => format!("pid {pid}: {l}"),
                                _ => l,
                            }),
                            bytes: r.bytes(),
                        }),
                    })
                    .collect(),
                unlisted_bytes: bytes_of(|r| matches!(r, PeakRow::Unlisted { .. })),
                no_site_bytes: bytes_of(|r| matches!(r, PeakRow::NoSite { .. })),
                note: (!d.tensor_lines.is_empty()).then_some(TENSOR_LINES_NOTE),
            }
        })
        .collect()
}

/// The call sites by the bytes they allocated over the run.
fn sites_by_allocated(a: &Analysis) -> Vec<ByAllocated> {
    a.call_sites
        .by_allocated
        .iter()
        .filter_map(|&i| a.call_sites.sites.get(i))
        .map(|s| ByAllocated {
            name: named(a, s),
            pid: s.pid,
            allocations: s.allocations,
            allocated_bytes: s.allocated_bytes,
            live_bytes_at_end: s.live_bytes_at_end,
        })
        .collect()
}

/// The processes' series on one device: the largest by peak on their own, the rest summed.
fn process_series<'a>(a: &Analysis, d: &'a Dev) -> Vec<Series<'a>> {
    let mut procs: Vec<(usize, usize)> = d.procs.iter().map(|(&s, &p)| (s, p)).collect();
    procs.sort_by(|x, y| {
        d.s.parts[y.1]
            .peak()
            .cmp(&d.s.parts[x.1].peak())
            .then(x.0.cmp(&y.0))
    });
    let rest = procs.split_off(procs.len().min(MAX_PROCESS_SERIES));
    procs.sort_unstable();
    let mut series: Vec<Series> = procs
        .iter()
        .map(|&(slot, part)| {
            let p = &d.s.parts[part];
            Series {
                name: a
                    .processes
                    .get(slot)
                    .map_or(format!("slot {slot}"), super::super::process_name),
                slot: Some(slot),
                pid: a.processes.get(slot).map(|p| p.pid),
                peak_bytes: p.peak(),
                at: Cow::Borrowed(&p.at),
                peaks: p
                    .max
                    .iter()
                    .zip(&p.at)
                    .enumerate()
                    .filter(|(_, (m, at))| m > at)
                    .map(|(i, (&m, _))| (i, m))
                    .collect(),
            }
        })
        .collect();
    if !rest.is_empty() {
        let sum = sum_parts(&d.s, rest.iter().map(|&(_, p)| p));
        series.push(Series {
            name: format!("{} other processes", rest.len()),
            slot: None,
            pid: None,
            peak_bytes: sum.iter().copied().max().unwrap_or(0),
            at: Cow::Owned(sum),
            peaks: Vec::new(),
        });
    }
    series
}

/// The largest allocations live at the end, each with its call site.
fn largest_live(a: &Analysis) -> Vec<Live> {
    a.live_at_end
        .iter()
        .map(|l| Live {
            pid: l.pid,
            device: place(l.on_host, l.device),
            api: l.api.name(),
            bytes: l.bytes,
            alloc_time_ns: l.alloc_time_ns,
            age_ns: l.age_ns,
            call_site: l.site.and_then(|i| site_name(a, i)),
        })
        .collect()
}
