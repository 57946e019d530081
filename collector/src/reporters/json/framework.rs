//! The JSON of the frameworks' allocators (the Python bridge): per device, per process, and what the bridge
//! attached to (docs/JSON-SCHEMA.md).

use super::{timeline, J};
use crate::model::{Analysis, DeviceFramework, Figures, ProcessFramework};

fn figures(f: &Figures) -> Vec<(&'static str, J)> {
    vec![
        ("allocated_bytes", f.allocated.into()),
        ("reserved_bytes", f.reserved.into()),
        ("active_bytes", f.active.into()),
        ("inactive_split_bytes", f.inactive_split.into()),
        ("requested_bytes", f.requested.into()),
        ("alloc_retries", f.alloc_retries.into()),
        ("num_ooms", f.ooms.into()),
    ]
}

pub fn device(f: &DeviceFramework) -> J {
    J::O(vec![
        ("frameworks", f.frameworks.as_str().into()),
        ("processes", f.processes.into()),
        ("peak_allocated_bytes", f.peak_allocated.into()),
        ("peak_allocated_time_ns", f.peak_allocated_time_ns.into()),
        ("peak_reserved_bytes", f.peak_reserved.into()),
        ("alloc_retries", f.alloc_retries.into()),
        ("num_ooms", f.ooms.into()),
        (
            "allocated_leak",
            f.leak
                .as_ref()
                .map_or(J::Null, |l| super::trends::leak(l, false)),
        ),
        (
            "kept_lines",
            f.kept.as_ref().map_or(J::Null, |k| {
                J::O(vec![
                    ("snapshot", k.path.as_str().into()),
                    (
                        "lines",
                        J::A(
                            k.kept
                                .iter()
                                .map(|l| {
                                    J::O(vec![
                                        ("label", l.label.as_str().into()),
                                        ("bytes", l.bytes.into()),
                                        ("count", l.count.into()),
                                        ("during_rise_bytes", l.during_rise_bytes.into()),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                ])
            }),
        ),
        ("allocated_timeline_bucket_ns", f.allocated.bucket_ns.into()),
        ("allocated_timeline", timeline(&f.allocated)),
        ("reserved_timeline_bucket_ns", f.reserved.bucket_ns.into()),
        ("reserved_timeline", timeline(&f.reserved)),
    ])
}

pub fn process(v: &[ProcessFramework]) -> J {
    J::A(
        v.iter()
            .map(|p| {
                let mut m = vec![
                    ("framework", p.framework.name().into()),
                    ("device", p.device.into()),
                    ("samples", p.samples.into()),
                    ("last_time_ns", p.last_time_ns.into()),
                    ("peak_allocated_bytes", p.peak_allocated.into()),
                    ("peak_reserved_bytes", p.peak_reserved.into()),
                ];
                m.push(("last", J::O(figures(&p.last))));
                J::O(m)
            })
            .collect(),
    )
}

pub fn bridge(a: &Analysis) -> J {
    let b = &a.bridge;
    let (held, tensors) = crate::reporters::text::framework::cache_at_end(a);
    J::O(vec![
        (
            "attached",
            J::A(
                b.attached
                    .iter()
                    .map(|p| {
                        J::O(vec![
                            ("pid", p.pid.into()),
                            ("framework", p.framework.name().into()),
                            ("version", p.framework_version.as_deref().into()),
                            ("python", p.python.as_deref().into()),
                            ("backend", p.backend.as_deref().into()),
                            ("alloc_conf", p.alloc_conf.as_deref().into()),
                            ("sample_ms", p.sample_ms.into()),
                            ("history_entries", p.history_entries.into()),
                            (
                                "problems",
                                J::A(p.problems.iter().map(|x| x.as_str().into()).collect()),
                            ),
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "messages",
            J::A(
                b.notes
                    .iter()
                    .map(|(pid, t, text)| {
                        J::O(vec![
                            ("pid", (*pid).into()),
                            ("time_ns", (*t).into()),
                            ("text", text.as_str().into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "history",
            J::A(
                b.history
                    .iter()
                    .map(|h| {
                        J::O(vec![
                            ("pid", h.pid.into()),
                            ("device", h.device.into()),
                            ("time_ns", h.time_ns.into()),
                            ("state", if h.armed { "armed" } else { "disarmed" }.into()),
                            ("reason", h.reason.as_str().into()),
                            ("entries", h.entries.into()),
                            ("allocated_bytes", h.allocated.into()),
                            ("limit_bytes", h.limit.into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("samples", b.samples.into()),
        ("cache_at_end_bytes", held.into()),
        ("cache_at_end_tensor_bytes", tensors.into()),
    ])
}
