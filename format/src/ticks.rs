//! Event times as the CPU's time-stamp counter (ring flag `FLAG_TICKS`), and their conversion to CLOCK_MONOTONIC
//! nanoseconds, the trace's clock.
//!
//! Where the kernel itself keeps time with the counter (clocksource `tsc`: invariant, the same on every core),
//! the shim stamps each event with the raw counter, one instruction, and the collector converts. Reading
//! CLOCK_MONOTONIC instead costs the vDSO's arithmetic on top of the same counter read (15 against 35 ns on the
//! development VM), and a calibrated line in the shim cost its loads and its checks on every event. Converting
//! in the collector also orders every process's events by one function, not each by its own calibration.
//!
//! The conversion ([`Calibration`]): a line through the latest sample of (counter, CLOCK_MONOTONIC) with the
//! rate measured since the first, drawn again as it ages ([`Calibration::line`]). For ticks near its sample it
//! is within tens of ns of CLOCK_MONOTONIC (the tests); ticks far older than the line (a ring drained long after,
//! the collector stopped) are off by the clock's drift over the distance (CLOCK_MONOTONIC is slewed by NTP: a few
//! ppm). A line drawn again can move a time by a few ns; the collector holds each process's times at no less
//! than the previous one, events and records alike, so nothing goes back.

/// How often the collector draws the line again.
pub const REDRAW_NS: u64 = 100_000_000;
/// The least span between the first sample and the first line: the rate's error is the samples' error (tens
/// of ns) over it.
pub const FIRST_SPAN_NS: u64 = 10_000_000;

/// Whether events can carry the counter: x86-64, and the kernel keeps time with it. `VRAMTRACE_CLOCK` overrides:
/// `monotonic` says no (events then carry CLOCK_MONOTONIC, read through the vDSO); `counter` says yes on any
/// x86-64 (for tests, and for a machine whose counter is invariant though its kernel chose another clocksource).
pub fn usable() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    match std::env::var("VRAMTRACE_CLOCK").as_deref() {
        Ok("monotonic") => false,
        Ok("counter") => true,
        _ => std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc"),
    }
}

/// The counter (0 where there is none: [`usable`] is false there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read() -> u64 {
    // SAFETY: RDTSC is in every x86-64 CPU and reads nothing from memory (a kernel that set CR4.TSD would make it
    // fault, as any program's RDTSC; `usable` is what decides whether events carry it).
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn read() -> u64 {
    0
}

/// CLOCK_MONOTONIC in ns, through the vDSO.
#[inline]
pub fn monotonic() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a local timespec the call writes; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One (counter, CLOCK_MONOTONIC) pair: the counter read halfway through the clock read, best of a few.
pub fn sample() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..7 {
        let a = read();
        let ns = monotonic();
        let b = read();
        let width = b.wrapping_sub(a);
        if width < best.0 {
            best = (width, a + width / 2, ns);
        }
    }
    (best.1, best.2)
}

/// Counter ticks to ns: `base_ns + (t - base_tsc) * mult / 2^32`, either side of the base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line {
    base_tsc: u64,
    base_ns: u64,
    /// Nanoseconds per tick, 32.32 fixed point.
    mult: u64,
}

impl Line {
    #[inline]
    pub fn to_ns(&self, t: u64) -> u64 {
        let d = t.wrapping_sub(self.base_tsc) as i64;
        let off = ((d.unsigned_abs() as u128 * self.mult as u128) >> 32) as u64;
        if d >= 0 {
            self.base_ns.saturating_add(off)
        } else {
            self.base_ns.saturating_sub(off)
        }
    }
}

/// The collector's conversion: the first sample, and the line drawn from the latest.
pub struct Calibration {
    first: (u64, u64),
    line: Option<(Line, u64)>,
}

impl Calibration {
    /// Takes the first sample: make it early (the first line waits until [`FIRST_SPAN_NS`] after it).
    pub fn new() -> Calibration {
        Calibration {
            first: sample(),
            line: None,
        }
    }

    /// The line to convert with now. It is drawn again once it is older than half the span its rate was
    /// measured over, or than [`REDRAW_NS`]: a line extrapolates its rate's error (the samples' error over the
    /// span) by at most half that span, a few ns, from the first line on. The first call waits until the first
    /// sample is [`FIRST_SPAN_NS`] old (at most that long, once).
    pub fn line(&mut self) -> Line {
        let now = monotonic();
        if let Some((l, at)) = self.line {
            let span = at.saturating_sub(self.first.1);
            if now.saturating_sub(at) < REDRAW_NS.min(span / 2) {
                return l;
            }
        }
        let since = now.saturating_sub(self.first.1);
        if since < FIRST_SPAN_NS {
            std::thread::sleep(std::time::Duration::from_nanos(FIRST_SPAN_NS - since));
        }
        let (t, ns) = sample();
        let (t0, ns0) = self.first;
        let mult = if t > t0 && ns > ns0 {
            ((((ns - ns0) as u128) << 32) / (t - t0) as u128) as u64
        } else {
            // A counter that did not move forward is no clock: keep the line there was (or one tick a ns).
            self.line.map_or(1 << 32, |(l, _)| l.mult)
        };
        let l = Line {
            base_tsc: t,
            base_ns: ns,
            mult,
        };
        self.line = Some((l, ns));
        l
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_converts_either_side_of_its_base() {
        let l = Line {
            base_tsc: 1_000,
            base_ns: 5_000,
            mult: 3 << 31, // 1.5 ns a tick
        };
        assert_eq!(l.to_ns(1_000), 5_000);
        assert_eq!(l.to_ns(1_100), 5_150);
        assert_eq!(l.to_ns(900), 4_850);
        assert_eq!(l.to_ns(0), 3_500);
        let early = Line {
            base_tsc: u64::MAX / 2,
            base_ns: 10,
            mult: 1 << 32,
        };
        assert_eq!(early.to_ns(0), 0, "never below zero");
    }

    #[test]
    fn converted_ticks_stay_within_a_few_microseconds_of_the_monotonic_clock() {
        if !usable() {
            eprintln!("SKIP: this machine's kernel does not keep time with the TSC (events carry CLOCK_MONOTONIC)");
            return;
        }
        let mut c = Calibration::new();
        let start = std::time::Instant::now();
        let (mut worst, mut lines) = (0i64, 0u32);
        let mut last = None;
        while start.elapsed() < std::time::Duration::from_millis(600) {
            let l = c.line();
            if last != Some(l) {
                lines += 1;
                last = Some(l);
            }
            for _ in 0..1000 {
                let (t, ns) = sample();
                worst = worst.max((l.to_ns(t) as i64 - ns as i64).abs());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("worst error against CLOCK_MONOTONIC: {worst} ns over {lines} lines");
        assert!(lines >= 4, "drawn again as it aged: {lines} lines");
        // A busy 2-core VM preempts the sampling now and then (a sample's own error is then the pre-emption): a
        // bound of microseconds, though the error is tens of ns in a quiet run.
        assert!(worst < 20_000, "worst error {worst} ns");
    }
}
