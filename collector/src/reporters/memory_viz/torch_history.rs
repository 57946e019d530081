//! PyTorch's own allocator history in the memory_viz export: a snapshot the bridge kept (`--torch-history`),
//! read by the one pickle reader, split per GPU and written back with the opcodes memory_viz reads, each GPU a
//! device after the real ones.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use super::super::pickle::{Pickler, BATCH};
use crate::inputs::pickle::{Doc, V};
use crate::inputs::torch_snapshot;
use crate::model::Analysis;

/// One process's and GPU's tensor-level history: PyTorch's own `segments` and `device_traces` for that GPU.
pub(super) struct TorchHistory {
    pub(super) label: String,
    /// The snapshot's strings (every GPU's history of one snapshot shares them).
    doc: Arc<Doc>,
    segments: Vec<V>,
    trace: Vec<V>,
}

/// Adds to `torch` the histories of every process of `a` the bridge kept a snapshot of (its exit snapshot, else
/// its last out-of-memory one), looked for beside `trace`; to `notes`, each process's whose none could be read.
/// `host`: the trace's host, said before each.
pub(super) fn add(
    a: &Analysis,
    trace: &Path,
    host: &str,
    torch: &mut Vec<TorchHistory>,
    notes: &mut Vec<String>,
) {
    // Per process, the snapshots to try, best first: at exit (the whole history), then the latest
    // out-of-memory one.
    let mut candidates: BTreeMap<u32, Vec<(String, &str)>> = BTreeMap::new();
    for (pid, p) in &a.bridge.exit_snapshots {
        candidates
            .entry(*pid)
            .or_default()
            .push((p.clone(), "exit"));
    }
    for o in a.ooms.iter().rev() {
        if let Some(p) = o.framework.as_ref().and_then(|f| f.snapshot_path.as_ref()) {
            candidates
                .entry(o.pid)
                .or_default()
                .push((p.clone(), "out of memory"));
        }
    }
    for (pid, tries) in candidates {
        let mut found = None;
        let mut why = Vec::new();
        for (recorded, at) in &tries {
            match torch_snapshot::locate(recorded, trace) {
                Some(path) => match torch_snapshot::load(&path) {
                    Ok(v) => {
                        found = Some((path, v, *at));
                        break;
                    }
                    Err(e) => why.push(format!("{}: {e}", path.display())),
                },
                None => why.push(format!("{recorded}: not found beside the trace")),
            }
        }
        let Some((path, v, at)) = found else {
            notes.push(format!(
                "pid {pid}: no PyTorch snapshot could be read ({})",
                why.join("; ")
            ));
            continue;
        };
        torch.extend(per_gpu(v, |gpu| {
            format!(
                "{host}pid {pid} GPU {gpu}: PyTorch's own allocator history (tensors in its segments), from its \
                 snapshot at {at} ({})",
                path.display()
            )
        }));
    }
}

/// The histories of a snapshot, one per GPU with segments or events; `label`: what each is said to be, by GPU.
fn per_gpu(doc: Doc, label: impl Fn(usize) -> String) -> Vec<TorchHistory> {
    let doc = Arc::new(doc);
    let device = doc.id("device");
    let traces = doc.get(&doc.root, "device_traces").map_or(&[][..], V::list);
    let segments = doc.get(&doc.root, "segments").map_or(&[][..], V::list);
    let mut out = Vec::new();
    for (gpu, t) in traces.iter().enumerate() {
        let mine: Vec<V> = segments
            .iter()
            .filter(|s| matches!(s.get(device), Some(V::Int(d)) if *d == gpu as i64))
            .cloned()
            .collect();
        let trace = t.list().to_vec();
        if mine.is_empty() && trace.is_empty() {
            continue;
        }
        out.push(TorchHistory {
            label: label(gpu),
            doc: doc.clone(),
            segments: mine,
            trace,
        });
    }
    out
}

impl TorchHistory {
    /// Its segments, as items of the open `segments` list, their `device` made `device`.
    pub(super) fn put_segments<W: Write>(&self, p: &mut Pickler<W>, device: i64) -> io::Result<()> {
        for chunk in self.segments.chunks(BATCH) {
            p.mark()?;
            for seg in chunk {
                put_value(p, &self.doc, seg, Some(device))?;
            }
            p.appends()?;
        }
        Ok(())
    }

    /// Its events, as one item (a list) of the open `device_traces` list.
    pub(super) fn put_trace<W: Write>(&self, p: &mut Pickler<W>) -> io::Result<()> {
        p.mark()?;
        p.empty_list()?;
        for chunk in self.trace.chunks(BATCH) {
            p.mark()?;
            for e in chunk {
                put_value(p, &self.doc, e, None)?;
            }
            p.appends()?;
        }
        p.appends()
    }
}

/// A dict key as the export orders keys: integers (by value) before strings (by their bytes), as the map
/// serde-pickle read snapshots into did, so the export's bytes stayed the same when the reader changed. Other
/// keys are left out (memory_viz reads none).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Key<'d> {
    Int(i64),
    Str(&'d str),
}

/// A value of PyTorch's snapshot, re-written with the opcodes memory_viz reads; `device`: the `device` of a
/// segment, replaced. Integers past 64-bit signed, floats and bytes (none in PyTorch's snapshots) become None.
fn put_value<W: Write>(
    p: &mut Pickler<W>,
    doc: &Doc,
    v: &V,
    device: Option<i64>,
) -> io::Result<()> {
    match v {
        V::None | V::BigInt(_) | V::Float(_) | V::Bytes => p.none(),
        V::Bool(b) => p.bool(*b),
        V::Int(i) => p.int(*i),
        V::Str(_) => p.str(doc.str(v).unwrap_or_default()),
        V::Tuple(l) if l.len() == 2 => {
            put_value(p, doc, &l[0], None)?;
            put_value(p, doc, &l[1], None)?;
            p.tuple2()
        }
        V::List(l) | V::Tuple(l) => {
            p.empty_list()?;
            for chunk in l.chunks(BATCH) {
                p.mark()?;
                for x in chunk {
                    put_value(p, doc, x, None)?;
                }
                p.appends()?;
            }
            Ok(())
        }
        V::Dict(m) => {
            p.empty_dict()?;
            if m.is_empty() {
                return Ok(());
            }
            let mut items: Vec<(Key, &V)> = m
                .iter()
                .filter_map(|(k, x)| match k {
                    V::Int(i) => Some((Key::Int(*i), x)),
                    V::Str(_) => Some((Key::Str(doc.str(k)?), x)),
                    _ => None,
                })
                .collect();
            // A key given twice keeps its last value, as a map does; the sort is stable.
            items.sort_by(|a, b| a.0.cmp(&b.0));
            items.reverse();
            items.dedup_by(|a, b| a.0 == b.0);
            items.reverse();
            p.mark()?;
            for (k, x) in items {
                match k {
                    Key::Str(k) => {
                        p.str(k)?;
                        match (k, device) {
                            ("device", Some(d)) => p.int(d)?,
                            _ => put_value(p, doc, x, None)?,
                        }
                    }
                    Key::Int(k) => {
                        p.int(k)?;
                        put_value(p, doc, x, None)?;
                    }
                }
            }
            p.setitems()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_keys_are_written_in_the_order_and_with_the_values_they_always_had() {
        // Integers before strings, each in order; a key given twice keeps its last value; other keys, floats
        // and integers past 64 bits left out or None; `device` replaced where asked.
        let doc = crate::inputs::pickle::read(&crate::inputs::pickle::python_written(
            "v = {'size': 1, 'device': 3, 7: 'x', 'addr': 2, -1: None, 2.5: 0, 'f': 1.5, 'big': 1 << 70}",
            false,
        ))
        .unwrap();
        let mut p = Pickler::new(Vec::new()).unwrap();
        put_value(&mut p, &doc, &doc.root, Some(9)).unwrap();
        let back = crate::inputs::pickle::read(&p.stop().unwrap()).unwrap();
        let keys: Vec<String> = match &back.root {
            V::Dict(m) => m
                .iter()
                .map(|(k, x)| {
                    let k = back.str(k).map_or_else(|| format!("{k:?}"), str::to_string);
                    let x = back.str(x).map_or_else(|| format!("{x:?}"), str::to_string);
                    format!("{k}={x}")
                })
                .collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            keys,
            [
                "Int(-1)=None",
                "Int(7)=x",
                "addr=Int(2)",
                "big=None",
                "device=Int(9)",
                "f=None",
                "size=Int(1)"
            ]
        );
        // {'a': 1} then 'a' again, 2: one key, its last value.
        let doc = crate::inputs::pickle::read(b"\x80\x04}\x8c\x01aK\x01s\x8c\x01aK\x02s.").unwrap();
        let mut p = Pickler::new(Vec::new()).unwrap();
        put_value(&mut p, &doc, &doc.root, None).unwrap();
        let back = crate::inputs::pickle::read(&p.stop().unwrap()).unwrap();
        assert!(matches!(&back.root, V::Dict(m) if m.len() == 1 && m[0].1 == V::Int(2)));
    }
}
