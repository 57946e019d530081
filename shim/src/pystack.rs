//! The calling thread's Python frames (file, line, function), read without the GIL.
//!
//! The allocating thread is inside a driver call, so its Python frames sit still above it: PyTorch, JAX, CuPy
//! and ctypes release the GIL around the call, but the thread's own frames cannot change until it returns. The
//! walk reads them directly: it never takes the GIL, never touches a reference count, never calls Python code
//! and never creates a Python object. The only interpreter functions it calls are
//! `PyGILState_GetThisThreadState` (this thread's `PyThreadState`, from a thread-local key) and
//! `PyCode_Addr2Line` (a line from a code object and a byte offset; it only reads the immutable code object).
//!
//! Everything is found at run time with glibc's `dlsym(RTLD_DEFAULT, ...)` (statically linked `python3` and
//! `libpython3.x.so` alike; no link dependency on Python) and cached once per process, without a lock.
//!
//! Layouts (release builds with the GIL, 64-bit Linux: checked on x86-64; aarch64 shares the LP64 layout):
//! - 3.10: `tstate->frame`, a chain of `PyFrameObject` (`f_back`, `f_code`, `f_lasti` counted in code units).
//! - 3.11, 3.12: `tstate->cframe->current_frame`, a chain of `_PyInterpreterFrame` (`previous`, `f_code`,
//!   `prev_instr`); 3.12 hides its entry frames (owner `FRAME_OWNED_BY_CSTACK`).
//! - 3.13 and later: the offsets come from `_PyRuntime.debug_offsets` (cookie `xdebugpy`), which CPython
//!   keeps for out-of-process debuggers: `tstate->current_frame`, `f_executable` (a tagged reference from
//!   3.14), `instr_ptr`, owners 3 and up hidden, the code object's fields and the string layout. The sections
//!   are located by their contents rather than by position, so fields added between minor versions do not
//!   move them (`parse_debug_offsets`).
//!
//! The 3.10-3.12 offsets were taken from CPython's headers (`Include/cpython/pystate.h`,
//! `Include/internal/pycore_frame.h`, `Include/cpython/code.h`, `Include/cpython/unicodeobject.h`) and are
//! stable within each minor version. Function names are `co_qualname` from 3.11 (`Class.method`,
//! `f.<locals>.<lambda>`), `co_name` on 3.10. Lines: `PyCode_Addr2Line(code, offset)` with the byte offset of
//! the frame's current instruction from the first one (`f_lasti * 2` on 3.10).
//!
//! Defence (a wrong offset must never crash the host): Pythons older than 3.10, debug builds, free-threaded
//! builds and any object header other than the release one (`PyCode_Type.ob_type == &PyType_Type` at offset
//! 8) are refused up front. The first walk that finds Python frames in a process reads everything with
//! `process_vm_readv` on our own pid (or, where seccomp forbids it, through a pipe), which reports an
//! unreadable address instead of faulting, and checks every step: the thread state's `thread_id` is this
//! thread's, every code object and string has the right type, every instruction offset lies inside its code.
//! Any failure turns the walker off for the process (`Walk::Unsupported`); only after it passed are later walks
//! direct memory reads. Every walk still checks each pointer (non-null, aligned, in user space) and each
//! object's type before trusting it, stops at [`MAX_FRAMES`] frames, and detects loops.
//!
//! Cost (`vramtrace_debug_pystack_ns`, release build, 2 shared cores, CPython 3.10-3.13): about 1.1-1.5 us
//! for a 20-frame stack, most of it the allocation of the 40 strings of the `PyFrame`s. So the call sites read a
//! stack by its keys first ([`walk_keys`]: each frame's file and function hashed where their characters lie, and
//! its line; nothing decoded, nothing allocated), and read its strings only for a stack new to the process: in
//! a 36-frame ctypes loop on the simulated driver, 1.35 us an allocation instead of 2.8 (docs/BENCHMARKS.md). Lines are cached per
//! (code, instruction) in [`LINES`]: `PyCode_Addr2Line` alone scans a line table from its start, which for a
//! long script's `<module>` is thousands of entries.
//!
//! Not covered: a Python loaded with `RTLD_LOCAL` by a host that embeds it (its symbols are not in the global
//! scope), or loaded only after this process's first walk (the look-up happens once); sub-interpreters' own
//! threads (the walk follows the thread's main-interpreter state).
//!
//! Diagnostics: `vramtrace_debug_pystack` and `vramtrace_debug_pystack_ns`, exported C functions that a
//! Python program can call through ctypes (which drops the GIL around the call, as frameworks do) to see
//! what the walker reads and what it costs.

mod memory;
mod offsets;
mod strings;
use memory::*;

use strings::*;

use offsets::*;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use vramtrace_format::PyFrame;

/// What a walk found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// No Python interpreter in this process, or the thread is not running Python code.
    NoPython,
    /// Frames were appended (at least one).
    Walked,
    /// An interpreter this walker cannot read (the reason, for a note in the trace). Said once; the caller
    /// stops asking.
    Unsupported(&'static str),
}

/// The most frames kept (the innermost ones).
pub const MAX_FRAMES: usize = 128;
/// The most frames looked at, hidden ones included.
const MAX_STEPS: usize = 1024;
/// Strings (file names, function names) are cut to this many characters.
pub const MAX_CHARS: usize = 4096;

/// From 3.12, frames whose owner is 3 or more are the interpreter's own (entry frames, shims); tracebacks
/// skip them too.
const OWNER_HIDDEN: u8 = 3;

/// How a thread's frames are chained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// 3.10: `tstate->frame` is a `PyFrameObject`; `fr_instr` is `f_lasti`, an `int` counted in code units.
    FrameObject,
    /// 3.11, 3.12: `tstate->cframe` is a `_PyCFrame`, whose `current` field is the innermost frame;
    /// `fr_instr` is `prev_instr`.
    CFrame { current: usize },
    /// 3.13+: `tstate->current_frame`; `fr_instr` is `instr_ptr`; `f_executable` may carry tag bits.
    Direct,
}

/// Byte offsets into the interpreter's structures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Offsets {
    shape: Shape,
    /// `PyThreadState`: the frame (3.10), the `_PyCFrame` (3.11, 3.12) or the current frame (3.13+).
    ts_frame: usize,
    /// `PyThreadState.thread_id` (`pthread_self()` of its thread).
    ts_thread_id: usize,
    fr_previous: usize,
    fr_code: usize,
    fr_instr: usize,
    /// The frame's `owner` byte, where entry frames are to be skipped (3.12+).
    fr_owner: Option<usize>,
    co_filename: usize,
    /// `co_qualname` from 3.11, `co_name` on 3.10.
    co_name: usize,
    /// 3.10: `co_code` (a bytes object); 3.11+: `co_code_adaptive`, the first instruction, inline.
    co_code: usize,
    /// `co_linetable` and `co_firstlineno`: with the code's address, what names a line in the line cache.
    co_linetable: usize,
    co_firstlineno: usize,
    /// Where a compact ASCII string's characters start (`sizeof(PyASCIIObject)`).
    str_ascii_data: usize,
    /// Where a compact non-ASCII string's characters start (`sizeof(PyCompactUnicodeObject)`); a legacy
    /// string's data pointer is there too.
    str_compact_data: usize,
    /// 3.10, 3.11: a string must have its `ready` bit (bit 7 of the state) set.
    str_ready_bit: bool,
}

// PyObject (release builds with the GIL): ob_refcnt, ob_type; PyVarObject adds ob_size.
const OB_TYPE: usize = 8;
const OB_SIZE: usize = 16;
// PyASCIIObject: length at 16, the state bit field at 32 (interned:2, kind:3, compact:1, ascii:1, ...).
const STR_LENGTH: usize = 16;
const STR_STATE: usize = 32;

type ThisThreadState = unsafe extern "C" fn() -> *mut c_void;
type Addr2Line = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// A Python this walker can read.
struct Python {
    off: Offsets,
    addr2line: Addr2Line,
    code_type: usize,
    unicode_type: usize,
    /// 3.10: the type of `co_code`.
    bytes_type: usize,
}

/// What the process has, found once.
struct Found {
    this_tstate: ThisThreadState,
    /// `Py_IsFinalizing` (3.13+) or `_Py_IsFinalizing` (3.10-3.12): both read one atomic, no GIL needed.
    finalizing: Option<unsafe extern "C" fn() -> c_int>,
    python: Result<Python, &'static str>,
}

/// `None` (no Python in the process) or what was found: a leaked box, published once.
static FOUND: AtomicPtr<Option<Found>> = AtomicPtr::new(std::ptr::null_mut());

/// The process was looked at and has no Python: a capture need not call the walker at all (the common case of
/// the default settings in a native program, on every allocation of 1 MiB or more).
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn known_absent() -> bool {
    ABSENT.load(Ordering::Relaxed)
}

/// `FOUND` was published as `None`: apart, so that the capture reads a word of the shim's data rather than the
/// published box on the heap (another page walk when the caches are cold).
#[link_section = ".vramtrace.hotdata"]
static ABSENT: AtomicBool = AtomicBool::new(false);

const PENDING: u8 = 0;
const VALID: u8 = 1;
const FAILED: u8 = 2;
/// Whether a walk with safe reads has passed in this process (then walks read memory directly).
static VALIDATION: AtomicU8 = AtomicU8::new(PENDING);
static FAIL_REASON: AtomicPtr<&'static str> = AtomicPtr::new(std::ptr::null_mut());
/// Validation walks that met a thread state of another thread; too many and the layout is taken as wrong.
static OTHER_THREAD: AtomicU32 = AtomicU32::new(0);

const R_OLD: &str =
    "Python frames unavailable: this Python is older than 3.10 (native stacks only)";
const R_DEBUG: &str = "Python frames unavailable: a debug build of Python (native stacks only)";
const R_HEADER: &str =
    "Python frames unavailable: this Python's objects have another header (a free-threaded \
     or trace-refs build; native stacks only)";
const R_SYMBOLS: &str =
    "Python frames unavailable: PyCode_Type, PyUnicode_Type or PyCode_Addr2Line not found (native stacks only)";
const R_RUNTIME: &str =
    "Python frames unavailable: _PyRuntime not found or unreadable (native stacks only)";
const R_PANIC: &str = "Python frames unavailable: the frame walker failed (native stacks only)";

/// Appends the calling thread's Python frames, innermost first, without the GIL. Never panics, never blocks
/// (past the first call of the process, which looks the interpreter's symbols up).
pub fn walk(out: &mut Vec<PyFrame>) -> Walk {
    let start = out.len();
    match catch_unwind(AssertUnwindSafe(|| walk_inner(out))) {
        Ok(w) => w,
        Err(_) => {
            out.truncate(start);
            fail(R_PANIC);
            Walk::Unsupported(R_PANIC)
        }
    }
}

fn walk_inner(out: &mut Vec<PyFrame>) -> Walk {
    let Some(found) = found() else {
        return Walk::NoPython;
    };
    // SAFETY: PyGILState_GetThisThreadState reads a thread-local key (NULL when the runtime has none yet);
    // it needs no GIL.
    let ts = unsafe { (found.this_tstate)() } as usize;
    if ts == 0 {
        return Walk::NoPython;
    }
    // While the interpreter is being torn down, frames and code objects are freed under us: native only.
    // SAFETY: see `Found::finalizing`.
    if found.finalizing.is_some_and(|f| unsafe { f() } != 0) {
        return Walk::NoPython;
    }
    let py = match &found.python {
        Ok(py) => py,
        Err(why) => return Walk::Unsupported(why),
    };
    let start = out.len();
    match VALIDATION.load(Ordering::Acquire) {
        VALID => {
            // Anything odd ends the walk: what was read before it stays.
            let _ = walk_frames(py, &Direct, ts, out, false);
            if out.len() > start {
                Walk::Walked
            } else {
                Walk::NoPython
            }
        }
        FAILED => Walk::Unsupported(fail_reason()),
        _ => validate(py, ts, out),
    }
}

/// A walk with safe reads and every check; passing it lets later walks read memory directly.
fn validate(py: &Python, ts: usize, out: &mut Vec<PyFrame>) -> Walk {
    let mem = Safe::new();
    let mut frames: Vec<PyFrame> = Vec::new();
    match walk_frames(py, &mem, ts, &mut frames, true) {
        Ok(()) if frames.is_empty() => Walk::NoPython,
        Ok(()) if frames.iter().all(|f| f.line == 0) => {
            let why =
                "Python frames unavailable: no frame's line could be read (native stacks only)";
            fail(why);
            Walk::Unsupported(why)
        }
        Ok(()) => {
            VALIDATION.store(VALID, Ordering::Release);
            out.append(&mut frames);
            Walk::Walked
        }
        Err(Stop::OtherThread) => {
            if OTHER_THREAD.fetch_add(1, Ordering::Relaxed) + 1 >= 8 {
                let why = "Python frames unavailable: thread states do not read as this thread's (native \
                           stacks only)";
                fail(why);
                return Walk::Unsupported(why);
            }
            Walk::NoPython
        }
        Err(Stop::Bad(why)) => {
            fail(why);
            Walk::Unsupported(why)
        }
    }
}

fn fail(why: &'static str) {
    FAIL_REASON.store(Box::into_raw(Box::new(why)), Ordering::Release);
    VALIDATION.store(FAILED, Ordering::Release);
}

fn fail_reason() -> &'static str {
    let p = FAIL_REASON.load(Ordering::Acquire);
    if p.is_null() {
        R_PANIC
    } else {
        // SAFETY: a leaked box, never freed.
        unsafe { *p }
    }
}

/// What the process has, looked up on the first call. Concurrent first calls may each look; one result is
/// kept (no lock, so no thread ever waits, and a fork in the middle leaves nothing half done).
fn found() -> Option<&'static Found> {
    let mut p = FOUND.load(Ordering::Acquire);
    if p.is_null() {
        let new = Box::into_raw(Box::new(probe()));
        p = match FOUND.compare_exchange(
            std::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => new,
            Err(existing) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(new) });
                existing
            }
        };
    }
    // SAFETY: published boxes are never freed.
    let found = unsafe { (*p).as_ref() };
    if found.is_none() {
        ABSENT.store(true, Ordering::Relaxed);
    }
    found
}

fn sym(name: &CStr) -> usize {
    match crate::driver::real_dlsym() {
        // SAFETY: glibc's dlsym with a NUL-terminated name.
        Some(dlsym) => unsafe { dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize },
        None => 0,
    }
}

fn probe() -> Option<Found> {
    let this_tstate = sym(c"PyGILState_GetThisThreadState");
    if this_tstate == 0 {
        return None;
    }
    // SAFETY: the interpreter's own function, of this signature in every version.
    let this_tstate = unsafe { std::mem::transmute::<usize, ThisThreadState>(this_tstate) };
    let fin = match sym(c"Py_IsFinalizing") {
        0 => sym(c"_Py_IsFinalizing"),
        f => f,
    };
    Some(Found {
        this_tstate,
        // SAFETY: `int Py_IsFinalizing(void)` / `int _Py_IsFinalizing(void)` in every version that has them.
        finalizing: (fin != 0)
            .then(|| unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> c_int>(fin) }),
        python: python(),
    })
}

/// `PY_VERSION_HEX` of the process's Python, when it says.
fn version() -> Option<u64> {
    let v = sym(c"Py_Version");
    if v != 0 {
        // 3.11+: `const unsigned long Py_Version`.
        return Safe::new().word(v).map(|v| v as u64);
    }
    let f = sym(c"Py_GetVersion");
    if f == 0 {
        return None;
    }
    // SAFETY: `const char *Py_GetVersion(void)`, "3.10.13 (main, ...)": formats constants into a static
    // buffer, no Python objects involved.
    let s = unsafe {
        let f = std::mem::transmute::<usize, unsafe extern "C" fn() -> *const c_char>(f);
        let p = f();
        if p.is_null() {
            return None;
        }
        CStr::from_ptr(p).to_bytes()
    };
    let mut parts = s
        .split(|b| !b.is_ascii_digit())
        .take(2)
        .map(|d| std::str::from_utf8(d).ok()?.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    Some((major << 24) | (minor << 16))
}

fn python() -> Result<Python, &'static str> {
    let version = version().ok_or(R_OLD)?;
    let (major, minor) = (version >> 24, (version >> 16) & 0xff);
    if major != 3 || minor < 10 {
        return Err(R_OLD);
    }
    // Reference-count debugging (every debug build) exports these; release builds do not.
    for name in [
        c"_Py_RefTotal",
        c"_Py_GetRefTotal",
        c"_Py_GetGlobalRefTotal",
        c"_Py_INCREF_IncRefTotal",
        c"_Py_NegativeRefcount",
    ] {
        if sym(name) != 0 {
            return Err(R_DEBUG);
        }
    }
    let code_type = sym(c"PyCode_Type");
    let unicode_type = sym(c"PyUnicode_Type");
    let type_type = sym(c"PyType_Type");
    let addr2line = sym(c"PyCode_Addr2Line");
    if code_type == 0 || unicode_type == 0 || type_type == 0 || addr2line == 0 {
        return Err(R_SYMBOLS);
    }
    let mem = Safe::new();
    // The release object header: static type objects have `ob_type == &PyType_Type` at offset 8.
    for t in [code_type, unicode_type, type_type] {
        if mem.word(t + OB_TYPE) != Some(type_type) {
            return Err(R_HEADER);
        }
    }
    let mut bytes_type = 0;
    let off = match minor {
        10 => {
            bytes_type = sym(c"PyBytes_Type");
            if bytes_type == 0 || mem.word(bytes_type + OB_TYPE) != Some(type_type) {
                return Err(R_SYMBOLS);
            }
            OFFSETS_310
        }
        11 => OFFSETS_311,
        12 => OFFSETS_312,
        _ => {
            let runtime = sym(c"_PyRuntime");
            let mut raw = [0u8; DEBUG_SLOTS * 8];
            if runtime == 0 || !mem.copy(runtime, &mut raw) {
                return Err(R_RUNTIME);
            }
            let mut slots = [0u64; DEBUG_SLOTS];
            for (s, b) in slots.iter_mut().zip(raw.chunks_exact(8)) {
                *s = u64::from_ne_bytes(b.try_into().unwrap_or_default());
            }
            parse_debug_offsets(&slots, version)?
        }
    };
    Ok(Python {
        off,
        // SAFETY: `int PyCode_Addr2Line(PyCodeObject *, int)` in every version.
        addr2line: unsafe { std::mem::transmute::<usize, Addr2Line>(addr2line) },
        code_type,
        unicode_type,
        bytes_type,
    })
}

/// How many 64-bit words of `_PyRuntime.debug_offsets` are read (3.13 uses 73, 3.14 about 100).
const DEBUG_SLOTS: usize = 192;

/// Why a walk stopped early.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// The thread state is another thread's (or does not read as one).
    OtherThread,
    /// Something did not read as the layout says.
    Bad(&'static str),
}

const B_FRAME: &str =
    "Python frames unavailable: a frame pointer does not read as one (native stacks only)";
const B_CODE: &str =
    "Python frames unavailable: a frame's code does not read as a code object (native stacks \
     only)";
const B_STRING: &str =
    "Python frames unavailable: a code object's names do not read as strings (native stacks \
     only)";
const B_INSTR: &str =
    "Python frames unavailable: a frame's instruction lies outside its code (native stacks \
     only)";
const B_LOOP: &str = "Python frames unavailable: the frame chain loops (native stacks only)";

/// A plausible object or frame address: in user space, not in the first page, 8-aligned.
#[inline]
fn ptr_ok(p: usize) -> bool {
    (0x1000..1 << 48).contains(&p) && p.is_multiple_of(8)
}

/// Appends the frames of thread state `ts`, innermost first. `strict`: every oddity is an error; otherwise
/// odd strings become "?" and an odd instruction offset line 0, while anything that breaks the chain still
/// ends the walk (with the frames read so far kept).
fn walk_frames<M: Mem, S: Frames>(
    py: &Python,
    m: &M,
    ts: usize,
    out: &mut S,
    strict: bool,
) -> Result<(), Stop> {
    let o = &py.off;
    if !ptr_ok(ts) {
        return Err(Stop::OtherThread);
    }
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    if m.word(ts + o.ts_thread_id) != Some(me) {
        return Err(Stop::OtherThread);
    }
    let mut frame = match o.shape {
        Shape::CFrame { current } => {
            let cf = m.word(ts + o.ts_frame).ok_or(Stop::Bad(B_FRAME))?;
            if !ptr_ok(cf) {
                return Err(Stop::Bad(B_FRAME));
            }
            m.word(cf + current).ok_or(Stop::Bad(B_FRAME))?
        }
        _ => m.word(ts + o.ts_frame).ok_or(Stop::Bad(B_FRAME))?,
    };
    let mut kept = 0;
    // Brent's loop detection: `mark` jumps to the current frame after 1, 2, 4, ... steps.
    let (mut mark, mut span, mut since) = (0usize, 1usize, 0usize);
    for _ in 0..MAX_STEPS {
        if frame == 0 || kept == MAX_FRAMES {
            return Ok(());
        }
        if !ptr_ok(frame) {
            return Err(Stop::Bad(B_FRAME));
        }
        if frame == mark {
            return Err(Stop::Bad(B_LOOP));
        }
        since += 1;
        if since == span {
            (mark, span, since) = (frame, span * 2, 0);
        }
        let hidden = match o.fr_owner {
            Some(at) => m.u8(frame + at).ok_or(Stop::Bad(B_FRAME))? >= OWNER_HIDDEN,
            None => false,
        };
        if !hidden {
            let mut code = m.word(frame + o.fr_code).ok_or(Stop::Bad(B_FRAME))?;
            if o.shape == Shape::Direct {
                // 3.14+: a `_PyStackRef`, whose low bits are tags.
                code &= !7;
            }
            if !ptr_ok(code) || m.word(code + OB_TYPE) != Some(py.code_type) {
                return Err(Stop::Bad(B_CODE));
            }
            out.frame(py, m, frame, code, strict)?;
            kept += 1;
        }
        frame = m.word(frame + o.fr_previous).ok_or(Stop::Bad(B_FRAME))?;
    }
    Ok(())
}

/// Where a walk puts each frame: its strings (`Vec<PyFrame>`), or its key ([`FrameKey`]).
trait Frames {
    /// Reads frame `frame` of code object `code` (checked to be one) and keeps it.
    fn frame<M: Mem>(
        &mut self,
        py: &Python,
        m: &M,
        frame: usize,
        code: usize,
        strict: bool,
    ) -> Result<(), Stop>;
}

impl Frames for Vec<PyFrame> {
    fn frame<M: Mem>(
        &mut self,
        py: &Python,
        m: &M,
        frame: usize,
        code: usize,
        strict: bool,
    ) -> Result<(), Stop> {
        let o = &py.off;
        let file = string(py, m, code + o.co_filename);
        let function = string(py, m, code + o.co_name);
        let line = line(py, m, frame, code, !strict);
        if strict && (file.is_none() || function.is_none()) {
            return Err(Stop::Bad(B_STRING));
        }
        let line = match line {
            Some(l) => l,
            None if strict => return Err(Stop::Bad(B_INSTR)),
            None => 0,
        };
        self.push(PyFrame {
            file: file.unwrap_or_else(|| "?".into()),
            function: function.unwrap_or_else(|| "?".into()),
            line,
        });
        Ok(())
    }
}

/// A Python frame by its content, read without decoding a string or allocating: 64-bit hashes of its file and
/// function names' stored characters (as [`decode_str`] would read them, cut alike) and its line. Equal frames
/// have equal keys, as their strings would; CPython's own cached hash is not used, since it is filled in only
/// when something hashes the string (file names often never are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameKey {
    pub file: u64,
    pub function: u64,
    pub line: u32,
}

impl Frames for Vec<FrameKey> {
    fn frame<M: Mem>(
        &mut self,
        py: &Python,
        m: &M,
        frame: usize,
        code: usize,
        _strict: bool,
    ) -> Result<(), Stop> {
        let o = &py.off;
        let hash_at = |at: usize| -> Result<u64, Stop> {
            let obj = m.word(at).ok_or(Stop::Bad(B_STRING))?;
            if !ptr_ok(obj) || m.word(obj + OB_TYPE) != Some(py.unicode_type) {
                return Err(Stop::Bad(B_STRING));
            }
            hash_str(o, m, obj).ok_or(Stop::Bad(B_STRING))
        };
        let file = hash_at(code + o.co_filename)?;
        let function = hash_at(code + o.co_name)?;
        let line = line(py, m, frame, code, true).unwrap_or(0);
        self.push(FrameKey {
            file,
            function,
            line,
        });
        Ok(())
    }
}

/// What [`walk_keys`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Keys were appended (at least one).
    Keyed,
    /// No Python frames on this thread (or no Python).
    NoPython,
    /// Keys cannot be read here (the walker is not validated yet, or cannot read this interpreter): walk the
    /// strings with [`walk`] instead.
    Strings,
}

/// The calling thread's Python frames as keys ([`FrameKey`]), innermost first: the call sites' fast path,
/// which decodes strings only for a stack it has not met (stacks.rs). Never panics, never blocks.
pub fn walk_keys(out: &mut Vec<FrameKey>) -> Keys {
    let start = out.len();
    let got = catch_unwind(AssertUnwindSafe(|| {
        let found = found()?;
        // SAFETY: as in `walk_inner`.
        let ts = unsafe { (found.this_tstate)() } as usize;
        if ts == 0 {
            return Some(Keys::NoPython);
        }
        // SAFETY: see `Found::finalizing`.
        if found.finalizing.is_some_and(|f| unsafe { f() } != 0) {
            return Some(Keys::NoPython);
        }
        let py = found.python.as_ref().ok()?;
        if VALIDATION.load(Ordering::Acquire) != VALID {
            return None;
        }
        match walk_frames(py, &Direct, ts, out, false) {
            Ok(()) if out.len() > start => Some(Keys::Keyed),
            Ok(()) | Err(Stop::OtherThread) => Some(Keys::NoPython),
            // Anything odd: the string walk decides (and says why, once).
            Err(_) => None,
        }
    }));
    match got {
        Ok(Some(k)) => k,
        Ok(None) | Err(_) => {
            out.truncate(start);
            if found().is_none() {
                Keys::NoPython
            } else {
                Keys::Strings
            }
        }
    }
}

/// The line `frame` is at (0 when its code has none there); `None` when its instruction lies outside its
/// code. `cached`: through [`LINES`].
fn line<M: Mem>(py: &Python, m: &M, frame: usize, code: usize, cached: bool) -> Option<u32> {
    let o = &py.off;
    let (offset, code_bytes) = match o.shape {
        Shape::FrameObject => {
            // f_lasti counts code units; -1 before the first instruction.
            let lasti = m.i32(frame + o.fr_instr)? as i64;
            let bytes = m.word(code + o.co_code)?;
            if !ptr_ok(bytes) || m.word(bytes + OB_TYPE)? != py.bytes_type {
                return None;
            }
            (lasti * 2, m.word(bytes + OB_SIZE)? as i64)
        }
        _ => {
            // The current (3.13+) or previous (3.11, 3.12: one code unit before the first when the frame
            // has not started) instruction, against the first one.
            let instr = m.word(frame + o.fr_instr)? as i64;
            let first = (code + o.co_code) as i64;
            // Py_SIZE of a code object counts its code units.
            (
                instr.wrapping_sub(first),
                (m.word(code + OB_SIZE)? as i64).saturating_mul(2),
            )
        }
    };
    if offset < -2 || offset >= code_bytes || offset % 2 != 0 || code_bytes > i32::MAX as i64 {
        return None;
    }
    let mut slot = None;
    if cached {
        let key = line_key(
            code,
            offset,
            m.word(code + o.co_linetable)?,
            m.u32(code + o.co_firstlineno)?,
        );
        let s = &LINES[key as usize % LINES.len()];
        let tag = (key >> LINE_BITS) | 1;
        let e = s.load(Ordering::Relaxed);
        if e >> LINE_BITS == tag {
            return Some((e & LINE_MASK) as u32);
        }
        slot = Some((s, tag));
    }
    // SAFETY: `code` is a code object (its type was checked); PyCode_Addr2Line only reads it.
    let line = unsafe { (py.addr2line)(code as *mut c_void, offset as c_int) }.max(0) as u32;
    if let Some((s, tag)) = slot {
        if u64::from(line) <= LINE_MASK {
            s.store((tag << LINE_BITS) | u64::from(line), Ordering::Relaxed);
        }
    }
    Some(line)
}

/// Lines already computed, shared by the process's threads: `PyCode_Addr2Line` scans the code's line table
/// from its start, which for the `<module>` code of a long script is thousands of entries, and the outer
/// frames of a program's allocations are the same few at the same instructions. Each entry is one word,
/// `tag << LINE_BITS | line`, the tag being the high bits of a hash of (code address, instruction offset, line
/// table address, first line): a torn or colliding entry cannot be read as another's. A code object freed
/// and another built at the same address, with its line table at the same address, the same first line and a
/// frame at the same offset, could be given the old line: a wrong line number, never a fault.
static LINES: [AtomicU64; 4096] = [const { AtomicU64::new(0) }; 4096];
const LINE_BITS: u32 = 24;
const LINE_MASK: u64 = (1 << LINE_BITS) - 1;

fn line_key(code: usize, offset: i64, linetable: usize, firstlineno: u32) -> u64 {
    let mut h = (code as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for v in [offset as u64, linetable as u64, u64::from(firstlineno)] {
        h = (h.rotate_left(29) ^ v).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    }
    h ^ (h >> 31)
}

/// Diagnostic (documented, kept): the calling thread's Python frames as text, one `file:line function` per
/// line, innermost first, written to `buf` (at most `len` bytes, cut at a line's end, then a NUL when there is
/// room). Returns the bytes written, 0 when the thread runs no Python; on an interpreter the walker cannot
/// read, writes `unsupported: <why>` and returns minus its length. ctypes drops the GIL around the call, so
/// this is the walk an allocation inside a framework gets.
#[no_mangle]
pub unsafe extern "C" fn vramtrace_debug_pystack(buf: *mut u8, len: usize) -> isize {
    let mut frames = Vec::new();
    let (text, sign) = match walk(&mut frames) {
        Walk::NoPython => (String::new(), 1),
        Walk::Walked => {
            let mut s = String::new();
            for f in &frames {
                s.push_str(&format!("{}:{} {}\n", f.file, f.line, f.function));
            }
            (s, 1)
        }
        Walk::Unsupported(why) => (format!("unsupported: {why}\n"), -1),
    };
    let mut n = text.len().min(len);
    if n < text.len() {
        n = text.as_bytes()[..n]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
    }
    if !buf.is_null() && len > 0 {
        // SAFETY: the caller's buffer holds `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n);
            if n < len {
                *buf.add(n) = 0;
            }
        }
    }
    sign * n as isize
}

/// Diagnostic (documented, kept): walks the calling thread's Python frames `iterations` times and returns the
/// mean nanoseconds per walk (the `PyFrame` strings included), 0 for no iterations.
#[no_mangle]
pub extern "C" fn vramtrace_debug_pystack_ns(iterations: u32) -> u64 {
    if iterations == 0 {
        return 0;
    }
    let mut frames = Vec::new();
    let t = std::time::Instant::now();
    for _ in 0..iterations {
        frames.clear();
        std::hint::black_box(walk(&mut frames));
    }
    (t.elapsed().as_nanos() / u128::from(iterations)) as u64
}

#[cfg(test)]
mod tests;
