//! What became of an out-of-memory refusal: recovered from, folded into a framework's error, or an error;
//! and the one place an error is counted (every observer hears it there).

use super::*;

impl Replay<'_> {
    /// The open refusals `which` picks are errors.
    pub(super) fn unrecovered(&mut self, which: impl Fn(&OpenOom) -> bool) {
        let mut i = 0;
        while i < self.open_ooms.len() {
            if which(&self.open_ooms[i]) {
                let o = self.open_ooms.remove(i);
                self.procs[o.slot].open_oom = self.open_ooms.iter().any(|x| x.slot == o.slot);
                self.error(Some(o.device));
            } else {
                i += 1;
            }
        }
    }

    /// One out-of-memory error on raw device `device`, decided: the one place the count moves, so every reader
    /// (the report, the live metrics) counts the same.
    pub(super) fn error(&mut self, device: Option<u32>) {
        self.calls.error(device.and_then(ordinal));
    }

    /// Thread `tid` of process `s` allocated on `device` at `t`: its open refusals there were recovered from
    /// (the allocator flushed its cache and retried, or the program went on): findings, not errors.
    #[inline(never)]
    pub(super) fn recovered(&mut self, s: usize, tid: u32, device: u32, t: u64) {
        let mut i = 0;
        while i < self.open_ooms.len() {
            let o = &self.open_ooms[i];
            if o.slot != s || o.tid != tid || o.device != device {
                i += 1;
                continue;
            }
            let o = self.open_ooms.remove(i);
            let mut site = None;
            if let Some(seq) = o.snap {
                if let Some(k) = self.ooms.iter().position(|x| x.seq == seq) {
                    site = self.ooms.remove(k).request_site;
                }
            }
            self.refusals_recovered += 1;
            let stall = t.saturating_sub(o.t);
            self.refusal_stall_ns = self.refusal_stall_ns.saturating_add(stall);
            self.calls.recovered(s);
            let p = &self.procs[s].s;
            if self.refusals.len() < REFUSALS_LISTED {
                self.refusals.push(Refusal {
                    time_ns: o.t,
                    pid: p.pid,
                    tid,
                    device: ordinal(device),
                    api: Api::from_u8(o.api),
                    requested_bytes: o.requested,
                    cap_refused: o.cap_refused,
                    recovered_after_ns: stall,
                    site,
                });
            }
        }
        self.procs[s].open_oom = self.open_ooms.iter().any(|o| o.slot == s);
    }

    /// A framework's record of an error raised at `t` by thread `tid` of process `s` on `device`: the refusals
    /// before it there (its thread's still open, whatever their age; the process's within [`FOLD_NS`]) were
    /// that error's, not recovered from.
    /// An error that names no device (a framework that did not say) folds the process's refusals on any.
    /// Returns how many it folded.
    pub(super) fn raised(&mut self, s: usize, tid: u32, device: Option<u32>, t: u64) -> usize {
        let before = self.open_ooms.len();
        self.open_ooms.retain(|o| {
            // No device named: any GPU's, never pinned host memory's (a `cuMemCreate` on the host).
            let on = device.map_or(o.device != HOST_DEVICE, |d| o.device == d);
            !(o.slot == s && on && folds_into(o.tid, o.t, tid, t))
        });
        self.procs[s].open_oom = self.open_ooms.iter().any(|o| o.slot == s);
        before - self.open_ooms.len()
    }

    /// Out-of-memory record `o` of process `s` reached the replay at `t` (snapshot `snap`, if it got one).
    pub(super) fn open_oom(
        &mut self,
        s: usize,
        o: &vramtrace_format::Oom,
        t: u64,
        snap: Option<u64>,
    ) {
        if self.open_ooms.len() >= OPEN_OOMS_BOUND {
            // The oldest is an error: it is forgotten, not recovered.
            let old = self.open_ooms.remove(0);
            self.procs[old.slot].open_oom = self.open_ooms.iter().any(|x| x.slot == old.slot);
            self.error(Some(old.device));
        }
        self.open_ooms.push(OpenOom {
            slot: s,
            tid: o.tid,
            device: book::oom_device(o),
            t,
            requested: o.requested_bytes,
            cap_refused: o.flags & flags::CAP_REFUSED != 0,
            api: o.api,
            snap,
        });
        self.procs[s].open_oom = true;
    }
}
