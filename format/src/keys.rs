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

/// The Python bridge's records (`Record::Bridge`): their kinds (`what`), as bridge/schema.json declares them. Each
/// kind's body is one JSON object whose keys and types the schema declares; the collector reads it into its own
/// types (`model::analysis::bridge::doc`), which a test there holds equal to the schema, as the bridge's tests
/// hold every record it makes.
pub mod bridge {
    macro_rules! bridge_kinds {
        ($($kind:ident, $variant:ident = $what:literal;)*) => {
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
        };
    }

    bridge_kinds! {
        ATTACH, Attach = "attach";
        HISTORY, History = "history";
        OOM, Oom = "oom";
        EXIT, Exit = "exit";
        SNAPSHOT, Snapshot = "snapshot";
        STEPS, Steps = "steps";
        PEAK, Peak = "peak";
        HOLDERS, Holders = "holders";
        NOTE, Note = "note";
        STOPPED, Stopped = "stopped";
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
    }
}

#[cfg(test)]
mod tests {
    use super::header::*;

    #[test]
    fn per_device_keys_go_both_ways() {
        assert_eq!(per_device(CAP_BYTES, 3), "cap_bytes.3");
        assert_eq!(device_of(CAP_BYTES, "cap_bytes.3"), Some(3));
        assert_eq!(device_of(CAP_BYTES, "cap_bytes3"), None);
        assert_eq!(device_of(CAP_BYTES, "device_total.3"), None);
    }
}
