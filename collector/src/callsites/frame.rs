//! A call stack's frames, and the two path helpers every part of the call sites uses.

/// What a frame's note says when its object was replaced after the trace was recorded (the symboliser's word,
/// `names/symbols.rs`): its label says so.
pub const REBUILT: &str = "rebuilt since: not symbolised";

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
        if self.note.as_deref() == Some(REBUILT) {
            s.push_str(" (");
            s.push_str(REBUILT);
            s.push(')');
        }
        s
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

pub(crate) fn base_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}
