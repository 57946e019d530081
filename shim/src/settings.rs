//! What the environment tells the shim, read once at its first tracked call (never in a constructor).

use std::ffi::OsString;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use vramtrace_format::env;
use vramtrace_format::settings::JobSettings;

/// The job's settings as the collector answered this process's hello (null: no answer, or no collector). A
/// pointer, not a lock: a fork at any moment leaves the child a value or null, never a held lock.
static JOB: AtomicPtr<JobSettings> = AtomicPtr::new(std::ptr::null_mut());

/// Keeps the collector's answer (the first one: a forked child's is the same job's).
pub(crate) fn set_job(s: JobSettings) {
    let p = Box::into_raw(Box::new(s));
    if JOB
        .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // SAFETY: `p` came from `Box::into_raw` just above and was never shared.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// The cap this process applies: the job's, as the collector said it (whatever this process's environment
/// says), else, with no answer (no collector, or none in time), the environment's: (spec, warn, ledger).
pub(crate) fn cap_settings() -> (Option<String>, bool, Option<OsString>) {
    // SAFETY: `JOB` holds null or a leaked box (never freed once stored).
    match unsafe { JOB.load(Ordering::Acquire).as_ref() } {
        Some(j) => {
            use std::os::unix::ffi::OsStringExt;
            (
                j.cap.clone(),
                j.warn,
                j.ledger.clone().map(OsString::from_vec),
            )
        }
        None => {
            let s = get();
            (s.cap.clone(), s.cap_warn, s.ledger.clone())
        }
    }
}

/// The shim's settings for this process.
#[derive(Debug, Default)]
pub struct Settings {
    /// Where the collector listens (`VRAMTRACE_SOCKET`). Unset: nothing is recorded.
    pub socket: Option<OsString>,
    /// `VRAMTRACE_DEBUG=1`: say on stderr what the shim does. Otherwise it is silent.
    pub debug: bool,
    /// `VRAMTRACE_CAP`: the cap's spec (format::cap), parsed by the cap module.
    pub cap: Option<String>,
    /// `VRAMTRACE_CAP_MODE=warn`: record and warn, never refuse.
    pub cap_warn: bool,
    /// `VRAMTRACE_LEDGER`: the job's shared ledger file. Unset: the cap covers this process alone.
    pub ledger: Option<OsString>,
    /// `VRAMTRACE_STACKS=none|native|python|all` (default all): capture the native return addresses of each
    /// allocation's call site.
    pub stacks_native: bool,
    /// ... and the allocating thread's Python frames.
    pub stacks_python: bool,
    /// `VRAMTRACE_STACK_MIN_BYTES` (bytes, or a size such as `1MiB`; default [`DEFAULT_STACK_MIN_BYTES`]):
    /// successful allocations smaller than this get no call site. Failed ones always get one.
    pub stack_min_bytes: u64,
    /// `VRAMTRACE_RING_BYTES` (a size; default 16 MiB): the shared-memory ring each process publishes into.
    /// Rounded down to a power of two of 64-byte slots, within 64 KiB and 1 GiB.
    pub ring_slots: u64,
    /// `VRAMTRACE_LOSSLESS=1`: a thread that finds the ring full waits for room instead of dropping the event.
    pub lossless: bool,
    /// Events carry the CPU's time-stamp counter (format's `ticks::usable`: the kernel keeps time with it, or
    /// `VRAMTRACE_CLOCK=counter`); else CLOCK_MONOTONIC.
    pub ticks: bool,
}

/// Allocations below this many bytes get no call site unless they fail. Why 1 MiB (bench_pairs on an H200,
/// driver 580; scripts/bench.sh has the same rows on the simulated driver):
/// - the capture's cost does not depend on the size but on the depth and on whether the thread saw the call
///   chain recently: a repeated chain adds 0.05 us at 10 frames and 0.12 us at 50; a chain the thread has not
///   seen among its last 8 pays libgcc's unwinder, 1.7 us at 11 frames and 4.5 to 5.8 us at 51;
/// - `cuMemAlloc_v2` + `cuMemFree_v2` cost 46 to 52 us a pair at every size from 4 KiB to 16 MiB, so for them
///   any threshold would do (at worst +12%);
/// - pool allocations (`cuMemAllocAsync` + `cuMemFreeAsync` served from the driver's pool) cost 0.52 us a
///   pair: there an unseen chain would multiply the call's cost by 3 to 10. Those are the frequent, small,
///   per-tensor allocations (PyTorch's `cudaMallocAsync` backend, CuPy's async pool).
///
/// Every framework's caching allocator asks the driver for segments of 2 MiB or more (PyTorch's smallest
/// segment is 2 MiB, JAX/XLA reserves arenas), so all of them keep their call sites at 1 MiB, while the
/// small pool allocations, where the capture would cost most and which weigh least in a device's memory, go
/// without. Failed allocations of any size keep theirs (they are what an out-of-memory report needs).
/// `VRAMTRACE_STACK_MIN_BYTES=0` records every allocation's call site.
pub const DEFAULT_STACK_MIN_BYTES: u64 = vramtrace_format::env::DEFAULT_STACK_MIN_BYTES;

#[link_section = ".vramtrace.hotdata"]
static SETTINGS: crate::lazy::Lazy<Settings> = crate::lazy::Lazy::new();

/// The call-site settings every allocation reads, copied out of `Settings` (on the heap, a page of its own) into
/// the shim's hot data: `KNOWN`, `NATIVE` and `PYTHON` bits over the minimum size (capped at `MIN_MASK`). 0: not
/// read yet. The environment does not change under a process, nor across a fork, so the copy never goes stale.
#[link_section = ".vramtrace.hotdata"]
static STACKS: AtomicU64 = AtomicU64::new(0);
const KNOWN: u64 = 1 << 63;
const NATIVE: u64 = 1 << 62;
const PYTHON: u64 = 1 << 61;
const MIN_MASK: u64 = (1 << 48) - 1;

/// What the call-site capture needs of the settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stacks {
    pub native: bool,
    pub python: bool,
    /// Allocations smaller than this get no call site (unless they fail). At most 2^48 - 1.
    pub min_bytes: u64,
}

/// [`Stacks`] from the hot copy (the settings read at the first call).
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn call_sites() -> Stacks {
    let mut v = STACKS.load(Ordering::Relaxed);
    if v & KNOWN == 0 {
        let s = get();
        v = KNOWN
            | if s.stacks_native { NATIVE } else { 0 }
            | if s.stacks_python { PYTHON } else { 0 }
            | s.stack_min_bytes.min(MIN_MASK);
        STACKS.store(v, Ordering::Relaxed);
    }
    Stacks {
        native: v & NATIVE != 0,
        python: v & PYTHON != 0,
        min_bytes: v & MIN_MASK,
    }
}

/// Reads the environment the first time; the same answer ever after (a forked child keeps its parent's, or
/// reads it afresh if the fork came while another thread was reading it).
pub fn get() -> &'static Settings {
    static NOTHING: Settings = Settings {
        socket: None,
        debug: false,
        cap: None,
        cap_warn: false,
        ledger: None,
        stacks_native: false,
        stacks_python: false,
        stack_min_bytes: u64::MAX,
        ring_slots: vramtrace_format::ring::DEFAULT_SLOTS,
        lossless: false,
        ticks: false,
    };
    // `read` always gives settings; `NOTHING` (record nothing, cap nothing) only keeps panics out of the host.
    SETTINGS.get_or_init(|| Some(read())).unwrap_or(&NOTHING)
}

/// The settings if they were read already, without reading them: one atomic load, safe anywhere (a signal
/// handler included).
pub fn peek() -> Option<&'static Settings> {
    SETTINGS.peek()
}

/// Every value is parsed as `vramtrace run` parses it (format's `env`): the two cannot disagree.
fn read() -> Settings {
    test_slow_init();
    let var = |k: &str| std::env::var(k).ok();
    Settings {
        socket: std::env::var_os(env::SOCKET).filter(|s| !s.is_empty()),
        debug: env::flag(var(env::DEBUG).as_deref()),
        cap: var(env::CAP).filter(|s| !s.trim().is_empty()),
        // Said only about a cap the user set.
        cap_warn: var(env::CAP).is_some_and(|c| !c.trim().is_empty())
            && cap_warn(var(env::CAP_MODE).as_deref()),
        ledger: std::env::var_os(env::LEDGER).filter(|s| !s.is_empty()),
        ring_slots: ring_slots(var(env::RING_BYTES).as_deref()),
        lossless: env::flag(var(env::LOSSLESS).as_deref()),
        ticks: vramtrace_format::ticks::usable(),
        ..stacks(
            var(env::STACKS).as_deref(),
            var(env::STACK_MIN_BYTES).as_deref(),
        )
    }
}

/// Whether the cap only warns. A mode that is neither gets one line on stderr and the default, enforce (`run`
/// refuses it before anything starts; a program preloaded by hand gets the cap it asked for, enforced).
fn cap_warn(v: Option<&str>) -> bool {
    match env::cap_mode(v) {
        Ok(m) => m == env::CapMode::Warn,
        Err(why) => {
            say(format_args!("{why}; enforcing the cap"));
            false
        }
    }
}

/// Debug builds only (the tests' shim): `VRAMTRACE_TEST_SLOW_INIT_MS` makes the first read of the settings
/// slow, so a test can fork while another thread is inside it.
fn test_slow_init() {
    if cfg!(debug_assertions) {
        if let Some(ms) = std::env::var("VRAMTRACE_TEST_SLOW_INIT_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
}

/// The stack settings from `VRAMTRACE_STACKS` and `VRAMTRACE_STACK_MIN_BYTES`. A bad value gets one line on
/// stderr (the user asked for something and does not get it) and the default.
fn stacks(mode: Option<&str>, min: Option<&str>) -> Settings {
    let (native, python) = env::stacks(mode).unwrap_or_else(|why| {
        say(format_args!("{why}; using all"));
        (true, true)
    });
    let stack_min_bytes = match min.map(str::trim).filter(|m| !m.is_empty()) {
        None => DEFAULT_STACK_MIN_BYTES,
        Some(m) => env::size(m).unwrap_or_else(|_| {
            say(format_args!(
                "VRAMTRACE_STACK_MIN_BYTES={m:?} is not a size; using {DEFAULT_STACK_MIN_BYTES}"
            ));
            DEFAULT_STACK_MIN_BYTES
        }),
    };
    Settings {
        stacks_native: native,
        stacks_python: python,
        stack_min_bytes,
        ..Settings::default()
    }
}

/// The ring's slot count from `VRAMTRACE_RING_BYTES`; a bad value gets one line on stderr and the default.
fn ring_slots(v: Option<&str>) -> u64 {
    use vramtrace_format::ring;
    match v.map(str::trim).filter(|v| !v.is_empty()) {
        None => ring::DEFAULT_SLOTS,
        Some(v) => match env::size(v) {
            Ok(b) => ring::slots_for_bytes(b),
            Err(_) => {
                say(format_args!(
                    "VRAMTRACE_RING_BYTES={v:?} is not a size; using {} bytes",
                    ring::bytes_for(ring::DEFAULT_SLOTS)
                ));
                ring::DEFAULT_SLOTS
            }
        },
    }
}

/// One line on stderr, whatever `VRAMTRACE_DEBUG` says.
fn say(args: std::fmt::Arguments) {
    let line = format!("vramtrace[{}]: {}\n", std::process::id(), args);
    // SAFETY: `line` is a live String and the call reads `line.len()` bytes of it; a closed or odd fd 2 only
    // makes write(2) fail.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

/// One line on stderr when `VRAMTRACE_DEBUG` is set. Written with one `write(2)`: no locks, no stdio.
pub fn debug(args: std::fmt::Arguments) {
    if !get().debug {
        return;
    }
    let line = format!("vramtrace[{}]: {}\n", std::process::id(), args);
    // SAFETY: `line` is a live String and the call reads `line.len()` bytes of it; a closed or odd fd 2 only
    // makes write(2) fail.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::settings::debug(format_args!($($t)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_settings_and_their_defaults() {
        let s = stacks(None, None);
        assert!(s.stacks_native && s.stacks_python);
        assert_eq!(s.stack_min_bytes, DEFAULT_STACK_MIN_BYTES);
        let s = stacks(Some("none"), Some("0"));
        assert!(!s.stacks_native && !s.stacks_python);
        assert_eq!(s.stack_min_bytes, 0);
        let s = stacks(Some("Native"), Some("1MiB"));
        assert!(s.stacks_native && !s.stacks_python);
        assert_eq!(s.stack_min_bytes, 1 << 20);
        let s = stacks(Some("python"), Some(" 4096 "));
        assert!(!s.stacks_native && s.stacks_python);
        assert_eq!(s.stack_min_bytes, 4096);
        // Bad values: the defaults (and a line on stderr).
        let s = stacks(Some("everything"), Some("50%"));
        assert!(s.stacks_native && s.stacks_python);
        assert_eq!(s.stack_min_bytes, DEFAULT_STACK_MIN_BYTES);
    }
}
