//! The Rust half of bridge/schema.json: each bridge kind's JSON object as a type. A test below holds these types
//! equal to the file, key for key and type for type, as the bridge's tests hold every record it makes; adding a
//! key is a field here and a line there, and the compiler then points at nothing until a reader uses it.
//!
//! The process wrote these objects, so nothing in one is trusted: a value of the wrong type reads as absent
//! (that key only, not the record), an unknown key (a newer bridge's) is skipped, and the readers in
//! [`super`] bound what they keep. A count or a flag written as text (`"123"`, `"1"`) reads as its number or
//! its truth: that is how records before the typed wire said them (format's `codec/bridge_pairs.rs`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// `count` in the schema: an integer of at least 0; absent when missing or not one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count(pub Option<u64>);

/// `text` in the schema: a string (a number or a truth value said as its text); absent when missing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Text(pub Option<String>);

/// `flag` in the schema: true or false (`1` or `"1"`, `"true"` in any case, for true); absent when missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flag(pub Option<bool>);

impl Count {
    pub fn get(self) -> Option<u64> {
        self.0
    }
    pub fn or0(self) -> u64 {
        self.0.unwrap_or(0)
    }
}

impl Text {
    /// The text, empty when absent.
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
    /// The text when present and not empty.
    pub fn some(&self) -> Option<String> {
        self.0.clone().filter(|t| !t.is_empty())
    }
}

impl Flag {
    pub fn get(self) -> Option<bool> {
        self.0
    }
    /// Set: present and true.
    pub fn set(self) -> bool {
        self.0 == Some(true)
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Count(match Value::deserialize(d)? {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }))
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Text(match Value::deserialize(d)? {
            Value::String(s) => Some(s),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }))
    }
}

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Flag(match Value::deserialize(d)? {
            Value::Bool(b) => Some(b),
            Value::Number(n) => Some(n.as_u64() == Some(1)),
            Value::String(s) => {
                let s = s.trim();
                Some(s == "1" || s.eq_ignore_ascii_case("true"))
            }
            _ => None,
        }))
    }
}

/// A list of `T`: absent, or not a list, reads as empty; an element that is not a `T` is skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T> Default for List<T> {
    fn default() -> Self {
        List(Vec::new())
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(List(match Value::deserialize(d)? {
            Value::Array(a) => a.into_iter().filter_map(from_json).collect(),
            _ => Vec::new(),
        }))
    }
}

// Serialized only by the schema's test: each type as the schema names it, from a value of that type.
impl Serialize for Count {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}
impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}
impl Serialize for Flag {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}
impl<T: Serialize> Serialize for List<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Declares each kind's object once: its fields are the schema's keys, its field types the schema's types.
macro_rules! docs {
    ($($(#[$doc:meta])* $name:ident { $($(#[$fmeta:meta])* $f:ident: $t:ty,)* })*) => {
        $(
            $(#[$doc])*
            #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
            #[serde(default)]
            pub struct $name {
                $($(#[$fmeta])* pub $f: $t,)*
            }
        )*
    };
}

docs! {
    /// `attach`: the bridge loaded in a process.
    Attach {
        bridge: Text,
        torch: Text,
        python: Text,
        backend: Text,
        alloc_conf: Text,
        sample_ms: Count,
        history_entries: Count,
        history_mode: Text,
        devices: Count,
        /// What the bridge could not do there.
        problems: List<String>,
    }
    /// `history`: PyTorch's allocation history armed or disarmed.
    History {
        state: Text,
        reason: Text,
        entries: Count,
        allocated: Count,
        reserved: Count,
        limit: Count,
        t_ns: Count,
    }
    /// `oom`: a framework's out-of-memory error (PyTorch's observer, or JAX's).
    Oom {
        framework: Text,
        error: Text,
        requested: Count,
        allowed_or_total: Count,
        device_free: Count,
        allocated: Count,
        reserved: Count,
        active: Count,
        inactive_split: Count,
        requested_current: Count,
        alloc_retries: Count,
        ooms: Count,
        backend: Text,
        alloc_conf: Text,
        expandable_segments: Text,
        garbage_collection_threshold: Text,
        /// PyTorch says "unlimited" as SIZE_MAX (or -1, which reads as absent).
        max_split_size: Count,
        oversize_allocations: Count,
        thread: Text,
        allocated_peak: Count,
        reserved_peak: Count,
        segments: Count,
        /// JAX's bridge sent its allocator's own name until 2026-11-28.
        #[serde(alias = "largest_free_block_bytes")]
        largest_free_block: Count,
        free_in_live_segments: Count,
        segments_expandable: Flag,
        segments_error: Text,
        snapshot: Text,
        bytes_in_use: Count,
        peak_bytes_in_use: Count,
        bytes_reserved: Count,
        bytes_limit: Count,
        num_allocs: Count,
        largest_alloc_size: Count,
    }
    /// `exit`: the process's last figures.
    Exit {
        framework: Text,
        allocated: Count,
        reserved: Count,
        alloc_retries: Count,
        ooms: Count,
        allocated_peak: Count,
        reserved_peak: Count,
        bytes_in_use: Count,
        peak_bytes_in_use: Count,
        bytes_reserved: Count,
        bytes_limit: Count,
        largest_free_block: Count,
        num_allocs: Count,
        largest_alloc_size: Count,
    }
    /// `snapshot`: a snapshot of PyTorch's history kept beside the trace.
    Snapshot {
        at: Text,
        path: Text,
    }
    /// `steps`: the program's iteration counters, and the allocator's reading at the boundary.
    Steps {
        optimizer: Count,
        batches: Count,
        scopes: Count,
        t_ns: Count,
        device: Count,
        allocated: Count,
        allocated_peak: Count,
        reserved_peak: Count,
    }
    /// `peak`: the allocator's peak counters rose.
    Peak {
        allocated_peak: Count,
        reserved_peak: Count,
    }
    /// `holders`: the bridge's walk of what held the tensors.
    Holders {
        at: Text,
        oom: Count,
        elapsed_ms: Count,
        objects: Count,
        tensors: Count,
        tensor_bytes: Count,
        partial: Flag,
        partial_reason: Text,
        holders: List<Holder>,
    }
    /// One holder of a walk.
    Holder {
        kind: Text,
        name: Text,
        scope: Text,
        what: Text,
        tensors: Count,
        bytes: Count,
        nodes: Count,
        batches: Count,
        lib: Flag,
    }
    /// `note`: something the bridge wants said once.
    Note {
        text: Text,
    }
    /// `stopped`: the bridge stopped the program after its steps.
    Stopped {
        counter: Text,
        steps: Count,
    }
}

/// Reads `doc` as a `T`; a body that is no JSON object reads as one with no keys.
pub fn read<T: DeserializeOwned + Default>(doc: &str) -> T {
    serde_json::from_str(doc)
        .ok()
        .and_then(from_json)
        .unwrap_or_default()
}

/// `v` as a `T`: a kind's object, or a list's element. A struct is read from an object only (serde would also
/// take a list of its fields in order: `[1, 2]` is no record); a string or number as itself.
fn from_json<T: DeserializeOwned>(v: Value) -> Option<T> {
    match v {
        Value::Array(_) | Value::Null => None,
        v => serde_json::from_value(v).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map};
    use vramtrace_format::keys::bridge::Kind;

    const SCHEMA: &str = include_str!("../../../../../bridge/schema.json");

    /// A value of each schema type.
    fn example(ty: &Value) -> Value {
        match ty {
            Value::String(t) if t == "count" => json!(7),
            Value::String(t) if t == "flag" => json!(true),
            Value::String(t) if t == "text" => json!("x"),
            Value::Array(a) if a.len() == 1 => json!([example(&a[0])]),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, t)| (k.clone(), example(t)))
                    .collect::<Map<_, _>>(),
            ),
            _ => panic!("the schema names no such type: {ty}"),
        }
    }

    /// `example` read as `T` and written back: only what `T` declares, of the type it declares, survives.
    fn round_trip<T: Serialize + DeserializeOwned + Default>(v: &Value) -> Value {
        serde_json::to_value(read::<T>(&v.to_string())).unwrap()
    }

    /// Every kind's keys and types here are bridge/schema.json's, no more and no fewer: a key of each type read
    /// and written back comes back as it went, and the type's own keys are the schema's.
    #[test]
    fn the_types_are_the_schemas() {
        let schema: Value = serde_json::from_str(SCHEMA).unwrap();
        let kinds = schema["kinds"].as_object().unwrap();
        let mut names: Vec<&str> = kinds.keys().map(String::as_str).collect();
        let mut ours: Vec<&str> = Kind::ALL.iter().map(|k| k.what()).collect();
        names.sort_unstable();
        ours.sort_unstable();
        assert_eq!(names, ours, "the kinds");
        for kind in Kind::ALL {
            let full = example(&kinds[kind.what()]);
            let (back, empty) = match kind {
                Kind::Attach => (round_trip::<Attach>(&full), json!(Attach::default())),
                Kind::History => (round_trip::<History>(&full), json!(History::default())),
                Kind::Oom => (round_trip::<Oom>(&full), json!(Oom::default())),
                Kind::Exit => (round_trip::<Exit>(&full), json!(Exit::default())),
                Kind::Snapshot => (round_trip::<Snapshot>(&full), json!(Snapshot::default())),
                Kind::Steps => (round_trip::<Steps>(&full), json!(Steps::default())),
                Kind::Peak => (round_trip::<Peak>(&full), json!(Peak::default())),
                Kind::Holders => (round_trip::<Holders>(&full), json!(Holders::default())),
                Kind::Note => (round_trip::<Note>(&full), json!(Note::default())),
                Kind::Stopped => (round_trip::<Stopped>(&full), json!(Stopped::default())),
            };
            assert_eq!(
                back,
                full,
                "{} reads every key the schema declares",
                kind.what()
            );
            let ours: Vec<&String> = empty.as_object().unwrap().keys().collect();
            let theirs: Vec<&String> = full.as_object().unwrap().keys().collect();
            assert_eq!(
                ours,
                theirs,
                "{} declares only the schema's keys",
                kind.what()
            );
        }
        let holder = &kinds["holders"]["holders"][0];
        assert_eq!(round_trip::<Holder>(&example(holder)), example(holder));
        // Each value a reader compares is one the schema lists.
        use vramtrace_format::keys::bridge::{values, what};
        let listed = |key: &str, v: &str| {
            schema["values"][key]
                .as_array()
                .unwrap_or_else(|| panic!("values of {key}"))
                .iter()
                .any(|x| x == v)
        };
        assert!(listed("history.state", values::ARMED));
        assert!(listed("holders.at", values::AT_REQUEST));
        assert!(listed("holders.at", what::OOM));
        assert!(listed("holders.at", what::EXIT));
        assert!(listed("snapshot.at", what::EXIT));
        assert!(listed("oom.framework", values::JAX));
    }

    #[test]
    fn a_hostile_body_loses_only_what_is_wrong_in_it() {
        let h: Holders = read(
            r#"{"at":"oom","oom":-1,"tensors":1.5,"elapsed_ms":"12","partial":"1","objects":99999999999999999999,
                "holders":[{"kind":"graph","bytes":5},7,{"kind":["x"],"lib":1},null],"later":{"x":1}}"#,
        );
        assert_eq!(h.at.as_str(), "oom");
        assert_eq!(
            (h.oom.get(), h.tensors.get(), h.objects.get()),
            (None, None, None)
        );
        assert_eq!(h.elapsed_ms.get(), Some(12));
        assert!(h.partial.set());
        assert_eq!(
            h.holders.0.len(),
            2,
            "a list's elements that are no holder are skipped"
        );
        assert_eq!(
            (h.holders.0[0].kind.as_str(), h.holders.0[0].bytes.get()),
            ("graph", Some(5))
        );
        assert_eq!(
            (h.holders.0[1].kind.0.as_deref(), h.holders.0[1].lib.set()),
            (None, true)
        );
        for junk in ["", "[1,2]", "{", "null", "\"x\"", &"[".repeat(10_000)] {
            assert_eq!(read::<Holders>(junk), Holders::default(), "{junk:.20}");
        }
        let o: Oom = read(
            r#"{"largest_free_block_bytes":"9","max_split_size":-1,"expandable_segments":"True"}"#,
        );
        assert_eq!(
            (o.largest_free_block.get(), o.max_split_size.get()),
            (Some(9), None)
        );
        assert_eq!(o.expandable_segments.as_str(), "True");
    }
}
