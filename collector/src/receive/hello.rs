//! A process's hello: who it is (the kernel's pid, the job's token for a gone peer), checked and answered
//! with the job's settings, and which cap it applies.

use vramtrace_format::keys;

use vramtrace_format::codec::{self, kind};
use vramtrace_format::Record;

use super::ingest::{self};
use super::peer::*;

impl Conn {
    /// Takes the hello: the process is who the kernel says it is (its pid and parent then), whatever the hello
    /// says; what it said is kept beside. A peer of another user that was gone before it could be checked is of
    /// the job only if its hello carries the job's token (the job's environment, which other users cannot
    /// read). The token never reaches the trace. `None`: turned away, or no hello at all.
    pub(super) fn hello(&mut self, payload: &[u8]) -> Option<vramtrace_format::Hello> {
        let Ok(Some(Record::Hello(mut h))) = codec::decode_record(kind::HELLO, payload) else {
            return None;
        };
        let token = h
            .extra
            .iter()
            .position(|(k, _)| k == ingest::TOKEN_KEY)
            .map(|i| h.extra.remove(i).1);
        h.extra.retain(|(k, _)| k != ingest::TOKEN_KEY);
        if let Some(g) = &self.gone {
            if !token.is_some_and(|t| ingest::same_token(&self.job_token, &t)) {
                if let Ok(mut r) = g.conns.refused.lock() {
                    r.push((self.kernel_pid.unwrap_or(h.pid), g.uid));
                }
                return None;
            }
        }
        self.gone = None;
        // No pid from the kernel (a peer outside our pid namespace): nobody the trace can name.
        let Some(kernel) = self.kernel_pid else {
            self.turned_away = Some(format!(
                "a process said hello as pid {} from outside the collector's pid namespace (the kernel gave \
                 no pid for it): not traced",
                h.pid
            ));
            return None;
        };
        let said = h.pid;
        if h.pid != kernel {
            h.extra
                .push((keys::hello::PID_IN_ITS_NAMESPACE.into(), h.pid.to_string()));
            h.pid = kernel;
        }
        // Its parent by /proc when it was accepted; else what its hello said, unless that is a number of its
        // own pid namespace (then unknown: 0).
        match self.peer.as_ref().map(|p| p.2).filter(|p| *p != 0) {
            Some(ppid) => h.ppid = ppid,
            None if said != kernel => h.ppid = 0,
            None => {}
        }
        self.who = Who::Process {
            pid: kernel,
            said: Some(said),
        };
        if let Some(c) = &self.conns {
            if h.ppid != 0 {
                c.reaps.parent(kernel, h.ts_ns, h.ppid);
            }
        }
        // A process that connected while the collector was stopped waited since its hello.
        if let Some(d) = self.ring.as_mut() {
            d.last_ns = d.last_ns.min(h.ts_ns);
        }
        if let Some((_, why)) = h.extra.iter().find(|(k, _)| k == keys::hello::NO_RING) {
            self.bad_ring = Some(why.clone());
        } else {
            if self.ring.is_none() && self.bad_ring.is_none() {
                // The shim sends its ring with the hello's first byte.
                self.bad_ring = Some("its hello came without it".into());
            }
            // Marked untraced, with why, so that the report names the process (never one that allocated
            // nothing).
            if let Some(why) = &self.bad_ring {
                h.extra.push((
                    keys::hello::NO_RING.into(),
                    format!("the collector could not take its event ring: {why}"),
                ));
            }
        }
        Some(h)
    }
}

/// This host's name, as the shim puts it in a hello.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is a local buffer of `buf.len()` bytes, as the call is told.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let end = buf.iter().position(|c| *c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// How soon after its hello a process's shim must have the job's settings to be taken as applying them: half
/// the time it waits for them (`shim/src/record.rs` `SETTINGS_WAIT`), for the trip back.
const SETTINGS_IN_TIME_NS: u64 = 125_000_000;

/// Says in the hello which cap the process applies: the job's (its shim had the settings in time: the keys are
/// made the job's), or, answered late, possibly its environment's (the keys its shim sent, as they were).
pub(super) fn cap_from(
    h: &mut vramtrace_format::Hello,
    job: &vramtrace_format::settings::JobSettings,
    now: u64,
) {
    use keys::hello::{CAP, CAP_FROM, CAP_LEDGER, CAP_MODE};
    h.extra.retain(|(k, _)| k != CAP_FROM);
    if now.saturating_sub(h.ts_ns) < SETTINGS_IN_TIME_NS {
        h.extra
            .retain(|(k, _)| k != CAP && k != CAP_MODE && k != CAP_LEDGER);
        if let Some(c) = &job.cap {
            h.extra.push((CAP.into(), c.clone()));
            h.extra.push((
                CAP_MODE.into(),
                if job.warn { "warn" } else { "enforce" }.into(),
            ));
            h.extra.push((
                CAP_LEDGER.into(),
                if job.ledger.is_some() { "1" } else { "0" }.into(),
            ));
        }
        h.extra.push((CAP_FROM.into(), "job".into()));
    } else {
        h.extra.push((CAP_FROM.into(), "environment".into()));
    }
}
