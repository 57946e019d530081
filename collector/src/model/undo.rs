//! Releases the driver refused after the shim had published them (`flags::UNDONE`). The shim publishes a
//! release before it calls the driver, so that its time comes before any reuse of what it frees; a refusal
//! comes after, from the same thread, as that thread's next event. Each thread's last release is kept until
//! then, so the refusal can put back exactly what the release took out.

use super::fasthash::FastMap;
use super::replay::{Live, Replay};
use super::tap::Change;
use crate::callsites::NO_SITE;

/// What a thread's last release took out: the allocation that was live there, or none (the release then
/// counted an unmatched free).
#[derive(Clone, Copy)]
struct Release {
    tid: u32,
    addr: u64,
    handle: bool,
    live: Option<Live>,
}

/// Threads kept in a list searched in place; a process with more keeps the rest in a map.
const SMALL: usize = 64;

/// A process's last release per thread.
#[derive(Default)]
pub(super) struct Releases {
    small: Vec<Release>,
    /// Where the last thread looked for was found in `small`: a thread releasing many times finds itself at once.
    hint: usize,
    many: FastMap<u32, Release>,
}

impl Releases {
    #[inline]
    pub fn note(&mut self, tid: u32, addr: u64, handle: bool, live: Option<Live>) {
        let r = Release {
            tid,
            addr,
            handle,
            live,
        };
        if let Some(x) = self.small.get_mut(self.hint) {
            if x.tid == tid {
                *x = r;
                return;
            }
        }
        if let Some(i) = self.small.iter().position(|x| x.tid == tid) {
            self.hint = i;
            self.small[i] = r;
        } else if self.small.len() < SMALL {
            self.hint = self.small.len();
            self.small.push(r);
        } else {
            self.many.insert(tid, r);
        }
    }

    /// The thread's last release, if it was of `addr` (forgotten either way: a refusal follows at once).
    fn take(&mut self, tid: u32, addr: u64, handle: bool) -> Option<Option<Live>> {
        let r = match self.small.iter().position(|x| x.tid == tid) {
            Some(i) => {
                self.hint = 0;
                self.small.swap_remove(i)
            }
            None => self.many.remove(&tid)?,
        };
        (r.addr == addr && r.handle == handle).then_some(r.live)
    }
}

impl Replay<'_> {
    /// The driver refused thread `tid`'s release of `addr` in process `s`, at `t` (relative ns): what the release
    /// took out is live again, as if it had never been released.
    pub(super) fn undo_release(&mut self, s: usize, tid: u32, addr: u64, handle: bool, t: u64) {
        let Some(live) = self.procs[s].releases.take(tid, addr, handle) else {
            return;
        };
        let Some(l) = live else {
            // Nothing was live there (a double free, a wrong pointer): the unmatched free it counted was none.
            let p = &mut self.procs[s];
            p.s.unmatched_frees = p.s.unmatched_frees.saturating_sub(1);
            self.unmatched = self.unmatched.saturating_sub(1);
            return;
        };
        let p = &mut self.procs[s];
        p.s.frees = p.s.frees.saturating_sub(1);
        let map = if handle { &mut p.handles } else { &mut p.ptrs };
        if map.insert(addr, l).is_some() {
            // Something else is live there already (not a thread's next event after all): leave the figures be.
            return;
        }
        self.give(s, l.dev as usize, l.size, t, l.site);
        // Back, not allocated anew: the counts of allocations stay as they were.
        let d = l.dev as usize;
        if l.site != NO_SITE {
            let a = &mut self.cs.aggs[l.site as usize];
            a.allocations = a.allocations.saturating_sub(1);
            a.bytes = a.bytes.saturating_sub(l.size);
        }
        self.devs[d].allocations = self.devs[d].allocations.saturating_sub(1);
        let p = &mut self.procs[s];
        p.s.allocations = p.s.allocations.saturating_sub(1);
        let pd = p.dev(d);
        pd.allocations = pd.allocations.saturating_sub(1);
        self.tap_live(Change::Alloc, s, handle, addr, &l, t);
    }
}
