//! The shim's per-thread state, reached in two instructions.
//!
//! Why not `thread_local!`: in a shared object it takes the general-dynamic model, a call to `__tls_get_addr`
//! that reads ld.so's code and data and the thread's vector of blocks. After a real allocation's trip through the
//! kernel those pages are cold, and each costs a page walk: on an H100 the shim's hooks cost about 1 us a pair
//! cold against 100 ns warm (docs/GPU-RESULTS.md, "The 1 MiB loop inside one process"). Preloaded, the shim's
//! block sits in the static TLS area at a fixed offset from the thread pointer: the initial-exec model reads that
//! offset from the GOT and adds the thread pointer. Stable Rust cannot choose a variable's model, so on x86-64
//! Linux the state is a TLS symbol defined and reached in assembly; elsewhere it is a `thread_local!`.
//!
//! An initial-exec access marks the library `STATIC_TLS`: its whole TLS block (this state with the call-site
//! memo, 320 bytes, and the thread-locals of std and the crates: about 500 bytes) is static however it is loaded.
//! Preloaded, as `vramtrace run` loads it, that is part of every thread's initial block. `dlopen`ed instead (the
//! Python call-site tests do that), it takes room in glibc's reserve of static TLS (1,664 bytes and more),
//! which that fits; where it would not, the `dlopen` fails. It never corrupts anything.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;

/// Return addresses a memo holds: with its other fields and the thread's flags before them, five cache lines (the
/// slots start 48 bytes into the first: a chain of n return addresses reads 1 + (n + 2) / 4 of them).
pub(crate) const MEMO_SLOTS: usize = 14;

/// A copy of one short chain, whole, in the thread's static TLS block (`tls::State`). A loop that allocates
/// from one place finds its chain here: after the driver's trip through the kernel the caches and TLB are cold,
/// and reading the chains' own buffers (the stack pointers, the chain, its slots: each on the heap, apart) cost a
/// page walk each (docs/GPU-RESULTS.md, "The 1 MiB loop inside one process"); in `Local`, on the heap, it cost
/// one, and a pointer's load before it (issue 27).
#[repr(C)]
pub(crate) struct Memo {
    /// The capturing frame's stack pointer; 0: empty.
    pub(crate) sp: u64,
    pub(crate) owner: usize,
    pub(crate) id: u32,
    pub(crate) n: u32,
    pub(crate) slots: [(u64, u64); MEMO_SLOTS],
}

/// One thread's state. All zero at thread start (`.tbss`). Aligned to a cache line, whose first bytes hold the
/// flags every hook reads and the memo's own fields.
#[repr(C, align(64))]
pub struct State {
    /// Inside a hook (or a thread of the shim's own): a tracked call made from there goes straight through.
    pub busy: Cell<bool>,
    /// Inside a call-site capture (a signal handler allocating mid-capture must not share its state).
    pub capturing: Cell<bool>,
    /// The thread handed its call-site state back (its pthread key's destructor ran): a capture from a later
    /// destructor must not take another, which glibc's last destructor round would never hand back.
    pub exiting: Cell<bool>,
    /// The thread's id (low 32 bits) and the fork generation it was read in, plus one (high 32 bits; 0: not
    /// read yet). One word, so that a signal handler never sees the one without the other.
    pub tid: Cell<u64>,
    /// The thread's call-site state (`stacks::Local`), or null.
    pub local: Cell<*mut c_void>,
    /// The thread's last call chain (`stacks::capture`), touched only while `capturing` is held: here rather than
    /// in `Local` on the heap, so that a repeated capture reads the lines right after these flags (the TLS area,
    /// which the thread's own code keeps warm) and no pointer's target.
    pub(crate) memo: UnsafeCell<Memo>,
}

/// The state's size: the TLS symbol's below.
const STATE_BYTES: usize = std::mem::size_of::<State>();

// The state is a TLS symbol of our own on x86-64 Linux (the size below is the symbol's), a `thread_local!`
// elsewhere.
#[cfg(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_pointer_width = "64"
))]
// 64 is also the most alignment glibc gives a static TLS block on x86-64: a larger one would fail a `dlopen`.
const _: () = assert!(
    STATE_BYTES.is_multiple_of(64) && STATE_BYTES <= 320 && std::mem::align_of::<State>() == 64
);

#[cfg(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_pointer_width = "64"
))]
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 6",
    ".globl vramtrace_thread_state",
    ".hidden vramtrace_thread_state",
    ".type vramtrace_thread_state, @object",
    ".size vramtrace_thread_state, {bytes}",
    "vramtrace_thread_state:",
    ".zero {bytes}",
    ".popsection",
    bytes = const STATE_BYTES,
    options(att_syntax)
);

/// This thread's state. The reference is the calling thread's own: `State` is not `Sync`, so it cannot be sent
/// to another thread; it stays valid as long as the thread lives (the block is freed with the thread's stack).
#[cfg(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_pointer_width = "64"
))]
#[inline(always)]
pub fn state() -> &'static State {
    let p: *const State;
    // SAFETY: the initial-exec sequence for a symbol of this object's static TLS block: %fs:0 is the thread
    // pointer (glibc and musl keep it there), the GOT slot the block's offset from it.
    unsafe {
        std::arch::asm!(
            "movq %fs:0, {p}",
            "addq vramtrace_thread_state@gottpoff(%rip), {p}",
            p = out(reg) p,
            options(att_syntax, pure, readonly, nostack),
        );
        &*p
    }
}

#[cfg(not(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_pointer_width = "64"
)))]
thread_local! {
    static STATE: State = const {
        State {
            busy: Cell::new(false),
            capturing: Cell::new(false),
            exiting: Cell::new(false),
            tid: Cell::new(0),
            local: Cell::new(std::ptr::null_mut()),
            memo: UnsafeCell::new(Memo::EMPTY),
        }
    };
}

/// This thread's state (see the other `state`).
#[cfg(not(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_pointer_width = "64"
)))]
#[inline(always)]
pub fn state() -> &'static State {
    // SAFETY: as above: the thread's own state, alive as long as the thread, never shared.
    STATE.with(|s| unsafe { &*(s as *const State) })
}

/// Marks the calling thread as the shim's own: nothing it does is ever recorded (the hooks see it busy).
pub fn mark_own_thread() {
    state().busy.set(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_state_starting_at_zero() {
        let s = state();
        assert!(!s.busy.get() && !s.capturing.get() && !s.exiting.get());
        assert_eq!(s.tid.get(), 0);
        assert!(s.local.get().is_null());
        s.busy.set(true);
        s.tid.set(7);
        assert!(
            std::ptr::eq(s, state()),
            "the same block on the same thread"
        );
        let other = std::thread::spawn(|| {
            let t = state();
            // SAFETY: this thread's own memo, nothing else touches it here.
            let memo_empty = unsafe { &*t.memo.get() }.is_empty();
            let fresh = !t.busy.get() && t.tid.get() == 0 && memo_empty;
            t.busy.set(true);
            t.tid.set(9);
            (fresh, t as *const State as usize)
        })
        .join()
        .unwrap();
        assert!(other.0, "a new thread starts at zero");
        assert_ne!(
            other.1, s as *const State as usize,
            "another thread, another block"
        );
        assert_eq!(s.tid.get(), 7, "the other thread's writes are its own");
        s.busy.set(false);
        s.tid.set(0);
    }
}
