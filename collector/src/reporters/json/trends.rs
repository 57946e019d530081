//! The JSON of what both `report --json` and `oom --json` show: the refusals a program recovered from, and a
//! growth's trend (docs/JSON-SCHEMA.md).

use super::J;
use crate::model::{Analysis, LeakTrend};

/// The refusals a program recovered from (docs/JSON-SCHEMA.md, "Refusals").
pub fn refusals(a: &Analysis) -> J {
    J::A(
        a.refusals
            .iter()
            .map(|r| {
                J::O(vec![
                    ("time_ns", r.time_ns.into()),
                    ("pid", (r.pid as u64).into()),
                    ("tid", (r.tid as u64).into()),
                    ("device", r.device.into()),
                    ("api", r.api.map(|x| x.name()).into()),
                    ("requested_bytes", r.requested_bytes.into()),
                    ("cap_refused", r.cap_refused.into()),
                    ("recovered_after_ns", r.recovered_after_ns.into()),
                    ("call_site", r.site.map(|x| x as u64).into()),
                ])
            })
            .collect(),
    )
}

/// A growth's trend; `call_sites`: the trace has stacks (the trend's `sites` are listed).
pub fn leak(l: &LeakTrend, call_sites: bool) -> J {
    let mut m = vec![
        (
            "minima",
            J::A(
                l.minima
                    .iter()
                    .map(|m| J::O(vec![("t_ns", m.t_ns.into()), ("bytes", m.bytes.into())]))
                    .collect(),
            ),
        ),
        ("rise_bytes", l.rise_bytes.into()),
        ("steps", l.steps.into()),
        (
            "groups",
            J::A(
                l.groups
                    .iter()
                    .map(|g| {
                        J::O(vec![
                            ("api", g.api.name().into()),
                            ("bytes_each", g.bytes_each.into()),
                            ("count", g.count.into()),
                            ("bytes", g.bytes.into()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("more_groups", l.more_groups.into()),
    ];
    if call_sites {
        m.push((
            "sites",
            J::A(
                l.sites
                    .iter()
                    .map(|g| {
                        J::O(vec![
                            ("call_site", (g.site as u64).into()),
                            ("label", g.label.as_str().into()),
                            ("count", g.count.into()),
                            ("bytes", g.bytes.into()),
                        ])
                    })
                    .collect(),
            ),
        ));
        m.push(("more_sites", l.more_sites.into()));
    }
    J::O(m)
}
