//! Reads a PyTorch allocator snapshot the bridge kept beside the trace (`--torch-history`: the pickle of
//! `torch.cuda.memory._snapshot()`, protocol 4) and groups the tensors live in it by the line that allocated
//! them: the line whose tensors are kept alive, rather than the line that happened to grow a segment.
//!
//! The snapshot's shape (PyTorch's memory_snapshot.cpp): `segments` (each with `device` and `blocks`; a block's
//! `state` is `active_allocated`, `active_pending_free` or `inactive`, and `frames` its allocation's Python
//! stack, innermost first) and `device_traces` (per device, entries with `action`, `addr`, `time_us`: Unix
//! microseconds).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::callsites::{is_library_python, short_path};
use crate::inputs::pickle::{Doc, V};
use crate::model::{KeptLine, SnapshotReading};

/// Snapshots larger than this are not read (a dump with a long history reaches gigabytes); memory_viz opens
/// them.
pub const MAX_SNAPSHOT_BYTES: u64 = 512 << 20;
/// Lines listed.
pub const KEPT_LINES: usize = 10;

/// Where a snapshot recorded at `recorded` is now: there, or beside `trace` (the trace and its files moved
/// together, or the trace was renamed).
pub fn locate(recorded: &str, trace: &Path) -> Option<PathBuf> {
    let p = PathBuf::from(recorded);
    if p.is_file() {
        return Some(p);
    }
    let dir = trace.parent().unwrap_or(Path::new("."));
    let name = p.file_name()?.to_string_lossy().into_owned();
    let beside = dir.join(&name);
    if beside.is_file() {
        return Some(beside);
    }
    // `<old trace name>.torch-PID-TAG.pickle` beside a renamed trace.
    let suffix = name.find(".torch-").map(|i| &name[i..])?;
    let renamed = PathBuf::from(format!("{}{suffix}", trace.display()));
    renamed.is_file().then_some(renamed)
}

/// Reads the snapshot at `path` for `device`; `rise_us`: the leak's rise as Unix microseconds
/// [first low point, last low point], to say which live tensors were allocated during it.
pub fn read(path: &Path, device: Option<u32>, rise_us: Option<(u64, u64)>) -> SnapshotReading {
    read_loaded(&load(path), path, device, rise_us)
}

/// [`read`] on a snapshot already loaded (or refused), so that several readings of one file load it once.
pub fn read_loaded(
    loaded: &Result<Doc, String>,
    path: &Path,
    device: Option<u32>,
    rise_us: Option<(u64, u64)>,
) -> SnapshotReading {
    let mut r = SnapshotReading {
        path: path.display().to_string(),
        ..SnapshotReading::default()
    };
    match loaded {
        Ok(doc) => group(doc, device, rise_us, &mut r),
        Err(e) => r.error = Some(e.clone()),
    }
    r
}

/// The snapshot's bytes (a regular file, bounded in size; said why not).
fn load_bytes(path: &Path) -> Result<Vec<u8>, String> {
    crate::files::untrusted_file::read_whole(path, MAX_SNAPSHOT_BYTES).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData && e.to_string().contains(" MiB this reads")
        {
            format!("{e} (memory_viz opens it)")
        } else {
            e.to_string()
        }
    })
}

/// The snapshot at `path` read by the one pickle reader (`crate::inputs::pickle`, bounded as it reads: a forged
/// pickle is refused before it costs more than it could justify), every string interned.
pub fn load(path: &Path) -> Result<Doc, String> {
    crate::inputs::pickle::read(&load_bytes(path)?)
        .map_err(|e| format!("not a readable pickle: {e}"))
}

/// An integer only where it fits 64-bit signed (as the figures below have always been read).
fn int(v: Option<&V>) -> Option<i64> {
    v.and_then(V::exact_int)
}

fn list(v: Option<&V>) -> &[V] {
    v.map_or(&[], V::list)
}

/// `file:line in function` of the first frame that is the user's own (else the innermost frame).
fn line_of(doc: &Doc, frames: &[V]) -> Option<String> {
    let (filename, line, name) = (doc.id("filename"), doc.id("line"), doc.id("name"));
    let label = |f: &V| -> Option<String> {
        let file = doc.text(f.get(filename))?;
        let line = int(f.get(line)).unwrap_or(0);
        let name = doc.text(f.get(name)).unwrap_or("?");
        Some(format!("{}:{line} in {name}", short_path(file)))
    };
    frames
        .iter()
        .find(|f| {
            doc.text(f.get(filename))
                .is_some_and(|p| !is_library_python(p))
        })
        .or(frames.first())
        .and_then(label)
}

fn group(doc: &Doc, device: Option<u32>, rise_us: Option<(u64, u64)>, r: &mut SnapshotReading) {
    let v = &doc.root;
    let on_device = |x: &V| device.is_none_or(|d| int(doc.get(x, "device")) == Some(d as i64));
    // When each live block was allocated: the last `alloc` at its address in the device's trace.
    let mut born: HashMap<i64, u64> = HashMap::new();
    let traces = list(doc.get(v, "device_traces"));
    let dev_trace = match device {
        Some(d) => traces.get(d as usize).map(|t| list(Some(t))).unwrap_or(&[]),
        None => &[],
    };
    // A trace has a million entries: its keys are looked up once.
    let (action, addr, time_us) = (doc.id("action"), doc.id("addr"), doc.id("time_us"));
    for e in dev_trace {
        if doc.text(e.get(action)) == Some("alloc") {
            if let (Some(a), Some(t)) = (int(e.get(addr)), int(e.get(time_us))) {
                born.insert(a, t.max(0) as u64);
            }
        }
    }
    r.overflowed = doc
        .get(v, "allocator_settings")
        .and_then(|s| doc.get(s, "trace_alloc_overflowed"))
        .is_some_and(|x| matches!(x, V::Bool(true)));
    let mut by_line: HashMap<String, KeptLine> = HashMap::new();
    for seg in list(doc.get(v, "segments")).iter().filter(|s| on_device(s)) {
        for b in list(doc.get(seg, "blocks")) {
            if doc.text(doc.get(b, "state")) != Some("active_allocated") {
                continue;
            }
            let size = int(doc.get(b, "size")).unwrap_or(0).max(0) as u64;
            r.live_tensors += 1;
            r.live_bytes = r.live_bytes.saturating_add(size);
            let Some(label) = line_of(doc, list(doc.get(b, "frames"))) else {
                r.no_frames_bytes = r.no_frames_bytes.saturating_add(size);
                continue;
            };
            let during = match (
                rise_us,
                int(doc.get(b, "address")).and_then(|a| born.get(&a)),
            ) {
                (Some((from, to)), Some(&t)) => t >= from && t <= to,
                _ => false,
            };
            let k = by_line.entry(label.clone()).or_insert(KeptLine {
                label,
                bytes: 0,
                count: 0,
                during_rise_bytes: 0,
            });
            k.bytes = k.bytes.saturating_add(size);
            k.count += 1;
            if during {
                k.during_rise_bytes = k.during_rise_bytes.saturating_add(size);
            }
        }
    }
    let mut kept: Vec<KeptLine> = by_line.into_values().collect();
    kept.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
    kept.truncate(KEPT_LINES);
    r.kept = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::pickle::python_written;

    /// A snapshot with five blocks on device 0 (two lines of the user's, one block without frames, one
    /// inactive) and the allocations of two of them in its trace, as Python writes it.
    const SNAPSHOT: &str = "lib = dict(filename='/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py', \
        line=134, name='forward')\n\
        def block(addr, size, state, user):\n    \
            return dict(address=addr, size=size, state=state, frames=[lib, user] if user else [])\n\
        train = dict(filename='/home/u/train.py', line=72, name='keep')\n\
        v = dict(segments=[dict(device=0, blocks=[block(100, 32 << 20, 'active_allocated', train), \
        block(200, 32 << 20, 'active_allocated', train), block(300, 8 << 20, 'inactive', train), \
        block(400, 4 << 20, 'active_allocated', dict(filename='/home/u/train.py', line=80, name='keep')), \
        block(500, 1 << 20, 'active_allocated', None)])], device_traces=[[dict(action='alloc', addr=100, \
        time_us=10), dict(action='alloc', addr=200, time_us=50)]])";

    #[test]
    fn live_tensors_group_by_the_users_line() {
        let doc = crate::inputs::pickle::read(&python_written(SNAPSHOT, false)).unwrap();
        let mut r = SnapshotReading::default();
        group(&doc, Some(0), Some((20, 60)), &mut r);
        assert_eq!(r.live_tensors, 4);
        assert_eq!(r.live_bytes, (32 + 32 + 4 + 1) << 20);
        assert_eq!(r.no_frames_bytes, 1 << 20);
        assert_eq!(r.kept.len(), 2);
        assert_eq!(r.kept[0].label, "u/train.py:72 in keep");
        assert_eq!((r.kept[0].bytes, r.kept[0].count), (64 << 20, 2));
        // Only the block allocated at 50 us lies in the rise [20, 60].
        assert_eq!(r.kept[0].during_rise_bytes, 32 << 20);
        assert_eq!(r.kept[1].label, "u/train.py:80 in keep");
        // Another device: nothing.
        let mut r = SnapshotReading::default();
        group(&doc, Some(1), None, &mut r);
        assert_eq!(r.live_tensors, 0);
    }

    #[test]
    fn a_snapshot_pytorch_dumped_itself_reads_as_the_bridges_own() {
        // PyTorch's `_dump_snapshot` pickles with the memo (each frame written once, referred to after);
        // serde-pickle 1.2 refused such a file. The bridge writes without it (fast mode). Both read alike.
        let dir = std::env::temp_dir().join(format!("vt-snap-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut got = Vec::new();
        for shared in [false, true] {
            let path = dir.join(format!("{shared}.pickle"));
            std::fs::write(&path, python_written(SNAPSHOT, shared)).unwrap();
            let mut r = read(&path, Some(0), Some((20, 60)));
            assert_eq!(r.error, None);
            r.path.clear();
            got.push(r);
        }
        assert_eq!(got[0], got[1]);
        assert_eq!(got[0].live_tensors, 4);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_pickle_nested_a_million_deep_is_refused_not_a_stack_overflow() {
        let dir = std::env::temp_dir().join(format!("vt-snap-deep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let deep = dir.join("deep.pickle");
        let mut b = vec![0x80, 4];
        b.extend(std::iter::repeat_n(b']', 1_000_000));
        b.extend(std::iter::repeat_n(b'a', 999_999));
        b.push(b'.');
        std::fs::write(&deep, &b).unwrap();
        let r = read(&deep, Some(0), None);
        assert!(
            r.error.as_deref().unwrap().contains("nests more than"),
            "{:?}",
            r.error
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unreadable_files_say_why() {
        let dir = std::env::temp_dir().join(format!("vt-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.pickle");
        std::fs::write(&bad, b"not a pickle").unwrap();
        let r = read(&bad, Some(0), None);
        assert!(
            r.error
                .as_deref()
                .unwrap()
                .contains("not a readable pickle"),
            "{:?}",
            r.error
        );
        let r = read(&dir, Some(0), None);
        assert!(
            r.error.as_deref().unwrap().contains("is a directory"),
            "{:?}",
            r.error
        );
        let r = read(&dir.join("missing.pickle"), Some(0), None);
        assert!(r.error.is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
