//! A process's loaded objects over every `Objects` record it sent: what the replay's call sites and the
//! collector's frame names (`crate::names::frame_names`) look a native return address up in.

use std::collections::HashMap;

use vramtrace_format::Object;

/// Distinct objects kept per process.
pub const MAX_OBJECTS: usize = 1 << 16;

/// One loaded object as a process listed it, over all its lists.
#[derive(Clone)]
pub struct ObjEntry {
    pub path: Box<str>,
    pub bias: u64,
    pub text: Vec<(u64, u64)>,
    pub build_id: Vec<u8>,
    /// The first and last lists (generations) naming it.
    first: u32,
    last: u32,
}

/// A process's loaded objects: every list it sent, merged. An address is looked up in the objects loaded when
/// its stack arrived, else in the latest list, else in earlier ones (newest first).
#[derive(Default)]
pub struct ObjectTable {
    gen: u32,
    entries: Vec<ObjEntry>,
    index: HashMap<(Box<str>, u64, Vec<u8>), usize>,
}

impl ObjectTable {
    pub fn update(&mut self, objects: Vec<Object>) {
        self.gen += 1;
        for o in objects {
            let key = (o.path.into_boxed_str(), o.bias, o.build_id);
            match self.index.get(&key) {
                Some(&i) => {
                    let e = &mut self.entries[i];
                    e.last = self.gen;
                    e.text = o.text;
                }
                None if self.entries.len() < MAX_OBJECTS => {
                    self.entries.push(ObjEntry {
                        path: key.0.clone(),
                        bias: key.1,
                        text: o.text,
                        build_id: key.2.clone(),
                        first: self.gen,
                        last: self.gen,
                    });
                    self.index.insert(key, self.entries.len() - 1);
                }
                None => {}
            }
        }
    }

    /// The list the latest `Objects` record made (0 before any).
    pub fn gen(&self) -> u32 {
        self.gen
    }

    pub fn find(&self, addr: u64, gen: u32) -> Option<&ObjEntry> {
        let has = |e: &&ObjEntry| e.text.iter().any(|&(a, b)| addr >= a && addr < b);
        let alive = |e: &&ObjEntry| e.first <= gen && gen <= e.last;
        self.entries
            .iter()
            .filter(has)
            .max_by_key(|e| (alive(e), e.last))
    }
}
