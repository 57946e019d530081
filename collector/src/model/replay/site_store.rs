//! The call sites during the replay: each process's stacks (stack id -> native return addresses and Python
//! frames, strings interned, memory bounded by [`MAX_STACKS`] and the frame limits), its loaded objects (every
//! list it sent, merged: see [`ObjectTable`]), and per (process, stack, device) an aggregate: allocations, bytes
//! allocated, bytes live now, bytes live at the device's peak, bytes live at the end.
//!
//! The aggregates' figures are an observer's (`observe/sites.rs`); the store hands out their indices.

use std::collections::HashMap;

use vramtrace_format::{Object, PyFrame, Stack};

use crate::callsites::objects::{ObjEntry, ObjectTable};
use crate::callsites::{Frame, FrameKind, Note};
use crate::names::fasthash::FastMap;
use crate::names::frame_names::Stored;
use crate::names::symbols::Symbolizer;

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
/// Distinct notes kept.
pub const MAX_NOTES: usize = 64;

// ---- during the replay ----------------------------------------------------------------------------------

use crate::model::observe::sites::SiteAggs;
pub(crate) use crate::model::observe::sites::NO_SITE;

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
    notes: Vec<(Note, Vec<u32>)>,
    pub stacks_seen: u64,
    pub stacks_not_kept: u64,
    /// Stack or objects records seen, or an event naming a stack.
    pub any: bool,
    /// The names of native frames the trace holds (`FrameNames` records): they win over the reader's files.
    pub names: Stored,
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
            gen: ps.objects.gen(),
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
    pub fn site_for(
        &mut self,
        ps: &mut ProcSites,
        aggs: &mut SiteAggs,
        slot: usize,
        stack: u32,
        dev: u16,
    ) -> u32 {
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
                if aggs.len() >= MAX_SITES {
                    return NO_SITE;
                }
                self.any = true;
                let i = aggs.add(slot as u32, stack, dev);
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

    /// The frames of stack `id` of a process, Python first then native, named as the trace names them
    /// ([`Store::names`]), else symbolised with `sym` (without it, native frames are `module+offset`). `None` when the stack is not kept.
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
            let r = match self
                .names
                .get(&o.path, &o.build_id, addr.wrapping_sub(o.bias))
            {
                Some(frames) => crate::names::symbols::Resolved { frames, note: None },
                None => s.resolve(&o.path, &o.build_id, o.bias, addr),
            };
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
