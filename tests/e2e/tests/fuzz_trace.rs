//! The trace-format fuzzer (`vramtrace_e2e::fuzz`), a short run in CI: broken traces of every kind put through
//! every reader end without a panic, in bounded time. The long run's counts are in docs/FUZZING.md
//! (`cargo run --release -p vramtrace-e2e --bin fuzz_trace`).

use std::time::Duration;

use vramtrace_e2e::fuzz;
use vramtrace_e2e::TempDir;

#[test]
fn broken_traces_of_every_kind_end_without_a_panic() {
    let dir = TempDir::new("fuzz");
    std::panic::set_hook(Box::new(|_| {}));
    let c = fuzz::run(7, 600, 20, dir.path());
    let _ = std::panic::take_hook();
    assert!(c.panics.is_empty(), "{:?}", c.panics);
    assert_eq!(c.cases, 600);
    // The cases reach the readers, and every mutation is tried.
    assert!(c.replayed > 300, "{c:?}");
    assert!(c.bad_frames > 0, "{c:?}");
    assert!(c.by_mutation.iter().all(|n| *n > 0), "{c:?}");
    assert!(c.slowest < Duration::from_secs(20), "{c:?}");
}
