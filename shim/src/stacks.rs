//! Call sites: where each allocation came from.
//!
//! For an allocation of at least `VRAMTRACE_STACK_MIN_BYTES` (and for every failed one, whose call site is what
//! an out-of-memory post-mortem needs most), the calling thread's return addresses are read with libgcc's
//! `_Unwind_Backtrace` (the shim's own frames skipped, at most [`MAX_FRAMES`], innermost first) and, when asked
//! for, its Python frames with [`crate::pystack::walk`]. The pair is interned per process: a 64-bit hash of the
//! frames names it, the first sighting gets the next id (from 1) and its `Record::Stack` goes into the channel
//! before the event that names it, so the collector always knows a stack before it meets its id.
//!
//! Cost (scripts/bench.sh): libgcc's unwinder takes about 0.1 us a frame, so each thread remembers its last
//! few call chains ([`Chains`], x86-64) and recognises a repeated one by reading its return addresses where they
//! lie, about 2 ns a frame. A stack already seen allocates nothing (beyond what the Python walker does). Each
//! thread keeps a small cache of the hashes it has met; only a miss takes one of the locks of the process's
//! table (stack_table.rs), and a new stack is offered to the channel while that lock is held, so no other thread can
//! name the id before the stack is queued. The table lives in the process's recorder, which a forked child
//! abandons: the child starts with an empty table and ids of its own. At most `stack_table::MAX_STACKS` distinct
//! stacks a process; past that, allocations get stack 0.

mod native;
use native::*;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use vramtrace_format::{PyFrame, Stack};

use crate::pystack::{self, FrameKey, Keys, Walk};
use crate::record;
use crate::settings;
use crate::stack_table::Table;
use crate::tls::{Memo, MEMO_SLOTS};

/// The most return addresses kept per stack (the innermost ones).
pub const MAX_FRAMES: usize = 64;
/// Entries of each thread's cache (a power of two).
const CACHE: usize = 128;

const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

extern "C" {
    // libgcc_s (already a NEEDED of the shim, through std's unwinder).
    fn _Unwind_Backtrace(
        trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
    fn _Unwind_GetCFA(ctx: *mut c_void) -> usize;
    /// The ELF header of the object this code is linked into (defined by the linker): the shim's own image.
    static __ehdr_start: libc::Elf64_Ehdr;
}

/// The call site of an allocation of `size` bytes that is being recorded now: a stack id, or 0 (stacks off,
/// too small, nothing recording, or no frames). `failed`: the allocation failed (any size gets a stack).
/// Only ever called from a hook that holds the reentrancy guard, on a host thread.
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn site(size: u64, failed: bool) -> u32 {
    let s = settings::call_sites();
    if !(s.native || s.python) || (size < s.min_bytes && !failed) {
        return 0;
    }
    capture(s)
}

/// The capture's hot part: the thread's last call chain again (its memo), or [`capture_walk`]. Small, so that a
/// loop allocating from one place runs a page of it.
#[inline(never)]
#[link_section = ".vramtrace.hot"]
fn capture(s: settings::Stacks) -> u32 {
    let Some(rec) = record::live() else { return 0 };
    // Read here, in this frame: a repeated call chain finds this frame at the same address. The chains are
    // keyed by it and hold the return addresses from this frame's caller outward (`CHAIN_FROM`).
    let sp = stack_pointer();
    if s.native && (!s.python || pystack::known_absent()) {
        let state = crate::tls::state();
        if !state.capturing.replace(true) {
            let owner = rec.stacks() as *const Table as usize;
            // SAFETY: this thread's own memo; `capturing` keeps a reentrant capture (a signal handler) off it.
            let hit = unsafe { &*state.memo.get() }.hit(sp, owner);
            state.capturing.set(false);
            if let Some(id) = hit {
                return id;
            }
        }
    }
    capture_walk(s, rec, sp)
}

/// The capture's every other case: Python frames, a chain remembered among the thread's others, a new one
/// unwound. `sp`: [`capture`]'s stack pointer, the chains' key.
#[inline(never)]
fn capture_walk(s: settings::Stacks, rec: &record::Recorder, sp: u64) -> u32 {
    let table = rec.stacks();
    let done = (|| {
        let p = local()?;
        let capturing = &crate::tls::state().capturing;
        if capturing.replace(true) {
            return None;
        }
        // SAFETY: this thread's own state; `capturing` keeps a reentrant capture (a signal handler) off it.
        let l = unsafe { &mut *p };
        // SAFETY: as `l`: the thread's own memo, under the same `capturing`.
        let memo = unsafe { &mut *crate::tls::state().memo.get() };
        // The thread's buffer for Python frames is borrowed only where there may be some to walk: in a process
        // without Python the capture's cache hit touches nothing of it.
        let walk =
            s.python && !pystack::known_absent() && !table.python_off.load(Ordering::Relaxed);
        let owner = table as *const Table as usize;
        // The chain of the thread's last capture, if this is it again: found in the thread's memo alone.
        if s.native && !walk {
            if let Some(id) = memo.hit(sp, owner) {
                capturing.set(false);
                return Some(id);
            }
        }
        // The Python frames by their keys (no string decoded, nothing allocated); by their strings only where
        // keys cannot be read.
        let mut keyed = false;
        let mut py = if walk {
            let mut py = std::mem::take(&mut l.python);
            py.clear();
            l.keys.clear();
            match pystack::walk_keys(&mut l.keys) {
                Keys::Keyed => keyed = true,
                Keys::NoPython => {}
                Keys::Strings => {
                    python(rec, table, &mut py);
                    // The process's first walk validates the walker: this stack by its keys too, or its first
                    // sighting would be another stack than the next ones.
                    if !py.is_empty() && pystack::walk_keys(&mut l.keys) == Keys::Keyed {
                        keyed = true;
                        py.clear();
                    }
                }
            }
            py
        } else {
            Vec::new()
        };
        let found = if s.native { l.chains.find(sp) } else { None };
        // A remembered chain with no Python frames is the stack it was last time: its id, without copying or
        // hashing the frames.
        let known = found
            .map(|i| &l.chains.chains[i])
            .filter(|c| py.is_empty() && !keyed && c.id != 0 && c.owner == owner)
            .map(|c| c.id);
        let id = match known {
            Some(id) => {
                if let Some(i) = found {
                    l.chains.remember_last(i, memo);
                }
                id
            }
            None => {
                let mut ips = [0u64; MAX_FRAMES];
                let (n, chain) = match found {
                    Some(i) => (l.chains.frames(i, &mut ips), Some(i)),
                    None if s.native => native(&mut l.chains, sp, &mut ips),
                    None => (0, None),
                };
                // Whether the stack is the native frames alone, read before `intern` (which takes `py` when
                // the stack is new).
                let plain = py.is_empty() && !keyed;
                let id = if keyed {
                    intern_keyed(rec, table, &mut l.ids, &ips[..n], &l.keys, &mut py)
                } else {
                    intern(rec, table, &mut l.ids, &ips[..n], &mut py)
                };
                if let Some(i) = chain.filter(|_| plain) {
                    let c = &mut l.chains.chains[i];
                    (c.id, c.owner) = (id, owner);
                    l.chains.remember_last(i, memo);
                }
                id
            }
        };
        if walk {
            l.python = py;
        }
        capturing.set(false);
        Some(id)
    })();
    match done {
        Some(id) => id,
        // A thread being torn down (or a reentry): native frames only, nothing cached.
        _ if s.native => {
            let mut ips = [0u64; MAX_FRAMES];
            let n = unwind(&mut ips, None);
            intern(rec, table, &mut Ids::default(), &ips[..n], &mut Vec::new())
        }
        _ => 0,
    }
}

/// The calling thread's Python frames into `py`; an interpreter the walker cannot read is said once in the
/// trace and never walked again in this process.
fn python(rec: &record::Recorder, table: &Table, py: &mut Vec<PyFrame>) {
    let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pystack::walk(py)));
    let why = match walked {
        Ok(Walk::NoPython) | Ok(Walk::Walked) => return,
        Ok(Walk::Unsupported(why)) => why.to_string(),
        Err(_) => "the Python frame walker failed: native stacks only".to_string(),
    };
    py.clear();
    if !table.python_off.swap(true, Ordering::Relaxed) {
        crate::debug!("{why}");
        rec.note(why);
    }
}

/// The id of (`native`, `python`), sending the stack first if it is new. `python` is taken when it is.
#[link_section = ".vramtrace.hot"]
fn intern(
    rec: &record::Recorder,
    table: &Table,
    ids: &mut Ids,
    native: &[u64],
    python: &mut Vec<PyFrame>,
) -> u32 {
    if native.is_empty() && python.is_empty() {
        return 0;
    }
    let h = hash(native, python);
    let owner = table as *const Table as usize;
    // A chain the thread has seen lately: its id, from the thread's own cache (the hot path).
    if let Some(id) = ids.get(owner, h) {
        return id;
    }
    intern_new(rec, table, ids, owner, h, native, python, false)
}

/// The id of (`native`, the Python frames keyed `keys`): as [`intern`], the Python part hashed from its keys,
/// so a stack met before costs no string. Only a stack new to the process has its strings read (into `python`),
/// for its record.
#[link_section = ".vramtrace.hot"]
fn intern_keyed(
    rec: &record::Recorder,
    table: &Table,
    ids: &mut Ids,
    native: &[u64],
    keys: &[FrameKey],
    python: &mut Vec<PyFrame>,
) -> u32 {
    let h = hash_keyed(native, keys);
    let owner = table as *const Table as usize;
    if let Some(id) = ids.get(owner, h) {
        return id;
    }
    intern_new(rec, table, ids, owner, h, native, python, true)
}

/// A chain the thread has not seen lately: the process's table (a lock), and a new stack record if it is new.
/// `walk`: the Python frames are still to be read (a keyed stack), only if the stack is new.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn intern_new(
    rec: &record::Recorder,
    table: &Table,
    ids: &mut Ids,
    owner: usize,
    h: u64,
    native: &[u64],
    python: &mut Vec<PyFrame>,
    walk: bool,
) -> u32 {
    let make = || {
        if walk {
            // The frames are those the keys were read from: the thread is inside the driver's call, its Python
            // frames cannot change under it.
            python.clear();
            self::python(rec, table, python);
        }
        Box::new(Stack {
            pid: rec.pid(),
            id: 0,
            native: native.to_vec(),
            python: std::mem::take(python),
        })
    };
    let id = table.intern(h, make, |s| rec.offer_stack(*s));
    if id != 0 {
        ids.put(owner, h, id);
    }
    id
}

/// A thread's recent stacks: hash -> id, direct-mapped, for the table `owner` (a forked child's new table
/// makes every entry stale).
#[derive(Default)]
struct Ids {
    owner: usize,
    keys: Vec<u64>,
    ids: Vec<u32>,
}

impl Ids {
    #[inline]
    fn slot(h: u64) -> usize {
        (h >> 48) as usize & (CACHE - 1)
    }

    #[inline]
    fn get(&mut self, owner: usize, h: u64) -> Option<u32> {
        if self.owner != owner || self.keys.len() != CACHE {
            // First use, or a forked child's first capture: its ids are new.
            self.owner = owner;
            self.keys.clear();
            self.keys.resize(CACHE, 0);
            self.ids.clear();
            self.ids.resize(CACHE, 0);
            return None;
        }
        let i = Self::slot(h);
        (self.keys[i] == h).then_some(self.ids[i])
    }

    #[inline]
    fn put(&mut self, owner: usize, h: u64, id: u32) {
        if self.owner == owner && self.keys.len() == CACHE {
            let i = Self::slot(h);
            self.keys[i] = h;
            self.ids[i] = id;
        }
    }
}

/// What a thread keeps between captures, allocated at its first one (its last chain, which a repeated capture
/// reads, is in its TLS block instead: `Memo`).
#[repr(C)]
struct Local {
    chains: Chains,
    ids: Ids,
    /// The buffers the Python walker fills, reused: the frames' strings, and their keys.
    python: Vec<PyFrame>,
    keys: Vec<FrameKey>,
}

impl Local {
    fn new() -> Box<Local> {
        Box::new(Local {
            ids: Ids::default(),
            chains: Chains::default(),
            python: Vec::new(),
            keys: Vec::new(),
        })
    }
}

// A thread's `Local` is reached through a plain pointer in a constant thread-local: a thread-local with a
// destructor would register it at the thread's first capture through `__cxa_thread_atexit_impl`, which takes the
// dynamic loader's lock, inside the host's `cuMemAlloc` (a thread holding PyTorch's allocator mutex there, while
// another thread in `dlopen` runs a constructor that allocates, would deadlock). A pthread key's destructor,
// which takes no such lock, hands the state to a pool at thread exit; the next new thread takes it from there, so
// after the first threads no capture allocates.
// The thread's pointer to its `Local`, and whether it is inside a capture, are in `tls::State` (`local`,
// `capturing`): reached without `__tls_get_addr`, as every hook's state.

/// The key whose destructor returns a finished thread's state to [`SPARE`].
static KEY: crate::lazy::Lazy<libc::pthread_key_t> = crate::lazy::Lazy::new();
/// States of finished threads (and a few made at the process's first capture), for threads to come.
const SPARES: usize = 64;
static SPARE: [AtomicPtr<Local>; SPARES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SPARES];
/// Made ahead, at the process's first capture, so the first threads' captures allocate nothing either.
const MADE_AHEAD: usize = 4;

extern "C" fn thread_done(p: *mut c_void) {
    let p = p.cast::<Local>();
    let state = crate::tls::state();
    state.local.set(std::ptr::null_mut());
    state.exiting.set(true);
    if !park(p) {
        // SAFETY: this thread's own state, allocated by `Local::new`, reachable from nowhere else now.
        drop(unsafe { Box::from_raw(p) });
    }
}

fn park(p: *mut Local) -> bool {
    SPARE.iter().any(|s| {
        s.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// This thread's state: its own, a finished thread's, or a new one (only when no spare is left).
#[link_section = ".vramtrace.hot"]
fn local() -> Option<*mut Local> {
    let p = crate::tls::state().local.get().cast::<Local>();
    if !p.is_null() {
        return Some(p);
    }
    if crate::tls::state().exiting.get() {
        // An allocation from a destructor that runs after ours: recorded without its call site.
        return None;
    }
    let key = KEY.get_or_init(|| {
        let mut k: libc::pthread_key_t = 0;
        // SAFETY: `k` is a local the call writes; `thread_done` is an `extern "C"` function of this library
        // taking the value this module stores under the key (a `*mut Local`, or nothing: glibc skips null
        // values).
        if unsafe { libc::pthread_key_create(&mut k, Some(thread_done)) } != 0 {
            return None;
        }
        for _ in 0..MADE_AHEAD {
            let _ = park(Box::into_raw(Local::new()));
        }
        Some(k)
    })?;
    let p = match SPARE
        .iter()
        .map(|s| s.swap(std::ptr::null_mut(), Ordering::AcqRel))
        .find(|q| !q.is_null())
    {
        Some(q) => {
            // A finished thread's ids are this process's, still right; its call chains point into its stack,
            // which is not this thread's: forgotten (emptied in place, nothing freed or allocated).
            // SAFETY: `q` is a non-null `Box<Local>` pointer taken out of SPARE by the swap: parked there by
            // `park` and reachable from nowhere else, so this thread has it alone.
            unsafe { (*q).chains.forget() };
            q
        }
        None => Box::into_raw(Local::new()),
    };
    // SAFETY: `key` was made by pthread_key_create (KEY holds only a key that was made); `p` is this thread's
    // non-null `Local`, which `thread_done` takes back at the thread's exit.
    unsafe { libc::pthread_setspecific(*key, p.cast()) };
    crate::tls::state().local.set(p.cast());
    Some(p)
}

/// A 64-bit hash of the native frames and the Python frames' keys (never 0). Seeded apart from [`hash`]: the two
/// never name the same stack by chance.
#[link_section = ".vramtrace.hot"]
fn hash_keyed(native: &[u64], keys: &[FrameKey]) -> u64 {
    let mut h = Mix(0x1319_8a2e_0370_7344);
    for ip in native {
        h.word(*ip);
    }
    h.word(native.len() as u64);
    for k in keys {
        h.word(k.file);
        h.word(k.function);
        h.word(k.line as u64);
    }
    h.word(keys.len() as u64);
    h.0.max(1)
}

/// A 64-bit hash of the frames (never 0, the cache's empty key).
#[link_section = ".vramtrace.hot"]
fn hash(native: &[u64], python: &[PyFrame]) -> u64 {
    let mut h = Mix(0x243f_6a88_85a3_08d3);
    for ip in native {
        h.word(*ip);
    }
    h.word(native.len() as u64);
    for f in python {
        h.bytes(f.file.as_bytes());
        h.bytes(f.function.as_bytes());
        h.word(f.line as u64);
    }
    h.word(python.len() as u64);
    h.0.max(1)
}

struct Mix(u64);

impl Mix {
    #[inline]
    fn word(&mut self, w: u64) {
        // A folded 64x64->128 multiply, as wyhash mixes.
        let m = ((self.0 ^ 0xa076_1d64_78bd_642f) as u128)
            .wrapping_mul((w ^ 0xe703_7ed1_a0b4_28db) as u128);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn bytes(&mut self, b: &[u8]) {
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let mut last = [0u8; 8];
        last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.word(u64::from_le_bytes(last));
        self.word(b.len() as u64);
    }
}

/// The stack pointer of the calling frame.
#[inline(always)]
fn stack_pointer() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let sp: u64;
        // SAFETY: one register move: no memory touched, no stack used, flags kept (as the options say).
        unsafe {
            std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
        }
        sp
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

#[cfg(test)]
mod tests;
