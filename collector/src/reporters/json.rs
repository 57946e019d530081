//! The documented JSON report (docs/JSON-SCHEMA.md, schema version [`SCHEMA_VERSION`]). Written by hand: a
//! small value tree and a printer that escapes strings per RFC 8259. Sizes are integer bytes, times integer ns
//! relative to the trace start.

mod framework;
pub mod print;
pub mod trends;
use std::fmt::Write;

use crate::callsites::{Frame, Site};
use crate::model::{Analysis, DeviceStats, LiveAlloc, ProcessStats};

/// Bumped when a field changes meaning or goes away; new fields do not bump it.
pub const SCHEMA_VERSION: u64 = 1;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    U(u64),
    S(String),
    A(Vec<J>),
    O(Vec<(&'static str, J)>),
}

impl From<u64> for J {
    fn from(v: u64) -> J {
        J::U(v)
    }
}
impl From<u32> for J {
    fn from(v: u32) -> J {
        J::U(v as u64)
    }
}
impl From<bool> for J {
    fn from(v: bool) -> J {
        J::Bool(v)
    }
}
impl From<&str> for J {
    fn from(v: &str) -> J {
        J::S(v.to_string())
    }
}
impl From<String> for J {
    fn from(v: String) -> J {
        J::S(v)
    }
}
impl<T: Into<J>> From<Option<T>> for J {
    fn from(v: Option<T>) -> J {
        v.map_or(J::Null, Into::into)
    }
}

fn strings(v: &[String]) -> J {
    J::A(v.iter().map(|s| J::S(s.clone())).collect())
}

/// The report as pretty-printed JSON, ending with a newline.
pub fn render(a: &Analysis) -> String {
    let mut out = String::new();
    write_value(&mut out, &to_value(a), 0);
    out.push('\n');
    out
}

/// The report as a value tree.
pub fn to_value(a: &Analysis) -> J {
    let h = &a.header;
    let cs = a.call_sites.present;
    let mut top = vec![
        ("version", SCHEMA_VERSION.into()),
        (
            "trace",
            J::O(vec![
                ("command", strings(&h.command)),
                ("hostname", h.hostname.as_str().into()),
                ("start_unix_ns", h.start_unix_ns.into()),
                ("format_version", (a.format_version as u64).into()),
                ("vramtrace_version", h.vramtrace_version.as_str().into()),
            ]),
        ),
        ("partial", a.partial.into()),
        ("stopped", a.stopped.clone().into()),
        ("frames", a.frames.into()),
        ("unknown_frames", a.unknown_frames.into()),
        ("bad_frames", a.bad_frames.into()),
        ("events", a.events.into()),
        ("dropped_events", a.dropped_events.into()),
        ("merge_inexact_events", a.merge_inexact_events.into()),
        ("unmatched_frees", a.unmatched_frees.into()),
        ("lost_frees", a.lost_frees.into()),
        ("first_event_ns", a.first_ns.into()),
        ("end_ns", a.end_ns.into()),
        ("duration_ns", a.duration_ns.into()),
        ("live_at_end_count", a.live_at_end_count.into()),
        ("live_at_end_bytes", a.live_at_end_bytes.into()),
        ("oom_records", a.oom_records.into()),
        ("refusals_recovered", a.refusals_recovered.into()),
        ("refusal_stall_ns", a.refusal_stall_ns.into()),
        ("refusals", trends::refusals(a)),
        (
            "devices",
            J::A(a.devices.iter().map(|d| device(a, d)).collect()),
        ),
        ("processes", J::A(a.processes.iter().map(process).collect())),
        ("bridge", framework::bridge(a)),
        (
            "live_at_end",
            J::A(a.live_at_end.iter().map(|l| live(l, cs)).collect()),
        ),
    ];
    top.extend(call_site_fields(a));
    if cs {
        top.push((
            "call_sites_by_allocated",
            J::A(
                a.call_sites
                    .by_allocated
                    .iter()
                    .map(|&i| J::U(i as u64))
                    .collect(),
            ),
        ));
    }
    J::O(top)
}

/// The fields every output with call sites carries: `notes` (when the trace has any or has stacks),
/// `stacks`, `stacks_not_kept`, `call_sites` (when it has stacks). Nothing for a trace without either.
pub fn call_site_fields(a: &Analysis) -> Vec<(&'static str, J)> {
    let cs = &a.call_sites;
    let mut m = Vec::new();
    if !cs.present && cs.notes.is_empty() {
        return m;
    }
    m.push((
        "notes",
        J::A(
            cs.notes
                .iter()
                .map(|n| {
                    J::O(vec![
                        ("pid", n.pid.into()),
                        ("time_ns", n.time_ns.into()),
                        ("processes", n.processes.into()),
                        ("text", n.text.as_str().into()),
                    ])
                })
                .collect(),
        ),
    ));
    if cs.present {
        m.push(("stacks", cs.stacks.into()));
        m.push(("stacks_not_kept", cs.stacks_not_kept.into()));
        m.push((
            "call_sites",
            J::A(
                cs.sites
                    .iter()
                    .enumerate()
                    .map(|(i, s)| site(i, s, a.caching_allocator(s.pid)))
                    .collect(),
            ),
        ));
    }
    m
}

fn site(id: usize, s: &Site, cache: bool) -> J {
    J::O(vec![
        ("id", (id as u64).into()),
        ("pid", s.pid.into()),
        ("stack", s.stack.into()),
        ("label", s.label().into()),
        ("grew_cache", cache.into()),
        ("site_frame", s.site.map(|i| i as u64).into()),
        ("missing", s.missing.into()),
        ("allocations", s.allocations.into()),
        ("allocated_bytes", s.allocated_bytes.into()),
        ("live_bytes_at_end", s.live_bytes_at_end.into()),
        (
            "per_device",
            J::A(
                s.per_device
                    .iter()
                    .map(|d| {
                        J::O(vec![
                            ("device", d.device.into()),
                            ("allocations", d.allocations.into()),
                            ("allocated_bytes", d.allocated_bytes.into()),
                            ("peak_bytes", d.peak_bytes.into()),
                            ("live_bytes_at_end", d.live_bytes_at_end.into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("frames", J::A(s.frames.iter().map(frame).collect())),
    ])
}

/// One frame: `{kind, function, file, line, module, offset, address, inlined, note}`.
pub fn frame(f: &Frame) -> J {
    J::O(vec![
        ("kind", f.kind.key().into()),
        ("function", f.function.clone().into()),
        ("file", f.file.clone().into()),
        ("line", f.line.into()),
        ("module", f.module.clone().into()),
        ("offset", f.offset.into()),
        ("address", f.address.into()),
        ("inlined", f.inlined.into()),
        ("note", f.note.clone().into()),
    ])
}

fn device(a: &Analysis, d: &DeviceStats) -> J {
    let mut m = vec![
        ("device", d.device.into()),
        ("on_host", d.on_host.into()),
        // The trace's host: traces of several nodes merge (`report A B`), and a device is its host's.
        ("host", a.header.hostname.as_str().into()),
        ("peak_bytes", d.peak_bytes.into()),
        ("peak_time_ns", d.peak_time_ns.into()),
        ("live_bytes_at_end", d.live_bytes_at_end.into()),
        ("in_use_bytes_at_end", d.in_use_bytes_at_end.into()),
        ("allocations", d.allocations.into()),
        (
            "largest_allocation_bytes",
            d.largest_allocation_bytes.into(),
        ),
        ("driver_total_bytes", d.driver_total_bytes.into()),
        ("driver_free_bytes", d.driver_free_bytes.into()),
        ("total_bytes", d.total_bytes.into()),
        ("cap_bytes", d.cap_bytes.into()),
        ("headroom_bytes", d.headroom_bytes().into()),
        (
            "growth",
            d.growth
                .as_ref()
                .map_or(J::Null, |l| trends::leak(l, a.call_sites.present)),
        ),
        ("timeline_bucket_ns", d.timeline.bucket_ns.into()),
        ("timeline", timeline(&d.timeline)),
        (
            "framework",
            d.framework.as_ref().map_or(J::Null, framework::device),
        ),
    ];
    if a.call_sites.present {
        let v = match a.call_sites.at_peak_of(d.device, d.on_host) {
            Some(p) => J::O(vec![
                (
                    "sites",
                    J::A(
                        p.sites
                            .iter()
                            .map(|b| {
                                J::O(vec![
                                    ("call_site", (b.site as u64).into()),
                                    ("bytes", b.bytes.into()),
                                ])
                            })
                            .collect(),
                    ),
                ),
                ("unlisted_bytes", p.unlisted_bytes.into()),
                ("no_site_bytes", p.no_site_bytes.into()),
            ]),
            None => J::Null,
        };
        m.push(("call_sites_at_peak", v));
    }
    J::O(m)
}

/// A timeline's buckets: `t_ns`, `max_bytes`, `last_bytes` each.
pub fn timeline(tl: &crate::model::Timeline) -> J {
    J::A(
        tl.buckets
            .iter()
            .map(|b| {
                J::O(vec![
                    ("t_ns", b.t_ns.into()),
                    ("max_bytes", b.max_bytes.into()),
                    ("last_bytes", b.last_bytes.into()),
                ])
            })
            .collect(),
    )
}

fn process(p: &ProcessStats) -> J {
    let cut = match p.ended {
        crate::model::Ended::CutMidFrame { partial_bytes } => J::U(partial_bytes as u64),
        _ => J::Null,
    };
    J::O(vec![
        ("pid", p.pid.into()),
        ("announced", p.announced.into()),
        ("ppid", p.ppid.into()),
        ("cmdline", strings(&p.cmdline)),
        ("hostname", p.hostname.clone().into()),
        ("rank", p.rank.into()),
        ("local_rank", p.local_rank.into()),
        ("slurm_procid", p.slurm_procid.into()),
        ("start_ns", p.start_ns.into()),
        ("end_ns", p.end_ns.into()),
        ("ended", p.ended.key().into()),
        ("exit", exit_json(p.exit)),
        ("cut_bytes", cut),
        ("peak_bytes", p.peak_bytes.into()),
        ("peak_time_ns", p.peak_time_ns.into()),
        (
            "per_device",
            J::A(
                p.per_device
                    .iter()
                    .map(|d| {
                        J::O(vec![
                            ("device", d.device.into()),
                            ("on_host", d.on_host.into()),
                            ("peak_bytes", d.peak_bytes.into()),
                            ("live_bytes_at_end", d.live_bytes_at_end.into()),
                            ("allocations", d.allocations.into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("allocations", p.allocations.into()),
        ("frees", p.frees.into()),
        ("failed_allocations", p.failed_allocations.into()),
        ("oom_results", p.oom_results.into()),
        ("cap_refusals", p.cap_refusals.into()),
        ("unmatched_frees", p.unmatched_frees.into()),
        ("lost_frees", p.lost_frees.into()),
        (
            "largest_allocation_bytes",
            p.largest_allocation_bytes.into(),
        ),
        ("live_bytes_at_end", p.live_bytes_at_end.into()),
        ("live_allocations_at_end", p.live_allocations_at_end.into()),
        ("dropped_events", p.dropped_events.into()),
        (
            "lost",
            J::A(
                p.lost
                    .iter()
                    .map(|(cause, n)| {
                        J::O(vec![
                            ("cause", cause.name().into()),
                            ("records", (*n).into()),
                            ("why", cause.describe().into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("untraced", p.untraced.clone().into()),
        ("context_freed_bytes", p.context_freed_bytes.into()),
        (
            "address_reserved_peak_bytes",
            p.address_reserved_peak_bytes.into(),
        ),
        ("mapped_peak_bytes", p.mapped_peak_bytes.into()),
        ("python_bridge", p.python_bridge.into()),
        ("framework", framework::process(&p.framework)),
    ])
}

fn live(l: &LiveAlloc, call_sites: bool) -> J {
    let mut m = vec![
        ("pid", l.pid.into()),
        ("device", l.device.into()),
        ("on_host", l.on_host.into()),
        ("api", l.api.name().into()),
        ("ptsz", l.ptsz.into()),
        ("address", l.address.into()),
        ("bytes", l.bytes.into()),
        ("alloc_time_ns", l.alloc_time_ns.into()),
        ("age_ns", l.age_ns.into()),
    ];
    if call_sites {
        m.push(("call_site", l.site.map(|i| i as u64).into()));
    }
    J::O(m)
}

// ---- printing ----

fn is_scalar(v: &J) -> bool {
    !matches!(v, J::A(_) | J::O(_))
}

/// A scalar (null, a boolean, a number, a string); containers are left to the caller.
fn write_scalar(out: &mut String, v: &J) {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::U(n) => {
            let _ = write!(out, "{n}");
        }
        J::S(s) => write_str(out, s),
        J::A(_) | J::O(_) => {}
    }
}

/// JSON on one line, no spaces (the HTML export's data).
pub fn write_compact(out: &mut String, v: &J) {
    match v {
        J::A(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_compact(out, x);
            }
            out.push(']');
        }
        J::O(members) => {
            out.push('{');
            for (i, (k, x)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                write_compact(out, x);
            }
            out.push('}');
        }
        scalar => write_scalar(out, scalar),
    }
}

/// Containers holding only scalars go on one line; the rest one member per line, indented by two.
pub fn write_value(out: &mut String, v: &J, indent: usize) {
    match v {
        J::A(items) => {
            if items.is_empty() {
                out.push_str("[]");
            } else if items.iter().all(is_scalar) {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_value(out, x, indent);
                }
                out.push(']');
            } else {
                out.push_str("[\n");
                for (i, x) in items.iter().enumerate() {
                    pad(out, indent + 2);
                    write_value(out, x, indent + 2);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, indent);
                out.push(']');
            }
        }
        J::O(members) => {
            if members.is_empty() {
                out.push_str("{}");
            } else if members.iter().all(|(_, x)| is_scalar(x)) {
                out.push('{');
                for (i, (k, x)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_str(out, k);
                    out.push_str(": ");
                    write_value(out, x, indent);
                }
                out.push('}');
            } else {
                out.push_str("{\n");
                for (i, (k, x)) in members.iter().enumerate() {
                    pad(out, indent + 2);
                    write_str(out, k);
                    out.push_str(": ");
                    write_value(out, x, indent + 2);
                    out.push_str(if i + 1 < members.len() { ",\n" } else { "\n" });
                }
                pad(out, indent);
                out.push('}');
            }
        }
        scalar => write_scalar(out, scalar),
    }
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// A JSON string: quotes, backslashes and control characters escaped; everything else as UTF-8.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// How a process ended, from its wait status: `{"code": 7}`, `{"signal": 9, "name": "SIGKILL", "core_dumped":
/// false}`, or null when vramtrace did not reap it.
pub fn exit_json(e: Option<crate::model::ExitStatus>) -> J {
    match e {
        None => J::Null,
        Some(crate::model::ExitStatus::Code(c)) => J::O(vec![("code", J::U(c as u64))]),
        Some(crate::model::ExitStatus::Signal { signal, core }) => J::O(vec![
            ("signal", J::U(signal as u64)),
            ("name", vramtrace_format::signal_name(signal).into()),
            ("core_dumped", core.into()),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_layout() {
        let mut s = String::new();
        write_str(&mut s, "a\"b\\c\nd\u{1}é\u{2028}");
        assert_eq!(s, "\"a\\\"b\\\\c\\nd\\u0001é\u{2028}\"");
        let v = J::O(vec![
            ("a", J::A(vec![J::U(1), J::Null])),
            ("b", J::A(vec![J::O(vec![("x", J::Bool(true))])])),
            ("c", J::A(vec![])),
        ]);
        let mut s = String::new();
        write_value(&mut s, &v, 0);
        assert_eq!(
            s,
            "{\n  \"a\": [1, null],\n  \"b\": [\n    {\"x\": true}\n  ],\n  \"c\": []\n}"
        );
    }
}
