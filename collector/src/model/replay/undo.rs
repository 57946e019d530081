//! Releases the driver refused after the shim had published them (`flags::UNDONE`). The shim publishes a
//! release before it calls the driver, so that its time comes before any reuse of what it frees; a refusal
//! comes after, from the same thread, as that thread's next event. Each thread's last release is kept until
//! then, so the refusal can put back exactly what the release took out.

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

/// A process's last release per thread, until a refusal of it (the thread's next event) takes it: here what a
/// release took out of the replay's live set, and in the live metrics (`live.rs`) what it took out of theirs.
pub(crate) struct Releases<T> {
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
