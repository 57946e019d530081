//! The figures the receiving side shares: how much one read takes, how long a ring may wait for a place, how far
//! behind its clock the collector promises. A leaf: it imports nothing of `receive`.

use std::time::Duration;

/// Bytes asked of the socket per read (and the room the splitter keeps for it).
pub(super) const READ: usize = 256 << 10;

/// How long a connection whose ring has not come waits to read until a descriptor is free for it.
pub(super) const RESERVE_WAIT: Duration = Duration::from_secs(2);

/// How far behind its own clock the collector promises. Events' counter ticks, converted by its line (format's
/// `ticks`), can be tens of ns off its `clock_gettime`, more when converted long after; a promise this far back
/// rarely needs an event held for it, and covers a new process's first events, which nothing holds.
pub(super) const CLOCK_MARGIN_NS: u64 = 50_000;
