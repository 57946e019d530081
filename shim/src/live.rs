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
    /// Ids the table could not hold. `spilled` counts them: 0, and nobody looks (nor locks).
    spill: Mutex<HashMap<u64, (u32, u64), BuildHasherDefault<IdHasher>>>,
    spilled: AtomicUsize,
    /// Of them, those the table cannot hold at all (see `packs`): a miss in the table looks in the locked map
    /// only when its path is full or these are there.
    unpackable: AtomicUsize,
}

impl Live {
    /// A table of `capacity` slots (a power of two). Zeroed memory from the allocator: its pages are the
    /// kernel's zero page until a slot on them is first claimed.
    pub(crate) fn new(capacity: usize) -> Live {
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
        if !packs(id, dev, size) {
            return self.spill_insert(id, dev, size);
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
                let w = s.load(Ordering::Acquire);
                match key_of(w) {
                    k if k == id => {
                        if s.compare_exchange(w, new, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                        {
                            return Some(unpack(val_of(w)));
                        }
                        free = None;
                        path_full = false;
                        break;
                    }
                    EMPTY => {
                        free.get_or_insert((s, w));
                        path_full = false;
                        break;
                    }
                    TOMB if free.is_none() => free = Some((s, w)),
                    _ => {}
                }
            }
            let Some((s, was)) = free else {
                if path_full {
                    // No room on the path: the locked map holds it (and may hold it already).
                    return self.spill_insert(id, dev, size);
                }
                continue;
            };
            if s.compare_exchange(was, new, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // A path with no empty slot may have sent this id to the locked map before: it is held here now.
            return if path_full {
                self.spill_remove(id)
            } else {
                None
            };
        }
    }

    /// Takes `id` out, with what it held; `None` if it was not held (or another thread took it first).
    pub(crate) fn remove(&self, id: u64) -> Option<(u32, u64)> {
        let mut path_full = true;
        if id > TOMB {
            let home = self.home(id);
            'path: for i in 0..PROBE {
                let s = self.slot(home, i);
                let mut w = s.load(Ordering::Acquire);
                loop {
                    match key_of(w) {
                        k if k == id => {
                            match s.compare_exchange(
                                w,
                                word(TOMB, 0),
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            ) {
                                Ok(_) => return Some(unpack(val_of(w))),
                                // Its value replaced meanwhile (held again), or taken: look at what is there now.
                                Err(now) => w = now,
                            }
                        }
                        EMPTY => {
                            path_full = false;
                            break 'path;
                        }
                        _ => continue 'path,
                    }
                }
            }
        }
        if path_full || self.unpackable.load(Ordering::Acquire) > 0 {
            self.spill_remove(id)
        } else {
            None
        }
    }

    /// Takes out every entry on `dev`: (count, bytes).
    pub(crate) fn drain_device(&self, dev: u32) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        for s in self.slots.iter() {
            let w = s.load(Ordering::Acquire);
            if key_of(w) <= TOMB {
                continue;
            }
            let (d, b) = unpack(val_of(w));
            // Only the entry as read: one freed, replaced or taken meanwhile is not this device's to give back.
            if d == dev
                && s.compare_exchange(w, word(TOMB, 0), Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                n += 1;
                bytes += b;
            }
        }
        if self.spilled.load(Ordering::Acquire) > 0 {
            if let Ok(mut m) = self.spill.lock() {
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
                self.unpackable.fetch_sub(odd, Ordering::AcqRel);
                self.spilled.store(m.len(), Ordering::Release);
            }
        }
        (n, bytes)
    }

    #[cold]
    fn spill_insert(&self, id: u64, dev: u32, size: u64) -> Option<(u32, u64)> {
        let mut m = self.spill.lock().ok()?;
        // Counted before the map says it holds it: a miss that reads the count afterwards looks there.
        if !packs(id, dev, size) {
            self.unpackable.fetch_add(1, Ordering::AcqRel);
        }
        let old = m.insert(id, (dev, size));
        if let Some((d, b)) = old {
            if !packs(id, d, b) {
                self.unpackable.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.spilled.store(m.len(), Ordering::Release);
        old
    }

    #[inline]
    fn spill_remove(&self, id: u64) -> Option<(u32, u64)> {
        if self.spilled.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.spill_remove_locked(id)
    }

    #[cold]
    fn spill_remove_locked(&self, id: u64) -> Option<(u32, u64)> {
        let mut m = self.spill.lock().ok()?;
        let old = m.remove(&id);
        if let Some((d, size)) = old {
            if !packs(id, d, size) {
                self.unpackable.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.spilled.store(m.len(), Ordering::Release);
        old
    }

    /// Ids held in the locked map (tests).
    #[cfg(test)]
    fn spilled(&self) -> usize {
        self.spilled.load(Ordering::Acquire)
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
        assert_eq!(live.spilled(), 4);
        assert_eq!(live.remove(1), Some((0, 2)));
        assert_eq!(live.remove(77), Some((300, 4)));
        assert_eq!(live.remove(78), Some((0, 1 << 60)));
        assert_eq!(live.drain_device(0), (2, 4));
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
