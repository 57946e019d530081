//! The PyTorch snapshots the GPU runs kept (tests/fixtures/gpu/*.pickle) read as `report` and `oom` read them:
//! every figure pinned, so a change of the pickle reader under `torch_snapshot::read` that reads a real dump
//! differently fails here. The figures were taken with serde-pickle, the reader before the one in
//! collector/src/inputs/pickle/.

use std::path::Path;

use vramtrace_collector::inputs::torch_snapshot::read;
use vramtrace_collector::model::SnapshotReading;

/// One line a reading: its totals, then each kept line's label, bytes, count and bytes during the rise.
fn figures(r: &SnapshotReading) -> String {
    let mut s = format!(
        "tensors {} bytes {} no_frames {} overflowed {} error {:?}",
        r.live_tensors, r.live_bytes, r.no_frames_bytes, r.overflowed, r.error
    );
    for k in &r.kept {
        s += &format!(
            "\n  {} | {} | {} | {}",
            k.label, k.bytes, k.count, k.during_rise_bytes
        );
    }
    s
}

#[test]
fn real_snapshots_read_to_the_figures_they_always_gave() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu");
    let mut got = String::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pickle"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 5, "{names:?}");
    for name in &names {
        let path = dir.join(name);
        // Every device a snapshot may name, and a rise that covers part of each run (Unix microseconds).
        for device in [Some(0), Some(1), None] {
            for rise in [
                None,
                Some((0, u64::MAX)),
                Some((1_795_000_000_000_000, 1_795_705_000_000_000)),
            ] {
                let r = read(&path, device, rise);
                got += &format!("{name} {device:?} {rise:?}: {}\n", figures(&r));
            }
        }
    }
    let want = include_str!("snapshot_fixtures.txt");
    assert!(got == want, "got:\n{got}");
}
