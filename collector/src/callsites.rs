//! Call sites: where allocations came from (trace format 2's `Stack`, `Objects` and `Note` records).
//!
//! During the replay ([`Store`]) each process keeps its stacks (stack id -> native return addresses and Python
//! frames, strings interned, memory bounded by [`MAX_STACKS`] and the frame limits), its loaded objects (every
//! list it sent, merged: see [`ObjectTable`]), and per (process, stack, device) an aggregate: allocations,
//! bytes allocated, bytes live now, bytes live at the device's peak, bytes live at the end.
//!
//! Bytes live at the peak cost O(1) an event: a device counts its new peaks (`peak_seq`); an aggregate that
//! changes notes the count it saw, and when it next changes (or at the end) with a newer peak in between, its
//! bytes then (unchanged since) were its bytes at that peak.
//!
//! At the end only the stacks a report shows are turned into [`Site`]s with frames, and only their native
//! addresses are symbolised ([`crate::symbols`]). The frame chosen as *the* call site of a stack: its innermost
//! Python frame outside the standard library and the frameworks' own packages ([`FRAMEWORK_PACKAGES`]), else its
//! innermost Python frame; without Python frames, its innermost native frame that is the program's own (not in
//! the CUDA runtime, driver, shim or frameworks' libraries ([`INTERNAL_MODULES`]), not library code by its
//! function's name ([`LIBRARY_FUNCTIONS`]: c10, ATen, cudarc, Rust's std...) or its source file
//! ([`LIBRARY_SOURCES`]: cargo's registry, Rust's own library, system headers)) or a PyTorch autograd node's
//! `apply` (the backward pass, named by its node: [`autograd_node`]); else outside [`CORE_MODULES`] and the
//! allocators' own functions ([`PLUMBING_FUNCTIONS`]); else outside [`CORE_MODULES`]; else the innermost.
//!
//! Two sites whose labels would read the same are told apart ([`distinguish`]): each label is extended with
//! the first frame (a caller, else a frame it came through) or line that differs, until no two are equal.

use std::collections::HashMap;

use vramtrace_format::{Object, PyFrame, Stack};

use crate::fasthash::FastMap;
use crate::symbols::Symbolizer;

/// Sites listed per list (each device's peak, bytes allocated, live at an out-of-memory event, what grew).
pub const SITES_LISTED: usize = 10;
/// Stacks kept, all processes together; later ones are counted, and their allocations show no frames.
pub const MAX_STACKS: usize = 1 << 20;
/// Native frames kept, all stacks together (8 bytes each).
pub const MAX_NATIVE_FRAMES: usize = 16 << 20;
/// Python frames kept, all stacks together (12 bytes each, strings interned).
pub const MAX_PYTHON_FRAMES: usize = 8 << 20;
/// Bytes of distinct Python file and function names kept.
pub const MAX_STRING_BYTES: usize = 64 << 20;
/// Native frames kept of one stack (the shim sends at most 64).
pub const MAX_STACK_DEPTH: usize = 256;
/// (process, stack, device) aggregates kept; allocations past that count as without a call site.
pub const MAX_SITES: usize = 1 << 21;
/// Distinct objects kept per process.
pub const MAX_OBJECTS: usize = 1 << 16;
/// Distinct notes kept.
pub const MAX_NOTES: usize = 64;

/// Native objects that are never the call site when another frame is: the CUDA driver and runtime, the shim,
/// the frameworks' native libraries, the Python interpreter and the C/C++ runtimes. Matched on the start of the
/// file's name; libraries under [`INTERNAL_DIRS`] too.
pub const INTERNAL_MODULES: &[&str] = &[
    "libcuda.so",
    "libcudart",
    "libvramtrace",
    "libc10",
    "libtorch",
    "libcublas",
    "libcudnn",
    "libnccl",
    "libcufft",
    "libcurand",
    "libcusparse",
    "libcusolver",
    "libnvrtc",
    "libnvJitLink",
    "libxla",
    "xla_extension",
    "libjax",
    "libpython",
    "python",
    "libc.so",
    "libstdc++",
    "libpthread",
    "libgcc_s",
    "ld-linux",
];
/// Of those, the ones that are never the call site even when all frames are internal.
pub const CORE_MODULES: &[&str] = &["libcuda.so", "libcudart", "libvramtrace"];
/// The CUDA runtime linked statically into a program (nvcc's default) lives in the program's own file: its
/// frames are told apart by function name instead. Matched on the start of the demangled name.
pub const RUNTIME_FUNCTIONS: &[&str] = &[
    "libcudart_static_",
    "cudart::",
    "__cudart",
    "cudaMalloc",
    "cudaFree",
];

/// Whether a native frame is CUDA plumbing by its function's name (a statically linked runtime).
fn runtime_function(f: &Frame) -> bool {
    f.function
        .as_deref()
        .is_some_and(|n| RUNTIME_FUNCTIONS.iter().any(|p| n.starts_with(p)))
}
/// Native functions that are library code wherever they are linked, by the start of their demangled name
/// (after a leading `<`, `&`, `mut ` or `dyn ` of a trait implementation): Rust's standard library, the C++
/// runtime, PyTorch (`c10`, ATen, `torch`, caffe2), CUDA's C++ libraries, Rust's CUDA crates (cudarc: its
/// `malloc_async`, `CudaStream::alloc`, `CudaContext` internals) and the frameworks over them.
pub const LIBRARY_FUNCTIONS: &[&str] = &[
    "std::",
    "core::",
    "alloc::",
    "__rust_",
    "__gnu_cxx::",
    "__cxxabiv1::",
    "c10::",
    "at::",
    "torch::",
    "caffe2::",
    "thrust::",
    "cub::",
    "cudarc::",
    "cust::",
    "cust_raw::",
    "candle_core::",
    "candle_nn::",
];
/// The C runtime's functions that start a program or a thread (in the program's own file too).
pub const CRT_FUNCTIONS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
];
/// Source files of library code, by a part of their path: third-party Rust crates (cargo's registry and git
/// checkouts), Rust's standard library (`/rustc/<hash>/library/`, or the `rust-src` component), C and C++
/// system headers, the headers of Python wheels (`site-packages/torch/include/...`) and of the CUDA toolkit.
pub const LIBRARY_SOURCES: &[&str] = &[
    "/.cargo/registry/",
    "/.cargo/git/",
    "/rustlib/src/rust/library/",
    "/usr/include/",
    "/site-packages/",
    "/dist-packages/",
    "/usr/local/cuda",
];
/// Of the library functions, the allocators' own and the runtimes': never the site while another frame
/// outside [`CORE_MODULES`] is there (when a stack has none of the program's own frames).
pub const PLUMBING_FUNCTIONS: &[&str] = &[
    "c10::",
    "at::empty",
    "at::detail::empty",
    "at::native::empty",
    "at::_ops::empty",
    "at::TensorBase::",
    "cudarc::",
    "cust::",
    "cust_raw::",
    "std::",
    "core::",
    "alloc::",
    "__rust_",
    "__gnu_cxx::",
];
/// PyTorch's autograd nodes outside `torch::autograd::generated` (whose every node counts), by class name.
pub const AUTOGRAD_NODES: &[&str] = &[
    "AccumulateGrad",
    "CopyBackwards",
    "CopySlices",
    "PyNode",
    "GraphRoot",
    "Error",
    "DelayedError",
    "UndefinedGrad",
    "UndefinedGradBackward",
    "Identity",
    "Scatter",
    "Gather",
];
/// Frames of PyTorch's autograd engine that run a node: a stack through one of them is the backward pass.
pub const AUTOGRAD_ENGINE: &[&str] = &[
    "torch::autograd::Engine::",
    "torch::autograd::Node::operator()",
    "torch::autograd::call_function",
];

/// A demangled name without the `<`, `&`, `mut ` and `dyn ` before a trait implementation's type.
fn name_path(n: &str) -> &str {
    let mut n = n;
    loop {
        let m = n
            .trim_start_matches(['<', '&'])
            .trim_start_matches("mut ")
            .trim_start_matches("dyn ");
        if m.len() == n.len() {
            return n;
        }
        n = m;
    }
}

/// Whether a native frame is library code by its function's name or its source file.
fn library_native(f: &Frame) -> bool {
    let by_name = f.function.as_deref().is_some_and(|n| {
        let p = name_path(n);
        LIBRARY_FUNCTIONS.iter().any(|l| p.starts_with(l))
            || CRT_FUNCTIONS.contains(&n)
            || runtime_function(f)
    });
    let by_file = f
        .file
        .as_deref()
        .is_some_and(|p| p.starts_with("/rustc/") || LIBRARY_SOURCES.iter().any(|l| p.contains(l)));
    by_name || by_file
}

/// Whether a native frame is an allocator's or a runtime's own function (see [`PLUMBING_FUNCTIONS`]).
fn plumbing_native(f: &Frame) -> bool {
    runtime_function(f)
        || f.function.as_deref().is_some_and(|n| {
            let p = name_path(n);
            PLUMBING_FUNCTIONS.iter().any(|l| p.starts_with(l)) || CRT_FUNCTIONS.contains(&n)
        })
}

/// Whether a native frame is the program's own: outside the internal libraries, not library code.
pub fn own_native(f: &Frame) -> bool {
    f.kind == FrameKind::Native
        && !f
            .module
            .as_deref()
            .is_some_and(|m| module_in(m, INTERNAL_MODULES, INTERNAL_DIRS))
        && !library_native(f)
}

/// The `::`-separated parts of a demangled C++ or Rust name, without its parameters: `a::B<c::D>::f(int)` ->
/// `["a", "B<c::D>", "f"]`.
fn name_parts(name: &str) -> Vec<String> {
    let name = name.replace("(anonymous namespace)", "{anonymous}");
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth <= 0 => break,
            ':' if depth <= 0 && chars.peek() == Some(&':') => {
                chars.next();
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts
}

/// `MmBackward0`, `AddmmBackward1`: a generated node's class name.
fn numbered_backward(node: &str) -> bool {
    let digits = node.trim_end_matches(|c: char| c.is_ascii_digit());
    digits.len() < node.len()
        && digits.strip_suffix("Backward").is_some_and(|s| {
            !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// The PyTorch autograd node whose `apply` a native frame is, from its demangled name: any node of
/// `torch::autograd::generated::` (`MmBackward0`, `AddmmBackward0`), any `*Backward<N>::apply` elsewhere, and
/// the hand-written nodes of `torch::autograd::` ([`AUTOGRAD_NODES`]; a C++ custom function's `CppNode<F>`
/// gives `F`). `None` for anything else (`torch::autograd::Function<F>::apply` is the forward pass).
pub fn autograd_node(f: &Frame) -> Option<String> {
    if f.kind != FrameKind::Native {
        return None;
    }
    let parts = name_parts(f.function.as_deref()?);
    let [ns @ .., node, last] = parts.as_slice() else {
        return None;
    };
    if last != "apply" && last != "apply_with_saved" {
        return None;
    }
    let torch = ns.len() >= 2 && ns[0] == "torch" && ns[1] == "autograd";
    let generated = torch && ns.get(2).is_some_and(|n| n == "generated");
    if let Some(inner) = node
        .strip_prefix("CppNode<")
        .and_then(|n| n.strip_suffix('>'))
    {
        return torch.then(|| inner.to_string());
    }
    let known = torch && AUTOGRAD_NODES.contains(&node.as_str());
    (generated || known || numbered_backward(node)).then(|| node.clone())
}

/// Whether a native frame is PyTorch's autograd engine running a node.
fn autograd_engine(f: &Frame) -> bool {
    f.kind == FrameKind::Native
        && f.function
            .as_deref()
            .is_some_and(|n| AUTOGRAD_ENGINE.iter().any(|e| n.starts_with(e)))
}

/// Python packages whose frames are framework internals (in `site-packages` or `dist-packages`).
pub const FRAMEWORK_PACKAGES: &[&str] =
    &["torch", "jax", "jaxlib", "cupy", "cupyx", "cupy_backends"];

/// Python or native.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Python,
    Native,
}

impl FrameKind {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            FrameKind::Python => "python",
            FrameKind::Native => "native",
        }
    }
}

/// One frame of a call stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    /// Python: the function; native: the demangled function (debug info or symbol table), when known.
    pub function: Option<String>,
    /// Python: the source file; native: the source file from debug info.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Native: the object (executable or library) the address is in, as the loader named it.
    pub module: Option<String>,
    /// Native: the address in the object's own terms (address - load bias): `module+0xoffset`.
    pub offset: Option<u64>,
    /// Native: the return address in the process.
    pub address: Option<u64>,
    /// Native: a function inlined at this address into the next frame.
    pub inlined: bool,
    /// Why a native frame is not (fully) symbolised, when there is something to say.
    pub note: Option<String>,
}

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
    pub fn at_peak_of(&self, device: Option<u32>, on_host: bool) -> Option<&DeviceSites> {
        self.at_peak
            .iter()
            .find(|d| d.device == device && d.on_host == on_host)
    }
}

impl Frame {
    /// One line: `train.py:88 in build_model`, `alloc_weights at src/prog.c:12`, `alloc_weights in prog`,
    /// `libfoo.so+0x1234`, `0x7f3a12345678`.
    pub fn label(&self) -> String {
        let mut s = match self.kind {
            FrameKind::Python => {
                let file = self.file.as_deref().map_or("?".to_string(), short_path);
                let mut s = match self.line {
                    Some(l) if l > 0 => format!("{file}:{l}"),
                    _ => file,
                };
                if let Some(f) = &self.function {
                    s.push_str(&format!(" in {f}"));
                }
                s
            }
            FrameKind::Native => {
                let module = self.module.as_deref().map(base_name);
                match (&self.function, &self.file, module) {
                    (Some(f), Some(file), _) => match self.line {
                        Some(l) if l > 0 => format!("{f} at {}:{l}", short_path(file)),
                        _ => format!("{f} at {}", short_path(file)),
                    },
                    (Some(f), None, Some(m)) => format!("{f} in {m}"),
                    (Some(f), None, None) => f.clone(),
                    (None, _, Some(m)) => format!("{m}+{:#x}", self.offset.unwrap_or(0)),
                    (None, _, None) => format!("{:#x}", self.address.unwrap_or(0)),
                }
            }
        };
        if self.inlined {
            s.push_str(" (inlined)");
        }
        if self.note.as_deref() == Some(crate::symbols::REBUILT) {
            s.push_str(" (rebuilt since: not symbolised)");
        }
        s
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

    /// The call site in lines, for text: [`Site::base_label`]; then its first `callers` callers and those its
    /// label adds (`<- ...`, with `<- …` where callers are skipped); then what else its label adds (`at ...`,
    /// `via ...`, `(pid P, stack S)`).
    pub fn short(&self, callers: usize) -> Vec<String> {
        let mut out = vec![self.base_label()];
        let Some(i) = self.site else {
            return out;
        };
        if self.extra.contains(&Extra::Line) {
            out.push(self.extra_part(Extra::Line, i));
        }
        let mut shown: Vec<usize> = (i + 1..self.frames.len())
            .take_while(|&j| self.is_caller(j))
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

/// The last two components of a path: `proj/train.py`.
pub fn short_path(p: &str) -> String {
    let mut parts = p.rsplitn(3, '/');
    let last = parts.next().unwrap_or(p);
    match parts.next() {
        Some(dir) if !dir.is_empty() => format!("{dir}/{last}"),
        _ => last.to_string(),
    }
}

fn base_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Directories whose native libraries are framework internals (PyTorch's, JAX's, CuPy's, NVIDIA's wheels).
pub const INTERNAL_DIRS: &[&str] = &[
    "/torch/lib/",
    "/jaxlib/",
    "/cupy_backends/",
    "/cupy/",
    "/nvidia/",
];

fn module_in(path: &str, list: &[&str], dirs: &[&str]) -> bool {
    let base = base_name(path);
    list.iter().any(|m| base.starts_with(m)) || dirs.iter().any(|d| path.contains(d))
}

/// A Python file of the standard library or of a framework's own package.
pub fn is_library_python(file: &str) -> bool {
    if file.starts_with('<') {
        return true; // <frozen importlib._bootstrap>, <string>...
    }
    for pkgs in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.find(pkgs) {
            let rest = &file[i + pkgs.len()..];
            let top = rest.split('/').next().unwrap_or("");
            let top = top.strip_suffix(".py").unwrap_or(top);
            return FRAMEWORK_PACKAGES.contains(&top);
        }
    }
    // The standard library: .../lib/python3.12/...
    file.contains("/lib/python")
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

// ---- during the replay ----------------------------------------------------------------------------------

/// No call site.
pub(crate) const NO_SITE: u32 = u32::MAX;

/// The figures of one (process slot, stack id, device index).
#[derive(Clone)]
pub(crate) struct Agg {
    pub slot: u32,
    pub stack: u32,
    pub dev: u16,
    /// The device's `peak_seq` when this last changed.
    pub seen: u64,
    pub cur: u64,
    pub at_peak: u64,
    pub live_count: u64,
    pub allocations: u64,
    pub bytes: u64,
    pub live_end: u64,
}

impl Agg {
    /// Before a change at a moment when the device has seen `peak_seq` peaks: the bytes now were the bytes at
    /// every peak since the last change.
    #[inline]
    pub fn sync(&mut self, peak_seq: u64) {
        if self.seen < peak_seq {
            self.at_peak = self.cur;
            self.seen = peak_seq;
        }
    }
}

/// A stack as kept: ranges of the frame arenas.
#[derive(Clone, Copy)]
struct RawStack {
    native: u32,
    native_len: u32,
    python: u32,
    python_len: u32,
    /// The process's objects generation when it arrived.
    gen: u32,
}

/// One loaded object as a process listed it, over all its lists.
#[derive(Clone)]
pub(crate) struct ObjEntry {
    pub path: Box<str>,
    pub bias: u64,
    pub text: Vec<(u64, u64)>,
    pub build_id: Vec<u8>,
    /// The first and last lists (generations) naming it.
    first: u32,
    last: u32,
}

/// A process's loaded objects: every list it sent, merged. An address is looked up in the objects loaded when
/// its stack arrived, else in the latest list, else in earlier ones (newest first).
#[derive(Default)]
pub(crate) struct ObjectTable {
    gen: u32,
    entries: Vec<ObjEntry>,
    index: HashMap<(Box<str>, u64, Vec<u8>), usize>,
}

impl ObjectTable {
    fn update(&mut self, objects: Vec<Object>) {
        self.gen += 1;
        for o in objects {
            let key = (o.path.into_boxed_str(), o.bias, o.build_id);
            match self.index.get(&key) {
                Some(&i) => {
                    let e = &mut self.entries[i];
                    e.last = self.gen;
                    e.text = o.text;
                }
                None if self.entries.len() < MAX_OBJECTS => {
                    self.entries.push(ObjEntry {
                        path: key.0.clone(),
                        bias: key.1,
                        text: o.text,
                        build_id: key.2.clone(),
                        first: self.gen,
                        last: self.gen,
                    });
                    self.index.insert(key, self.entries.len() - 1);
                }
                None => {}
            }
        }
    }

    pub fn find(&self, addr: u64, gen: u32) -> Option<&ObjEntry> {
        let has = |e: &&ObjEntry| e.text.iter().any(|&(a, b)| addr >= a && addr < b);
        let alive = |e: &&ObjEntry| e.first <= gen && gen <= e.last;
        self.entries
            .iter()
            .filter(has)
            .max_by_key(|e| (alive(e), e.last))
    }
}

/// A process's call-site state.
pub(crate) struct ProcSites {
    /// Stack id -> kept stack.
    stacks: FastMap<u32, u32>,
    /// (stack id << 16 | device index) -> aggregate.
    sites: FastMap<u64, u32>,
    last: (u64, u32),
    pub objects: ObjectTable,
}

impl Default for ProcSites {
    fn default() -> Self {
        ProcSites {
            stacks: FastMap::default(),
            sites: FastMap::default(),
            last: (u64::MAX, NO_SITE),
            objects: ObjectTable::default(),
        }
    }
}

/// All processes' stacks, interned names, aggregates and notes.
#[derive(Default)]
pub(crate) struct Store {
    strings: Vec<Box<str>>,
    string_ids: HashMap<Box<str>, u32>,
    string_bytes: usize,
    python: Vec<[u32; 3]>,
    native: Vec<u64>,
    stacks: Vec<RawStack>,
    pub aggs: Vec<Agg>,
    notes: Vec<(Note, Vec<u32>)>,
    pub stacks_seen: u64,
    pub stacks_not_kept: u64,
    /// Stack or objects records seen, or an event naming a stack.
    pub any: bool,
}

impl Store {
    fn intern(&mut self, s: String) -> Option<u32> {
        if let Some(&i) = self.string_ids.get(s.as_str()) {
            return Some(i);
        }
        if self.string_bytes + s.len() > MAX_STRING_BYTES {
            return None;
        }
        self.string_bytes += s.len();
        let b: Box<str> = s.into_boxed_str();
        let i = self.strings.len() as u32;
        self.strings.push(b.clone());
        self.string_ids.insert(b, i);
        Some(i)
    }

    pub fn on_stack(&mut self, ps: &mut ProcSites, st: Stack) {
        self.any = true;
        self.stacks_seen += 1;
        if st.id == 0 || ps.stacks.contains_key(&st.id) {
            return;
        }
        let native_len = st.native.len().min(MAX_STACK_DEPTH);
        let python_len = st.python.len().min(MAX_STACK_DEPTH);
        if self.stacks.len() >= MAX_STACKS
            || self.native.len() + native_len > MAX_NATIVE_FRAMES
            || self.python.len() + python_len > MAX_PYTHON_FRAMES
        {
            self.stacks_not_kept += 1;
            return;
        }
        let mut py = Vec::with_capacity(python_len);
        for PyFrame {
            file,
            function,
            line,
        } in st.python.into_iter().take(python_len)
        {
            match (self.intern(file), self.intern(function)) {
                (Some(f), Some(g)) => py.push([f, g, line]),
                _ => {
                    self.stacks_not_kept += 1;
                    return;
                }
            }
        }
        let raw = RawStack {
            native: self.native.len() as u32,
            native_len: native_len as u32,
            python: self.python.len() as u32,
            python_len: py.len() as u32,
            gen: ps.objects.gen,
        };
        self.native.extend_from_slice(&st.native[..native_len]);
        self.python.extend(py);
        ps.stacks.insert(st.id, self.stacks.len() as u32);
        self.stacks.push(raw);
    }

    pub fn on_objects(&mut self, ps: &mut ProcSites, objects: Vec<Object>) {
        self.any = true;
        ps.objects.update(objects);
    }

    pub fn on_note(&mut self, pid: u32, time_ns: u64, text: String) {
        if let Some((n, pids)) = self.notes.iter_mut().find(|(n, _)| n.text == text) {
            if !pids.contains(&pid) && pids.len() < 4096 {
                pids.push(pid);
                n.processes += 1;
            }
            return;
        }
        if self.notes.len() < MAX_NOTES {
            self.notes.push((
                Note {
                    text,
                    pid,
                    time_ns,
                    processes: 1,
                },
                vec![pid],
            ));
        }
    }

    /// The aggregate of an allocation of `stack` on device index `dev` by process slot `slot`.
    #[inline]
    pub fn site_for(&mut self, ps: &mut ProcSites, slot: usize, stack: u32, dev: u16) -> u32 {
        if stack == 0 {
            return NO_SITE;
        }
        let key = (stack as u64) << 16 | dev as u64;
        if ps.last.0 == key {
            return ps.last.1;
        }
        let idx = match ps.sites.get(&key) {
            Some(&i) => i,
            None => {
                if self.aggs.len() >= MAX_SITES {
                    return NO_SITE;
                }
                self.any = true;
                let i = self.aggs.len() as u32;
                self.aggs.push(Agg {
                    slot: slot as u32,
                    stack,
                    dev,
                    seen: 0,
                    cur: 0,
                    at_peak: 0,
                    live_count: 0,
                    allocations: 0,
                    bytes: 0,
                    live_end: 0,
                });
                ps.sites.insert(key, i);
                i
            }
        };
        ps.last = (key, idx);
        idx
    }

    pub fn notes(&self) -> Vec<Note> {
        self.notes.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The frames of stack `id` of a process, Python first then native, symbolised with `sym` (without it,
    /// native frames are `module+offset`). `None` when the stack is not kept.
    pub fn frames(
        &self,
        ps: &ProcSites,
        id: u32,
        mut sym: Option<&mut Symbolizer>,
    ) -> Option<Vec<Frame>> {
        let raw = *self.stacks.get(*ps.stacks.get(&id)? as usize)?;
        let mut out = Vec::new();
        let py = &self.python[raw.python as usize..(raw.python + raw.python_len) as usize];
        for &[file, function, line] in py {
            let text =
                |i: u32| Some(self.strings[i as usize].to_string()).filter(|s| !s.is_empty());
            out.push(Frame {
                kind: FrameKind::Python,
                function: text(function),
                file: text(file),
                line: (line > 0).then_some(line),
                module: None,
                offset: None,
                address: None,
                inlined: false,
                note: None,
            });
        }
        let native = &self.native[raw.native as usize..(raw.native + raw.native_len) as usize];
        for &addr in native {
            let raw_frame = |module: Option<&ObjEntry>, note: Option<&str>| Frame {
                kind: FrameKind::Native,
                function: None,
                file: None,
                line: None,
                module: module.map(|o| {
                    if o.path.is_empty() {
                        "(main program)".to_string()
                    } else {
                        o.path.to_string()
                    }
                }),
                offset: module.map(|o| addr.wrapping_sub(o.bias)),
                address: Some(addr),
                inlined: false,
                note: note.map(str::to_string),
            };
            let Some(o) = ps.objects.find(addr, raw.gen) else {
                out.push(raw_frame(
                    None,
                    Some("in no loaded object (JIT or anonymous memory)"),
                ));
                continue;
            };
            let Some(s) = sym.as_deref_mut() else {
                out.push(raw_frame(Some(o), None));
                continue;
            };
            let r = s.resolve(&o.path, &o.build_id, o.bias, addr);
            if r.frames.is_empty() {
                out.push(raw_frame(Some(o), r.note));
                continue;
            }
            for f in r.frames {
                let mut fr = raw_frame(Some(o), r.note);
                fr.function = f.function;
                fr.file = f.file;
                fr.line = f.line;
                fr.inlined = f.inlined;
                out.push(fr);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(file: &str) -> Frame {
        Frame {
            kind: FrameKind::Python,
            function: Some("f".into()),
            file: Some(file.into()),
            line: Some(3),
            module: None,
            offset: None,
            address: None,
            inlined: false,
            note: None,
        }
    }

    fn native(module: &str) -> Frame {
        Frame {
            kind: FrameKind::Native,
            function: None,
            file: None,
            line: None,
            module: Some(module.into()),
            offset: Some(0x10),
            address: Some(0x1010),
            inlined: false,
            note: None,
        }
    }

    #[test]
    fn the_site_skips_library_and_internal_frames() {
        let f = vec![
            py("/usr/lib/python3.12/site-packages/torch/nn/modules/module.py"),
            py("/usr/lib/python3.12/functools.py"),
            py("/home/u/train.py"),
            py("/home/u/main.py"),
        ];
        assert_eq!(choose_site(&f), Some(2));
        let f = vec![py("/x/site-packages/torch/a.py"), py("<frozen runpy>")];
        assert_eq!(choose_site(&f), Some(0));
        let f = vec![
            native("/usr/lib/x86_64-linux-gnu/libcudart.so.12"),
            native("/opt/conda/lib/python3.11/site-packages/torch/lib/libc10_cuda.so"),
            native("/home/u/app"),
        ];
        assert_eq!(choose_site(&f), Some(2));
        let f = vec![
            native("/usr/lib/libcudart.so.12"),
            native("/x/libtorch_cuda.so"),
        ];
        assert_eq!(choose_site(&f), Some(1));
        assert_eq!(choose_site(&[]), None);
        // nvcc's default: the runtime is inside the program itself; its frames are known by their names.
        let named = |path: &str, function: &str| Frame {
            function: Some(function.to_string()),
            ..native(path)
        };
        let f = vec![
            native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            named("/home/u/allocs", "libcudart_static_3130888"),
            named("/home/u/allocs", "cudaMalloc"),
            named("/home/u/allocs", "main"),
        ];
        assert_eq!(choose_site(&f), Some(3));
        assert!(!is_library_python(
            "/x/site-packages/transformers/models/llama.py"
        ));
        assert!(is_library_python("/x/dist-packages/jax/_src/api.py"));
    }

    /// A symbolised native frame.
    fn sym(module: &str, function: &str, file: Option<&str>, line: u32) -> Frame {
        Frame {
            function: Some(function.to_string()),
            file: file.map(str::to_string),
            line: (line > 0).then_some(line),
            ..native(module)
        }
    }

    /// A site over `frames`, its site chosen as a report chooses it.
    fn site(pid: u32, stack: u32, frames: Vec<Frame>) -> Site {
        Site {
            pid,
            stack,
            site: choose_site(&frames),
            frames,
            missing: false,
            allocations: 1,
            allocated_bytes: 1,
            live_bytes_at_end: 0,
            per_device: Vec::new(),
            extra: Vec::new(),
        }
    }

    const TORCH_LIB: &str = "/opt/env/lib/python3.12/site-packages/torch/lib/";

    /// The native stack of an allocation on PyTorch's backward thread (no Python frames): the caching
    /// allocator, an ATen op, the node's helper, the node's `apply`, the engine, the C++ runtime's thread.
    fn backward_stack(node: &str, line: u32) -> Vec<Frame> {
        let lib = |l: &str| format!("{TORCH_LIB}{l}");
        vec![
            native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            sym(
                &lib("libc10_cuda.so"),
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
                None,
                0,
            ),
            sym(
                &lib("libc10_cuda.so"),
                "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
                None,
                0,
            ),
            sym(
                &lib("libtorch_cuda.so"),
                "at::native::structured_mm_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&)",
                None,
                0,
            ),
            sym(
                &lib("libtorch_cpu.so"),
                "torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, c10::Layout, c10::Scalar const&)",
                None,
                0,
            ),
            sym(
                &lib("libtorch_cpu.so"),
                &format!("torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
                Some("/pytorch/torch/csrc/autograd/generated/Functions.cpp"),
                line,
            ),
            sym(
                &lib("libtorch_cpu.so"),
                "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
                None,
                0,
            ),
            sym(
                &lib("libtorch_cpu.so"),
                "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
                None,
                0,
            ),
            sym(
                &lib("libtorch_cpu.so"),
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                None,
                0,
            ),
            sym(
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                "execute_native_thread_routine",
                None,
                0,
            ),
            sym("/usr/lib/x86_64-linux-gnu/libc.so.6", "start_thread", None, 0),
        ]
    }

    #[test]
    fn a_backward_thread_is_named_by_its_autograd_node() {
        let f = backward_stack("MmBackward0", 1234);
        assert_eq!(choose_site(&f), Some(5));
        let s = site(1, 1, f);
        assert_eq!(s.label(), "autograd MmBackward0 (backward pass)");
        let s = site(1, 2, backward_stack("AddmmBackward0", 77));
        assert_eq!(s.label(), "autograd AddmmBackward0 (backward pass)");
        // The hand-written nodes, by their names; a C++ custom function by its own.
        let node = |name: &str| autograd_node(&sym("/x/libtorch_cpu.so", name, None, 0));
        assert_eq!(
            node("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")
                .as_deref(),
            Some("AccumulateGrad")
        );
        assert_eq!(
            node("torch::autograd::CppNode<MyLinearFunction>::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")
                .as_deref(),
            Some("MyLinearFunction")
        );
        assert_eq!(
            node("torch::autograd::PyNode::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")
                .as_deref(),
            Some("PyNode")
        );
        assert_eq!(
            node("torch_npu::autograd::generated::NpuFusedAttentionBackward1::apply").as_deref(),
            Some("NpuFusedAttentionBackward1")
        );
        // Not nodes: the forward pass of a custom function, the engine, the base class, other `apply`s.
        for name in [
            "torch::autograd::Function<MyLinearFunction>::apply<at::Tensor&>(at::Tensor&)",
            "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
            "torch::autograd::Node::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
            "myproj::Backward::apply(int)",
            "at::native::(anonymous namespace)::apply(int)",
            "mm_backward",
        ] {
            assert_eq!(node(name), None, "{name}");
        }
        // A frame of the program's own inside the node (a C++ extension's backward) is the site.
        let mut f = backward_stack("MmBackward0", 1234);
        f.insert(
            4,
            sym(
                "/home/u/ext/my_ext.so",
                "my_ext::fused_backward(at::Tensor const&)",
                Some("/home/u/ext/fused.cu"),
                40,
            ),
        );
        assert_eq!(choose_site(&f), Some(4));
        // With Python frames, the Python rule holds.
        let mut f = backward_stack("MmBackward0", 1234);
        f.insert(0, py("/home/u/train.py"));
        assert_eq!(choose_site(&f), Some(0));
        // The engine without a named node: the innermost frame outside the allocator, marked as the backward
        // pass.
        let mut f = backward_stack("MmBackward0", 1234);
        f.remove(5);
        f.remove(4);
        let s = site(1, 3, f);
        assert_eq!(s.site, Some(3));
        assert!(
            s.label()
                .starts_with("at::native::structured_mm_out_cuda::impl(")
                && s.label().ends_with(" (backward pass)"),
            "{}",
            s.label()
        );
    }

    /// The demo's stack: cudarc's allocation over the workload's own functions, over Rust's std and libc.
    fn cudarc_stack(caller_line: u32) -> Vec<Frame> {
        let exe = "/work/target/release/vramtrace-workload";
        let reg =
            "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/cudarc-0.19.10/src/driver";
        let std = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        let mut inlined = sym(
            exe,
            "cudarc::driver::sys::cuMemAllocAsync",
            Some(&format!("{reg}/sys/mod.rs")),
            13214,
        );
        inlined.inlined = true;
        let mut training = sym(
            exe,
            "vramtrace_workload::training",
            Some("/work/workload/src/main.rs"),
            caller_line,
        );
        training.inlined = true;
        vec![
            native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            inlined,
            sym(
                exe,
                "cudarc::driver::result::malloc_async",
                Some(&format!("{reg}/result.rs")),
                831,
            ),
            sym(
                exe,
                "cudarc::driver::safe::core::CudaStream::alloc",
                Some(&format!("{reg}/safe/core.rs")),
                1629,
            ),
            sym(
                exe,
                "cudarc::driver::safe::core::CudaStream::alloc_zeros",
                Some(&format!("{reg}/safe/core.rs")),
                1656,
            ),
            sym(
                exe,
                "vramtrace_workload::Gpu::alloc",
                Some("/work/workload/src/main.rs"),
                218,
            ),
            training,
            sym(
                exe,
                "vramtrace_workload::main",
                Some("/work/workload/src/main.rs"),
                83,
            ),
            sym(
                exe,
                "core::ops::function::FnOnce::call_once",
                Some(&format!("{std}/core/src/ops/function.rs")),
                250,
            ),
            sym(
                exe,
                "std::sys::backtrace::__rust_begin_short_backtrace",
                Some(&format!("{std}/std/src/sys/backtrace.rs")),
                166,
            ),
            sym(exe, "main", None, 0),
            sym(
                "/lib/x86_64-linux-gnu/libc.so.6",
                "__libc_start_call_main",
                None,
                0,
            ),
            sym(exe, "_start", None, 0),
        ]
    }

    #[test]
    fn rust_crates_and_std_are_library_code() {
        let f = cudarc_stack(332);
        assert_eq!(
            choose_site(&f),
            Some(5),
            "the workload's own frame, under cudarc's"
        );
        // By the source file alone (a crate not named in the lists), or by the name alone (no debug info).
        let exe = "/work/target/release/app";
        let f = vec![
            sym(
                exe,
                "some_gpu_crate::pool::Pool::get",
                Some("/home/u/.cargo/registry/src/x/some_gpu_crate-1.0/src/pool.rs"),
                10,
            ),
            sym(
                exe,
                "some_git_crate::alloc",
                Some("/home/u/.cargo/git/checkouts/some_git_crate-1/abc/src/lib.rs"),
                3,
            ),
            sym(
                exe,
                "<cudarc::driver::safe::core::CudaStream as core::clone::Clone>::clone",
                None,
                0,
            ),
            sym(
                exe,
                "<&mut alloc::vec::Vec<u8> as core::fmt::Write>::write_str",
                None,
                0,
            ),
            sym(
                exe,
                "std::vector<float, std::allocator<float> >::_M_realloc_insert",
                Some("/usr/include/c++/12/bits/vector.tcc"),
                9,
            ),
            sym(
                exe,
                "app::model::Linear::new",
                Some("/home/u/app/src/model.rs"),
                12,
            ),
        ];
        assert_eq!(choose_site(&f), Some(5));
        // Nothing of the program's own: the innermost frame outside the allocators and the runtime.
        let f = vec![
            native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            sym(&format!("{TORCH_LIB}libc10_cuda.so"), "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", None, 0),
            sym(&format!("{TORCH_LIB}libtorch_cuda.so"), "at::native::cudnn_convolution(at::Tensor const&)", None, 0),
            sym("/usr/lib/x86_64-linux-gnu/libc.so.6", "start_thread", None, 0),
        ];
        assert_eq!(choose_site(&f), Some(2));
    }

    #[test]
    fn equal_labels_are_told_apart_by_what_differs() {
        // The demo's two sites: the same frame, called from two lines of `training`: a wrapper, so its
        // caller is the site and the wrapper what it came through.
        let mut sites = vec![site(1, 1, cudarc_stack(332)), site(1, 2, cudarc_stack(335))];
        assert_eq!(sites[0].label(), sites[1].label());
        distinguish(&mut sites);
        assert_eq!(
            sites[0].label(),
            "vramtrace_workload::training at src/main.rs:332 (inlined) via vramtrace_workload::Gpu::alloc \
             at src/main.rs:218"
        );
        assert!(
            sites[1]
                .label()
                .starts_with("vramtrace_workload::training at src/main.rs:335 (inlined) via"),
            "{}",
            sites[1].label()
        );
        // In text: the site, its callers, then the wrapper it came through.
        let short = sites[1].short(1);
        assert_eq!(
            short.first().map(String::as_str),
            Some("vramtrace_workload::training at src/main.rs:335 (inlined)")
        );
        assert_eq!(
            short.get(1).map(String::as_str),
            Some("<- vramtrace_workload::main at src/main.rs:83")
        );
        assert_eq!(
            short.last().map(String::as_str),
            Some("via vramtrace_workload::Gpu::alloc at src/main.rs:218"),
            "{short:?}"
        );
        // A caller further out: the skipped ones are marked; the text shows the first two, then `<- …`.
        let mut a = cudarc_stack(332);
        let mut b = cudarc_stack(332);
        a[10].line = Some(7);
        a[10].file = Some("/work/workload/src/start.rs".into());
        b[10].line = Some(8);
        b[10].file = Some("/work/workload/src/start.rs".into());
        let mut sites = vec![site(1, 1, a), site(1, 2, b)];
        distinguish(&mut sites);
        assert_eq!(
            sites[0].label(),
            "vramtrace_workload::Gpu::alloc at src/main.rs:218 <- … <- main at src/start.rs:7"
        );
        let lines = sites[1].short(2);
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert_eq!(lines[3], "<- …");
        assert_eq!(lines[4], "<- main at src/start.rs:8");
        // Two MmBackward0 allocations: the node's line tells them apart.
        let mut sites = vec![
            site(1, 1, backward_stack("MmBackward0", 1234)),
            site(1, 2, backward_stack("MmBackward0", 1240)),
            site(1, 3, backward_stack("AddmmBackward0", 1234)),
        ];
        distinguish(&mut sites);
        let labels: Vec<String> = sites.iter().map(Site::label).collect();
        assert_eq!(
            labels,
            vec![
                "autograd MmBackward0 (backward pass) at generated/Functions.cpp:1234",
                "autograd MmBackward0 (backward pass) at generated/Functions.cpp:1240",
                "autograd AddmmBackward0 (backward pass)",
            ]
        );
        // One Python line, two ops under it (native frames recorded too): the first native frame that differs
        // outside the allocator.
        let op = |name: &str| {
            let mut f = backward_stack("MmBackward0", 1);
            f.truncate(3);
            f.push(sym(&format!("{TORCH_LIB}libtorch_cuda.so"), name, None, 0));
            f.insert(0, py("/home/u/train.py"));
            f
        };
        let mut sites = vec![
            site(1, 1, op("at::native::mm_out_cuda(at::Tensor const&)")),
            site(1, 2, op("at::native::add_out_cuda(at::Tensor const&)")),
        ];
        distinguish(&mut sites);
        assert_eq!(
            sites[1].label(),
            "u/train.py:3 in f via at::native::add_out_cuda(at::Tensor const&) in libtorch_cuda.so"
        );
        // Nothing differs (two processes, one program): the process and the stack say which.
        let mut sites = vec![site(7, 1, cudarc_stack(332)), site(8, 1, cudarc_stack(332))];
        distinguish(&mut sites);
        assert!(
            sites[0].label().ends_with(" (pid 7, stack 1)"),
            "{}",
            sites[0].label()
        );
        assert_ne!(sites[0].label(), sites[1].label());
        // Different labels are left as they are.
        let mut sites = vec![
            site(1, 1, cudarc_stack(332)),
            site(1, 2, backward_stack("MmBackward0", 1)),
        ];
        distinguish(&mut sites);
        assert!(sites.iter().all(|s| s.extra.is_empty()));
    }

    #[test]
    fn labels() {
        let mut f = py("/home/u/proj/train.py");
        f.function = Some("build_model".into());
        assert_eq!(f.label(), "proj/train.py:3 in build_model");
        let mut n = native("/usr/lib/libfoo.so");
        assert_eq!(n.label(), "libfoo.so+0x10");
        n.function = Some("foo".into());
        assert_eq!(n.label(), "foo in libfoo.so");
        n.file = Some("/src/foo.c".into());
        n.line = Some(9);
        assert_eq!(n.label(), "foo at src/foo.c:9");
        let mut a = native("x");
        a.module = None;
        assert_eq!(a.label(), "0x1010");
        assert_eq!(short_path("train.py"), "train.py");
        assert_eq!(short_path("/train.py"), "train.py");
    }
}
