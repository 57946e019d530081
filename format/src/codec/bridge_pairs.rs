//! Frame kind 13: the bridge's records as bridges before 2026-11-29 wrote them, their fields `key=value` text
//! pairs with nested data flattened into the keys (`h.3.kind`: holder 3's kind; `problem.2`). Read, no longer
//! written: each is read into today's [`Bridge`] (kind 21), its pairs into the one JSON object the schema
//! declares, so that every reader has one shape to read. The values stay text; the collector's reader takes a
//! count or a flag written as text as its number or its truth, as the old readers did.

use serde_json::{Map, Value};

use crate::codec::{bincode_from, DecodeError};
use crate::Bridge;

/// The body of a kind-13 frame, in its field order.
#[derive(bincode::Decode)]
struct BridgePairs {
    pid: u32,
    tid: u32,
    ts_ns: u64,
    what: String,
    device: u32,
    ack: bool,
    fields: Vec<(String, String)>,
}

/// The most holders a walk's flattened keys are read for (the bridge sent at most 16).
const MAX_HOLDERS: usize = 64;

/// Decodes a kind-13 payload into today's record.
pub(crate) fn decode(payload: &[u8]) -> Result<Bridge, DecodeError> {
    let b: BridgePairs = bincode_from(payload)?;
    let doc = Value::Object(nest(&b.fields)).to_string();
    Ok(Bridge {
        pid: b.pid,
        tid: b.tid,
        ts_ns: b.ts_ns,
        what: b.what,
        device: b.device,
        ack: b.ack,
        doc,
    })
}

/// The pairs as the object today's bridge sends: `problem.N` into the list `problems` (in the old readers'
/// order, their keys sorted as text), `h.N.key` into the list `holders` (holder N's `key`, from 0 up to the
/// first without a `kind`, where the old readers stopped), every other key as itself. A key said twice keeps
/// its first value, as the old readers' lookup did.
pub fn nest(fields: &[(String, String)]) -> Map<String, Value> {
    let mut doc = Map::new();
    let mut problems: Vec<(&str, &str)> = Vec::new();
    let mut holders: Vec<Map<String, Value>> = Vec::new();
    for (k, v) in fields {
        if k.starts_with("problem.") {
            problems.push((k, v));
        } else if let Some((i, key)) = k
            .strip_prefix("h.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(i, key)| Some((i.parse::<usize>().ok()?, key)))
        {
            if i < MAX_HOLDERS {
                if holders.len() <= i {
                    holders.resize_with(i + 1, Map::new);
                }
                holders[i]
                    .entry(key.to_string())
                    .or_insert_with(|| Value::String(v.clone()));
            }
        } else {
            doc.entry(k.clone())
                .or_insert_with(|| Value::String(v.clone()));
        }
    }
    if !problems.is_empty() {
        problems.sort();
        let list = problems
            .into_iter()
            .map(|(_, v)| Value::String(v.to_string()))
            .collect();
        doc.insert("problems".into(), Value::Array(list));
    }
    let walked: Vec<Value> = holders
        .into_iter()
        .take_while(|h| h.contains_key("kind"))
        .map(Value::Object)
        .collect();
    if !walked.is_empty() {
        doc.insert("holders".into(), Value::Array(walked));
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn flattened_keys_are_nested_as_the_schema_declares() {
        let doc = nest(&pairs(&[
            ("at", "oom"),
            ("h.1.kind", "graph"),
            ("h.0.kind", "variable"),
            ("h.0.bytes", "5"),
            ("h.0.bytes", "6"),
            ("h.3.kind", "cycle"), // after a gap: the old readers stopped at h.2
            ("problem.2", "b"),
            ("problem.10", "c"),
            ("problem.1", "a"),
            ("at", "exit"),
        ]));
        assert_eq!(
            Value::Object(doc),
            serde_json::json!({
                "at": "oom",
                "holders": [{"kind": "variable", "bytes": "5"}, {"kind": "graph"}],
                "problems": ["a", "c", "b"],
            })
        );
        assert!(nest(&[]).is_empty());
    }

    #[test]
    fn a_kind_13_frame_reads_as_todays_record() {
        let mut payload = Vec::new();
        crate::codec::bincode_to(
            &mut payload,
            &(
                7u32,
                8u32,
                9u64,
                "note".to_string(),
                crate::NO_DEVICE,
                true,
                pairs(&[("text", "hi")]),
            ),
        );
        let b = decode(&payload).unwrap();
        assert_eq!(
            (b.pid, b.tid, b.ts_ns, b.what.as_str(), b.ack),
            (7, 8, 9, "note", true)
        );
        assert_eq!(b.doc, r#"{"text":"hi"}"#);
        assert!(decode(&payload[..payload.len() - 1]).is_err());
    }
}
