//! What a pickle reads as: its values ([`V`]) and the document that holds them with their strings ([`Doc`]).

use std::collections::HashMap;

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
    pub(super) ids: HashMap<String, u32>,
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
