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
