//! What the acceptor, the receivers and `run` share about the job's connections: how many are open, who was
//! turned away, the budget of their unfinished frames, the reaps they reported, the job's token and settings.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use super::budget::Budget;
use super::reaped::{self, Reaps};
use super::writer::TraceWriter;

/// What the acceptor, the receivers and `run` share about the job's connections.
#[derive(Default)]
pub(crate) struct Connections {
    /// Connections with a receiver still running (`run` waits for them at the end).
    pub(crate) open: AtomicUsize,
    /// Set when the job is over: the acceptor takes what waits in the backlog, then stops.
    pub(crate) stop: AtomicBool,
    /// Pids of the job that vramtrace reaped (their exits are its own, not a parent's report: `reaped`).
    pub(crate) reaped: Mutex<std::collections::HashSet<u32>>,
    /// Connections turned away: (pid, uid).
    pub(crate) refused: Mutex<Vec<(u32, u32)>>,
    /// The acceptor stopped with connections it could not take for lack of file descriptors still waiting.
    pub(crate) starved: AtomicBool,
    /// Connections taken whose hello has not come yet: no newcomer promise while any is (its hello, or the one
    /// the collector writes for it, may be older).
    pub(crate) unannounced: AtomicUsize,
    /// One budget for every connection's unfinished frame.
    pub(crate) unfinished: Arc<Budget>,
    /// The job's token (`VRAMTRACE_JOB_TOKEN` in the job's environment): vouches for a peer of another user
    /// that was gone before the kernel could be asked where it came from.
    pub(crate) job_token: Arc<str>,
    /// Parents of the trace's processes, and the exits their parents reported (`reaped`).
    pub(crate) reaps: Reaps,
    /// The job's settings line, sent to each process that says hello (`format::settings`): its shim applies
    /// them rather than what its environment says.
    pub(crate) settings: Arc<[u8]>,
}

impl Connections {
    pub(crate) fn new(job_token: &str) -> Connections {
        Connections {
            job_token: Arc::from(job_token),
            ..Default::default()
        }
    }

    /// With the job's settings for the shims (`format::settings::JobSettings`).
    pub(crate) fn with_settings(
        mut self,
        s: &vramtrace_format::settings::JobSettings,
    ) -> Connections {
        self.settings = Arc::from(s.encode().into_bytes());
        self
    }
}

impl Connections {
    /// The reaps the processes reported, written once every connection has ended (`reaped::write`).
    pub(crate) fn write_reaped(&self, trace: &Mutex<TraceWriter>) {
        reaped::write(&self.reaps, &self.reaped, trace);
    }
}
