//! Events' counter ticks (rings with `FLAG_TICKS`) to the trace's CLOCK_MONOTONIC ns. One calibration for the
//! whole collector, so that every process's events are converted by the same line (format's `ticks`).

use std::sync::Mutex;

use vramtrace_format::ticks::{Calibration, Line};

/// The collector's clock: CLOCK_MONOTONIC ns, the clock of the trace (its processes' records carry it).
pub fn mono_ns() -> u64 {
    vramtrace_format::ticks::monotonic()
}

static CALIBRATION: Mutex<Option<Calibration>> = Mutex::new(None);

/// Takes the first sample, if not taken yet: early, so that the first line (drawn over at least
/// `FIRST_SPAN_NS` from it) is ready when the job's first events are.
pub fn start() {
    let mut c = CALIBRATION.lock().unwrap_or_else(|e| e.into_inner());
    c.get_or_insert_with(Calibration::new);
}

/// The line to convert a drain's ticks with (drawn again when it is old). The first call may wait for the first
/// span, about 10 ms, once.
pub fn line() -> Line {
    let mut c = CALIBRATION.lock().unwrap_or_else(|e| e.into_inner());
    c.get_or_insert_with(Calibration::new).line()
}
