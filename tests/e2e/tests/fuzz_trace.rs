//! The trace-format fuzzer (`vramtrace_e2e::fuzz`), a short run in CI: broken traces of every kind and shape put
//! through every reader end without a panic, each in its own process within 20 s and 1 GiB, the whole run
//! within about a minute and a half of CI's two cores. The long run's counts are in docs/FUZZING.md
//! (`cargo run --release -p vramtrace-e2e --bin fuzz_trace`).

use std::time::Duration;

use vramtrace_e2e::fuzz::{self, Limits};
use vramtrace_e2e::TempDir;

#[test]
fn broken_traces_of_every_kind_end_without_a_panic_in_bounded_time_and_memory() {
    let dir = TempDir::new("fuzz");
    std::panic::set_hook(Box::new(|_| {}));
    let limits = Limits {
        time: Duration::from_secs(20),
        memory: 1 << 30,
        budget: Some(Duration::from_secs(75)),
    };
    let c = fuzz::run_cases(7, 0, 600, 20, dir.path(), limits);
    let _ = std::panic::take_hook();
    let failures = c.failures();
    assert!(failures.is_empty(), "{failures:#?}");
    // Enough cases ran to mean something, they reach the readers, and every mutation and shape is tried.
    assert!(c.cases >= 200, "{c:?}");
    assert!(c.replayed > c.cases / 2, "{c:?}");
    assert!(c.bad_frames > 0, "{c:?}");
    assert!(c.by_mutation.iter().all(|n| *n > 0), "{c:?}");
    assert!(c.large > 0 && c.many_devices > 0, "{c:?}");
}
