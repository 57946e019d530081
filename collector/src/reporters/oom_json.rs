//! The documented JSON of `vramtrace oom --json` (docs/JSON-SCHEMA.md, "`vramtrace oom --json`", schema version
//! [`OOM_SCHEMA_VERSION`]). Same conventions as the report's JSON: integer bytes, integer ns relative to the
//! trace start, `null` for "not known".

use crate::model::diagnose::{diagnose, Diagnosis, Finding};
use crate::model::{self, Analysis, OomSnapshot};
use crate::reporters::json::trends::{leak, refusals};
use crate::reporters::json::{call_site_fields, write_value, J};
use crate::reporters::oom_text::api_label;

/// Bumped when a field changes meaning or goes away; new fields do not bump it.
pub const OOM_SCHEMA_VERSION: u64 = 1;

/// The message when the trace holds no out-of-memory record.
pub const NO_OOM: &str = "no out-of-memory event was recorded";

/// Pretty-printed, ending with a newline.
pub fn render(a: &Analysis) -> String {
    let mut out = String::new();
    write_value(&mut out, &to_value(a), 0);
    out.push('\n');
    out
}

fn strings(v: &[String]) -> J {
    J::A(v.iter().map(|s| J::S(s.clone())).collect())
}

pub fn to_value(a: &Analysis) -> J {
    let h = &a.header;
    let oom_results: u64 = a.processes.iter().map(|p| p.oom_results).sum();
    let mut top = vec![
        ("version", OOM_SCHEMA_VERSION.into()),
        ("kind", "oom".into()),
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
        ("end_ns", a.end_ns.into()),
        ("oom_recorded", (a.oom_records > 0).into()),
        (
            "message",
            if a.oom_records == 0 {
                J::S(NO_OOM.to_string())
            } else {
                J::Null
            },
        ),
        ("oom_records", a.oom_records.into()),
        ("refusals_recovered", a.refusals_recovered.into()),
        ("refusal_stall_ns", a.refusal_stall_ns.into()),
        ("refusals", refusals(a)),
        ("oom_not_analysed", a.ooms_not_snapshotted().into()),
        ("oom_results", oom_results.into()),
        (
            "ooms",
            J::A(a.ooms.iter().map(|s| oom(a, s, &diagnose(a, s))).collect()),
        ),
        (
            "processes",
            J::A(
                a.processes
                    .iter()
                    .map(|p| {
                        let cut = match p.ended {
                            model::Ended::CutMidFrame { partial_bytes } => {
                                J::U(partial_bytes as u64)
                            }
                            _ => J::Null,
                        };
                        J::O(vec![
                            ("pid", p.pid.into()),
                            ("rank", p.rank.into()),
                            ("cmdline", strings(&p.cmdline)),
                            ("ended", p.ended.key().into()),
                            ("exit", crate::reporters::json::exit_json(p.exit)),
                            ("end_ns", p.end_ns.into()),
                            ("cut_bytes", cut),
                            ("peak_bytes", p.peak_bytes.into()),
                            ("live_at_end_bytes", p.live_bytes_at_end.into()),
                            (
                                "live_at_end",
                                J::A(
                                    p.per_device
                                        .iter()
                                        .filter(|d| d.live_bytes_at_end > 0)
                                        .map(|d| {
                                            J::O(vec![
                                                ("device", d.device.into()),
                                                ("on_host", d.on_host.into()),
                                                ("bytes", d.live_bytes_at_end.into()),
                                            ])
                                        })
                                        .collect(),
                                ),
                            ),
                            ("oom_results", p.oom_results.into()),
                            ("cap_refusals", p.cap_refusals.into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "devices",
            J::A(
                a.devices
                    .iter()
                    .map(|d| {
                        J::O(vec![
                            ("device", d.device.into()),
                            ("on_host", d.on_host.into()),
                            ("peak_bytes", d.peak_bytes.into()),
                            ("peak_time_ns", d.peak_time_ns.into()),
                            ("total_bytes", d.total_bytes.into()),
                            ("cap_bytes", d.cap_bytes.into()),
                            ("limit_bytes", d.limit_bytes().into()),
                            ("headroom_bytes", d.headroom_bytes().into()),
                            ("live_bytes_at_end", d.live_bytes_at_end.into()),
                            (
                                "leak_trend",
                                d.growth
                                    .as_ref()
                                    .map_or(J::Null, |l| leak(l, a.call_sites.present)),
                            ),
                        ])
                    })
                    .collect(),
            ),
        ),
    ];
    top.extend(call_site_fields(a));
    J::O(top)
}

fn finding(f: &Finding, call_sites: bool) -> J {
    let mut m: Vec<(&'static str, J)> = vec![("kind", f.key().into()), ("text", f.text().into())];
    match f {
        Finding::Fit {
            needed_bytes,
            available_bytes,
            short_bytes,
            limited_by,
        } => {
            m.push(("needed_bytes", (*needed_bytes).into()));
            m.push(("available_bytes", (*available_bytes).into()));
            m.push(("short_bytes", (*short_bytes).into()));
            m.push(("limited_by", (*limited_by).into()));
        }
        Finding::LeakTrend(l) => {
            if let J::O(fields) = leak(l, call_sites) {
                m.extend(fields);
            }
        }
        Finding::PoolCache {
            freed_bytes,
            shortfall_bytes,
        } => {
            m.push(("freed_bytes", (*freed_bytes).into()));
            m.push(("shortfall_bytes", (*shortfall_bytes).into()));
        }
        Finding::LedgerDiffers {
            ledger_bytes,
            trace_bytes,
        } => {
            m.push(("ledger_bytes", (*ledger_bytes).into()));
            m.push(("trace_bytes", (*trace_bytes).into()));
        }
        Finding::DroppedEvents { count } => m.push(("count", (*count).into())),
        Finding::NoDriverFigures => {}
        Finding::FrameworkFigures {
            allocated_bytes,
            reserved_bytes,
            inactive_split_bytes,
            largest_free_block_bytes,
            free_in_live_segments_bytes,
            alloc_retries,
            settings,
        } => {
            m.push(("allocated_bytes", (*allocated_bytes).into()));
            m.push(("reserved_bytes", (*reserved_bytes).into()));
            m.push(("inactive_split_bytes", (*inactive_split_bytes).into()));
            m.push((
                "largest_free_block_bytes",
                (*largest_free_block_bytes).into(),
            ));
            m.push((
                "free_in_live_segments_bytes",
                (*free_in_live_segments_bytes).into(),
            ));
            m.push(("alloc_retries", (*alloc_retries).into()));
            m.push(("settings", settings.as_str().into()));
        }
        Finding::AllocatedLeakTrend(l) => {
            if let J::O(fields) = leak(l, false) {
                m.extend(fields);
            }
        }
        Finding::AllocRetries { count } => m.push(("count", (*count).into())),
        Finding::BackwardThread { thread } => m.push(("thread", thread.as_str().into())),
    }
    J::O(m)
}

/// The framework's own record of the error (`null` without the Python bridge).
fn framework_oom(s: &OomSnapshot) -> J {
    let Some(o) = &s.framework else {
        return match s.framework_figures {
            Some(f) => J::O(vec![
                ("source", "sample".into()),
                ("allocated_bytes", f.allocated.into()),
                ("reserved_bytes", f.reserved.into()),
                ("inactive_split_bytes", f.inactive_split.into()),
                ("alloc_retries", f.alloc_retries.into()),
            ]),
            None => J::Null,
        };
    };
    let f = o.figures;
    let mut m = vec![
        ("source", "observer".into()),
        ("framework", o.framework.name().into()),
        ("thread", o.thread.as_deref().into()),
        ("requested_bytes", o.requested_bytes.into()),
        ("allowed_or_total_bytes", o.allowed_or_total_bytes.into()),
        ("device_free_bytes", o.device_free_bytes.into()),
        ("allocated_bytes", f.allocated.into()),
        ("reserved_bytes", f.reserved.into()),
        ("active_bytes", f.active.into()),
        ("inactive_split_bytes", f.inactive_split.into()),
        ("requested_current_bytes", f.requested.into()),
        ("alloc_retries", f.alloc_retries.into()),
        ("num_ooms", f.ooms.into()),
        ("backend", o.backend.as_deref().into()),
        ("alloc_conf", o.alloc_conf.as_deref().into()),
        ("expandable_segments", o.expandable_segments.into()),
        ("max_split_size_bytes", o.max_split_size.into()),
        ("segments", o.segments.into()),
        ("largest_free_block_bytes", o.largest_free_block.into()),
        (
            "free_in_live_segments_bytes",
            o.free_in_live_segments.into(),
        ),
        ("snapshot", o.snapshot_path.as_deref().into()),
    ];
    if let Some(r) = &o.snapshot {
        m.push((
            "kept",
            J::A(
                r.kept
                    .iter()
                    .map(|k| {
                        J::O(vec![
                            ("label", k.label.as_str().into()),
                            ("bytes", k.bytes.into()),
                            ("count", k.count.into()),
                            ("during_rise_bytes", k.during_rise_bytes.into()),
                        ])
                    })
                    .collect(),
            ),
        ));
        m.push(("snapshot_error", r.error.as_deref().into()));
    }
    J::O(m)
}

fn oom(a: &Analysis, s: &OomSnapshot, d: &Diagnosis) -> J {
    let cs = a.call_sites.present;
    let mut m = vec![
        ("time_ns", s.time_ns.into()),
        ("pid", s.pid.into()),
        ("tid", s.tid.into()),
        ("device", s.device.into()),
        ("on_host", s.on_host.into()),
        ("api", api_label(s.api, s.api_code, false).into()),
        ("ptsz", s.ptsz.into()),
        ("cap_refused", s.cap_refused.into()),
        ("requested_bytes", s.requested_bytes.into()),
        ("result", s.result.into()),
    ];
    if cs {
        // The failing request's own call site (an index into `call_sites`, and its one-line label).
        m.push(("request_call_site", s.request_site.map(|i| i as u64).into()));
        m.push((
            "request_site",
            s.request_site
                .and_then(|i| a.call_sites.sites.get(i))
                .map(|x| x.label())
                .into(),
        ));
    }
    m.push(("view", d.view.into()));
    m.push(("framework", framework_oom(s)));
    m.push(("driver_ooms_folded", s.driver_ooms_folded.into()));
    m.extend([
        ("cause", d.cause.key().into()),
        ("cause_rule", d.rule.into()),
        ("cause_reason", d.reason.as_str().into()),
        (
            "growth",
            d.growth
                .as_ref()
                .map_or(J::Null, |l| leak(l, a.call_sites.present)),
        ),
        (
            "growth_line",
            d.growth_line.as_ref().map_or(J::Null, |g| {
                J::O(vec![
                    ("label", g.label.as_str().into()),
                    ("source", g.source.into()),
                    ("kind", g.kind.key().into()),
                    ("bytes", g.bytes.into()),
                    ("count", g.count.into()),
                    ("during_rise", g.during_rise.into()),
                ])
            }),
        ),
        ("device_free_bytes", s.device_free_bytes.into()),
        ("device_total_bytes", s.device_total_bytes.into()),
        ("cap_bytes", d.cap_bytes.into()),
        ("job_live_bytes", d.job_live_bytes.into()),
        ("job_live_source", d.job_live_source.into()),
        ("job_live_trace_bytes", s.job_live_trace_bytes.into()),
        ("ledger_job_bytes", s.ledger_job_bytes.into()),
        ("ledger_process_bytes", s.ledger_process_bytes.into()),
        ("shortfall_bytes", d.shortfall_bytes.into()),
        ("outside_job_bytes", d.outside_job_bytes.into()),
        ("context_estimate_bytes", d.context_estimate_bytes.into()),
        ("outside_excess_bytes", d.outside_excess_bytes.into()),
        ("job_processes_on_device", s.job_processes_on_device.into()),
        (
            "async_freed_recent_bytes",
            s.async_freed_recent_bytes.into(),
        ),
        ("job_peak_bytes", s.job_peak_bytes.into()),
        ("job_peak_time_ns", s.job_peak_time_ns.into()),
        ("needed_bytes", d.needed_bytes.into()),
        ("available_bytes", d.available_bytes.into()),
        ("short_of_fitting_bytes", d.short_of_fitting_bytes.into()),
        ("suggested_cap_bytes", d.suggested_cap_bytes.into()),
        ("dropped_events", s.dropped_events.into()),
        ("live_count", s.live_count.into()),
        (
            "processes",
            J::A(
                s.processes
                    .iter()
                    .map(|p| {
                        J::O(vec![
                            ("pid", p.pid.into()),
                            ("rank", p.rank.into()),
                            ("cmdline", strings(&p.cmdline)),
                            ("device_live_bytes", p.device_live_bytes.into()),
                            ("on_device", p.on_device.into()),
                            (
                                "live",
                                J::A(
                                    p.per_device
                                        .iter()
                                        .map(|(dv, b)| {
                                            J::O(vec![
                                                ("device", (*dv).into()),
                                                ("bytes", (*b).into()),
                                            ])
                                        })
                                        .collect(),
                                ),
                            ),
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "top_live",
            J::A(
                s.top_live
                    .iter()
                    .map(|l| {
                        let mut m = vec![
                            ("pid", l.pid.into()),
                            ("tid", l.tid.into()),
                            ("device", l.device.into()),
                            ("api", l.api.name().into()),
                            ("ptsz", l.ptsz.into()),
                            ("address", l.address.into()),
                            ("bytes", l.bytes.into()),
                            ("alloc_time_ns", l.alloc_time_ns.into()),
                            ("age_ns", l.age_ns.into()),
                        ];
                        if cs {
                            m.push(("call_site", l.site.map(|i| i as u64).into()));
                            m.push((
                                "site",
                                l.site
                                    .and_then(|i| a.call_sites.sites.get(i))
                                    .map(|x| x.label())
                                    .into(),
                            ));
                        }
                        J::O(m)
                    })
                    .collect(),
            ),
        ),
        (
            "size_classes",
            J::A(
                s.size_classes
                    .iter()
                    .map(|c| {
                        J::O(vec![
                            ("label", c.label.into()),
                            ("min_bytes", c.min_bytes.into()),
                            ("max_bytes", c.max_bytes.into()),
                            ("count", c.count.into()),
                            ("bytes", c.bytes.into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("timeline_bucket_ns", s.timeline.bucket_ns.into()),
        ("timeline", crate::reporters::json::timeline(&s.timeline)),
        (
            "findings",
            J::A(d.findings.iter().map(|f| finding(f, cs)).collect()),
        ),
        (
            "advice",
            J::A(d.advice.iter().map(|x| J::S(x.clone())).collect()),
        ),
    ]);
    if cs {
        m.push((
            "live_by_call_site",
            J::A(
                s.by_site
                    .iter()
                    .map(|b| {
                        J::O(vec![
                            ("call_site", (b.site as u64).into()),
                            ("count", b.count.into()),
                            ("bytes", b.bytes.into()),
                        ])
                    })
                    .collect(),
            ),
        ));
        m.push((
            "live_by_call_site_unlisted_bytes",
            s.by_site_unlisted_bytes.into(),
        ));
        m.push(("live_no_site_bytes", s.no_site_bytes.into()));
    }
    J::O(m)
}
