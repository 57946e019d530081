//! Offline symbolisation of native return addresses, after the fact, from the files the trace names.
//!
//! For an address in an object (an executable or shared library listed by the trace's `Objects` record) the
//! lookup address is `address - bias - 1` (a return address points after its call; the byte before it is the
//! call). Then, best first:
//!
//! 1. DWARF (`addr2line`): function (demangled, Rust and C++), file and line, inlined frames expanded. From the
//!    object itself, or from a separate debug file: `<debug dir>/.build-id/xx/rest.debug` by the object's build
//!    id, else its `.gnu_debuglink` name beside it, in `.debug/` beside it, or under `<debug dir>/<its dir>`. A
//!    dwz supplementary file (`.gnu_debugaltlink`) is loaded too.
//! 2. The symbol table (`.symtab`, else `.dynsym`): the function's name only (stripped binaries).
//! 3. Nothing: the caller shows `module+0xoffset`.
//!
//! An object whose build id differs from the one recorded was rebuilt since the trace: it is not read (the
//! answer says so). Missing files, unreadable or non-ELF files, JIT code and anonymous memory are never an
//! error: the answer is just empty. Objects are opened once and kept (parsed DWARF is built lazily by
//! `addr2line`); only the addresses of the stacks a report shows are looked up.
//!
//! Debug directories: `VRAMTRACE_DEBUG_DIRS` (colon-separated) then `/usr/lib/debug`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use object::{Object as _, ObjectSection, ObjectSymbol, SymbolKind};

type Reader = gimli::EndianRcSlice<gimli::RunTimeEndian>;

/// The default debug directory (GDB's `debug-file-directory`).
pub const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";
/// What a frame says when its object was replaced after the trace was recorded (the frame's own word).
pub use crate::callsites::frame::REBUILT;

/// One function at an address; several when inlined (innermost first, each inlined into the next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymFrame {
    /// Demangled.
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Inlined into the next frame (same address).
    pub inlined: bool,
}

/// The answer for one address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Innermost first; empty when nothing is known.
    pub frames: Vec<SymFrame>,
    /// Why nothing (or less) is known, when there is something to say: [`REBUILT`], "file not found", ...
    pub note: Option<&'static str>,
}

/// Reads objects and their debug information, once each.
pub struct Symbolizer {
    debug_dirs: Vec<PathBuf>,
    cache: HashMap<(String, Vec<u8>), Rc<Loaded>>,
    /// `VRAMTRACE_SYMBOLS=off`: no object file is read; frames stay `module+offset`.
    off: bool,
}

enum Loaded {
    /// Could not be used; the note says why.
    Unusable(&'static str),
    Ready(Box<Symbols>),
}

struct Symbols {
    dwarf: Option<addr2line::Context<Reader>>,
    /// Function symbols: (address, size, name as in the file), by address. Demangled when looked up (a
    /// framework's library can have 100,000 of them).
    table: Vec<(u64, u64, Box<str>)>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Debug directories from `VRAMTRACE_DEBUG_DIRS` (colon-separated), then [`DEFAULT_DEBUG_DIR`]; no file read
    /// at all with `VRAMTRACE_SYMBOLS=off` (a report that must not depend on what this machine has: the
    /// golden tests, or a trace read far from where it was recorded).
    pub fn new() -> Self {
        let mut dirs: Vec<PathBuf> = std::env::var_os("VRAMTRACE_DEBUG_DIRS")
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        dirs.push(PathBuf::from(DEFAULT_DEBUG_DIR));
        let mut s = Self::with_debug_dirs(dirs);
        s.off = std::env::var("VRAMTRACE_SYMBOLS").is_ok_and(|v| v.trim() == "off");
        s
    }

    /// Exactly these debug directories, in order.
    pub fn with_debug_dirs(debug_dirs: Vec<PathBuf>) -> Self {
        Symbolizer {
            debug_dirs,
            cache: HashMap::new(),
            off: false,
        }
    }

    /// The functions at return address `address` of object `path` loaded with `bias`, whose build id was
    /// `build_id` when the trace was recorded (empty: unknown, not checked).
    pub fn resolve(&mut self, path: &str, build_id: &[u8], bias: u64, address: u64) -> Resolved {
        let key = (path.to_string(), build_id.to_vec());
        let loaded = match self.cache.get(&key) {
            Some(l) => l.clone(),
            None => {
                let l = Rc::new(self.load(path, build_id));
                self.cache.insert(key, l.clone());
                l
            }
        };
        let syms = match &*loaded {
            Loaded::Unusable(why) => {
                return Resolved {
                    frames: Vec::new(),
                    note: Some(why),
                }
            }
            Loaded::Ready(s) => s,
        };
        // The call before the return address.
        let pc = address.wrapping_sub(bias).wrapping_sub(1);
        let mut frames = Vec::new();
        if let Some(ctx) = &syms.dwarf {
            if let Ok(mut it) = ctx.find_frames(pc).skip_all_loads() {
                while let Ok(Some(f)) = it.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.demangle().ok())
                        .map(Cow::into_owned);
                    let (file, line) = match &f.location {
                        Some(l) => (l.file.map(str::to_string), l.line),
                        None => (None, None),
                    };
                    frames.push(SymFrame {
                        function,
                        file,
                        line,
                        inlined: true,
                    });
                    if frames.len() >= 32 {
                        break;
                    }
                }
            }
        }
        if let Some(last) = frames.last_mut() {
            last.inlined = false;
        }
        // The symbol table names what DWARF left unnamed (or everything, without DWARF).
        if frames.iter().all(|f| f.function.is_none()) {
            if let Some(name) = lookup_symbol(&syms.table, pc) {
                let name = addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned();
                match frames.last_mut() {
                    Some(f) => f.function = Some(name),
                    None => frames.push(SymFrame {
                        function: Some(name),
                        file: None,
                        line: None,
                        inlined: false,
                    }),
                }
            }
        }
        Resolved { frames, note: None }
    }

    fn load(&self, path: &str, build_id: &[u8]) -> Loaded {
        if self.off {
            return Loaded::Unusable("VRAMTRACE_SYMBOLS=off");
        }
        if !path.starts_with('/') {
            // "[vdso]", "linux-vdso.so.1", anonymous or JIT memory, the unnamed main program.
            return Loaded::Unusable("no file");
        }
        let object = match ObjectFile::open(Path::new(path)) {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Loaded::Unusable("file not found")
            }
            Err(_) => return Loaded::Unusable("file unreadable"),
        };
        let Ok(file) = object.parse() else {
            return Loaded::Unusable("not an ELF file");
        };
        let actual = file.build_id().ok().flatten().unwrap_or(&[]);
        if !build_id.is_empty() && actual != build_id {
            return Loaded::Unusable(REBUILT);
        }
        let id = if actual.is_empty() { build_id } else { actual };
        let mut table = Vec::new();
        add_symbols(&file, &mut table);
        let mut dwarf = load_dwarf(&object, &file, None);
        if dwarf.is_none() {
            if let Some((debug_object, debug_path)) = self.find_debug_file(&file, path, id) {
                if let Ok(debug) = debug_object.parse() {
                    add_symbols(&debug, &mut table);
                    let sup = self.find_sup(&debug, &debug_path);
                    let sup = sup.as_ref().and_then(|o| Some((o, o.parse().ok()?)));
                    dwarf = load_dwarf(&debug_object, &debug, sup.as_ref().map(|(o, f)| (*o, f)));
                }
            }
        }
        table.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        table.dedup_by_key(|s| s.0);
        table.shrink_to_fit();
        Loaded::Ready(Box::new(Symbols { dwarf, table }))
    }

    /// A separate debug file for `file` (at `path`, build id `id`): by build id, then by `.gnu_debuglink`.
    fn find_debug_file(&self, file: &Elf, path: &str, id: &[u8]) -> Option<(ObjectFile, PathBuf)> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if id.len() >= 2 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            for d in &self.debug_dirs {
                candidates.push(
                    d.join(".build-id")
                        .join(&hex[..2])
                        .join(format!("{}.debug", &hex[2..])),
                );
            }
        }
        if let Ok(Some((name, _crc))) = file.gnu_debuglink() {
            if let Ok(name) = std::str::from_utf8(name) {
                let dir = Path::new(path).parent().unwrap_or(Path::new("/"));
                candidates.push(dir.join(name));
                candidates.push(dir.join(".debug").join(name));
                let rel = dir.strip_prefix("/").unwrap_or(dir);
                for d in &self.debug_dirs {
                    candidates.push(d.join(rel).join(name));
                }
            }
        }
        for c in candidates {
            if c == Path::new(path) {
                continue;
            }
            let Ok(object) = ObjectFile::open(&c) else {
                continue;
            };
            let Ok(debug) = object.parse() else {
                continue;
            };
            // A debug file of another build would give wrong lines: its build id must match when both have one.
            let theirs = debug.build_id().ok().flatten().unwrap_or(&[]);
            let usable = (id.is_empty() || theirs.is_empty() || theirs == id) && has_dwarf(&debug);
            drop(debug);
            if usable {
                return Some((object, c));
            }
        }
        None
    }

    /// The dwz supplementary file a debug file points to (`.gnu_debugaltlink`), if found.
    fn find_sup(&self, debug: &Elf, debug_path: &Path) -> Option<ObjectFile> {
        let (name, id) = debug.gnu_debugaltlink().ok().flatten()?;
        let name = Path::new(std::str::from_utf8(name).ok()?);
        let mut candidates = Vec::new();
        if name.is_absolute() {
            candidates.push(name.to_path_buf());
        } else if let Some(dir) = debug_path.parent() {
            candidates.push(dir.join(name));
        }
        if id.len() >= 2 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            for d in &self.debug_dirs {
                candidates.push(
                    d.join(".build-id")
                        .join(&hex[..2])
                        .join(format!("{}.debug", &hex[2..])),
                );
            }
        }
        candidates.into_iter().find_map(|c| {
            let object = ObjectFile::open(&c).ok()?;
            let same = object.parse().ok()?.build_id().ok().flatten() == Some(id);
            same.then_some(object)
        })
    }
}

fn has_dwarf(f: &Elf) -> bool {
    f.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0 && s.kind() != object::SectionKind::UninitializedData)
}

fn endian(f: &Elf) -> gimli::RunTimeEndian {
    if f.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    }
}

/// Section `id` of `f` (read from `o`), as gimli holds it; empty when absent or unreadable.
fn section(o: &ObjectFile, f: &Elf, id: gimli::SectionId) -> Reader {
    let data = f
        .section_by_name(id.name())
        .filter(|s| s.kind() != object::SectionKind::UninitializedData)
        .and_then(|s| o.section_bytes(&s))
        .unwrap_or_default();
    gimli::EndianRcSlice::new(Rc::from(data), endian(f))
}

/// The DWARF of `f` (with the supplementary file's, if any) as an `addr2line` context; `None` without any.
fn load_dwarf(
    o: &ObjectFile,
    f: &Elf,
    sup: Option<(&ObjectFile, &Elf)>,
) -> Option<addr2line::Context<Reader>> {
    if !has_dwarf(f) {
        return None;
    }
    let mut dwarf = gimli::Dwarf::load(|id| Ok::<_, gimli::Error>(section(o, f, id))).ok()?;
    if let Some((so, sf)) = sup {
        let _ = dwarf.load_sup(|id| Ok::<_, gimli::Error>(section(so, sf, id)));
    }
    addr2line::Context::from_dwarf(dwarf).ok()
}

fn add_symbols(f: &Elf, table: &mut Vec<(u64, u64, Box<str>)>) {
    for s in f.symbols().chain(f.dynamic_symbols()) {
        if s.kind() != SymbolKind::Text || s.address() == 0 || s.is_undefined() {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        if name.is_empty() {
            continue;
        }
        table.push((s.address(), s.size(), name.into()));
    }
}

/// The function symbol covering `pc`: the last one at or below it, within its size when it has one.
fn lookup_symbol(table: &[(u64, u64, Box<str>)], pc: u64) -> Option<&str> {
    let i = table.partition_point(|s| s.0 <= pc).checked_sub(1)?;
    let (addr, size, name) = &table[i];
    (*size == 0 || pc - addr < *size).then_some(&**name)
}

/// An object file read through `pread`, never mapped: another process can truncate a file while it is read,
/// and a mapped page past the new end kills the reader (SIGBUS), where a read just comes back short. Parsing
/// reads the headers, tables and names it needs through `object`'s cache (a few pieces, each read once);
/// DWARF sections, which gimli keeps anyway, are read straight into their own buffers, each no larger than
/// the file.
struct ObjectFile {
    cache: Cache,
    file: std::fs::File,
    len: u64,
}

type Cache = object::ReadCache<std::fs::File>;

/// An ELF object as parsed from an [`ObjectFile`].
type Elf<'a> = object::File<'a, &'a Cache>;

impl ObjectFile {
    fn open(path: &Path) -> std::io::Result<ObjectFile> {
        // A trace names files it does not vouch for: only a regular file is opened.
        let file = crate::files::untrusted_file::open_regular(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        Ok(ObjectFile {
            cache: object::ReadCache::new(file.try_clone()?),
            file,
            len,
        })
    }

    fn parse(&self) -> object::Result<Elf<'_>> {
        object::File::parse(&self.cache)
    }

    /// A section's contents, uncompressed; `None` when it lies past the file's end (as it was opened, or as
    /// it is now) or does not decompress.
    fn section_bytes<'a>(&'a self, s: &object::Section<'a, '_, &'a Cache>) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let range = s.compressed_file_range().ok()?;
        if range.format != object::CompressionFormat::None {
            return s.uncompressed_data().ok().map(Cow::into_owned);
        }
        let end = range.offset.checked_add(range.uncompressed_size)?;
        if end > self.len {
            return None;
        }
        let mut data = vec![0; usize::try_from(range.uncompressed_size).ok()?];
        self.file.read_exact_at(&mut data, range.offset).ok()?;
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_cover_their_size_only() {
        let t: Vec<(u64, u64, Box<str>)> = vec![
            (0x100, 0x10, "a".into()),
            (0x200, 0, "b".into()),
            (0x300, 0x20, "c".into()),
        ];
        assert_eq!(lookup_symbol(&t, 0x105), Some("a"));
        assert_eq!(lookup_symbol(&t, 0x110), None);
        assert_eq!(lookup_symbol(&t, 0x2ff), Some("b"));
        assert_eq!(lookup_symbol(&t, 0x31f), Some("c"));
        assert_eq!(lookup_symbol(&t, 0x50), None);
    }

    #[test]
    fn missing_and_odd_paths_are_answers_not_errors() {
        let mut s = Symbolizer::with_debug_dirs(vec![]);
        let r = s.resolve("/nonexistent/libx.so", &[1, 2], 0x1000, 0x1234);
        assert!(r.frames.is_empty());
        assert_eq!(r.note, Some("file not found"));
        assert_eq!(s.resolve("[vdso]", &[], 0, 5).note, Some("no file"));
        assert_eq!(
            s.resolve("/proc/self/status", &[], 0, 5).note,
            Some("file unreadable")
        );
    }
}
