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

mod data;
pub mod stacked;

use std::io::{self, Write};

use vramtrace_format::{flags, TraceHeader, NO_DEVICE};

use self::stacked::Stacked;
use std::collections::HashMap;

use super::{site_label, site_of};
use crate::callsites::{distinguish, Site};
use crate::model::observe::tap::{Change, Frames, OomStep, Step, Tap};
use crate::model::Analysis;
use crate::names::fasthash::FastMap;
use crate::reporters::json::print;
use crate::reporters::text::short_command;

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
    /// Each device's index in `devs`.
    dev_ids: FastMap<Option<u32>, usize>,
    last_dev: Option<(Option<u32>, usize)>,
    markers: Vec<Marker>,
    markers_left_out: u64,
    /// Site labels, resolved at the end.
    labels: FastMap<SiteKey, String>,
    sites_past_limit: bool,
    /// The what-if's table, when the trace has PyTorch histories (`whatif_table`).
    whatif: Option<data::WhatIfTable>,
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
        let i = match self.dev_ids.get(&device) {
            Some(&i) => i,
            None => {
                // The devices' timelines share one budget of buckets (as the report's): more devices, coarser
                // each, so a trace naming a million devices costs what 64 do.
                let cap = crate::model::observe::timeline::cap_for(self.devs.len() + 1);
                if cap != crate::model::observe::timeline::cap_for(self.devs.len()) {
                    for d in &mut self.devs {
                        d.s.set_cap(cap);
                    }
                }
                let mut d = Dev::new(device);
                d.s.set_cap(cap);
                self.devs.push(d);
                self.dev_ids.insert(device, self.devs.len() - 1);
                self.devs.len() - 1
            }
        };
        self.last_dev = Some((device, i));
        i
    }

    /// Adds the what-if's answers to the page (a table of each setting's peak, smallest cap and first refusal).
    pub fn set_whatif(&mut self, w: &crate::whatif::answer::WhatIf, start_unix_us: u64) {
        self.whatif = Some(data::WhatIfTable::of(w, start_unix_us));
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
        self.dev_ids = self
            .devs
            .iter()
            .enumerate()
            .map(|(i, d)| (d.device, i))
            .collect();
        self.last_dev = None;
        let json = print::compact(&self.data(a, host));
        // `<` only occurs inside strings: escaped, no `</script>` or `<!--` can end the data early.
        json.replace('<', "\\u003c")
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
        #[derive(serde::Serialize)]
        struct D {
            a: (u64, Option<u64>, bool),
            b: &'static str,
        }
        let s = print::compact(&D {
            a: (1, None, true),
            b: "x</script><!-- \"q\"\n",
        });
        assert_eq!(
            s,
            "{\"a\":[1,null,true],\"b\":\"x</script><!-- \\\"q\\\"\\n\"}"
        );
        assert!(!s.replace('<', "\\u003c").contains('<'));
    }
}
