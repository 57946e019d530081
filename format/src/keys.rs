//! The keys of the `extra` pairs in a trace's header and in a process's hello, defined once: the collector
//! writes the header's and reads both, the shim writes the hello's. Each constant's comment says what it means.

/// The header's keys.
pub mod header {
    /// `"1"`: the collector promises, with pid 0 ticks, that no process still to come has anything older.
    pub const NEWCOMER_TICKS: &str = "newcomer_ticks";
    /// `"1"`: a process's goodbye is written after everything of its ring.
    pub const GOODBYE_LAST: &str = "goodbye_last";
    /// `"1"`: the trace ends with an `End` record when the collector finished it.
    pub const END_RECORD: &str = "end_record";
    /// The job's name, and where it came from (`--job-name`, a scheduler's variable).
    pub const JOB: &str = "job";
    pub const JOB_SOURCE: &str = "job_source";
    /// The job's call-site settings as `run` gave them: the threshold in bytes (allocations below it record no
    /// call site) and which stacks (`none`, `native`, `python`, `all`).
    pub const STACK_MIN_BYTES: &str = "stack_min_bytes";
    pub const STACKS: &str = "stacks";
    /// `on` or `off`: whether the Python bridge was put on the job's path.
    pub const PYTHON_AGENT: &str = "python_agent";
    /// The cap's spec as given, and its mode (`enforce` or `warn`).
    pub const CAP: &str = "cap";
    pub const CAP_MODE: &str = "cap_mode";
    /// Per device (`cap_bytes.<ordinal>`): the cap in bytes.
    pub const CAP_BYTES: &str = "cap_bytes";
    /// Per device (`device_total.<ordinal>`): the device's memory in bytes.
    pub const DEVICE_TOTAL: &str = "device_total";

    /// A per-device key: `key.<device>`.
    pub fn per_device(key: &str, device: u32) -> String {
        format!("{key}.{device}")
    }

    /// The device a per-device key names, if `name` is `key.<device>`.
    pub fn device_of(key: &str, name: &str) -> Option<u32> {
        name.strip_prefix(key)?.strip_prefix('.')?.parse().ok()
    }
}

/// The hello's keys.
pub mod hello {
    /// Why no events of the process are in the trace (its ring could not be made, passed or taken).
    pub const NO_RING: &str = "no_ring";
    /// `"1"`: the Python bridge loaded in this process.
    pub const PYTHON_BRIDGE: &str = "python_bridge";
    /// The pid the process has in a pid namespace of its own (its hello's; the trace's is the kernel's).
    pub const PID_IN_ITS_NAMESPACE: &str = "pid_in_its_namespace";
    /// The job's token (`VRAMTRACE_JOB_TOKEN`): sent by the shim, checked and taken out by the collector.
    pub const JOB_TOKEN: &str = "job_token";
    /// The cap this process's shim applies, as it read it (`VRAMTRACE_CAP`; absent: none): the collector
    /// compares it with the job's, to say how a process got past the cap.
    pub const CAP: &str = "cap";
    /// `enforce` or `warn`: the mode the shim applies (with [`CAP`]).
    pub const CAP_MODE: &str = "cap_mode";
    /// `"1"` when the shim was given the job's ledger (`VRAMTRACE_LEDGER`), `"0"` when it caps the process alone.
    pub const CAP_LEDGER: &str = "cap_ledger";
    /// Written by the collector: `job` when the process's shim had the job's settings in time (its cap keys are
    /// then the job's), `environment` when it may have applied its own environment's (its hello's keys).
    pub const CAP_FROM: &str = "cap_from";
}

/// The Python bridge's records (`Record::Bridge`): each kind (`what`) and the keys its fields may carry, as
/// bridge/schema.json declares them (a test holds the two equal; the bridge's own tests check every record it
/// makes against the file). A key ending in `.*` is a prefix ([`prefix`]). The readers ask by these
/// constants, never by a string of their own.
pub mod bridge {
    macro_rules! bridge_kinds {
        ($($module:ident: $kind:ident, $variant:ident = $what:literal { $($key:ident = $name:literal,)* })*) => {
            /// The kinds of record (`Bridge::what`).
            pub mod what {
                $(pub const $kind: &str = $what;)*
                /// Every kind, in the schema's order.
                pub const ALL: &[&str] = &[$($what),*];
            }

            /// A record's kind as a type ([`crate::Bridge::kind`]): a reader matches on it, so a kind added
            /// here is a compile error in every reader until it is handled.
            #[derive(Clone, Copy, Debug, PartialEq, Eq)]
            pub enum Kind {
                $($variant,)*
            }

            impl Kind {
                /// Every kind, in the schema's order.
                pub const ALL: &[Kind] = &[$(Kind::$variant),*];

                /// The kind named `what`; `None` for one this build does not know (a newer bridge's).
                pub fn of(what: &str) -> Option<Kind> {
                    match what {
                        $($what => Some(Kind::$variant),)*
                        _ => None,
                    }
                }

                /// Its name on the wire.
                pub fn what(self) -> &'static str {
                    match self {
                        $(Kind::$variant => $what,)*
                    }
                }
            }
            $(
                #[doc = concat!("The keys of a `", $what, "` record.")]
                pub mod $module {
                    $(pub const $key: &str = $name;)*
                    /// Every key, in the schema's order.
                    pub const ALL: &[&str] = &[$($name),*];
                }
            )*
        };
    }

    bridge_kinds! {
        attach: ATTACH, Attach = "attach" {
            BRIDGE = "bridge",
            TORCH = "torch",
            PYTHON = "python",
            BACKEND = "backend",
            ALLOC_CONF = "alloc_conf",
            SAMPLE_MS = "sample_ms",
            HISTORY_ENTRIES = "history_entries",
            HISTORY_MODE = "history_mode",
            DEVICES = "devices",
            PROBLEM_PREFIX = "problem.*",
        }
        history: HISTORY, History = "history" {
            STATE = "state",
            REASON = "reason",
            ENTRIES = "entries",
            ALLOCATED = "allocated",
            RESERVED = "reserved",
            LIMIT = "limit",
            T_NS = "t_ns",
        }
        oom: OOM, Oom = "oom" {
            FRAMEWORK = "framework",
            ERROR = "error",
            REQUESTED = "requested",
            ALLOWED_OR_TOTAL = "allowed_or_total",
            DEVICE_FREE = "device_free",
            ALLOCATED = "allocated",
            RESERVED = "reserved",
            ACTIVE = "active",
            INACTIVE_SPLIT = "inactive_split",
            REQUESTED_CURRENT = "requested_current",
            ALLOC_RETRIES = "alloc_retries",
            OOMS = "ooms",
            BACKEND = "backend",
            ALLOC_CONF = "alloc_conf",
            EXPANDABLE_SEGMENTS = "expandable_segments",
            GARBAGE_COLLECTION_THRESHOLD = "garbage_collection_threshold",
            MAX_SPLIT_SIZE = "max_split_size",
            OVERSIZE_ALLOCATIONS = "oversize_allocations",
            THREAD = "thread",
            ALLOCATED_PEAK = "allocated_peak",
            RESERVED_PEAK = "reserved_peak",
            SEGMENTS = "segments",
            LARGEST_FREE_BLOCK = "largest_free_block",
            FREE_IN_LIVE_SEGMENTS = "free_in_live_segments",
            SEGMENTS_EXPANDABLE = "segments_expandable",
            SEGMENTS_ERROR = "segments_error",
            SNAPSHOT = "snapshot",
            BYTES_IN_USE = "bytes_in_use",
            PEAK_BYTES_IN_USE = "peak_bytes_in_use",
            BYTES_RESERVED = "bytes_reserved",
            BYTES_LIMIT = "bytes_limit",
            NUM_ALLOCS = "num_allocs",
            LARGEST_ALLOC_SIZE = "largest_alloc_size",
        }
        exit: EXIT, Exit = "exit" {
            FRAMEWORK = "framework",
            ALLOCATED = "allocated",
            RESERVED = "reserved",
            ALLOC_RETRIES = "alloc_retries",
            OOMS = "ooms",
            ALLOCATED_PEAK = "allocated_peak",
            RESERVED_PEAK = "reserved_peak",
            BYTES_IN_USE = "bytes_in_use",
            PEAK_BYTES_IN_USE = "peak_bytes_in_use",
            BYTES_RESERVED = "bytes_reserved",
            BYTES_LIMIT = "bytes_limit",
            LARGEST_FREE_BLOCK = "largest_free_block",
            NUM_ALLOCS = "num_allocs",
            LARGEST_ALLOC_SIZE = "largest_alloc_size",
        }
        snapshot: SNAPSHOT, Snapshot = "snapshot" {
            AT = "at",
            PATH = "path",
        }
        steps: STEPS, Steps = "steps" {
            OPTIMIZER = "optimizer",
            BATCHES = "batches",
            SCOPES = "scopes",
            T_NS = "t_ns",
            DEVICE = "device",
            ALLOCATED = "allocated",
            ALLOCATED_PEAK = "allocated_peak",
            RESERVED_PEAK = "reserved_peak",
        }
        peak: PEAK, Peak = "peak" {
            ALLOCATED_PEAK = "allocated_peak",
            RESERVED_PEAK = "reserved_peak",
        }
        holders: HOLDERS, Holders = "holders" {
            AT = "at",
            OOM = "oom",
            ELAPSED_MS = "elapsed_ms",
            OBJECTS = "objects",
            TENSORS = "tensors",
            TENSOR_BYTES = "tensor_bytes",
            PARTIAL = "partial",
            PARTIAL_REASON = "partial_reason",
            H_PREFIX = "h.*",
        }
        note: NOTE, Note = "note" {
            TEXT = "text",
        }
        stopped: STOPPED, Stopped = "stopped" {
            COUNTER = "counter",
            STEPS = "steps",
        }
    }

    /// The keys under a `holders` record's `h.*` prefix: holder `i`'s are `h.<i>.<key>` ([`holder::key`]), as
    /// the schema's `nested` declares them.
    pub mod holder {
        pub const KIND: &str = "kind";
        pub const NAME: &str = "name";
        pub const SCOPE: &str = "scope";
        pub const WHAT: &str = "what";
        pub const TENSORS: &str = "tensors";
        pub const BYTES: &str = "bytes";
        pub const NODES: &str = "nodes";
        pub const BATCHES: &str = "batches";
        pub const LIB: &str = "lib";
        /// Every key, in the schema's order.
        pub const ALL: &[&str] = &[KIND, NAME, SCOPE, WHAT, TENSORS, BYTES, NODES, BATCHES, LIB];

        /// Holder `i`'s `key` as the record carries it.
        pub fn key(i: usize, key: &str) -> String {
            format!("{}{i}.{key}", super::prefix(super::holders::H_PREFIX))
        }
    }

    /// The values a reader compares, as the schema's `values` lists them (`KIND.KEY` there).
    pub mod values {
        /// `history.state`: the history was turned on (else `disarmed`).
        pub const ARMED: &str = "armed";
        /// `holders.at`: a walk the program asked for (`vramtrace.holders()`, `%vramtrace holders`); `oom` and
        /// `exit` are the kinds' own names.
        pub const AT_REQUEST: &str = "request";
        /// `oom.framework`, `exit.framework`: JAX's allocator (absent or `torch`: PyTorch's).
        pub const JAX: &str = "jax";
        /// A flag's value when set (`holders.partial`, `h.*.lib`).
        pub const YES: &str = "1";
    }

    /// The name of a key declared as a prefix (`"h.*"`): what the keys it stands for start with.
    pub fn prefix(declared: &str) -> &str {
        declared.trim_end_matches('*')
    }

    /// Keys of bridges before this build, read from the traces they wrote.
    pub mod legacy {
        /// JAX's bridge sent its allocator's own name (2026-11-28 and before); now `largest_free_block`.
        pub const LARGEST_FREE_BLOCK_BYTES: &str = "largest_free_block_bytes";
    }
}

#[cfg(test)]
mod tests {
    use super::header::*;

    /// Every kind and key bridge/schema.json names is a constant here, and every constant is in the file: the
    /// bridge's side is checked against the same file (bridge/tests), so the two sides cannot drift apart.
    #[test]
    fn the_bridge_keys_are_the_schemas() {
        use super::bridge;
        let schema: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(include_str!("../../bridge/schema.json")).unwrap();
        let kinds: Vec<&str> = schema
            .keys()
            .map(String::as_str)
            .filter(|k| !["comment", "nested", "values"].contains(k))
            .collect();
        let mut want: Vec<&str> = bridge::what::ALL.to_vec();
        let mut have = kinds.clone();
        want.sort_unstable();
        have.sort_unstable();
        assert_eq!(want, have, "kinds");
        let declared: [(&str, &[&str]); 10] = [
            (bridge::what::ATTACH, bridge::attach::ALL),
            (bridge::what::HISTORY, bridge::history::ALL),
            (bridge::what::OOM, bridge::oom::ALL),
            (bridge::what::EXIT, bridge::exit::ALL),
            (bridge::what::SNAPSHOT, bridge::snapshot::ALL),
            (bridge::what::STEPS, bridge::steps::ALL),
            (bridge::what::PEAK, bridge::peak::ALL),
            (bridge::what::HOLDERS, bridge::holders::ALL),
            (bridge::what::NOTE, bridge::note::ALL),
            (bridge::what::STOPPED, bridge::stopped::ALL),
        ];
        assert_eq!(declared.len(), kinds.len(), "every kind's keys compared");
        for (i, k) in bridge::Kind::ALL.iter().enumerate() {
            assert_eq!(k.what(), bridge::what::ALL[i]);
            assert_eq!(bridge::Kind::of(k.what()), Some(*k));
        }
        assert_eq!(bridge::Kind::of("later"), None);
        for (what, keys) in declared {
            let in_file: Vec<&str> = schema[what]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(keys, in_file.as_slice(), "the keys of {what}");
        }
        assert!(!bridge::oom::ALL.contains(&bridge::legacy::LARGEST_FREE_BLOCK_BYTES));
        assert_eq!(bridge::prefix(bridge::holders::H_PREFIX), "h.");
        let nested: Vec<&str> = schema["nested"][bridge::holders::H_PREFIX]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(bridge::holder::ALL, nested.as_slice(), "the keys under h.*");
        assert_eq!(bridge::holder::key(3, bridge::holder::KIND), "h.3.kind");
        // Each value a reader compares is listed where the schema lists the key's values.
        let listed = |key: &str, v: &str| {
            schema["values"][key]
                .as_array()
                .unwrap_or_else(|| panic!("values of {key}"))
                .iter()
                .any(|x| x == v)
        };
        assert!(listed("history.state", bridge::values::ARMED));
        assert!(listed("holders.at", bridge::values::AT_REQUEST));
        assert!(listed("holders.at", bridge::what::OOM));
        assert!(listed("holders.at", bridge::what::EXIT));
        assert!(listed("snapshot.at", bridge::what::EXIT));
        assert!(listed("oom.framework", bridge::values::JAX));
        assert!(listed("h.*.lib", bridge::values::YES));
        assert!(listed("holders.partial", bridge::values::YES));
    }

    #[test]
    fn per_device_keys_go_both_ways() {
        assert_eq!(per_device(CAP_BYTES, 3), "cap_bytes.3");
        assert_eq!(device_of(CAP_BYTES, "cap_bytes.3"), Some(3));
        assert_eq!(device_of(CAP_BYTES, "cap_bytes3"), None);
        assert_eq!(device_of(CAP_BYTES, "device_total.3"), None);
    }
}
