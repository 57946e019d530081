//! A process's call sites by hash: each distinct stack's id, given once (from 1) and remembered only once its
//! `Record::Stack` is queued, so no event names an id the collector cannot know. Sharded: a thread that misses
//! its own cache (stacks.rs) takes one of [`SHARDS`] locks. Kept in the process's recorder (a forked child
//! starts afresh with its own).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use vramtrace_format::Stack;

/// The most distinct stacks per process.
pub const MAX_STACKS: u32 = 1 << 20;
/// Locks of the interning table (a power of two).
const SHARDS: usize = 64;

/// The process's stacks: hash -> id, sharded.
pub struct Table {
    shards: [Mutex<HashMap<u64, u32, BuildHasherDefault<Prehashed>>>; SHARDS],
    /// The last id given.
    last: AtomicU32,
    /// The Python walker said it cannot read this interpreter (or failed): native stacks only.
    pub(crate) python_off: AtomicBool,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::default())),
            last: AtomicU32::new(0),
            python_off: AtomicBool::new(false),
        }
    }
}

impl Table {
    /// The id of the stack hashed `h`. A new one gets the next id, is built by `make` and handed to `offer`
    /// while its shard is locked; it is remembered only if `offer` queued it (else 0, and it is tried again
    /// next time).
    pub(crate) fn intern(
        &self,
        h: u64,
        make: impl FnOnce() -> Box<Stack>,
        offer: impl FnOnce(Box<Stack>) -> bool,
    ) -> u32 {
        let shard = &self.shards[(h >> 32) as usize & (SHARDS - 1)];
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = map.get(&h) {
            return id;
        }
        if self.last.load(Ordering::Relaxed) >= MAX_STACKS {
            return 0;
        }
        let id = self.last.fetch_add(1, Ordering::Relaxed) + 1;
        if id > MAX_STACKS {
            return 0;
        }
        let mut stack = make();
        stack.id = id;
        if !offer(stack) {
            return 0;
        }
        map.insert(h, id);
        id
    }

    /// Distinct stacks given an id so far.
    pub fn len(&self) -> u32 {
        self.last.load(Ordering::Relaxed).min(MAX_STACKS)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The table's keys are already hashes.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_gives_ids_from_one_and_sends_each_stack_once() {
        let t = Table::default();
        let mut sent = Vec::new();
        let mk = |id| {
            move || {
                Box::new(Stack {
                    pid: 1,
                    id,
                    native: vec![],
                    python: vec![],
                })
            }
        };
        let a = t.intern(10, mk(0), |s| {
            sent.push(s.id);
            true
        });
        let b = t.intern(11, mk(0), |s| {
            sent.push(s.id);
            true
        });
        let a2 = t.intern(10, mk(0), |_| panic!("sent twice"));
        assert_eq!((a, b, a2), (1, 2, 1));
        assert_eq!(sent, vec![1, 2]);
        // A stack the channel refused is not remembered: tried again (with a new id).
        assert_eq!(t.intern(12, mk(0), |_| false), 0);
        assert_eq!(t.intern(12, mk(0), |_| true), 4);
    }
}
