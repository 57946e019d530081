//! A `holders` record read into [`Holders`]: the walk's moment, and its holders cleaned and bounded (a kind this
//! build does not know skipped, a forged size not shown), largest first.

use vramtrace_format::keys::bridge::{values, what};
use vramtrace_format::{Bridge, NO_DEVICE};

use super::doc;
use crate::model::analysis::holders::{Holder, HolderKind, Holders, WalkAt, MAX_HOLDERS};

/// The most bytes a holder's figure may say (1 PiB): more is no GPU's.
pub const MAX_HOLDER_BYTES: u64 = 1 << 50;

impl Holders {
    /// Reads a `holders` record at relative time `t`; `None` when it says nothing usable.
    pub fn from_bridge(b: &Bridge, t: u64) -> Option<Holders> {
        let walk: doc::Holders = doc::read(&b.doc);
        let at = match walk.at.0.as_deref()? {
            what::OOM => WalkAt::Oom(walk.oom.or0()),
            what::EXIT => WalkAt::Exit,
            values::AT_REQUEST => WalkAt::Request,
            _ => return None,
        };
        let clean = |s: &doc::Text| {
            s.as_str()
                .chars()
                .filter(|&c| !crate::names::units::unsafe_char(c))
                .take(200)
                .collect::<String>()
        };
        let mut holders = Vec::new();
        for h in walk.holders.0.iter().take(MAX_HOLDERS) {
            // A kind this build does not know (a newer bridge's) is not shown.
            let Some(kind) = h.kind.0.as_deref().and_then(HolderKind::parse) else {
                continue;
            };
            // No GPU holds a petabyte: a figure past it is a process's forgery, and the holder is not shown.
            if h.bytes.get().is_some_and(|b| b > MAX_HOLDER_BYTES) {
                continue;
            }
            holders.push(Holder {
                kind,
                name: clean(&h.name),
                scope: clean(&h.scope),
                what: clean(&h.what),
                tensors: h.tensors.or0(),
                bytes: h.bytes.or0(),
                nodes: h.nodes.get(),
                batches: h.batches.get().filter(|&x| x > 1),
                library: h.lib.set(),
            });
        }
        holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
        Some(Holders {
            pid: b.pid,
            device: (b.device != NO_DEVICE).then_some(b.device),
            time_ns: t,
            at,
            elapsed_ms: walk.elapsed_ms.or0(),
            objects: walk.objects.or0(),
            tensors: walk.tensors.or0(),
            tensor_bytes: walk
                .tensor_bytes
                .get()
                .filter(|&x| x <= MAX_HOLDER_BYTES)
                .unwrap_or(0),
            partial: walk.partial.set().then(|| match walk.partial_reason.0 {
                Some(_) => clean(&walk.partial_reason),
                None => "its time bound".to_string(),
            }),
            holders,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `holders` record of device 0, from the flattened pairs of the bridges before the typed wire.
    fn rec(fields: &[(&str, &str)]) -> Bridge {
        crate::model::analysis::bridge::record(5, "holders", 0, fields)
    }

    #[test]
    fn a_record_reads_into_holders_largest_first() {
        let h = Holders::from_bridge(
            &rec(&[
                ("at", "oom"),
                ("oom", "2"),
                ("tensors", "60"),
                ("tensor_bytes", "5000"),
                ("h.0.kind", "parameters"),
                ("h.0.name", "model"),
                ("h.0.bytes", "1000"),
                ("h.1.kind", "variable"),
                ("h.1.name", "kept"),
                ("h.1.scope", "global of __main__"),
                ("h.1.what", "list"),
                ("h.1.tensors", "57"),
                ("h.1.bytes", "4000"),
                ("h.2.kind", "graph"),
                ("h.2.name", "total\u{202e}"),
                ("h.2.batches", "1"),
                ("h.3.kind", "nonsense"),
                ("h.4.kind", "variable"),
                ("h.4.name", "late"),
                ("h.4.bytes", "10"),
            ]),
            7,
        )
        .unwrap();
        assert_eq!(h.at, WalkAt::Oom(2));
        assert_eq!(h.device, Some(0));
        // A kind it does not know (a newer bridge's) is skipped; largest first.
        assert_eq!(h.holders.len(), 4);
        assert_eq!(h.holders[0].name, "kept");
        assert_eq!(h.holders[0].tensors, 57);
        assert_eq!(h.holders[1].kind, HolderKind::Parameters);
        assert_eq!(h.holders[2].name, "late");
        // Control characters (a right-to-left override) never reach a terminal; one batch is no span.
        assert_eq!(h.holders[3].name, "total");
        assert_eq!(h.holders[3].batches, None);
        assert_eq!(h.suspects().count(), 3);
        assert!(Holders::from_bridge(&rec(&[("at", "later")]), 0).is_none());
    }

    #[test]
    fn a_holder_of_a_forged_size_is_not_shown() {
        let h = Holders::from_bridge(
            &rec(&[
                ("at", "exit"),
                ("tensor_bytes", "18446744073709551615"),
                ("h.0.kind", "variable"),
                ("h.0.name", "huge"),
                ("h.0.bytes", "18446744073709551000"),
                ("h.1.kind", "variable"),
                ("h.1.name", "kept"),
                ("h.1.bytes", "4096"),
            ]),
            7,
        )
        .unwrap();
        let names: Vec<&str> = h.holders.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["kept"]);
        assert_eq!(h.tensor_bytes, 0);
    }
}
