//! What the process holds under the cap, id -> (device, bytes): found and changed without a lock or an
//! allocation.
//!
//! Every capped allocation is kept here until its free, so that the free gives back the right bytes on the right
//! device. The table is open-addressed: an id lives at most `PROBE` slots past its home slot. One
//! compare-and-swap claims a slot, and one gives it back. A slot goes from empty to taken, from taken to free
//! (a tombstone) and back to taken, never back to empty. So an id is always found before the first empty slot
//! on its path, and a thread that reads a slot while another changes it sees one state or the other, never a
//! mix:
//!
//! ```text
//! EMPTY ──claim──▶ CLAIMED ──value, then id (release)──▶ id ──take (CAS)──▶ TOMB ──claim──▶ CLAIMED ...
//! ```
//!
//! An id with no room within its probe (a process holding tens of thousands of allocations that collide), or one
//! the table cannot hold (0 to 2, a device past 255, 2^56 bytes or more), goes to a locked map beside it. That
//! map is looked at only while it holds something, so the common path never takes its lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Slot keys that are not ids.
const EMPTY: u64 = 0;
const TOMB: u64 = 1;
const CLAIMED: u64 = 2;
/// The farthest an id lives from its home slot.
const PROBE: usize = 32;
/// Values pack the device in the top 8 bits and the bytes below.
const SIZE_BITS: u32 = 56;

#[repr(C, align(16))]
struct Slot {
    key: AtomicU64,
    val: AtomicU64,
}

/// Id -> (device, bytes) for what this process holds under the cap.
pub(crate) struct Live {
    slots: Box<[Slot]>,
    mask: usize,
    /// Ids the table could not hold. `spilled` counts them: 0, and nobody looks (nor locks).
    spill: Mutex<HashMap<u64, (u32, u64), BuildHasherDefault<IdHasher>>>,
    spilled: AtomicUsize,
}

impl Live {
    /// A table of `capacity` slots (a power of two). Zeroed memory from the allocator: its pages are the
    /// kernel's zero page until a slot on them is first claimed.
    pub(crate) fn new(capacity: usize) -> Live {
        assert!(capacity.is_power_of_two() && capacity >= PROBE);
        let layout = std::alloc::Layout::array::<Slot>(capacity).expect("a table of slots");
        // SAFETY: a zeroed `Slot` is two zero atomics (EMPTY); the box takes ownership of the allocation with the
        // layout it was made with.
        let slots = unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<Slot>();
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
        }
    }

    #[inline]
    fn home(&self, id: u64) -> usize {
        (mix(id) >> 32) as usize & self.mask
    }

    #[inline]
    fn slot(&self, home: usize, i: usize) -> &Slot {
        &self.slots[(home + i) & self.mask]
    }

    /// Keeps `id` as holding `size` bytes on `dev`. If `id` was held already (its free went by a path the shim
    /// does not see), what it held.
    pub(crate) fn insert(&self, id: u64, dev: u32, size: u64) -> Option<(u32, u64)> {
        if id <= CLAIMED || dev > 0xff || size >> SIZE_BITS != 0 {
            return self.spill_insert(id, dev, size);
        }
        let val = (dev as u64) << SIZE_BITS | size;
        let home = self.home(id);
        // A claim lost to another thread's: look again (each loss is another id taking a slot, so this ends).
        'look: loop {
            let mut free = None;
            for i in 0..PROBE {
                let s = self.slot(home, i);
                match s.key.load(Ordering::Acquire) {
                    k if k == id => return Some(unpack(s.val.swap(val, Ordering::AcqRel))),
                    EMPTY => {
                        free.get_or_insert((s, EMPTY));
                        break;
                    }
                    TOMB if free.is_none() => free = Some((s, TOMB)),
                    _ => {}
                }
            }
            let old = self.spill_remove(id);
            let Some((s, was)) = free else {
                self.spill_insert(id, dev, size);
                return old;
            };
            if s.key
                .compare_exchange(was, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                if let Some((d, b)) = old {
                    self.spill_insert(id, d, b);
                }
                continue 'look;
            }
            s.val.store(val, Ordering::Relaxed);
            // Release: whoever reads the id reads its value.
            s.key.store(id, Ordering::Release);
            return old;
        }
    }

    /// Takes `id` out, with what it held; `None` if it was not held (or another thread took it first).
    pub(crate) fn remove(&self, id: u64) -> Option<(u32, u64)> {
        if id > CLAIMED {
            let home = self.home(id);
            for i in 0..PROBE {
                let s = self.slot(home, i);
                match s.key.load(Ordering::Acquire) {
                    k if k == id => {
                        let val = s.val.load(Ordering::Relaxed);
                        return s
                            .key
                            .compare_exchange(id, TOMB, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                            .then(|| unpack(val));
                    }
                    EMPTY => break,
                    _ => {}
                }
            }
        }
        self.spill_remove(id)
    }

    /// Takes out every entry on `dev`: (count, bytes).
    pub(crate) fn drain_device(&self, dev: u32) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        for s in self.slots.iter() {
            let k = s.key.load(Ordering::Acquire);
            if k <= CLAIMED {
                continue;
            }
            let (d, b) = unpack(s.val.load(Ordering::Relaxed));
            if d == dev
                && s.key
                    .compare_exchange(k, TOMB, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                n += 1;
                bytes += b;
            }
        }
        if self.spilled.load(Ordering::Acquire) > 0 {
            if let Ok(mut m) = self.spill.lock() {
                m.retain(|_, (d, size)| {
                    if *d == dev {
                        n += 1;
                        bytes += *size;
                        false
                    } else {
                        true
                    }
                });
                self.spilled.store(m.len(), Ordering::Release);
            }
        }
        (n, bytes)
    }

    #[cold]
    fn spill_insert(&self, id: u64, dev: u32, size: u64) -> Option<(u32, u64)> {
        let mut m = self.spill.lock().ok()?;
        let old = m.insert(id, (dev, size));
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
        self.spilled.store(m.len(), Ordering::Release);
        old
    }

    /// Ids held in the locked map (tests).
    #[cfg(test)]
    fn spilled(&self) -> usize {
        self.spilled.load(Ordering::Acquire)
    }
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
        assert_eq!(live.spilled(), 5);
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
}
