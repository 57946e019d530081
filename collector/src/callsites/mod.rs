//! Call sites: where allocations came from (trace format 2's `Stack`, `Objects` and `Note` records).
//!
//! During the replay (`model::replay::site_store`) each process keeps its stacks (stack id -> native return
//! addresses and Python
//! frames, strings interned, memory bounded by `MAX_STACKS` and the frame limits), its loaded objects (every
//! list it sent, merged: see `ObjectTable`), and per (process, stack, device) an aggregate: allocations,
//! bytes allocated, bytes live now, bytes live at the device's peak, bytes live at the end.
//!
//! Bytes live at the peak cost O(1) an event: a device counts its new peaks (`peak_seq`); an aggregate that
//! changes notes the count it saw, and when it next changes (or at the end) with a newer peak in between, its
//! bytes then (unchanged since) were its bytes at that peak.
//!
//! At the end only the stacks a report shows are turned into [`Site`]s with frames, and only their native
//! addresses are symbolised ([`crate::names::symbols`]). The frame chosen as *the* call site of a stack: its innermost
//! Python frame outside the standard library and the frameworks' own packages ([`FRAMEWORK_PACKAGES`]), else its
//! innermost Python frame; without Python frames, its innermost native frame that is the program's own (not in
//! the CUDA runtime, driver, shim or frameworks' libraries ([`INTERNAL_MODULES`]), not library code by its
//! function's name ([`LIBRARY_FUNCTIONS`]: c10, ATen, cudarc, Rust's std...) or its source file
//! ([`LIBRARY_SOURCES`]: cargo's registry, Rust's own library, system headers)) or a PyTorch autograd node's
//! `apply` (the backward pass, named by its node: [`autograd_node`]); else outside [`CORE_MODULES`] and the
//! allocators' own functions ([`PLUMBING_FUNCTIONS`]); else outside [`CORE_MODULES`]; else the innermost.
//!
//! Two sites whose labels would read the same are told apart ([`distinguish`]): each label is extended with

pub mod frame;
pub mod objects;
pub mod policy;

use std::collections::HashMap;

use frame::base_name;
pub use frame::{short_path, Frame, FrameKind};
use policy::{autograd_engine, module_in, plumbing_native, runtime_function};
pub use policy::{
    autograd_node, is_library_python, own_frame, own_native, AUTOGRAD_ENGINE, AUTOGRAD_NODES,
    CORE_MODULES, CRT_FUNCTIONS, FRAMEWORK_PACKAGES, INTERNAL_DIRS, INTERNAL_MODULES,
    LIBRARY_FUNCTIONS, LIBRARY_SOURCES, PLUMBING_FUNCTIONS, RUNTIME_FUNCTIONS,
};

/// Sites listed per list (each device's peak, bytes allocated, live at an out-of-memory event, what grew).
pub const SITES_LISTED: usize = 10;

/// A call site: one stack of one process, with its figures. `frames` holds its Python frames first (innermost
/// first), then its native frames (innermost first, inlined functions expanded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub pid: u32,
    /// The stack id in the trace.
    pub stack: u32,
    pub frames: Vec<Frame>,
    /// The index in `frames` of the frame chosen as the call site; `None` without frames.
    pub site: Option<usize>,
    /// The stack's frames are not in the trace (never sent, or past [`MAX_STACKS`]).
    pub missing: bool,
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub live_bytes_at_end: u64,
    /// Per device it allocated on, by ordinal.
    pub per_device: Vec<SiteDevice>,
    /// What its label adds to tell it apart from another site's that would read the same ([`distinguish`]).
    pub extra: Vec<Extra>,
}

/// A part added to a call site's label by [`distinguish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    /// The site frame's own file and line (an autograd node's label does not show them).
    Line,
    /// A frame of the stack (an index into `frames`): a caller of the site (`<- ...`), or a frame it came
    /// through (`via ...`).
    Frame(usize),
    /// Nothing in the stacks tells the sites apart: the process and the stack id.
    Id,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteDevice {
    pub device: Option<u32>,
    pub allocations: u64,
    pub allocated_bytes: u64,
    /// Its bytes live when the device reached its peak.
    pub peak_bytes: u64,
    pub live_bytes_at_end: u64,
}

/// Bytes of one call site in a list: `site` indexes [`CallSites::sites`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteBytes {
    pub site: usize,
    /// Allocations (live ones, for live bytes).
    pub count: u64,
    pub bytes: u64,
}

/// The call sites of what was live at a device's peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSites {
    pub device: Option<u32>,
    /// Host memory (`cuMemCreate` with a host location), kept apart from an unknown GPU (both have no device).
    pub on_host: bool,
    pub peak_bytes: u64,
    /// The largest, largest first (at most [`SITES_LISTED`]).
    pub sites: Vec<SiteBytes>,
    /// Bytes at the peak of the sites not listed.
    pub unlisted_bytes: u64,
    /// Bytes at the peak allocated without a call site (stack 0, or past [`MAX_SITES`]).
    pub no_site_bytes: u64,
    /// Each process's bytes at the peak over all its call sites (listed or not), by pid.
    pub by_process: Vec<(u32, u64)>,
    /// Processes whose PyTorch history reaches the peak: their tensors then, by the line that allocated them
    /// (read from the snapshot kept beside the trace; `whatif/trace_file.rs`).
    pub tensor_lines: Vec<TensorLines>,
}

/// A PyTorch process's tensors live at a device's peak, by line: what its cache segments held then, which the
/// segments' own call sites (where the cache grew) do not say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TensorLines {
    pub pid: u32,
    /// The snapshot its history came from (`exit`, `out of memory`).
    pub taken_at: String,
    /// The largest lines (at most [`SITES_LISTED`]): `file:line in function`.
    pub lines: Vec<TensorLine>,
    /// Bytes of the lines not listed.
    pub unlisted_bytes: u64,
    /// Bytes of tensors allocated with no Python frames (autograd's backward pass, native code).
    pub no_line_bytes: u64,
    /// Bytes of tensors live before the history began, their lines unknown.
    pub before_history_bytes: u64,
    /// All its tensors' bytes then (as asked), and its reserve (segments) then.
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLine {
    pub line: String,
    pub bytes: u64,
    pub tensors: u64,
}

/// What rows of tensor lines are, said once under a device's call sites.
pub const TENSOR_LINES_NOTE: &str =
    "PyTorch's tensors by the line that allocated them (its history), not where its cache grew.";

/// One row of a device's call sites at its peak, as every reporter shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeakRow {
    /// A call site of the trace (index into [`CallSites::sites`]).
    Site { site: usize, bytes: u64 },
    /// A PyTorch process's tensors allocated at one line.
    Line { pid: u32, line: String, bytes: u64 },
    /// Tensors of a PyTorch process allocated with no Python frames.
    NoLine { pid: u32, bytes: u64 },
    /// Tensors of a PyTorch process live before its history began.
    BeforeHistory { pid: u32, bytes: u64 },
    /// A PyTorch process's other lines, past the listed ones.
    OtherLines { pid: u32, bytes: u64 },
    /// PyTorch's cache of a process: reserved, in no tensor then.
    CacheFree { pid: u32, bytes: u64 },
    /// A PyTorch process's bytes outside its cache (libraries' own allocations: cuBLAS, NCCL, ...).
    Outside { pid: u32, bytes: u64 },
    /// Call sites not listed.
    Unlisted { bytes: u64 },
    /// Allocated with no call site.
    NoSite { bytes: u64 },
}

impl PeakRow {
    /// The label of a row that is not a call site of the trace, as every reporter shows it (`None`: a call
    /// site, or the other and unsited rows, which each reporter words itself).
    pub fn label(&self) -> Option<String> {
        Some(match self {
            PeakRow::Line { line, .. } => line.clone(),
            PeakRow::NoLine { .. } => {
                "(tensors with no Python line: the backward pass, native code)".into()
            }
            PeakRow::BeforeHistory { .. } => "(tensors from before the history began)".into(),
            PeakRow::OtherLines { .. } => "(other lines)".into(),
            PeakRow::CacheFree { .. } => "PyTorch's cache: reserved, in no tensor then".into(),
            PeakRow::Outside { .. } => {
                "outside PyTorch's cache (libraries' own allocations)".into()
            }
            PeakRow::Site { .. } | PeakRow::Unlisted { .. } | PeakRow::NoSite { .. } => {
                return None
            }
        })
    }

    /// The process a row of tensor lines belongs to.
    pub fn pid(&self) -> Option<u32> {
        match *self {
            PeakRow::Line { pid, .. }
            | PeakRow::NoLine { pid, .. }
            | PeakRow::BeforeHistory { pid, .. }
            | PeakRow::OtherLines { pid, .. }
            | PeakRow::CacheFree { pid, .. }
            | PeakRow::Outside { pid, .. } => Some(pid),
            PeakRow::Site { .. } | PeakRow::Unlisted { .. } | PeakRow::NoSite { .. } => None,
        }
    }

    pub fn bytes(&self) -> u64 {
        match *self {
            PeakRow::Site { bytes, .. }
            | PeakRow::Line { bytes, .. }
            | PeakRow::NoLine { bytes, .. }
            | PeakRow::BeforeHistory { bytes, .. }
            | PeakRow::OtherLines { bytes, .. }
            | PeakRow::CacheFree { bytes, .. }
            | PeakRow::Outside { bytes, .. }
            | PeakRow::Unlisted { bytes }
            | PeakRow::NoSite { bytes } => bytes,
        }
    }
}

impl DeviceSites {
    /// A process's bytes at the peak outside PyTorch's cache, for a process whose tensor lines are known: what
    /// its reserve does not explain of its call sites.
    pub fn outside_cache(&self, pid: u32) -> u64 {
        let Some(t) = self.tensor_lines.iter().find(|t| t.pid == pid) else {
            return 0;
        };
        let process = self.process_bytes(pid);
        process.saturating_sub(t.reserved_bytes.max(t.allocated_bytes))
    }

    /// A process's bytes at the peak over all its call sites.
    pub fn process_bytes(&self, pid: u32) -> u64 {
        self.by_process
            .binary_search_by_key(&pid, |x| x.0)
            .map_or(0, |i| self.by_process[i].1)
    }

    /// The rows every reporter shows, adding up to the peak: for a process whose tensors' lines are known,
    /// those lines, the cache they left free and what it held outside the cache, in place of its own call
    /// sites (where its cache grew); the other processes' call sites as they are.
    pub fn rows(&self, sites: &[Site]) -> Vec<PeakRow> {
        let by_lines = |pid: u32| self.tensor_lines.iter().any(|t| t.pid == pid);
        let pid_of = |i: usize| sites.get(i).map(|s| s.pid);
        let mut rows = Vec::new();
        let mut unlisted = self.unlisted_bytes;
        let mut no_site = self.no_site_bytes;
        for t in &self.tensor_lines {
            let process = self.process_bytes(t.pid);
            // Its sites' bytes, listed or not: the unlisted part leaves the "other call sites" row.
            let listed: u64 = self
                .sites
                .iter()
                .filter(|b| pid_of(b.site) == Some(t.pid))
                .map(|b| b.bytes)
                .sum();
            unlisted = unlisted.saturating_sub(process.saturating_sub(listed));
            for l in &t.lines {
                rows.push(PeakRow::Line {
                    pid: t.pid,
                    line: l.line.clone(),
                    bytes: l.bytes,
                });
            }
            let pid = t.pid;
            for row in [
                PeakRow::OtherLines {
                    pid,
                    bytes: t.unlisted_bytes,
                },
                PeakRow::NoLine {
                    pid,
                    bytes: t.no_line_bytes,
                },
                PeakRow::BeforeHistory {
                    pid,
                    bytes: t.before_history_bytes,
                },
                PeakRow::CacheFree {
                    pid,
                    bytes: t.reserved_bytes.saturating_sub(t.allocated_bytes),
                },
            ] {
                if row.bytes() > 0 {
                    rows.push(row);
                }
            }
            // What the reserve does not explain of the process's sites is outside its cache; a reserve larger
            // than its sites (segments with no call site) comes out of the rows without one.
            let reserve = t.reserved_bytes.max(t.allocated_bytes);
            if process > reserve {
                rows.push(PeakRow::Outside {
                    pid: t.pid,
                    bytes: self.outside_cache(t.pid),
                });
            } else {
                let over = reserve - process;
                let from_no_site = over.min(no_site);
                no_site -= from_no_site;
                unlisted = unlisted.saturating_sub(over - from_no_site);
            }
        }
        rows.extend(
            self.sites
                .iter()
                .filter(|b| !pid_of(b.site).is_some_and(by_lines))
                .map(|b| PeakRow::Site {
                    site: b.site,
                    bytes: b.bytes,
                }),
        );
        rows.sort_by_key(|r| std::cmp::Reverse(r.bytes()));
        for r in [
            PeakRow::Unlisted { bytes: unlisted },
            PeakRow::NoSite { bytes: no_site },
        ] {
            if r.bytes() > 0 {
                rows.push(r);
            }
        }
        rows
    }
}

/// Something the shim said (once, however many processes said it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub text: String,
    /// The first process that said it, and when (relative ns).
    pub pid: u32,
    pub time_ns: u64,
    /// How many processes said it.
    pub processes: u64,
}

/// Everything about call sites in an analysis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallSites {
    /// The trace has stacks (or allocations naming one): reports show call sites.
    pub present: bool,
    /// Stacks in the trace, and those not kept (past the limits).
    pub stacks: u64,
    pub stacks_not_kept: u64,
    /// The sites that lists refer to (by index).
    pub sites: Vec<Site>,
    /// One per device with a peak, by device ordinal.
    pub at_peak: Vec<DeviceSites>,
    /// The sites that allocated the most bytes, most first (at most [`SITES_LISTED`]).
    pub by_allocated: Vec<usize>,
    pub notes: Vec<Note>,
}

impl CallSites {
    /// The sites at `device`'s peak. `at_peak` is in order of device number (no device last): a binary
    /// search, as this is asked once per device and a trace can name a million.
    pub fn at_peak_of(&self, device: Option<u32>, on_host: bool) -> Option<&DeviceSites> {
        let key = |d: &DeviceSites| d.device.unwrap_or(u32::MAX);
        let want = device.unwrap_or(u32::MAX);
        let from = self.at_peak.partition_point(|d| key(d) < want);
        self.at_peak[from..]
            .iter()
            .take_while(|d| key(d) == want)
            .find(|d| d.device == device && d.on_host == on_host)
    }
}

impl Site {
    /// The frame chosen as the call site.
    pub fn site_frame(&self) -> Option<&Frame> {
        self.frames.get(self.site?)
    }

    /// The call site's own frame in one line: its label; for an autograd node, `autograd MmBackward0
    /// (backward pass)`; another frame of a stack through the autograd engine says `(backward pass)` after
    /// it; `stack N (frames not recorded)` without frames.
    pub fn base_label(&self) -> String {
        match self.site_frame() {
            Some(f) => match autograd_node(f) {
                Some(node) => format!("autograd {node} (backward pass)"),
                None if f.kind == FrameKind::Native && self.frames.iter().any(autograd_engine) => {
                    format!("{} (backward pass)", f.label())
                }
                None => f.label(),
            },
            None if self.missing => format!("stack {} (frames not recorded)", self.stack),
            None => format!("stack {} (no frames)", self.stack),
        }
    }

    /// The call site in one line: [`Site::base_label`] and what tells it apart from the other sites
    /// ([`Site::extra`]): `... <- caller`, `... <- … <- a caller further out`, `... via frame`, `... at
    /// file:line`, `... (pid P, stack S)`.
    pub fn label(&self) -> String {
        let mut s = self.base_label();
        let mut prev = self.site.unwrap_or(0);
        for &e in &self.extra {
            let part = self.extra_part(e, prev);
            if let Extra::Frame(j) = e {
                if self.is_caller(j) {
                    prev = j;
                }
            }
            s.push(' ');
            s.push_str(&part);
        }
        s
    }

    /// Whether frame `j` is a caller of the site: after it, of the same kind (Python frames come before the
    /// native ones they sit on, so a native frame is no Python frame's caller).
    fn is_caller(&self, j: usize) -> bool {
        self.site.is_some_and(|i| {
            j > i
                && self.frames[i..=j]
                    .iter()
                    .all(|f| f.kind == self.frames[i].kind)
        })
    }

    /// Whether caller `j` is the program's own to show: not library code, and not the entry point a runtime
    /// generates between two stretches of library code (Rust's `main`, called by the C runtime, calling std's
    /// `lang_start`): only library and runtime frames are on either side of it.
    fn own_caller(&self, j: usize) -> bool {
        let f = &self.frames[j];
        if !own_frame(f) {
            return false;
        }
        let generated_entry = f.file.is_none()
            && j > 0
            && !own_frame(&self.frames[j - 1])
            && self.frames[j + 1..].iter().all(|g| !own_frame(g));
        !generated_entry
    }

    /// The site frame's file and line: `generated/Functions.cpp:123` (or what its label has instead).
    fn site_line(&self) -> Option<String> {
        let f = self.site_frame()?;
        match (&f.file, f.line) {
            (Some(file), Some(l)) if l > 0 => Some(format!("{}:{l}", short_path(file))),
            (Some(file), _) => Some(short_path(file)),
            _ => f
                .offset
                .map(|o| format!("{}+{o:#x}", f.module.as_deref().map_or("?", base_name))),
        }
    }

    /// One part of the label as printed; `prev` is the last caller shown before it (or the site).
    fn extra_part(&self, e: Extra, prev: usize) -> String {
        match e {
            Extra::Line => format!("at {}", self.site_line().unwrap_or_default()),
            Extra::Frame(j) if self.is_caller(j) && j > prev + 1 => {
                format!("<- … <- {}", self.frames[j].label())
            }
            Extra::Frame(j) if self.is_caller(j) => format!("<- {}", self.frames[j].label()),
            Extra::Frame(j) => format!("via {}", self.frames[j].label()),
            Extra::Id => format!("(pid {}, stack {})", self.pid, self.stack),
        }
    }

    /// The call site in lines, for text: [`Site::base_label`]; then its first `callers` callers of the
    /// program's own (library frames folded) and those its label adds (`<- ...`, with `<- …` where callers are skipped); then what else its label adds (`at ...`,
    /// `via ...`, `(pid P, stack S)`).
    pub fn short(&self, callers: usize) -> Vec<String> {
        let mut out = vec![self.base_label()];
        let Some(i) = self.site else {
            return out;
        };
        if self.extra.contains(&Extra::Line) {
            out.push(self.extra_part(Extra::Line, i));
        }
        // Callers of the program's own: library and runtime frames between them (Rust's std and core, the
        // C runtime, a framework's internals) fold into `<- …` as the frames inside the site do.
        let mut shown: Vec<usize> = (i + 1..self.frames.len())
            .take_while(|&j| self.is_caller(j))
            .filter(|&j| self.own_caller(j))
            .take(callers)
            .collect();
        for &e in &self.extra {
            if let Extra::Frame(j) = e {
                if self.is_caller(j) && !shown.contains(&j) {
                    shown.push(j);
                }
            }
        }
        shown.sort_unstable();
        let mut prev = i;
        for j in shown {
            if j > prev + 1 {
                out.push("<- …".to_string());
            }
            out.push(format!("<- {}", self.frames[j].label()));
            prev = j;
        }
        for &e in &self.extra {
            match e {
                Extra::Frame(j) if self.is_caller(j) => {}
                Extra::Line => {}
                e => out.push(self.extra_part(e, i)),
            }
        }
        out
    }

    /// What may tell this site apart from another whose label reads the same, in the order tried: its own
    /// line (when its label lacks it), its callers outward, the frames of its kind inside it (nearest first),
    /// then the others (those outside the allocators and the CUDA runtime first).
    fn candidates(&self) -> Vec<Extra> {
        let Some(i) = self.site else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if autograd_node(&self.frames[i]).is_some() && self.site_line().is_some() {
            out.push(Extra::Line);
        }
        let kind = self.frames[i].kind;
        out.extend(
            (i + 1..self.frames.len())
                .filter(|&j| self.is_caller(j))
                .map(Extra::Frame),
        );
        out.extend(
            (0..i)
                .rev()
                .filter(|&j| self.frames[j].kind == kind)
                .map(Extra::Frame),
        );
        let others: Vec<usize> = (0..self.frames.len())
            .filter(|&j| self.frames[j].kind != kind)
            .collect();
        let quiet = |j: &usize| {
            let f = &self.frames[*j];
            plumbing_native(f)
                || f.module
                    .as_deref()
                    .is_some_and(|m| module_in(m, CORE_MODULES, &[]))
        };
        out.extend(
            others
                .iter()
                .copied()
                .filter(|j| !quiet(j))
                .map(Extra::Frame),
        );
        out.extend(
            others
                .iter()
                .copied()
                .filter(|j| quiet(j))
                .map(Extra::Frame),
        );
        out
    }

    /// How a candidate reads, to compare sites by.
    fn candidate_text(&self, e: Extra) -> String {
        match e {
            Extra::Line => self.site_line().unwrap_or_default(),
            Extra::Frame(j) => self.frames[j].label(),
            Extra::Id => String::new(),
        }
    }
}

/// Rounds of [`distinguish`] at most (each adds one part to the labels of each group that reads the same).
const MAX_DISTINGUISH_ROUNDS: usize = 64;

/// Extends the labels of sites that would read the same until they differ: each group of equal labels gets,
/// from each member's [`Site::candidates`], the first one that is not the same for all of them; sites that
/// nothing tells apart get their process and stack id.
pub fn distinguish(sites: &mut [Site]) {
    tell_apart(sites);
    // A frame two sites share that only their immediate callers tell apart is a wrapper (`Gpu::alloc`, a
    // helper): the caller is the site, the wrapper what it came through (`training at main.rs:332 via
    // Gpu::alloc at main.rs:218`), so the line a reader looks for comes first. Callers further out stay
    // callers (`<- … <- main`): the site stays near the allocation.
    for s in sites.iter_mut() {
        if let (Some(i), Some(&Extra::Frame(j))) = (s.site, s.extra.first()) {
            if j == i + 1 && s.is_caller(j) {
                s.site = Some(j);
                s.extra[0] = Extra::Frame(i);
            }
        }
    }
}

fn tell_apart(sites: &mut [Site]) {
    let candidates: Vec<Vec<Extra>> = sites.iter().map(Site::candidates).collect();
    let mut cursor = vec![0usize; sites.len()];
    for _ in 0..MAX_DISTINGUISH_ROUNDS {
        let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, s) in sites.iter().enumerate() {
            groups.entry(s.label()).or_default().push(i);
        }
        let mut groups: Vec<Vec<usize>> = groups.into_values().filter(|g| g.len() > 1).collect();
        if groups.is_empty() {
            return;
        }
        groups.sort_unstable();
        for g in groups {
            let text = |i: usize, k: usize| {
                candidates[i]
                    .get(cursor[i] + k)
                    .map(|&e| sites[i].candidate_text(e))
            };
            let left = g
                .iter()
                .map(|&i| candidates[i].len().saturating_sub(cursor[i]))
                .max()
                .unwrap_or(0);
            let differs = (0..left).find(|&k| {
                let first = text(g[0], k);
                g.iter().any(|&i| text(i, k) != first)
            });
            for &i in &g {
                match differs {
                    Some(k) => {
                        if let Some(&e) = candidates[i].get(cursor[i] + k) {
                            sites[i].extra.push(e);
                        }
                        cursor[i] += k + 1;
                    }
                    None => {
                        if !sites[i].extra.contains(&Extra::Id) {
                            sites[i].extra.push(Extra::Id);
                        }
                        cursor[i] = candidates[i].len();
                    }
                }
            }
        }
    }
}

/// The index of the frame chosen as the call site (see the module's documentation).
pub fn choose_site(frames: &[Frame]) -> Option<usize> {
    let py: Vec<usize> = (0..frames.len())
        .filter(|&i| frames[i].kind == FrameKind::Python)
        .collect();
    if let Some(&first) = py.first() {
        return Some(
            py.iter()
                .copied()
                .find(|&i| !frames[i].file.as_deref().is_some_and(is_library_python))
                .unwrap_or(first),
        );
    }
    if frames.is_empty() {
        return None;
    }
    let outside_core = |i: usize| {
        !runtime_function(&frames[i])
            && !frames[i]
                .module
                .as_deref()
                .is_some_and(|m| module_in(m, CORE_MODULES, &[]))
    };
    (0..frames.len())
        .find(|&i| own_native(&frames[i]) || autograd_node(&frames[i]).is_some())
        .or_else(|| (0..frames.len()).find(|&i| outside_core(i) && !plumbing_native(&frames[i])))
        .or_else(|| (0..frames.len()).find(|&i| outside_core(i)))
        .or(Some(0))
}

#[cfg(test)]
mod tests;
