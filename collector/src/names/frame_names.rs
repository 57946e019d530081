//! Native frames named where the trace was recorded (frame kind 20, `Record::FrameNames`; issue 53, portable
//! traces).
//!
//! A trace names its native frames by object and address; the names come from the object files. Read on
//! another machine (a trace copied off a GPU node), or after the program was rebuilt or removed, those files
//! are not there to ask. So `vramtrace run`, at the end of the job and before it closes the trace, resolves
//! every distinct frame its stacks hold with the same [`Symbolizer`] a report uses, and writes the names into
//! the trace ([`Gather`]). A reader takes them first ([`Stored`]) and asks its own files only for frames the
//! trace does not name (older traces: all of them).
//!
//! Costs are bounded on both sides. Recording: each distinct (process, return address) is kept once, at most
//! [`MAX_GATHERED`] of them; each distinct (object, offset) is resolved once, within [`RESOLVE_BUDGET`] (what
//! is left past it stays to be named by the reader, as before). Reading: the trace is untrusted input, so the
//! stored names are bounded in count ([`MAX_STORED_FRAMES`], [`MAX_FUNCTIONS_PER_FRAME`],
//! [`MAX_STORED_FUNCTIONS`], [`MAX_STORED_OBJECTS`]), in length ([`MAX_NAME_BYTES`], longer ones cut) and in
//! bytes ([`MAX_STORED_BYTES`]), and printed through
//! `units::printable` like every other string a trace holds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vramtrace_format::codec::{self, kind};
use vramtrace_format::{FrameNames, NamedFrame, NamedFunction, NamedObject, Record};

use crate::callsites::objects::ObjectTable;
use crate::names::fasthash::FastMap;
use crate::names::symbols::{SymFrame, Symbolizer};

/// Distinct (process, return address) pairs kept while recording; more are counted, not named.
pub const MAX_GATHERED: usize = 1 << 18;
/// How long the end of `run` may spend naming frames; what is left is named by the reader, as before.
pub const RESOLVE_BUDGET: Duration = Duration::from_secs(30);
/// Bytes of one stored name (a function, a file); longer ones are cut (on writing and on reading).
pub const MAX_NAME_BYTES: usize = 4096;
/// Functions kept per frame (the symboliser gives at most 32: a frame and what is inlined into it).
pub const MAX_FUNCTIONS_PER_FRAME: usize = 32;
/// Frames a reader keeps from a trace's records, all together.
pub const MAX_STORED_FRAMES: usize = 1 << 20;
/// Bytes of distinct names (and object paths) a reader keeps from a trace's records.
pub const MAX_STORED_BYTES: usize = 64 << 20;
/// Functions (a frame's and those inlined into it) a reader keeps, all frames together (12 bytes each).
pub const MAX_STORED_FUNCTIONS: usize = 4 << 20;
/// Objects a reader keeps names for.
pub const MAX_STORED_OBJECTS: usize = 1 << 16;
/// A record is closed once its names pass this many bytes or functions (far under the frame limit).
const RECORD_STRING_BYTES: usize = 8 << 20;
const RECORD_FUNCTIONS: usize = 1 << 18;

// ---- recording ------------------------------------------------------------------------------------------

/// What `run` keeps of the frames written to the trace: each process's loaded objects and the distinct
/// return addresses of its stacks (with the objects' generation when first seen, as the replay looks them up).
#[derive(Default)]
pub struct Gather {
    procs: FastMap<u32, GatherProc>,
    addresses: usize,
    /// Addresses past [`MAX_GATHERED`].
    pub not_kept: u64,
}

#[derive(Default)]
struct GatherProc {
    objects: ObjectTable,
    addrs: FastMap<u64, u32>,
}

/// What the end of `run` did: frames named, frames it found nothing for, frames left to the reader (past the
/// count or the time), and the time it took.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub records: Vec<FrameNames>,
    pub named: usize,
    pub unnamed: usize,
    pub left: usize,
    pub elapsed: Duration,
}

impl Gather {
    /// Takes note of the call sites and loaded objects among `bytes` (whole frames, as written to the trace).
    pub fn frames(&mut self, bytes: &[u8]) {
        for (k, payload) in codec::frames(bytes) {
            if k != kind::STACK && k != kind::OBJECTS {
                continue;
            }
            match codec::decode_record(k, payload) {
                Ok(Some(Record::Stack(st))) => {
                    let p = self.procs.entry(st.pid).or_default();
                    let gen = p.objects.gen();
                    for a in st.native {
                        if p.addrs.contains_key(&a) {
                            continue;
                        }
                        if self.addresses >= MAX_GATHERED {
                            self.not_kept += 1;
                            continue;
                        }
                        self.addresses += 1;
                        p.addrs.insert(a, gen);
                    }
                }
                Ok(Some(Record::Objects(o))) => {
                    self.procs
                        .entry(o.pid)
                        .or_default()
                        .objects
                        .update(o.objects);
                }
                _ => {}
            }
        }
    }

    /// Distinct return addresses kept.
    pub fn addresses(&self) -> usize {
        self.addresses
    }

    /// Names each distinct (object, offset) once with `sym`, until `deadline`; the records to write.
    pub fn resolve(&self, sym: &mut Symbolizer, deadline: Instant) -> Resolution {
        let start = Instant::now();
        // (path, build id) -> offsets, each once, in order (so that a cut by the deadline is the same frames
        // on the same trace).
        let mut keys: HashMap<ObjectRef, Vec<u64>> = HashMap::new();
        for p in self.procs.values() {
            for (&addr, &gen) in &p.addrs {
                if let Some(o) = p.objects.find(addr, gen) {
                    keys.entry((&o.path, &o.build_id))
                        .or_default()
                        .push(addr.wrapping_sub(o.bias));
                }
            }
        }
        let mut keys: Vec<(ObjectRef, Vec<u64>)> = keys.into_iter().collect();
        keys.sort_unstable();
        let mut out = Resolution::default();
        let mut w = RecordWriter::default();
        let mut late = false;
        for ((path, build_id), mut offsets) in keys {
            offsets.sort_unstable();
            offsets.dedup();
            let mut frames = Vec::new();
            for off in offsets {
                if late || Instant::now() >= deadline {
                    late = true;
                    out.left += 1;
                    continue;
                }
                // The offset is the address less the bias: resolved as an address with no bias.
                let r = sym.resolve(path, build_id, 0, off);
                if r.frames
                    .iter()
                    .all(|f| f.function.is_none() && f.file.is_none())
                {
                    out.unnamed += 1;
                    continue;
                }
                out.named += 1;
                frames.push((off, r.frames));
            }
            if !frames.is_empty() {
                w.object(path, build_id, frames, &mut out.records);
            }
        }
        w.finish(&mut out.records);
        out.elapsed = start.elapsed();
        out
    }
}

/// An object by its path and build id.
type ObjectRef<'a> = (&'a str, &'a [u8]);

/// Builds [`FrameNames`] records, a string table each, closed before they grow large.
#[derive(Default)]
struct RecordWriter {
    cur: FrameNames,
    ids: HashMap<String, u32>,
    bytes: usize,
    functions: usize,
}

impl RecordWriter {
    fn string(&mut self, s: &str) -> u32 {
        let s = cut(s);
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.cur.strings.len() as u32;
        self.bytes += s.len();
        self.cur.strings.push(s.to_string());
        self.ids.insert(s.to_string(), i);
        i
    }

    fn object(
        &mut self,
        path: &str,
        build_id: &[u8],
        frames: Vec<(u64, Vec<SymFrame>)>,
        out: &mut Vec<FrameNames>,
    ) {
        let mut named = Vec::new();
        for (offset, fs) in frames {
            if self.bytes >= RECORD_STRING_BYTES || self.functions >= RECORD_FUNCTIONS {
                self.close(path, build_id, &mut named, out);
            }
            let functions = fs
                .iter()
                .take(MAX_FUNCTIONS_PER_FRAME)
                .map(|f| NamedFunction {
                    function: f.function.as_deref().map(|s| self.string(s)),
                    file: f.file.as_deref().map(|s| self.string(s)),
                    line: f.line.unwrap_or(0),
                })
                .collect::<Vec<_>>();
            self.functions += functions.len();
            named.push(NamedFrame { offset, functions });
        }
        self.close_object(path, build_id, named);
    }

    fn close_object(&mut self, path: &str, build_id: &[u8], frames: Vec<NamedFrame>) {
        if frames.is_empty() {
            return;
        }
        self.bytes += path.len();
        self.cur.objects.push(NamedObject {
            path: path.to_string(),
            build_id: build_id.to_vec(),
            frames,
        });
    }

    /// Ends the current record (with the object's frames so far) and starts another.
    fn close(
        &mut self,
        path: &str,
        build_id: &[u8],
        named: &mut Vec<NamedFrame>,
        out: &mut Vec<FrameNames>,
    ) {
        self.close_object(path, build_id, std::mem::take(named));
        self.finish(out);
    }

    fn finish(&mut self, out: &mut Vec<FrameNames>) {
        if !self.cur.objects.is_empty() {
            out.push(std::mem::take(&mut self.cur));
        }
        *self = RecordWriter::default();
    }
}

/// `s`, at most [`MAX_NAME_BYTES`] (cut at a character's boundary).
fn cut(s: &str) -> &str {
    if s.len() <= MAX_NAME_BYTES {
        return s;
    }
    let mut end = MAX_NAME_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The records [`Gather::resolve`] made, as frames to append to the trace (before its `End`).
pub fn encode(r: &Resolution) -> Vec<u8> {
    let mut buf = Vec::new();
    for rec in &r.records {
        codec::put_record(&mut buf, &Record::FrameNames(rec.clone()));
    }
    buf
}

// ---- reading --------------------------------------------------------------------------------------------

type FrameTable = FastMap<u64, (u32, u8)>;

/// The names a trace's `FrameNames` records give, as a reader keeps them: bounded whatever the records say.
#[derive(Default)]
pub struct Stored {
    /// (path, build id) -> offset -> (its first function in `functions`, how many).
    objects: HashMap<(Box<str>, Vec<u8>), FrameTable>,
    functions: Vec<(Option<u32>, Option<u32>, u32)>,
    strings: Vec<Box<str>>,
    string_ids: HashMap<Box<str>, u32>,
    bytes: usize,
    frames: usize,
    /// Frames (or names) the records held past the bounds, or naming strings they do not have.
    pub not_kept: u64,
}

impl Stored {
    /// Keeps the names of one record (the first record naming a frame wins).
    pub fn add(&mut self, rec: FrameNames) {
        let FrameNames { strings, objects } = rec;
        // The record's strings, interned as they are used: an index past them names nothing.
        let mut mine: Vec<Option<Option<u32>>> = vec![None; strings.len()];
        for o in objects {
            let key = (Box::<str>::from(o.path.as_str()), o.build_id);
            let known = self.objects.contains_key(&key);
            if !known
                && (self.objects.len() >= MAX_STORED_OBJECTS
                    || self.bytes + o.path.len() + key.1.len() > MAX_STORED_BYTES)
            {
                self.not_kept += o.frames.len() as u64;
                continue;
            }
            let mut table = self.objects.remove(&key).unwrap_or_default();
            for f in o.frames {
                if self.frames >= MAX_STORED_FRAMES
                    || self.functions.len() + MAX_FUNCTIONS_PER_FRAME > MAX_STORED_FUNCTIONS
                    || table.contains_key(&f.offset)
                {
                    self.not_kept += 1;
                    continue;
                }
                let at = self.functions.len() as u32;
                let mut n = 0u8;
                for g in f.functions.into_iter().take(MAX_FUNCTIONS_PER_FRAME) {
                    let mut name = |i: Option<u32>| -> Option<u32> {
                        let i = i? as usize;
                        let slot = mine.get_mut(i)?;
                        if slot.is_none() {
                            *slot = Some(self_intern(
                                &mut self.strings,
                                &mut self.string_ids,
                                &mut self.bytes,
                                &strings[i],
                            ));
                        }
                        (*slot)?
                    };
                    let (function, file) = (name(g.function), name(g.file));
                    if function.is_none() && file.is_none() {
                        continue;
                    }
                    self.functions.push((function, file, g.line));
                    n += 1;
                }
                if n == 0 {
                    self.not_kept += 1;
                    continue;
                }
                self.frames += 1;
                table.insert(f.offset, (at, n));
            }
            // An object kept only once it names a frame.
            if !table.is_empty() {
                if !known {
                    self.bytes += key.0.len() + key.1.len();
                }
                self.objects.insert(key, table);
            }
        }
    }

    /// Whether any frame is named.
    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// The functions stored for `offset` in the object `path` with `build_id`, innermost first, as the
    /// symboliser would answer; `None` when the trace does not name that frame.
    pub fn get(&self, path: &str, build_id: &[u8], offset: u64) -> Option<Vec<SymFrame>> {
        if self.frames == 0 {
            return None;
        }
        let table = self
            .objects
            .get(&(Box::<str>::from(path), build_id.to_vec()))?;
        let &(at, n) = table.get(&offset)?;
        let text = |i: Option<u32>| i.map(|i| self.strings[i as usize].to_string());
        let fs = &self.functions[at as usize..at as usize + n as usize];
        Some(
            fs.iter()
                .enumerate()
                .map(|(k, &(function, file, line))| SymFrame {
                    function: text(function),
                    file: text(file),
                    line: (line > 0).then_some(line),
                    inlined: k + 1 < fs.len(),
                })
                .collect(),
        )
    }
}

/// Interns `s` (cut to [`MAX_NAME_BYTES`]) into a reader's strings, within [`MAX_STORED_BYTES`].
fn self_intern(
    strings: &mut Vec<Box<str>>,
    ids: &mut HashMap<Box<str>, u32>,
    bytes: &mut usize,
    s: &str,
) -> Option<u32> {
    let s = cut(s);
    if let Some(&i) = ids.get(s) {
        return Some(i);
    }
    if *bytes + s.len() > MAX_STORED_BYTES {
        return None;
    }
    *bytes += s.len();
    let b: Box<str> = s.into();
    let i = strings.len() as u32;
    strings.push(b.clone());
    ids.insert(b, i);
    Some(i)
}

#[cfg(test)]
mod tests;
