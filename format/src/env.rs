//! The environment variables the shim reads and `vramtrace run` sets (or takes from its own environment), and
//! one parser for each value: the two sides cannot disagree on what a value means. What each does with a value
//! that does not parse is its own: `run` refuses it, from its flags or its own environment (exit 2, nothing
//! started); the shim, which must never stop the program, says so once on stderr and uses the default.

use crate::cap::{Amount, CapSpec};

/// Where the collector listens. Unset: the shim records nothing.
pub const SOCKET: &str = "VRAMTRACE_SOCKET";
/// `1`: the shim says on stderr what it does.
pub const DEBUG: &str = "VRAMTRACE_DEBUG";
/// The cap's spec (`crate::cap`).
pub const CAP: &str = "VRAMTRACE_CAP";
/// `enforce` (the default) or `warn`.
pub const CAP_MODE: &str = "VRAMTRACE_CAP_MODE";
/// The job's shared ledger file.
pub const LEDGER: &str = "VRAMTRACE_LEDGER";
/// `none`, `native`, `python` or `all` (the default).
pub const STACKS: &str = "VRAMTRACE_STACKS";
/// A size: allocations below it record no call site.
pub const STACK_MIN_BYTES: &str = "VRAMTRACE_STACK_MIN_BYTES";
/// [`STACK_MIN_BYTES`] unless set: 1 MiB (the shim's `settings.rs` says why). The reports name it where an
/// allocation has no call site.
pub const DEFAULT_STACK_MIN_BYTES: u64 = 1 << 20;
/// A size: each process's ring.
pub const RING_BYTES: &str = "VRAMTRACE_RING_BYTES";
/// `1`: a thread that finds the ring full waits for room.
pub const LOSSLESS: &str = "VRAMTRACE_LOSSLESS";
/// The job's token (the collector's check of a peer gone before it was looked at).
pub const JOB_TOKEN: &str = "VRAMTRACE_JOB_TOKEN";

/// The cap's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapMode {
    /// Allocations past the cap are refused (out of memory).
    Enforce,
    /// They are recorded and warned about, never refused.
    Warn,
}

impl CapMode {
    /// As the variable spells it.
    pub fn name(self) -> &'static str {
        match self {
            CapMode::Enforce => "enforce",
            CapMode::Warn => "warn",
        }
    }
}

/// `VRAMTRACE_CAP_MODE`: unset or empty is `enforce`; case and surrounding space do not matter.
pub fn cap_mode(v: Option<&str>) -> Result<CapMode, String> {
    match v.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("enforce") => Ok(CapMode::Enforce),
        Some("warn") => Ok(CapMode::Warn),
        Some(_) => Err(format!(
            "{CAP_MODE}={:?} is not enforce or warn",
            v.unwrap_or_default()
        )),
    }
}

/// Which call sites are captured: (native, python).
pub fn stacks(v: Option<&str>) -> Result<(bool, bool), String> {
    match v.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("all") => Ok((true, true)),
        Some("none") => Ok((false, false)),
        Some("native") => Ok((true, false)),
        Some("python") => Ok((false, true)),
        Some(_) => Err(format!(
            "{STACKS}={:?} is not none, native, python or all",
            v.unwrap_or_default()
        )),
    }
}

/// A size: a byte count (`65536`, `0`), or as a cap writes one for all devices (`1MiB`, `64K`).
pub fn size(v: &str) -> Result<u64, String> {
    let v = v.trim();
    if let Ok(n) = v.parse::<u64>() {
        return Ok(n);
    }
    match CapSpec::parse(v).map_err(|e| e.to_string())? {
        CapSpec {
            all: Some(Amount::Bytes(b)),
            devices,
        } if devices.is_empty() => Ok(b),
        _ => Err("not a size (examples: 1MiB, 65536, 0)".to_string()),
    }
}

/// A switch: on when set to anything but empty or `0`.
pub fn flag(v: Option<&str>) -> bool {
    v.is_some_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_modes() {
        assert_eq!(cap_mode(None), Ok(CapMode::Enforce));
        assert_eq!(cap_mode(Some(" Warn ")), Ok(CapMode::Warn));
        assert_eq!(cap_mode(Some("enforce")), Ok(CapMode::Enforce));
        assert!(cap_mode(Some("loose")).is_err());
        for m in [CapMode::Enforce, CapMode::Warn] {
            assert_eq!(cap_mode(Some(m.name())), Ok(m));
        }
    }

    #[test]
    fn stacks_and_flags() {
        assert_eq!(stacks(Some("NATIVE")), Ok((true, false)));
        assert_eq!(stacks(None), Ok((true, true)));
        assert!(stacks(Some("some")).is_err());
        assert!(flag(Some("1")) && flag(Some("yes")));
        assert!(!flag(Some("0")) && !flag(Some(" ")) && !flag(None));
    }

    #[test]
    fn sizes() {
        assert_eq!(size("0"), Ok(0));
        assert_eq!(size("65536"), Ok(65536));
        assert_eq!(size(" 1MiB "), Ok(1 << 20));
        assert!(size("1MiB,0=2GiB").is_err(), "per device is no size");
        assert!(size("50%").is_err(), "a share is no size");
        assert!(size("lots").is_err());
    }
}
