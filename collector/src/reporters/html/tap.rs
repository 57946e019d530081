//! The tap that gathers the page's timelines as the replay runs: per device, the job's bytes stacked by process
//! and by call site ([`super::stacked`]), and each out-of-memory error as the replay reached it.

use std::collections::HashMap;

use vramtrace_format::{flags, TraceHeader, NO_DEVICE};

use super::stacked::Stacked;
use super::whatif::WhatIfTable;
use crate::callsites::{distinguish, Site};
use crate::model::observe::tap::{Change, Frames, OomStep, Step, Tap};
use crate::names::fasthash::FastMap;
use crate::reporters::{site_label, site_of};

/// Call sites followed per device before the rest are counted together (memory: one series each).
pub const MAX_SITE_KEYS: usize = 512;
/// Out-of-memory errors marked on the timelines; the rest are counted.
pub const MAX_OOM_MARKERS: usize = 10_000;

/// A call-site key: (slot, stack id); these two stand for no call site and for the sites past the limit.
pub(super) type SiteKey = (usize, u32);
pub(super) const NO_SITE_KEY: SiteKey = (usize::MAX, 0);
pub(super) const OTHER_SITES_KEY: SiteKey = (usize::MAX, 1);

/// One device's timelines and which part of them is which.
pub(super) struct Dev {
    pub(super) device: Option<u32>,
    pub(super) s: Stacked,
    /// slot -> part.
    pub(super) procs: FastMap<usize, usize>,
    pub(super) sites: FastMap<SiteKey, usize>,
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
pub(super) struct Marker {
    pub(super) t_ns: u64,
    pub(super) slot: usize,
    pub(super) pid: u32,
    pub(super) device: Option<u32>,
    pub(super) requested: u64,
    pub(super) cap_refused: bool,
    pub(super) free: Option<u64>,
    pub(super) stack: u32,
    /// Pinned host memory (`cuMemCreate` with a host location), not a GPU's.
    pub(super) on_host: bool,
}

/// The tap that gathers the page's timelines; [`Html::write`] writes the page once the analysis is done.
#[derive(Default)]
pub struct Html {
    header: Option<TraceHeader>,
    pub(super) devs: Vec<Dev>,
    /// Each device's index in `devs`.
    pub(super) dev_ids: FastMap<Option<u32>, usize>,
    pub(super) last_dev: Option<(Option<u32>, usize)>,
    pub(super) markers: Vec<Marker>,
    pub(super) markers_left_out: u64,
    /// Site labels, resolved at the end.
    pub(super) labels: FastMap<SiteKey, String>,
    sites_past_limit: bool,
    /// The what-if's table, when the trace has PyTorch histories (`whatif_table`).
    pub(super) whatif: Option<WhatIfTable>,
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
        self.whatif = Some(WhatIfTable::of(w, start_unix_us));
    }
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
