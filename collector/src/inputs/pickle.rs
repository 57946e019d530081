//! The one reader of the pickles vramtrace is given: PyTorch's allocator snapshots (`report`, `oom`, `whatif`,
//! `export`, `run`'s post-mortem). A small pickle machine for the opcodes Python 3 writes for plain data
//! (protocols 2 to 5: dicts, lists, tuples, sets, strings, numbers, the memo), with every string interned once,
//! so a million history entries cost neither a string nor a map each.
//!
//! The input is untrusted (issue 36). Every value the machine would build is counted before it is built, in
//! the same walk ([`bound`]): nesting past [`MAX_DEPTH`], more than [`BUDGET`] bytes once shared values are
//! copied, more than [`MAX_STACK`] stack items or [`MAX_MEMO`] memo entries end the read with why. Every
//! length and stack access is checked: anything else ends in an error, never a panic. Objects (`GLOBAL`,
//! `REDUCE`, ...) and protocol 0's text opcodes are refused: a snapshot has none.

mod bound;
mod read;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

pub use bound::{BUDGET, MAX_DEPTH, MAX_MEMO, MAX_STACK};
pub use read::read;

/// A value: strings are ids into [`Doc::strings`]; sets are read as lists (a frozen one as a tuple).
#[derive(Clone, Debug, PartialEq)]
pub enum V {
    None,
    Bool(bool),
    Int(i64),
    /// An integer past 64-bit signed, saturated to it (PyTorch writes none).
    BigInt(i64),
    Float(f64),
    Str(u32),
    /// Bytes (a snapshot has none): their contents are not kept.
    Bytes,
    List(Vec<V>),
    Tuple(Vec<V>),
    /// In the pickle's order; a key given twice is found at its last (Python's dict keeps the last).
    Dict(Vec<(V, V)>),
}

/// A pickle read: its value, its strings, and how deeply it nests.
#[derive(Debug)]
pub struct Doc {
    pub root: V,
    pub strings: Vec<String>,
    ids: HashMap<String, u32>,
    /// The deepest nesting of containers read (PyTorch's snapshots nest about 8 deep).
    pub depth: usize,
}

impl Doc {
    /// The id of `s` if the pickle has that string at all.
    pub fn id(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    pub fn str(&self, v: &V) -> Option<&str> {
        match v {
            V::Str(i) => self.strings.get(*i as usize).map(String::as_str),
            _ => None,
        }
    }

    /// The value under the string key `key` of the dict `v` (looked up by text: for a key read once, where
    /// [`Doc::id`] and [`V::get`] serve a key read many times).
    pub fn get<'v>(&self, v: &'v V, key: &str) -> Option<&'v V> {
        v.get(self.id(key))
    }

    /// The text of `v`, if it is a string.
    pub fn text<'d>(&'d self, v: Option<&V>) -> Option<&'d str> {
        v.and_then(|v| self.str(v))
    }
}

impl V {
    /// The value under key id `k` of a dict.
    pub fn get(&self, k: Option<u32>) -> Option<&V> {
        let k = k?;
        match self {
            V::Dict(items) => items
                .iter()
                .rev()
                .find(|(key, _)| *key == V::Str(k))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn list(&self) -> &[V] {
        match self {
            V::List(l) | V::Tuple(l) => l,
            _ => &[],
        }
    }

    /// An integer, saturated past 64-bit signed (a bool is 0 or 1).
    pub fn int(&self) -> Option<i64> {
        match self {
            V::Int(i) | V::BigInt(i) => Some(*i),
            V::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// An integer only where it fits 64-bit signed exactly (a bool is 0 or 1).
    pub fn exact_int(&self) -> Option<i64> {
        match self {
            V::BigInt(_) => None,
            v => v.int(),
        }
    }
}

/// (Tests) What Python's pickle writes for `v` after `program` (protocol 4): in fast mode (no memo, as the bridge
/// writes), or `shared` (the memo: a value used twice is written once and referred to, as PyTorch's own
/// `_dump_snapshot` writes).
#[cfg(test)]
pub(crate) fn python_written(program: &str, shared: bool) -> Vec<u8> {
    let dump = if shared {
        "sys.stdout.buffer.write(pickle.dumps(v, protocol=4))"
    } else {
        "p = pickle.Pickler(sys.stdout.buffer, protocol=4)\np.fast = True\np.dump(v)"
    };
    let out = std::process::Command::new("python3")
        .args(["-c", &format!("import pickle,sys\n{program}\n{dump}")])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
