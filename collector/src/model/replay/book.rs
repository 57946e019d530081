//! The replay's core: what one event does to a process's live allocations, decided in one place for the report
//! (`Replay`) and for the live metrics (`crate::live`), so the two cannot disagree on it.
//!
//! - [`act`] reads an event: an allocation (a pointer, or a `cuMemCreate` handle) on which device, a refusal, a
//!   release, a release the driver refused after the shim had published it, or none of these.
//! - [`Book`] is a process's live set: its pointers and handles by address, each with what its owner keeps
//!   of it (`V`: the replay's call site and time, the metrics' device and size), and each thread's last
//!   release, until a refusal of it puts back exactly what it took out.
//!
//! The shim publishes a release before it calls the driver, so that its time comes before any reuse of what it
//! frees; a refusal comes after, from the same thread, as that thread's next event (`flags::UNDONE`).

use vramtrace_format::{flags, Api, Effect, Event, Oom, NO_DEVICE};

use crate::names::fasthash::FastMap;

/// The device of memory on no GPU: `cuMemCreate` with a host location (the shim records it on no device).
/// Kept apart from `NO_DEVICE` (a GPU the shim could not tell) so that neither is taken for the other.
pub(crate) const HOST_DEVICE: u32 = NO_DEVICE - 1;

/// What an event does to its process's live set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    /// A successful allocation on `device` ([`HOST_DEVICE`] for host memory); `handle`: a `cuMemCreate`.
    Alloc { handle: bool, device: u32 },
    /// An allocation refused (by the driver, or by the cap: `flags::CAP_REFUSED`) on `device`.
    Refused { device: u32 },
    /// A successful release of a pointer or (`handle`) a `cuMemCreate` handle.
    Free { handle: bool },
    /// A release the driver refused after the shim had published it: what it took out is live again.
    Undo { handle: bool },
    /// A refused release nothing was published for, or an address-space call or a query: no allocation changes.
    None,
}

/// What `e` does to its process's live set. Inlined: once per event of every replay.
#[inline(always)]
pub(crate) fn act(e: &Event) -> Act {
    match e.api.effect() {
        eff @ (Effect::AllocPtr | Effect::CreateHandle) => {
            let handle = eff == Effect::CreateHandle;
            // A `cuMemCreate` on no device is memory on the host (the shim names only device locations).
            let device = if handle && e.device == NO_DEVICE {
                HOST_DEVICE
            } else {
                e.device
            };
            if e.result == 0 {
                Act::Alloc { handle, device }
            } else {
                Act::Refused { device }
            }
        }
        eff @ (Effect::FreePtr | Effect::ReleaseHandle) => {
            let handle = eff == Effect::ReleaseHandle;
            if e.result == 0 {
                Act::Free { handle }
            } else if e.flags & flags::UNDONE != 0 {
                Act::Undo { handle }
            } else {
                Act::None
            }
        }
        Effect::AddressSpace | Effect::Info => Act::None,
    }
}

/// The device an out-of-memory record's refusal is on, as [`act`] names its allocation's: a `cuMemCreate` on no
/// device asked for host memory.
pub(crate) fn oom_device(o: &Oom) -> u32 {
    if o.api == Api::MemCreate as u8 && o.device == NO_DEVICE {
        HOST_DEVICE
    } else {
        o.device
    }
}

/// What a refused release gave back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Undone<V> {
    /// What the release took out, live again.
    Back(V),
    /// The release had taken nothing (a double free, a wrong pointer): its unmatched free was none.
    Nothing,
    /// Not the thread's last release, or something else is live at the address already: nothing changes.
    Stale,
}

/// A process's live allocations (`V`: what its owner keeps of each) and each thread's last release.
pub(crate) struct Book<V> {
    ptrs: FastMap<u64, V>,
    handles: FastMap<u64, V>,
    releases: Releases<Option<V>>,
}

impl<V> Default for Book<V> {
    fn default() -> Self {
        Book {
            ptrs: FastMap::default(),
            handles: FastMap::default(),
            releases: Releases::default(),
        }
    }
}

impl<V: Copy> Book<V> {
    #[inline(always)]
    fn map(&mut self, handle: bool) -> &mut FastMap<u64, V> {
        if handle {
            &mut self.handles
        } else {
            &mut self.ptrs
        }
    }

    /// `v` is live at `addr`. Returns what was live there before: its free was never recorded (lost), and the
    /// newer allocation replaces it.
    #[inline(always)]
    pub fn alloc(&mut self, handle: bool, addr: u64, v: V) -> Option<V> {
        self.map(handle).insert(addr, v)
    }

    /// Thread `tid` released `addr`: what it took out (`None`: nothing was live there), noted until the
    /// thread's next event.
    #[inline(always)]
    pub fn free(&mut self, tid: u32, handle: bool, addr: u64) -> Option<V> {
        let took = self.map(handle).remove(&addr);
        self.releases.note(tid, addr, handle, took);
        took
    }

    /// The driver refused thread `tid`'s release of `addr`: what that release took out is live again, as if
    /// it had never been released.
    pub fn undo(&mut self, tid: u32, handle: bool, addr: u64) -> Undone<V> {
        let Some(took) = self.releases.take(tid, addr, handle) else {
            return Undone::Stale;
        };
        let Some(v) = took else {
            return Undone::Nothing;
        };
        let map = self.map(handle);
        if map.contains_key(&addr) {
            // Something else is live there already (not the thread's next event after all): leave it be.
            return Undone::Stale;
        }
        map.insert(addr, v);
        Undone::Back(v)
    }

    /// Everything live, pointers then handles: (address, what is kept of it).
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.ptrs.iter().chain(self.handles.iter())
    }

    /// The live handle at `addr` (a `cuMemMap` names its handle).
    pub fn handle(&self, addr: u64) -> Option<&V> {
        self.handles.get(&addr)
    }

    /// Every context of the process on a device was torn down: the driver freed its pointer allocations there
    /// (`on_device` says which; handles are the device's and stay). Returns them; what releases took out there
    /// is gone whatever the driver answers them.
    pub fn context_gone(&mut self, on_device: impl Fn(&V) -> bool) -> Vec<(u64, V)> {
        self.releases
            .forget(|took| took.as_ref().is_some_and(&on_device));
        let gone: Vec<u64> = self
            .ptrs
            .iter()
            .filter(|(_, v)| on_device(v))
            .map(|(a, _)| *a)
            .collect();
        gone.into_iter()
            .filter_map(|a| self.ptrs.remove(&a).map(|v| (a, v)))
            .collect()
    }

    /// The process ended: everything still live, pointers then handles, with `true` for handles. The book is
    /// empty after.
    pub fn take_all(&mut self) -> impl Iterator<Item = (u64, V, bool)> {
        let ptrs = std::mem::take(&mut self.ptrs);
        let handles = std::mem::take(&mut self.handles);
        ptrs.into_iter()
            .map(|(a, v)| (a, v, false))
            .chain(handles.into_iter().map(|(a, v)| (a, v, true)))
    }
}

/// One thread's last release: its address, whether a handle, and what it took out (`T`).
#[derive(Clone, Copy)]
struct Release<T> {
    tid: u32,
    addr: u64,
    handle: bool,
    took: T,
}

/// Notes kept per process: a thread's place is its id modulo this. Two threads sharing a place, the second
/// releasing between the first's release and its refusal, lose the first's note (its release then stands):
/// rare, and the memory stays bounded however many threads come and go.
const NOTES: usize = 256;

/// A process's last release per thread, until a refusal of it (the thread's next event) takes it.
struct Releases<T> {
    notes: Vec<Option<Release<T>>>,
}

impl<T> Default for Releases<T> {
    fn default() -> Self {
        Releases { notes: Vec::new() }
    }
}

impl<T: Copy> Releases<T> {
    #[inline]
    pub fn note(&mut self, tid: u32, addr: u64, handle: bool, took: T) {
        if self.notes.is_empty() {
            self.notes.resize_with(NOTES, || None);
        }
        self.notes[tid as usize % NOTES] = Some(Release {
            tid,
            addr,
            handle,
            took,
        });
    }

    /// What the thread's last release took out, if it was of `addr` (forgotten either way: a refusal follows
    /// at once).
    pub fn take(&mut self, tid: u32, addr: u64, handle: bool) -> Option<T> {
        let r = self.notes.get_mut(tid as usize % NOTES)?.take()?;
        (r.tid == tid && r.addr == addr && r.handle == handle).then_some(r.took)
    }

    /// Forgets the releases whose take `gone` says is gone for good.
    pub fn forget(&mut self, gone: impl Fn(&T) -> bool) {
        for n in &mut self.notes {
            if n.as_ref().is_some_and(|r| gone(&r.took)) {
                *n = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_format::Api;

    fn ev(api: Api, device: u32, result: u32, flags: u8) -> Event {
        Event {
            ts_ns: 1,
            tid: 1,
            api,
            flags,
            device,
            result,
            addr: 0x10,
            size: 8,
            aux: 0,
            stack: 0,
        }
    }

    #[test]
    fn each_event_is_read_once_for_everyone() {
        let alloc = |handle, device| Act::Alloc { handle, device };
        assert_eq!(act(&ev(Api::MemAlloc, 2, 0, 0)), alloc(false, 2));
        assert_eq!(act(&ev(Api::MemCreate, 2, 0, 0)), alloc(true, 2));
        // A handle on no device is the host's memory; a pointer on no device is a GPU the shim could not tell.
        assert_eq!(
            act(&ev(Api::MemCreate, NO_DEVICE, 0, 0)),
            alloc(true, HOST_DEVICE)
        );
        assert_eq!(
            act(&ev(Api::MemAlloc, NO_DEVICE, 0, 0)),
            alloc(false, NO_DEVICE)
        );
        assert_eq!(act(&ev(Api::MemAlloc, 0, 2, 0)), Act::Refused { device: 0 });
        assert_eq!(act(&ev(Api::MemFree, 0, 0, 0)), Act::Free { handle: false });
        assert_eq!(
            act(&ev(Api::MemRelease, 0, 0, 0)),
            Act::Free { handle: true }
        );
        assert_eq!(
            act(&ev(Api::MemFree, 0, 1, flags::UNDONE)),
            Act::Undo { handle: false }
        );
        assert_eq!(act(&ev(Api::MemFree, 0, 1, 0)), Act::None);
        assert_eq!(act(&ev(Api::MemMap, 0, 0, 0)), Act::None);
    }

    #[test]
    fn a_refused_release_puts_back_what_it_took_and_nothing_else() {
        let mut b: Book<u64> = Book::default();
        assert_eq!(b.alloc(false, 0x10, 100), None);
        // The same address again, its free never recorded: the old one comes back to be taken out.
        assert_eq!(b.alloc(false, 0x10, 50), Some(100));
        assert_eq!(b.free(7, false, 0x10), Some(50));
        // Another thread's refusal, or another address: not that release.
        assert_eq!(b.undo(8, false, 0x10), Undone::Stale);
        assert_eq!(b.free(7, false, 0x10), None);
        assert_eq!(b.undo(7, false, 0x10), Undone::Nothing);
        // A pointer and a handle at one number are two things.
        assert_eq!(b.alloc(true, 0x10, 9), None);
        assert_eq!(b.free(7, true, 0x10), Some(9));
        assert_eq!(b.undo(7, true, 0x10), Undone::Back(9));
        assert_eq!(b.undo(7, true, 0x10), Undone::Stale, "taken once");
        assert_eq!(b.handle(0x10), Some(&9));
        let mut all: Vec<_> = b.take_all().collect();
        all.sort();
        assert_eq!(all, [(0x10, 9, true)]);
        assert_eq!(b.iter().count(), 0);
    }

    #[test]
    fn a_torn_down_context_takes_its_pointers_and_forgets_their_releases() {
        // Values: (device, bytes).
        let mut b: Book<(u32, u64)> = Book::default();
        b.alloc(false, 1, (0, 10));
        b.alloc(false, 2, (1, 20));
        b.alloc(true, 3, (1, 30));
        b.alloc(false, 4, (1, 40));
        assert_eq!(b.free(5, false, 4), Some((1, 40)));
        let mut gone = b.context_gone(|&(d, _)| d == 1);
        gone.sort();
        assert_eq!(gone, [(2, (1, 20))], "handles are the device's and stay");
        // The driver refusing the release now gives nothing back: the context took it.
        assert_eq!(b.undo(5, false, 4), Undone::Stale);
        let mut left: Vec<_> = b.iter().map(|(a, v)| (*a, *v)).collect();
        left.sort();
        assert_eq!(left, [(1, (0, 10)), (3, (1, 30))]);
    }
}
