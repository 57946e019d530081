//! Every event's time: CLOCK_MONOTONIC nanoseconds, the collector's clock. Reading it through the vDSO costs
//! 20 to 40 ns (half the shim's cost per event); where the kernel itself keeps time with the CPU's time-stamp
//! counter (clocksource `tsc`: invariant, the same on every core), the shim reads the counter (a few ns) and
//! converts it with a calibration against CLOCK_MONOTONIC that the courier thread keeps fresh.
//!
//! The conversion is one line per calibration, `ns = base_ns + (tsc - base_tsc) * mult`, each line starting
//! where the one before it ends (never earlier: the clock never runs backwards for a thread) and aimed to meet
//! CLOCK_MONOTONIC at the next calibration, 100 ms later. Its error against CLOCK_MONOTONIC stays within about a
//! microsecond (`test`s and `calibration_error_ns`). Anything unexpected (no `tsc` clocksource, not x86-64, a
//! calibration older than a second, as in a forked child before its first tracked call) reads CLOCK_MONOTONIC.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

/// Set once the courier has two samples far enough apart.
static TSC_ON: AtomicBool = AtomicBool::new(false);
/// Seqlock over the line: odd while the courier writes it.
static SEQ: AtomicU64 = AtomicU64::new(0);
static BASE_TSC: AtomicU64 = AtomicU64::new(0);
static BASE_NS: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per tick, 32.32 fixed point.
static MULT: AtomicU64 = AtomicU64::new(0);
/// Ticks past the line's base after which the line is stale (about a second).
static STALE_TICKS: AtomicU64 = AtomicU64::new(0);

/// How often the courier recalibrates, and the least span the first line is measured over.
pub const RECALIBRATE: std::time::Duration = std::time::Duration::from_millis(100);
const FIRST_SPAN_NS: u64 = 50_000_000;

/// CLOCK_MONOTONIC, from the vDSO.
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn monotonic() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[link_section = ".vramtrace.hot"]
fn tsc() -> u64 {
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
#[link_section = ".vramtrace.hot"]
fn tsc() -> u64 {
    0
}

/// CLOCK_MONOTONIC in nanoseconds, as cheaply as this machine allows.
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn now() -> u64 {
    if !TSC_ON.load(Ordering::Relaxed) {
        return monotonic();
    }
    let t = tsc();
    let s1 = SEQ.load(Ordering::Acquire);
    let base_tsc = BASE_TSC.load(Ordering::Relaxed);
    let base_ns = BASE_NS.load(Ordering::Relaxed);
    let mult = MULT.load(Ordering::Relaxed);
    let stale = STALE_TICKS.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    if s1 & 1 != 0 || SEQ.load(Ordering::Relaxed) != s1 {
        // The courier is moving the line (or was preempted doing it): never wait for it.
        return monotonic();
    }
    // A counter read before the line began (the courier moved it meanwhile) is on the new line too.
    let d = t.wrapping_sub(base_tsc) as i64;
    if d.unsigned_abs() > stale {
        return monotonic();
    }
    let off = ((d.unsigned_abs() as u128 * mult as u128) >> 32) as u64;
    if d >= 0 {
        base_ns + off
    } else {
        base_ns.saturating_sub(off)
    }
}

/// In a forked child: the line may have been half-written by the parent's courier, which the child does not
/// have. CLOCK_MONOTONIC until the child's own courier draws a fresh line.
pub fn after_fork_in_child() {
    TSC_ON.store(false, Ordering::Relaxed);
    let s = SEQ.load(Ordering::Relaxed);
    if s & 1 != 0 {
        SEQ.store(s + 1, Ordering::Relaxed);
    }
}

/// One (counter, CLOCK_MONOTONIC) pair: the counter read halfway through the clock read, best of a few.
fn sample() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..7 {
        let a = tsc();
        let ns = monotonic();
        let b = tsc();
        let width = b.wrapping_sub(a);
        if width < best.0 {
            best = (width, a + width / 2, ns);
        }
    }
    (best.1, best.2)
}

/// Whether the kernel keeps time with the time-stamp counter (then it is invariant and synchronised).
fn kernel_uses_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
        && std::env::var_os("VRAMTRACE_CLOCK").is_none_or(|v| v != "monotonic")
}

/// The courier's side: calibrates, then keeps the line fresh. Call `tick` about every [`RECALIBRATE`].
pub struct Calibrator {
    usable: bool,
    first: Option<(u64, u64)>,
    last: Option<(u64, u64)>,
}

impl Calibrator {
    pub fn new() -> Calibrator {
        let usable = kernel_uses_tsc();
        Calibrator {
            usable,
            first: usable.then(sample),
            last: None,
        }
    }

    /// Takes a sample and moves the line: from where the current line is now, aimed at CLOCK_MONOTONIC one
    /// period ahead.
    pub fn tick(&mut self) {
        if !self.usable {
            return;
        }
        let (t, ns) = sample();
        let Some((t0, ns0)) = self.first else {
            return;
        };
        if !TSC_ON.load(Ordering::Relaxed) {
            if ns.saturating_sub(ns0) < FIRST_SPAN_NS || t <= t0 {
                return;
            }
            let mult = ((((ns - ns0) as u128) << 32) / (t - t0) as u128) as u64;
            // About a second of ticks: past that, a line is stale.
            let stale = ((1_000_000_000u128 << 32) / mult.max(1) as u128) as u64;
            publish(t, ns, mult, stale);
            self.last = Some((t, ns));
            TSC_ON.store(true, Ordering::Release);
            return;
        }
        // The rate measured over everything so far; the next line starts where this one is now (never earlier),
        // and meets CLOCK_MONOTONIC again a period later.
        let rate = if ns.saturating_sub(ns0) >= FIRST_SPAN_NS && t > t0 {
            ((((ns - ns0) as u128) << 32) / (t - t0) as u128) as u64
        } else {
            // A forked child's new courier: its own span is still short; the inherited line's rate serves.
            MULT.load(Ordering::Relaxed)
        };
        let on_line = now_at(t);
        let start = on_line.max(self.last.map_or(0, |l| l.1));
        let period_ticks = ((RECALIBRATE.as_nanos() << 32) / rate.max(1) as u128) as u64;
        let aim = ns + RECALIBRATE.as_nanos() as u64;
        let mult = if aim > start && period_ticks > 0 {
            ((((aim - start) as u128) << 32) / period_ticks as u128) as u64
        } else {
            rate / 2 // ahead of the clock by a whole period: slow down, never step back
        };
        let stale = STALE_TICKS.load(Ordering::Relaxed);
        publish(t, start, mult, stale);
        self.last = Some((t, start));
    }
}

impl Default for Calibrator {
    fn default() -> Self {
        Self::new()
    }
}

/// The current line's time at counter value `t`.
fn now_at(t: u64) -> u64 {
    let d = t.wrapping_sub(BASE_TSC.load(Ordering::Relaxed)) as i64;
    let off = ((d.unsigned_abs() as u128 * MULT.load(Ordering::Relaxed) as u128) >> 32) as u64;
    let base = BASE_NS.load(Ordering::Relaxed);
    if d >= 0 {
        base + off
    } else {
        base.saturating_sub(off)
    }
}

fn publish(base_tsc: u64, base_ns: u64, mult: u64, stale: u64) {
    SEQ.fetch_add(1, Ordering::AcqRel);
    fence(Ordering::Release);
    BASE_TSC.store(base_tsc, Ordering::Relaxed);
    BASE_NS.store(base_ns, Ordering::Relaxed);
    MULT.store(mult, Ordering::Relaxed);
    STALE_TICKS.store(stale, Ordering::Relaxed);
    SEQ.fetch_add(1, Ordering::Release);
}

/// How far `now()` is from CLOCK_MONOTONIC at this moment (for tests and the debug line), in ns.
pub fn calibration_error_ns() -> i64 {
    let a = monotonic();
    let n = now();
    let b = monotonic();
    n as i64 - ((a + b) / 2) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock's state is the process's: its tests take turns.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_line_being_moved_never_makes_a_reader_wait_and_a_fork_starts_afresh() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        publish(tsc(), monotonic(), 1 << 32, u64::MAX / 2);
        TSC_ON.store(true, Ordering::Release);
        // The courier stopped in the middle of moving the line (preempted, or the process forked then).
        SEQ.fetch_add(1, Ordering::AcqRel);
        let a = monotonic();
        let n = now();
        let b = monotonic();
        assert!(
            a <= n && n <= b,
            "read CLOCK_MONOTONIC instead: {a} {n} {b}"
        );
        // A child forked at that moment: monotonic until its own courier draws a line, and a line it draws
        // is readable (the sequence is even again).
        after_fork_in_child();
        assert!(!TSC_ON.load(Ordering::Relaxed));
        assert_eq!(SEQ.load(Ordering::Relaxed) & 1, 0);
        publish(tsc(), monotonic(), 1 << 32, u64::MAX / 2);
        assert_eq!(SEQ.load(Ordering::Relaxed) & 1, 0);
        TSC_ON.store(false, Ordering::Release);
    }

    #[test]
    fn stays_within_a_few_microseconds_of_the_monotonic_clock_and_never_goes_back() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        TSC_ON.store(false, Ordering::Release);
        let mut c = Calibrator::new();
        if !c.usable {
            eprintln!("this machine's kernel does not keep time with the TSC: the shim reads CLOCK_MONOTONIC");
            return;
        }
        let start = std::time::Instant::now();
        let mut worst = 0i64;
        let mut last = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(800) {
            c.tick();
            for _ in 0..20_000 {
                let t = now();
                assert!(t >= last, "went back: {last} -> {t}");
                last = t;
            }
            if TSC_ON.load(Ordering::Relaxed) {
                worst = worst.max(calibration_error_ns().abs());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(TSC_ON.load(Ordering::Relaxed), "calibrated within 800 ms");
        eprintln!("worst error against CLOCK_MONOTONIC: {worst} ns");
        // A busy 2-core VM preempts the sampling thread now and then; a microsecond-scale bound still holds.
        assert!(worst < 20_000, "worst error {worst} ns");
    }
}
