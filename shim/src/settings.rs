//! What the environment tells the shim, read once at its first tracked call (never in a constructor).

use std::ffi::OsString;
use std::sync::OnceLock;

/// The shim's settings for this process.
#[derive(Debug, Default)]
pub struct Settings {
    /// Where the collector listens (`VRAMTRACE_SOCKET`). Unset: nothing is recorded.
    pub socket: Option<OsString>,
    /// `VRAMTRACE_DEBUG=1`: say on stderr what the shim does. Otherwise it is silent.
    pub debug: bool,
    /// `VRAMTRACE_CAP`: the cap's spec (format::cap), parsed by the cap module.
    pub cap: Option<String>,
    /// `VRAMTRACE_CAP_MODE=warn`: record and warn, never refuse.
    pub cap_warn: bool,
    /// `VRAMTRACE_LEDGER`: the job's shared ledger file. Unset: the cap covers this process alone.
    pub ledger: Option<OsString>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Reads the environment the first time; the same answer ever after (a forked child keeps its parent's).
pub fn get() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        socket: std::env::var_os("VRAMTRACE_SOCKET").filter(|s| !s.is_empty()),
        debug: matches!(std::env::var("VRAMTRACE_DEBUG").as_deref(), Ok(v) if !v.is_empty() && v != "0"),
        cap: std::env::var("VRAMTRACE_CAP").ok().filter(|s| !s.trim().is_empty()),
        cap_warn: matches!(std::env::var("VRAMTRACE_CAP_MODE").as_deref(), Ok("warn")),
        ledger: std::env::var_os("VRAMTRACE_LEDGER").filter(|s| !s.is_empty()),
    })
}

/// One line on stderr when `VRAMTRACE_DEBUG` is set. Written with one `write(2)`: no locks, no stdio.
pub fn debug(args: std::fmt::Arguments) {
    if !get().debug {
        return;
    }
    let line = format!("vramtrace[{}]: {}\n", std::process::id(), args);
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::settings::debug(format_args!($($t)*)) };
}
