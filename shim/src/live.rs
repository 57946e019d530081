//! What the process holds under the cap, id -> (device, bytes): found and changed without a lock or an
//! allocation.
//!
//! Every capped allocation is kept here until its free, so that the free gives back the right bytes on the right
//! device. The table is open-addressed: an id lives at most `PROBE` slots past its home slot. A slot is one
//! 128-bit word, the id and its value together, and every change is one 128-bit compare-and-swap of the whole
//! word, so a thread that changes a slot has seen exactly what it replaces: a free racing a context's teardown,
//! or a program's double free, gives the bytes back once. A slot goes from empty to an id, from an id to free (a
//! tombstone) and from free to an id again, never back to empty:
//!
//! ```text
//! (EMPTY, 0) ──claim──▶ (id, value) ──take──▶ (TOMB, 0) ──claim──▶ (id', value') ...
//!                             └──replace──▶ (id, value'')   (held again: its free went by a path we do not see)
//! ```
//!
//! So an id is always found before the first empty slot on its path, and an id whose path holds an empty slot
//! was never put anywhere else. Only an id with no room within its probe (a process holding tens of thousands of
//! allocations that collide), or one the table cannot hold (0 or 1, a device past 255, 2^56 bytes or more), goes
//! to a locked map beside it, looked at only when the path is full or the id is one of those.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use portable_atomic::AtomicU128;

/// Slot keys that are not ids.
const EMPTY: u64 = 0;
const TOMB: u64 = 1;
/// The farthest an id lives from its home slot.
const PROBE: usize = 32;
/// Values pack the device in the top 8 bits and the bytes below.
const SIZE_BITS: u32 = 56;

/// A slot's word: the id (or `EMPTY`, `TOMB`) in the low half, its packed value in the high half.
#[inline]
fn word(key: u64, val: u64) -> u128 {
    (val as u128) << 64 | key as u128
}

#[inline]
fn key_of(w: u128) -> u64 {
    w as u64
}

#[inline]
fn val_of(w: u128) -> u64 {
    (w >> 64) as u64
}

/// Id -> (device, bytes) for what this process holds under the cap.
pub(crate) struct Live {
    slots: Box<[AtomicU128]>,
    mask: usize,
    /// Whether the table is used: only where a 128-bit compare-and-swap is lock-free (`cmpxchg16b`, detected at
    /// run time; every x86-64 CPU since 2006). Elsewhere portable-atomic would take a lock of its own, which a
    /// `fork` could leave held in the child: everything goes to the locked map instead.
    table: bool,
    /// Ids the table could not hold. `spilled` counts them: 0, and nobody looks (nor locks).
    spill: Mutex<Spill>,
    spilled: AtomicUsize,
    /// Of them, those the table cannot hold at all (see `packs`): a miss in the table looks in the locked map
    /// only when its path is full or these are there.
    unpackable: AtomicUsize,
}

type Spill = HashMap<u64, (u32, u64), BuildHasherDefault<IdHasher>>;

/// What became of a claim once the path was looked at again ([`Live::settle`]).
enum Settled {
    /// It stays; the figures of a farther copy of the same id, taken out.
    Kept(Option<(u32, u64)>),
    /// A nearer copy stays: ours was taken back (its figures, to give back) or taken by the other thread.
    Yielded(Option<(u32, u64)>),
}

impl Live {
    /// A table of `capacity` slots (a power of two). Zeroed memory from the allocator: its pages are the
    /// kernel's zero page until a slot on them is first claimed (or first read, where portable-atomic reads a
    /// slot with `cmpxchg16b` for want of AVX: that writes).
    pub(crate) fn new(capacity: usize) -> Live {
        Live::with(capacity, AtomicU128::is_lock_free())
    }

    fn with(capacity: usize, table: bool) -> Live {
        assert!(capacity.is_power_of_two() && capacity >= PROBE);
        let layout = std::alloc::Layout::array::<AtomicU128>(capacity).expect("a table of slots");
        // SAFETY: a zeroed `AtomicU128` is (EMPTY, 0); the box takes ownership of the allocation with the layout
        // it was made with.
        let slots = unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<AtomicU128>();
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, capacity))
        };
        Live {
            slots,
            mask: capacity - 1,
            table,
            spill: Mutex::new(HashMap::default()),
            spilled: AtomicUsize::new(0),
            unpackable: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn home(&self, id: u64) -> usize {
        (mix(id) >> 32) as usize & self.mask
    }

    #[inline]
    fn slot(&self, home: usize, i: usize) -> &AtomicU128 {
        &self.slots[(home + i) & self.mask]
    }

    /// Keeps `id` as holding `size` bytes on `dev`. If `id` was held already (its free went by a path the shim
    /// does not see), what it held.
    pub(crate) fn insert(&self, id: u64, dev: u32, size: u64) -> Option<(u32, u64)> {
        self.insert_looked(id, dev, size, || ())
    }

    /// [`Live::insert`], running `looked` between the look along the path and the claim it chose (where another
    /// thread may change the path: tests make that happen).
    #[inline(always)]
    fn insert_looked(
        &self,
        id: u64,
        dev: u32,
        size: u64,
        mut looked: impl FnMut(),
    ) -> Option<(u32, u64)> {
        if !self.table || !packs(id, dev, size) {
            // Held in the table before, under figures it could hold: it moves.
            let before = if self.table { self.take(id) } else { None };
            let mut m = self.locked();
            return before.or(self.spill_put(&mut m, id, dev, size));
        }
        let new = word(id, (dev as u64) << SIZE_BITS | size);
        let home = self.home(id);
        // A compare-and-swap lost to another thread's change: look again (each loss is another thread's change
        // to the same few slots, so this ends).
        loop {
            let mut free = None;
            let mut path_full = true;
            for i in 0..PROBE {
                let s = self.slot(home, i);
                let w = s.load(Ordering::SeqCst);
                match key_of(w) {
                    k if k == id => {
                        if s.compare_exchange(w, new, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                        {
                            return Some(unpack(val_of(w)));
                        }
                        free = None;
                        path_full = false;
                        break;
                    }
                    EMPTY => {
                        free.get_or_insert((i, w));
                        path_full = false;
                        break;
                    }
                    TOMB if free.is_none() => free = Some((i, w)),
                    _ => {}
                }
            }
            looked();
            let Some((at, was)) = free else {
                if path_full {
                    return self.spill_full_path(id, dev, size, home, new);
                }
                continue;
            };
            if self
                .slot(home, at)
                .compare_exchange(was, new, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            let old = match self.settle(home, at, new) {
                Settled::Kept(old) => old,
                Settled::Yielded(back) => return back,
            };
            // A path with no empty slot may have sent this id to the locked map before (a miss that finds an
            // empty slot on the path never looks there: such an id was never sent). Under the lock, whatever a
            // concurrent `spill_full_path` of the same id did.
            if path_full || self.unpackable.load(Ordering::SeqCst) > 0 {
                let mut m = self.locked();
                return old.or(self.spill_take(&mut m, id));
            }
            return old;
        }
    }

    /// This thread just claimed slot `at` of `id`'s path for `new`. Another thread inserting the same id may have
    /// claimed another slot meanwhile (an address a context's teardown freed and the driver handed out again):
    /// the copy nearest home stays, and a farther one is taken back, its figures returned as an id held again's.
    /// Both threads look (every claim and look is sequentially consistent), so at least one sees the other.
    fn settle(&self, home: usize, at: usize, new: u128) -> Settled {
        let id = key_of(new);
        let mut old = None;
        for j in (0..PROBE).filter(|&j| j != at) {
            let s = self.slot(home, j);
            let w = s.load(Ordering::SeqCst);
            match key_of(w) {
                EMPTY => break,
                k if k == id && j < at => {
                    let ours = self.slot(home, at);
                    let back = ours
                        .compare_exchange(new, word(TOMB, 0), Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok();
                    // Taken back: our figures are the held-again ones. Taken by the other thread: it returns them.
                    return Settled::Yielded(back.then(|| unpack(val_of(new))));
                }
                k if k == id
                    && j > at
                    && s.compare_exchange(w, word(TOMB, 0), Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok() =>
                {
                    old = old.or(Some(unpack(val_of(w))));
                }
                _ => {}
            }
        }
        Settled::Kept(old)
    }

    /// `id`'s path is full: the locked map holds it. Under the lock, the path is looked at once more: an insert of
    /// the same id that claimed a slot freed since holds it there (and looks in this map under the lock after).
    #[cold]
    fn spill_full_path(
        &self,
        id: u64,
        dev: u32,
        size: u64,
        home: usize,
        new: u128,
    ) -> Option<(u32, u64)> {
        let mut m = self.locked();
        for i in 0..PROBE {
            let s = self.slot(home, i);
            let mut w = s.load(Ordering::SeqCst);
            while key_of(w) == id {
                match s.compare_exchange(w, new, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return Some(unpack(val_of(w))),
                    Err(now) => w = now,
                }
            }
        }
        self.spill_put(&mut m, id, dev, size)
    }

    /// Takes `id` out, with what it held; `None` if it was not held (or another thread took it first).
    pub(crate) fn remove(&self, id: u64) -> Option<(u32, u64)> {
        let path_full = match self.take_in_table(id) {
            Ok(held) => return Some(held),
            Err(path_full) => path_full,
        };
        if path_full || self.unpackable.load(Ordering::SeqCst) > 0 {
            if self.spilled.load(Ordering::SeqCst) == 0 {
                return None;
            }
            let mut m = self.locked();
            return self.spill_take(&mut m, id);
        }
        None
    }

    /// [`Live::remove`] from the table alone.
    fn take(&self, id: u64) -> Option<(u32, u64)> {
        self.take_in_table(id).ok()
    }

    /// Takes `id` out of the table: what it held, or whether the search ended with no empty slot on the path
    /// (the id may then be in the locked map).
    #[inline]
    fn take_in_table(&self, id: u64) -> Result<(u32, u64), bool> {
        if !self.table || id <= TOMB {
            return Err(true);
        }
        let home = self.home(id);
        'path: for i in 0..PROBE {
            let s = self.slot(home, i);
            let mut w = s.load(Ordering::SeqCst);
            loop {
                match key_of(w) {
                    k if k == id => {
                        match s.compare_exchange(
                            w,
                            word(TOMB, 0),
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        ) {
                            Ok(_) => return Ok(unpack(val_of(w))),
                            // Its value replaced meanwhile (held again), or taken: look at what is there now.
                            Err(now) => w = now,
                        }
                    }
                    EMPTY => return Err(false),
                    _ => continue 'path,
                }
            }
        }
        Err(true)
    }

    /// Takes out every entry on `dev`: (count, bytes).
    pub(crate) fn drain_device(&self, dev: u32) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        for s in self.slots.iter().filter(|_| self.table) {
            let w = s.load(Ordering::SeqCst);
            if key_of(w) <= TOMB {
                continue;
            }
            let (d, b) = unpack(val_of(w));
            // Only the entry as read: one freed, replaced or taken meanwhile is not this device's to give back.
            if d == dev
                && s.compare_exchange(w, word(TOMB, 0), Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                n += 1;
                bytes += b;
            }
        }
        if self.spilled.load(Ordering::SeqCst) > 0 {
            let mut m = self.locked();
            let mut odd = 0;
            m.retain(|&id, &mut (d, size)| {
                if d == dev {
                    n += 1;
                    bytes += size;
                    odd += !packs(id, d, size) as usize;
                    false
                } else {
                    true
                }
            });
            self.uncount_unpackable(odd);
            self.spilled.store(m.len(), Ordering::SeqCst);
        }
        (n, bytes)
    }

    /// The locked map. A panic while it was held cannot have left it half-changed (`HashMap` calls no code of
    /// ours), so a poisoned lock is taken as it is.
    fn locked(&self) -> std::sync::MutexGuard<'_, Spill> {
        self.spill
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn spill_put(&self, m: &mut Spill, id: u64, dev: u32, size: u64) -> Option<(u32, u64)> {
        // Counted before the map holds it: a miss that reads the count afterwards looks there.
        if !packs(id, dev, size) {
            self.unpackable.fetch_add(1, Ordering::SeqCst);
        }
        let old = m.insert(id, (dev, size));
        if let Some((d, b)) = old {
            self.uncount_unpackable(!packs(id, d, b) as usize);
        }
        self.spilled.store(m.len(), Ordering::SeqCst);
        old
    }

    fn spill_take(&self, m: &mut Spill, id: u64) -> Option<(u32, u64)> {
        let old = m.remove(&id);
        if let Some((d, b)) = old {
            self.uncount_unpackable(!packs(id, d, b) as usize);
        }
        self.spilled.store(m.len(), Ordering::SeqCst);
        old
    }

    fn uncount_unpackable(&self, n: usize) {
        if n > 0 {
            let was = self.unpackable.fetch_sub(n, Ordering::SeqCst);
            debug_assert!(was >= n, "unpackable count below zero");
        }
    }

    /// Ids held in the locked map, and how many of them the table cannot hold (tests).
    #[cfg(test)]
    fn spilled(&self) -> usize {
        self.spilled.load(Ordering::SeqCst)
    }

    #[cfg(test)]
    fn unpackable(&self) -> usize {
        self.unpackable.load(Ordering::SeqCst)
    }
}

/// Whether the table can hold `id` with its value.
#[inline]
fn packs(id: u64, dev: u32, size: u64) -> bool {
    id > TOMB && dev <= 0xff && size >> SIZE_BITS == 0
}

#[inline]
fn unpack(v: u64) -> (u32, u64) {
    ((v >> SIZE_BITS) as u32, v & ((1 << SIZE_BITS) - 1))
}

/// Spreads device addresses and handles, which differ mostly above their low alignment bits.
#[inline]
fn mix(x: u64) -> u64 {
    (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The locked map's hasher: [`mix`].
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = mix(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_slots_are_lock_free_here() {
        // `cmpxchg16b`, detected at run time (every x86-64 CPU since 2006); without it portable-atomic would
        // fall back to a lock of its own.
        assert!(AtomicU128::is_lock_free());
    }

    #[test]
    fn without_a_lock_free_table_the_locked_map_does_it_all() {
        let live = Live::with(1024, false);
        assert_eq!(live.insert(0x7f00_0020_0000, 1, 4096), None);
        assert_eq!(live.insert(0x7f00_0020_0000, 3, 8192), Some((1, 4096)));
        assert_eq!(live.insert(0x7f00_0040_0000, 2, 10), None);
        assert_eq!(live.spilled(), 2);
        assert!(
            live.slots.iter().all(|s| s.load(Ordering::SeqCst) == 0),
            "the table untouched"
        );
        assert_eq!(live.remove(0x7f00_0020_0000), Some((3, 8192)));
        assert_eq!(live.remove(0x7f00_0020_0000), None);
        assert_eq!(live.drain_device(2), (1, 10));
        assert_eq!(live.spilled(), 0);
    }

    #[test]
    fn holds_takes_and_replaces_like_a_map() {
        let live = Live::new(1024);
        assert_eq!(live.insert(0x7f00_0020_0000, 1, 4096), None);
        assert_eq!(live.insert(0x7f00_0040_0000, 2, 1 << 40), None);
        // Held again without a free the shim saw: the old figures come back, the new ones stay.
        assert_eq!(live.insert(0x7f00_0020_0000, 3, 8192), Some((1, 4096)));
        assert_eq!(live.remove(0x7f00_0020_0000), Some((3, 8192)));
        assert_eq!(live.remove(0x7f00_0020_0000), None, "taken once");
        assert_eq!(live.remove(0x7f00_0060_0000), None, "never held");
        assert_eq!(live.remove(0x7f00_0040_0000), Some((2, 1 << 40)));
        assert_eq!(live.spilled(), 0);
    }

    #[test]
    fn ids_the_table_cannot_hold_go_to_the_locked_map() {
        let live = Live::new(1024);
        for (id, dev, size) in [
            (0, 0, 1),
            (1, 0, 2),
            (2, 0, 3),
            (77, 300, 4),
            (78, 0, 1 << 60),
        ] {
            assert_eq!(live.insert(id, dev, size), None);
        }
        // 2 is an id like any other now.
        assert_eq!((live.spilled(), live.unpackable()), (4, 4));
        assert_eq!(live.remove(1), Some((0, 2)));
        assert_eq!(live.unpackable(), 3);
        assert_eq!(live.remove(77), Some((300, 4)));
        assert_eq!(live.remove(78), Some((0, 1 << 60)));
        assert_eq!(live.drain_device(0), (2, 4));
        assert_eq!((live.spilled(), live.unpackable()), (0, 0));
    }

    #[test]
    fn an_id_held_again_with_figures_the_table_cannot_hold_moves() {
        let live = Live::new(1024);
        let x = 0x7f00_0020_0000;
        assert_eq!(live.insert(x, 300, 4), None);
        assert_eq!(live.insert(x, 0, 5), Some((300, 4)));
        assert_eq!(live.unpackable(), 0);
        assert_eq!(live.insert(x, 301, 6), Some((0, 5)));
        assert_eq!(live.unpackable(), 1);
        assert_eq!(live.remove(x), Some((301, 6)));
        assert_eq!(live.remove(x), None);
        assert_eq!((live.spilled(), live.unpackable()), (0, 0));
    }

    /// Ids with the same home in a table of `live`'s size, from `from` on.
    fn same_home(live: &Live, home: usize, from: u64, n: usize) -> Vec<u64> {
        (from..)
            .step_by(1 << 12)
            .filter(|&id| live.home(id) == home)
            .take(n)
            .collect()
    }

    #[test]
    fn two_inserts_of_one_id_that_claim_two_slots_leave_one() {
        // Found in review: X's path holds Y, then a free slot. One insert of X looks and picks that slot; before
        // it claims it, Y is freed and another insert of X takes Y's slot, nearer home. Both claims land.
        let live = Live::new(1024);
        let ids = same_home(&live, 200, 1 << 21, 3);
        let (x, y, z) = (ids[0], ids[1], ids[2]);
        live.insert(y, 0, 1);
        live.insert(z, 0, 1);
        live.remove(z);
        let (a, b) = ((0, 100), (0, 200));
        let mut once = true;
        let first = live.insert_looked(x, a.0, a.1, || {
            if std::mem::take(&mut once) {
                assert_eq!(live.remove(y), Some((0, 1)));
                assert_eq!(live.insert(x, b.0, b.1), None);
            }
        });
        // The farther claim was taken back: its figures come back as an id held again's, the nearer one stays.
        assert_eq!(first, Some(a));
        assert_eq!(live.remove(x), Some(b));
        assert_eq!(live.remove(x), None, "one copy of x");
    }

    #[test]
    fn an_insert_sent_to_the_locked_map_meets_one_that_found_room() {
        // X's path is full (no free slot): one insert looks and heads for the locked map; before it gets there,
        // a slot on the path is freed and another insert of X claims it. One copy must stay, the other's figures
        // come back.
        let live = Live::new(1024);
        let crowd = same_home(&live, 300, 1 << 21, PROBE + 1);
        let x = crowd[PROBE];
        for &id in &crowd[..PROBE] {
            live.insert(id, 0, 1);
        }
        let mut once = true;
        let first = live.insert_looked(x, 0, 100, || {
            if std::mem::take(&mut once) {
                assert_eq!(live.remove(crowd[5]), Some((0, 1)));
                assert_eq!(live.insert(x, 0, 200), None);
            }
        });
        assert_eq!(first, Some((0, 200)));
        assert_eq!(live.remove(x), Some((0, 100)));
        assert_eq!(live.remove(x), None, "one copy of x");
        assert_eq!(live.spilled(), 0);
    }

    #[test]
    fn a_full_probe_spills_and_everything_is_still_found() {
        // Far more ids than the table holds: some land in the locked map, and every one is found once.
        let live = Live::new(64);
        let ids: Vec<u64> = (1..=500u64).map(|i| i << 21).collect();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(live.insert(id, (i % 3) as u32, i as u64 + 1), None);
        }
        assert!(live.spilled() >= 500 - 64);
        for (i, &id) in ids.iter().enumerate().step_by(2) {
            assert_eq!(live.remove(id), Some(((i % 3) as u32, i as u64 + 1)));
        }
        // Freed slots are taken again, and an id held in the locked map is not held twice.
        for (i, &id) in ids.iter().enumerate().skip(1).step_by(2) {
            assert_eq!(live.insert(id, 9, 1), Some(((i % 3) as u32, i as u64 + 1)));
        }
        assert_eq!(live.drain_device(9), (250, 250));
        for &id in &ids {
            assert_eq!(live.remove(id), None);
        }
        assert_eq!(live.spilled(), 0);
    }

    #[test]
    fn a_device_torn_down_gives_back_its_entries_only() {
        let live = Live::new(256);
        for i in 1..=100u64 {
            live.insert(i << 20, (i % 2) as u32, i);
        }
        let odd: u64 = (1..=100u64).filter(|i| i % 2 == 1).sum();
        assert_eq!(live.drain_device(1), (50, odd));
        assert_eq!(live.drain_device(1), (0, 0));
        assert_eq!(live.remove(2 << 20), Some((0, 2)));
        assert_eq!(live.remove(3 << 20), None);
    }

    #[test]
    fn threads_churning_lose_and_double_count_nothing() {
        // Each thread allocates and frees its own ids, reusing addresses the others freed (as a driver hands
        // them out again); every free must give back exactly what its allocation kept.
        let live = Arc::new(Live::new(1024));
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let live = live.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    let mut back = 0u64;
                    for i in 0..40_000u64 {
                        // 600 addresses per thread in flight at most, spread over 4,800 in all: the table runs
                        // near full and spills at times.
                        let id = ((t * 600 + i % 600) << 21) | 0x7f00_0000_0000;
                        if i >= 600 {
                            let (old, size) = held.remove(0);
                            assert_eq!(
                                live.remove(old),
                                Some((t as u32, size)),
                                "thread {t} free {i}"
                            );
                            back += size;
                        }
                        assert_eq!(live.insert(id, t as u32, i + 1), None);
                        held.push((id, i + 1));
                    }
                    for (id, size) in held {
                        assert_eq!(live.remove(id), Some((t as u32, size)));
                        back += size;
                    }
                    back
                })
            })
            .collect();
        let expected: u64 = (1..=40_000u64).sum();
        for t in threads {
            assert_eq!(t.join().unwrap(), expected);
        }
        assert_eq!(live.spilled(), 0);
        for t in 0..8 {
            assert_eq!(live.drain_device(t), (0, 0));
        }
    }

    #[test]
    fn two_threads_freeing_one_id_give_its_bytes_back_once() {
        // A program's double free racing with itself: both threads free every id at once; each id's bytes come
        // back to one of them.
        let live = Arc::new(Live::new(1 << 16));
        let ids: Vec<u64> = (1..=20_000u64).map(|i| i << 21).collect();
        for round in 0..20 {
            for &id in &ids {
                assert_eq!(live.insert(id, 0, 1), None);
            }
            let go = Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = (0..2)
                .map(|_| {
                    let (live, go, ids) = (live.clone(), go.clone(), ids.clone());
                    std::thread::spawn(move || {
                        go.wait();
                        ids.iter().filter(|&&id| live.remove(id).is_some()).count()
                    })
                })
                .collect();
            let got: usize = racers.into_iter().map(|t| t.join().unwrap()).sum();
            assert_eq!(got, ids.len(), "round {round}");
        }
    }

    #[test]
    fn a_teardown_racing_a_reused_address_gives_back_each_allocation_once() {
        // The driver freed a torn-down device's memory; until the drain, the table still holds those entries.
        // Another thread is handed the same addresses on another device meanwhile (a held-again id: its old
        // figures come back from `insert`). Each old allocation's bytes must come back once, by the drain or by
        // the insert, and every new one must stay (found in review: a drain that read the value, then took the
        // slot by its id alone, gave the old bytes back twice and lost the new entry).
        for round in 0..50 {
            let live = Arc::new(Live::new(1 << 16));
            let ids: Vec<u64> = (1..=5_000u64).map(|i| i << 21).collect();
            for &id in &ids {
                live.insert(id, 0, id >> 21);
            }
            let (l2, ids2) = (live.clone(), ids.clone());
            let reuser = std::thread::spawn(move || {
                ids2.iter()
                    .map(|&id| {
                        l2.insert(id, 1, 1 << 30).map_or(0, |(d, b)| {
                            assert_eq!(d, 0);
                            b
                        })
                    })
                    .sum::<u64>()
            });
            let (_, drained) = live.drain_device(0);
            let given_back_by_insert = reuser.join().unwrap();
            let old: u64 = (1..=5_000u64).sum();
            assert_eq!(drained + given_back_by_insert, old, "round {round}");
            for &id in &ids {
                assert_eq!(
                    live.remove(id),
                    Some((1, 1 << 30)),
                    "round {round}: the new entry stayed"
                );
            }
        }
    }

    #[test]
    fn a_free_racing_a_held_again_id_gives_each_figure_back_once() {
        // A program's free racing the shim seeing the same address allocated again (its earlier free unseen):
        // whatever the order, the old and the new figures each come back exactly once.
        for _ in 0..2_000 {
            let live = Arc::new(Live::new(64));
            live.insert(0x4000_0000, 0, 100);
            let go = Arc::new(std::sync::Barrier::new(2));
            let (l2, g2) = (live.clone(), go.clone());
            let freer = std::thread::spawn(move || {
                g2.wait();
                l2.remove(0x4000_0000)
            });
            go.wait();
            let replaced = live.insert(0x4000_0000, 0, 200);
            let freed = freer.join().unwrap();
            let left = live.remove(0x4000_0000);
            let mut got: Vec<u64> = [replaced, freed, left]
                .iter()
                .flatten()
                .map(|&(_, b)| b)
                .collect();
            got.sort();
            assert_eq!(
                got,
                vec![100, 200],
                "replaced {replaced:?} freed {freed:?} left {left:?}"
            );
        }
    }

    #[test]
    fn a_spilled_id_does_not_put_the_others_behind_the_lock() {
        let live = Arc::new(Live::new(1024));
        // 33 ids with the same home: the 33rd finds its path full and goes to the locked map.
        let same: Vec<u64> = (1u64 << 21..)
            .step_by(1 << 12)
            .filter(|&id| live.home(id) == 100)
            .take(PROBE + 1)
            .collect();
        for &id in &same {
            live.insert(id, 0, 7);
        }
        assert_eq!(live.spilled(), 1);
        // Ids far from that path, whose paths hold empty slots.
        let elsewhere: Vec<u64> = (1u64 << 40..)
            .step_by(1 << 12)
            .filter(|&id| live.home(id) > 300 && live.home(id) < 900)
            .take(100)
            .collect();
        let held = live.spill.lock().unwrap();
        let l2 = live.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut back = 0;
            for &id in &elsewhere {
                assert_eq!(l2.insert(id, 0, 3), None);
            }
            for &id in &elsewhere {
                back += l2.remove(id).map_or(0, |(_, b)| b);
                assert_eq!(l2.remove(id), None, "a free the table never held");
            }
            tx.send(back).unwrap();
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(300),
            "the others went on while the locked map was held"
        );
        drop(held);
        assert_eq!(live.remove(same[PROBE]), Some((0, 7)));
        assert_eq!(live.spilled(), 0);
    }
}
