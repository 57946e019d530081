//! Processes and signals: exit codes and one-line errors, hang-ups, the probe, the descriptor limit.

pub mod exit;
pub mod fdlimit;
pub(crate) mod hangup;
pub mod probe;
