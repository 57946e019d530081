//! `--format html`: one self-contained page for a person to open (docs/EXPORTS.md): per device an
//! interactive timeline (uPlot, embedded: no network at all) of the job's bytes in use, stacked by process or
//! by call site, with the cap and the device's memory as lines and each out-of-memory error marked, its
//! post-mortem (`vramtrace oom`'s text) beside it; then the top call sites, what was live at the end, and the
//! processes.
//!
//! The timelines ride the replay's tap like the other exports (so they cannot disagree with `report`) and are
//! downsampled as they are built, keeping every bucket's maximum ([`stacked`]): the page's highest point is the
//! report's peak, per device and per process. Everything the page shows is one JSON object in a
//! `<script type="application/json">` (its `<` escaped), drawn by `assets/html/report.js`; the page's
//! Content-Security-Policy forbids every load from anywhere.

pub mod stacked;

use std::io::{self, Write};

use vramtrace_format::{flags, TraceHeader, NO_DEVICE};

use self::stacked::Stacked;
use std::collections::HashMap;

use super::{site_label, site_of};
use crate::callsites::{distinguish, Site};
use crate::fasthash::FastMap;
use crate::model::observe::tap::{Change, Frames, OomStep, Step, Tap};
use crate::model::{Analysis, FOLD_NS};
use crate::reporters::json::{write_compact, J};
use crate::reporters::text::{device_name, ending_label, short_command};

/// Processes drawn on their own in a device's stack (the largest by peak); the rest are one "other processes".
pub const MAX_PROCESS_SERIES: usize = 24;
/// Call sites drawn on their own in a device's stack (the largest); the rest are one "other call sites".
pub const MAX_SITE_SERIES: usize = 10;
/// Call sites followed per device before the rest are counted together (memory: one series each).
pub const MAX_SITE_KEYS: usize = 512;
/// Out-of-memory errors marked on the timelines; the rest are counted.
pub const MAX_OOM_MARKERS: usize = 10_000;
/// The version of the page's JSON (docs/EXPORTS.md).
pub const DATA_VERSION: u64 = 1;

const UPLOT_JS: &str = include_str!("../../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../assets/uplot/LICENSE");
/// uPlot's banner names its home page; the page names no address at all.
const UPLOT_BANNER_URL: &str = "https://github.com/leeoniya/uPlot";
const REPORT_JS: &str = include_str!("../../assets/html/report.js");
const REPORT_CSS: &str = include_str!("../../assets/html/report.css");

/// A call-site key: (slot, stack id); these two stand for no call site and for the sites past the limit.
type SiteKey = (usize, u32);
const NO_SITE_KEY: SiteKey = (usize::MAX, 0);
const OTHER_SITES_KEY: SiteKey = (usize::MAX, 1);

/// One device's timelines and which part of them is which.
struct Dev {
    device: Option<u32>,
    s: Stacked,
    /// slot -> part.
    procs: FastMap<usize, usize>,
    sites: FastMap<SiteKey, usize>,
    /// The last (slot, part) and (site, part) looked up: a process's changes come in runs.
    last_proc: (usize, usize),
    last_site: (SiteKey, usize),
}

impl Dev {
    fn new(device: Option<u32>) -> Self {
        Dev {
            device,
            s: Stacked::default(),
            procs: FastMap::default(),
            sites: FastMap::default(),
            last_proc: (usize::MAX, 0),
            last_site: ((usize::MAX, u32::MAX), 0),
        }
    }

    #[inline]
    fn proc_part(&mut self, slot: usize) -> usize {
        if self.last_proc.0 == slot {
            return self.last_proc.1;
        }
        let part = match self.procs.get(&slot) {
            Some(&p) => p,
            None => {
                let p = self.s.add_part();
                self.procs.insert(slot, p);
                p
            }
        };
        self.last_proc = (slot, part);
        part
    }

    #[inline]
    fn site_part(&mut self, key: SiteKey) -> usize {
        if self.last_site.0 == key {
            return self.last_site.1;
        }
        let part = match self.sites.get(&key) {
            Some(&p) => p,
            None => {
                let key = if self.sites.len() >= MAX_SITE_KEYS && key != NO_SITE_KEY {
                    OTHER_SITES_KEY
                } else {
                    key
                };
                match self.sites.get(&key) {
                    Some(&p) => p,
                    None => {
                        let p = self.s.add_part();
                        self.sites.insert(key, p);
                        p
                    }
                }
            }
        };
        self.last_site = (key, part);
        part
    }
}

/// An out-of-memory error as the replay reached it.
struct Marker {
    t_ns: u64,
    slot: usize,
    pid: u32,
    device: Option<u32>,
    requested: u64,
    cap_refused: bool,
    free: Option<u64>,
    stack: u32,
    /// Pinned host memory (`cuMemCreate` with a host location), not a GPU's.
    on_host: bool,
}

/// The tap that gathers the page's timelines; [`Html::write`] writes the page once the analysis is done.
#[derive(Default)]
pub struct Html {
    header: Option<TraceHeader>,
    devs: Vec<Dev>,
    last_dev: Option<(Option<u32>, usize)>,
    markers: Vec<Marker>,
    markers_left_out: u64,
    /// Site labels, resolved at the end.
    labels: FastMap<SiteKey, String>,
    sites_past_limit: bool,
}

impl Html {
    pub fn new() -> Self {
        Html::default()
    }

    pub fn notes(&self) -> Vec<String> {
        let mut n = Vec::new();
        if self.markers_left_out > 0 {
            n.push(format!(
                "{} out-of-memory errors past the first {MAX_OOM_MARKERS} are not marked on the timelines",
                self.markers_left_out
            ));
        }
        if self.sites_past_limit {
            n.push(format!(
                "call sites past the first {MAX_SITE_KEYS} of a device are drawn together as \"other call sites\""
            ));
        }
        n
    }

    #[inline]
    fn dev(&mut self, device: Option<u32>) -> usize {
        if let Some((d, i)) = self.last_dev {
            if d == device {
                return i;
            }
        }
        let i = match self.devs.iter().position(|d| d.device == device) {
            Some(i) => i,
            None => {
                self.devs.push(Dev::new(device));
                self.devs.len() - 1
            }
        };
        self.last_dev = Some((device, i));
        i
    }

    /// Writes the page: the analysis `a` is the replay's that fed this tap.
    pub fn write<W: Write>(&mut self, a: &Analysis, w: W) -> io::Result<W> {
        let json = self.section(a, None);
        write_page(w, &short_command(&a.header.command), &[json])
    }

    /// This trace's part of a page, as the JSON the page's script draws: `host` names it among several traces
    /// of one job (its hostname, and where its clock starts on the job's).
    pub fn section(&mut self, a: &Analysis, host: Option<(&str, u64)>) -> String {
        for d in &mut self.devs {
            d.s.finish(a.end_ns);
        }
        self.devs.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
        let mut data = self.data(a);
        if let (J::O(fields), Some((name, offset))) = (&mut data, host) {
            fields.push(("host", name.into()));
            fields.push(("host_offset_ns", offset.into()));
        }
        let mut json = String::with_capacity(1 << 20);
        write_compact(&mut json, &data);
        // `<` only occurs inside strings: escaped, no `</script>` or `<!--` can end the data early.
        json.replace('<', "\\u003c")
    }

    fn data(&self, a: &Analysis) -> J {
        let post_mortems: Vec<J> = a
            .ooms
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let d = crate::model::diagnose::diagnose(a, s);
                J::O(vec![
                    ("device", crate::reporters::oom_text::oom_place(s).into()),
                    ("t_ns", s.time_ns.into()),
                    ("pid", s.pid.into()),
                    ("requested_bytes", s.requested_bytes.into()),
                    ("cause", d.cause.key().into()),
                    ("cause_title", d.cause.title().into()),
                    ("reason", d.reason.clone().into()),
                    (
                        "line",
                        d.growth_line.as_ref().map(|g| g.label.clone()).into(),
                    ),
                    (
                        "figures",
                        J::A(
                            crate::model::diagnose::key_figures(s, &d)
                                .into_iter()
                                .map(|(k, v)| J::A(vec![k.into(), crate::units::bytes(v).into()]))
                                .collect(),
                        ),
                    ),
                    (
                        "findings",
                        J::A(
                            crate::model::diagnose::short_findings(&d)
                                .map(|f| f.text().into())
                                .collect(),
                        ),
                    ),
                    (
                        "advice",
                        J::A(d.advice.iter().map(|x| x.as_str().into()).collect()),
                    ),
                    (
                        "text",
                        crate::reporters::oom_text::event_text(a, s, &d, i + 1).into(),
                    ),
                ])
            })
            .collect();
        let markers: Vec<J> = self
            .markers
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
                    .map(|(i, _)| i as u64);
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
                    let at = a.ooms[i as usize].time_ns;
                    self.markers.iter().any(|o| {
                        o.pid == m.pid
                            && o.device == m.device
                            && o.t_ns.abs_diff(at) < m.t_ns.abs_diff(at)
                    })
                });
                J::O(vec![
                    (
                        "device",
                        if m.on_host {
                            "host memory".to_string()
                        } else {
                            device_name(m.device)
                        }
                        .into(),
                    ),
                    ("t_ns", m.t_ns.into()),
                    ("pid", m.pid.into()),
                    ("slot", (m.slot as u64).into()),
                    ("requested_bytes", m.requested.into()),
                    ("cap_refused", m.cap_refused.into()),
                    ("device_free_bytes", m.free.into()),
                    ("call_site", site.into()),
                    ("post_mortem", pm.into()),
                    ("recovered", recovered.into()),
                    ("folded", folded.into()),
                ])
            })
            .collect();
        let devices: Vec<J> = self.devs.iter().map(|d| self.device(a, d)).collect();
        let processes: Vec<J> = a
            .processes
            .iter()
            .enumerate()
            .map(|(slot, p)| {
                let devs: Vec<String> = p
                    .per_device
                    .iter()
                    .map(|d| {
                        if d.on_host {
                            "host memory".to_string()
                        } else {
                            device_name(d.device)
                        }
                    })
                    .collect();
                J::O(vec![
                    ("slot", (slot as u64).into()),
                    ("pid", p.pid.into()),
                    ("rank", p.rank.into()),
                    ("command", short_command(&p.cmdline).into()),
                    ("name", super::process_name(p).into()),
                    ("ended", ending_label(p).into()),
                    ("start_ns", p.start_ns.into()),
                    ("end_ns", p.end_ns.into()),
                    ("devices", devs.join(", ").into()),
                    ("peak_bytes", p.peak_bytes.into()),
                    ("peak_time_ns", p.peak_time_ns.into()),
                    ("allocations", p.allocations.into()),
                    ("failed_allocations", p.failed_allocations.into()),
                    ("oom_results", p.oom_results.into()),
                    ("live_bytes_at_end", p.live_bytes_at_end.into()),
                    ("live_allocations_at_end", p.live_allocations_at_end.into()),
                ])
            })
            .collect();
        // A site of a process with PyTorch's caching allocator grew the cache: said beside its name.
        let named = |s: &Site| {
            if a.caching_allocator(s.pid) {
                format!("{} (grew PyTorch's cache)", s.label())
            } else {
                s.label()
            }
        };
        let site_name = |i: usize| a.call_sites.sites.get(i).map(named);
        let at_peak: Vec<J> = a
            .call_sites
            .at_peak
            .iter()
            .map(|d| {
                let name = a
                    .devices
                    .iter()
                    .find(|x| x.device == d.device && x.on_host == d.on_host)
                    .map_or_else(
                        || device_name(d.device),
                        crate::reporters::text::device_label,
                    );
                J::O(vec![
                    ("device", name.into()),
                    ("peak_bytes", d.peak_bytes.into()),
                    (
                        "sites",
                        J::A(
                            d.sites
                                .iter()
                                .map(|s| {
                                    J::O(vec![
                                        ("name", site_name(s.site).into()),
                                        ("bytes", s.bytes.into()),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                    ("unlisted_bytes", d.unlisted_bytes.into()),
                    ("no_site_bytes", d.no_site_bytes.into()),
                ])
            })
            .collect();
        let by_allocated: Vec<J> = a
            .call_sites
            .by_allocated
            .iter()
            .filter_map(|&i| a.call_sites.sites.get(i))
            .map(|s| {
                J::O(vec![
                    ("name", named(s).into()),
                    ("pid", s.pid.into()),
                    ("allocations", s.allocations.into()),
                    ("allocated_bytes", s.allocated_bytes.into()),
                    ("live_bytes_at_end", s.live_bytes_at_end.into()),
                ])
            })
            .collect();
        let live: Vec<J> = a
            .live_at_end
            .iter()
            .map(|l| {
                J::O(vec![
                    ("pid", l.pid.into()),
                    (
                        "device",
                        if l.on_host {
                            "host memory".to_string()
                        } else {
                            device_name(l.device)
                        }
                        .into(),
                    ),
                    ("api", l.api.name().into()),
                    ("bytes", l.bytes.into()),
                    ("alloc_time_ns", l.alloc_time_ns.into()),
                    ("age_ns", l.age_ns.into()),
                    ("call_site", l.site.and_then(site_name).into()),
                ])
            })
            .collect();
        let mut notes: Vec<J> = self.notes().into_iter().map(J::from).collect();
        notes.extend(a.call_sites.notes.iter().map(|n| J::from(n.text.clone())));
        if a.merge_inexact_events > 0 {
            notes.push(
                format!(
                    "{} events arrived after the merge had replayed later ones (their process broke its \
                     promise of order): they were replayed where they arrived",
                    a.merge_inexact_events
                )
                .into(),
            );
        }
        if a.dropped_events > 0 {
            notes.push(
                format!(
                    "{} events were dropped by the shim (its queue was full): the figures miss them",
                    a.dropped_events
                )
                .into(),
            );
        }
        J::O(vec![
            ("version", DATA_VERSION.into()),
            (
                "made_by",
                concat!("vramtrace ", env!("CARGO_PKG_VERSION")).into(),
            ),
            ("command", short_command(&a.header.command).into()),
            ("start_unix_ns", a.header.start_unix_ns.into()),
            ("duration_ns", a.duration_ns.into()),
            ("events", a.events.into()),
            ("partial", a.stopped.clone().into()),
            ("notes", J::A(notes)),
            ("devices", J::A(devices)),
            ("oom_records", a.oom_records.into()),
            ("refusals_recovered", a.refusals_recovered.into()),
            ("ooms", J::A(markers)),
            ("ooms_not_marked", self.markers_left_out.into()),
            ("post_mortems", J::A(post_mortems)),
            ("ooms_not_analysed", a.ooms_not_snapshotted().into()),
            ("processes", J::A(processes)),
            ("sites_at_peak", J::A(at_peak)),
            ("sites_by_allocated", J::A(by_allocated)),
            (
                "live_at_end",
                J::O(vec![
                    ("count", a.live_at_end_count.into()),
                    ("bytes", a.live_at_end_bytes.into()),
                    ("largest", J::A(live)),
                ]),
            ),
        ])
    }

    fn device(&self, a: &Analysis, d: &Dev) -> J {
        // The series are of GPU memory (host memory is not in them): never the host's figures.
        let stats = a
            .devices
            .iter()
            .find(|x| x.device == d.device && !x.on_host);
        let nums = |v: &[u64]| J::A(v.iter().map(|&x| J::U(x)).collect());
        // Processes: the largest by peak on their own, the rest summed.
        let mut procs: Vec<(usize, usize)> = d.procs.iter().map(|(&s, &p)| (s, p)).collect();
        procs.sort_by(|x, y| {
            d.s.parts[y.1]
                .peak()
                .cmp(&d.s.parts[x.1].peak())
                .then(x.0.cmp(&y.0))
        });
        let rest = procs.split_off(procs.len().min(MAX_PROCESS_SERIES));
        procs.sort_unstable();
        let mut series: Vec<J> = procs
            .iter()
            .map(|&(slot, part)| {
                let p = &d.s.parts[part];
                let name = a
                    .processes
                    .get(slot)
                    .map_or(format!("slot {slot}"), super::process_name);
                let peaks: Vec<J> = p
                    .max
                    .iter()
                    .zip(&p.at)
                    .enumerate()
                    .filter(|(_, (m, at))| m > at)
                    .map(|(i, (&m, _))| J::A(vec![J::U(i as u64), J::U(m)]))
                    .collect();
                J::O(vec![
                    ("name", name.into()),
                    ("slot", (slot as u64).into()),
                    ("pid", a.processes.get(slot).map(|p| p.pid).into()),
                    ("peak_bytes", p.peak().into()),
                    ("at", nums(&p.at)),
                    ("peaks", J::A(peaks)),
                ])
            })
            .collect();
        if !rest.is_empty() {
            let sum = sum_parts(&d.s, rest.iter().map(|&(_, p)| p));
            series.push(J::O(vec![
                ("name", format!("{} other processes", rest.len()).into()),
                ("slot", J::Null),
                ("pid", J::Null),
                ("peak_bytes", sum.iter().copied().max().unwrap_or(0).into()),
                ("at", nums(&sum)),
                ("peaks", J::A(Vec::new())),
            ]));
        }
        // Call sites, by label (the same line in two processes is one site here), the largest on their own.
        let mut sites_j = Vec::new();
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
            for (l, v) in summed {
                sites_j.push(J::O(vec![("name", l.into()), ("at", nums(&v))]));
            }
            if n_rest > 0 {
                let mut v = sum_parts(&d.s, other.into_iter());
                for (_, r) in rest {
                    for (x, y) in v.iter_mut().zip(r) {
                        *x = x.saturating_add(y);
                    }
                }
                sites_j.push(J::O(vec![
                    ("name", "other call sites".into()),
                    ("at", nums(&v)),
                ]));
            }
            if !none.is_empty() {
                let v = sum_parts(&d.s, none.into_iter());
                if v.iter().any(|&x| x > 0) {
                    sites_j.push(J::O(vec![
                        ("name", "no call site (below the threshold)".into()),
                        ("at", nums(&v)),
                    ]));
                }
            }
        }
        let headroom = stats.and_then(crate::reporters::text::headroom_line);
        // PyTorch's allocated and reserved bytes (the bridge's samples), on this page's buckets: each the most
        // its timeline held in the bucket, so they draw beside the driver's bytes.
        let fw = stats.and_then(|s| s.framework.as_ref());
        let on_grid = |tl: &crate::model::Timeline| -> J {
            let w = d.s.width.max(1);
            J::A(
                (0..d.s.job.len() as u64)
                    .map(|i| J::U(tl.max_between(i * w, (i + 1) * w).unwrap_or(0)))
                    .collect(),
            )
        };
        J::O(vec![
            (
                "name",
                stats
                    .map_or_else(
                        || device_name(d.device),
                        crate::reporters::text::device_label,
                    )
                    .into(),
            ),
            ("device", d.device.into()),
            ("bucket_ns", d.s.width.into()),
            ("peak_bytes", stats.map(|s| s.peak_bytes).into()),
            ("peak_time_ns", stats.and_then(|s| s.peak_time_ns).into()),
            ("cap_bytes", stats.and_then(|s| s.cap_bytes).into()),
            ("total_bytes", stats.and_then(|s| s.total_bytes).into()),
            ("headroom", headroom.into()),
            (
                "in_use_bytes_at_end",
                stats.map(|s| s.in_use_bytes_at_end).into(),
            ),
            ("allocations", stats.map(|s| s.allocations).into()),
            ("job", nums(&d.s.job)),
            (
                "framework",
                fw.map_or(J::Null, |f| {
                    J::O(vec![
                        (
                            "name",
                            crate::reporters::text::framework::title(&f.frameworks).into(),
                        ),
                        ("allocated", on_grid(&f.allocated)),
                        ("reserved", on_grid(&f.reserved)),
                    ])
                }),
            ),
            ("processes", J::A(series)),
            ("sites", J::A(sites_j)),
        ])
    }
}

/// The page around its sections' data (one per trace, the first with the id the tests and tools look for).
pub fn write_page<W: Write>(mut w: W, command: &str, sections: &[String]) -> io::Result<W> {
    let title = format!("vramtrace: {command}");
    write!(
        w,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"vramtrace {}\">\n<title>{}</title>\n\
         <!-- The charts are drawn by uPlot 1.6.32, embedded below under its license:\n{}\n-->\n\
         <style>{}</style>\n<style>{}</style>\n</head>\n<body>\n\
         <noscript>This report is drawn by JavaScript (embedded in this file: it loads nothing).</noscript>\n\
         <main id=\"app\"></main>\n",
        env!("CARGO_PKG_VERSION"),
        html_escape(&title),
        UPLOT_LICENSE.trim_end(),
        UPLOT_CSS,
        REPORT_CSS,
    )?;
    for (i, json) in sections.iter().enumerate() {
        let which = if i == 0 {
            "id=\"vramtrace-data\""
        } else {
            "class=\"vramtrace-data\""
        };
        write!(w, "<script type=\"application/json\" {which}>")?;
        w.write_all(json.as_bytes())?;
        w.write_all(b"</script>\n")?;
    }
    write!(
        w,
        "<script>{}</script>\n<script>{}</script>\n</body>\n</html>\n",
        uplot_js(),
        REPORT_JS
    )?;
    Ok(w)
}

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

/// uPlot as shipped, its banner without its address.
fn uplot_js() -> String {
    UPLOT_JS.replacen(UPLOT_BANNER_URL, "github.com/leeoniya/uPlot", 1)
}

fn html_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

impl Tap for Html {
    fn start(&mut self, header: &TraceHeader) {
        self.header = Some(header.clone());
    }

    #[inline]
    fn step(&mut self, s: &Step) {
        // GPU memory only: pinned host memory would share the unknown GPU's series (the report lists it).
        if s.on_host {
            return;
        }
        let grow = match s.change {
            Change::Alloc => true,
            Change::Free | Change::Released => false,
            Change::Map | Change::Unmap => return,
        };
        let d = self.dev(s.device);
        let dev = &mut self.devs[d];
        dev.s.at_time(s.t_ns);
        let pp = dev.proc_part(s.slot);
        let key = if s.stack == 0 {
            NO_SITE_KEY
        } else {
            (s.slot, s.stack)
        };
        let sp = dev.site_part(key);
        let cur = dev.s.parts[sp].cur;
        let v = if grow {
            cur.saturating_add(s.size)
        } else {
            cur.saturating_sub(s.size)
        };
        dev.s
            .set2(pp, s.process_device_bytes, sp, v, s.device_bytes);
    }

    fn oom(&mut self, o: &OomStep) {
        if self.markers.len() >= MAX_OOM_MARKERS {
            self.markers_left_out += 1;
            return;
        }
        self.markers.push(Marker {
            t_ns: o.t_ns,
            slot: o.slot,
            pid: o.process.pid,
            device: (o.oom.device != NO_DEVICE).then_some(o.oom.device),
            requested: o.oom.requested_bytes,
            cap_refused: o.oom.flags & flags::CAP_REFUSED != 0,
            // A host request's record may carry a GPU's figures (older shims): not the host's.
            free: o.oom.device_free_bytes.filter(|_| !o.on_host),
            stack: o.stack,
            on_host: o.on_host,
        });
    }

    fn finish(&mut self, frames: &mut Frames) {
        let mut keys: Vec<SiteKey> = self
            .devs
            .iter()
            .flat_map(|d| d.sites.keys().copied())
            .filter(|k| k.0 != usize::MAX)
            .collect();
        keys.extend(
            self.markers
                .iter()
                .filter(|m| m.stack != 0)
                .map(|m| (m.slot, m.stack)),
        );
        self.sites_past_limit = self
            .devs
            .iter()
            .any(|d| d.sites.contains_key(&OTHER_SITES_KEY));
        // One site per distinct stack (the same stack in several processes is drawn as one), labelled as the
        // report labels its sites: two that would read the same get what tells them apart.
        keys.sort_unstable();
        keys.dedup();
        let mut uniq: HashMap<Vec<String>, usize> = HashMap::new();
        let mut sites: Vec<Site> = Vec::new();
        let mut of_key: Vec<(SiteKey, Option<usize>)> = Vec::with_capacity(keys.len());
        for k in keys {
            let i = frames(k.0, k.1).map(|fr| {
                let sig: Vec<String> = fr.iter().map(|f| f.label()).collect();
                *uniq.entry(sig).or_insert_with(|| {
                    sites.push(site_of(k.1, fr));
                    sites.len() - 1
                })
            });
            of_key.push((k, i));
        }
        distinguish(&mut sites);
        for (k, i) in of_key {
            let label = match i {
                Some(i) => sites[i].label(),
                None => site_label(k.1, None),
            };
            self.labels.insert(k, label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_library_names_no_address_once_its_banner_is_rewritten() {
        assert_eq!(UPLOT_JS.matches("://").count(), 1, "a new address in uPlot");
        assert!(UPLOT_JS.starts_with(&format!("/*! {UPLOT_BANNER_URL} (v1.6.32) */")));
        let js = uplot_js();
        assert!(!js.contains("http://") && !js.contains("https://"));
        for s in [UPLOT_CSS, REPORT_JS, REPORT_CSS, UPLOT_LICENSE] {
            assert!(!s.contains("http://") && !s.contains("https://"));
        }
        // The license sits in an HTML comment: nothing in it may end one.
        assert!(!UPLOT_LICENSE.contains("--"));
        // Nothing in the scripts ends their <script> element early.
        assert!(!js.contains("</script") && !REPORT_JS.contains("</script"));
    }

    #[test]
    fn compact_json_escapes_what_could_end_the_script() {
        let mut s = String::new();
        write_compact(
            &mut s,
            &J::O(vec![
                ("a", J::A(vec![J::U(1), J::Null, J::Bool(true)])),
                ("b", "x</script><!-- \"q\"\n".into()),
            ]),
        );
        assert_eq!(
            s,
            "{\"a\":[1,null,true],\"b\":\"x</script><!-- \\\"q\\\"\\n\"}"
        );
        assert!(!s.replace('<', "\\u003c").contains('<'));
    }
}
