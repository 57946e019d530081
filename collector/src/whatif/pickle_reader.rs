//! A PyTorch snapshot read for the what-if, fast: a small pickle machine for the opcodes Python writes for plain
//! data (dicts, lists, tuples, strings, numbers), with every string interned once, so a million history entries
//! cost neither a string nor a map each. serde-pickle took 3 s for a million entries; the what-if's target is
//! 5 s in all (docs/BENCHMARKS.md).
//!
//! The input is untrusted. It is walked first by `pickle_depth` (nesting at most 200 deep, at most 1 GiB to
//! build once shared values are copied), and the machine itself checks every length and stack access: it ends
//! in an error, never a panic, on anything else. Every opcode costs it constant time (a memo key is found in a
//! map, never by a search of the stack), and an item memoized under many keys is copied into the memo once.
//! Objects (`GLOBAL`, `REDUCE`, ...) are refused: a snapshot has none.

use std::collections::HashMap;
use std::rc::Rc;

use crate::pickle_depth::{le, take};

/// A value: strings are ids into [`Doc::strings`].
#[derive(Clone, Debug, PartialEq)]
pub enum V {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(u32),
    Bytes,
    List(Vec<V>),
    Tuple(Vec<V>),
    Dict(Vec<(V, V)>),
}

/// A pickle read: its value and its strings.
#[derive(Debug)]
pub struct Doc {
    pub root: V,
    pub strings: Vec<String>,
    ids: HashMap<String, u32>,
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
}

impl V {
    /// The value under key id `k` of a dict.
    pub fn get(&self, k: Option<u32>) -> Option<&V> {
        let k = k?;
        match self {
            V::Dict(items) => items
                .iter()
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

    pub fn int(&self) -> Option<i64> {
        match self {
            V::Int(i) => Some(*i),
            V::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
}

/// A stack item: its value and the memo keys it was stored under. The memo keeps objects, not copies: a list
/// memoized empty and filled afterwards is read back full. An item enters the memo when it leaves the stack
/// (into its container, or as the result), complete; a get of one still on the stack copies it as it is.
struct Item {
    v: V,
    keys: Vec<u64>,
}

fn item(v: V) -> Option<Item> {
    Some(Item {
        v,
        keys: Vec::new(),
    })
}

/// The memo: complete values by key (one copy, however many keys), and where the items still on the stack that
/// have keys are.
#[derive(Default)]
struct Memo {
    done: HashMap<u64, Rc<V>>,
    /// Key to stack position, for an item not yet settled.
    pending: HashMap<u64, usize>,
    /// Keys given to items still on the stack (MEMOIZE's next key is `done` and these).
    pending_keys: u64,
}

/// The item's value, leaving the stack: copied into the memo under its keys, once.
fn settle(it: Item, memo: &mut Memo) -> V {
    if !it.keys.is_empty() {
        let v = Rc::new(it.v.clone());
        memo.pending_keys -= it.keys.len() as u64;
        for k in it.keys {
            memo.pending.remove(&k);
            memo.done.insert(k, v.clone());
        }
    }
    it.v
}

/// Reads the pickle `b` (checked by `pickle_depth::depth` first).
pub fn read(b: &[u8]) -> Result<Doc, String> {
    crate::pickle_depth::depth(b)?;
    let mut strings: Vec<String> = Vec::new();
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut intern = |s: &[u8]| -> u32 {
        let text = String::from_utf8_lossy(s);
        if let Some(&i) = ids.get(text.as_ref()) {
            return i;
        }
        let i = strings.len() as u32;
        strings.push(text.clone().into_owned());
        ids.insert(text.into_owned(), i);
        i
    };
    // `None` marks a MARK.
    let mut stack: Vec<Option<Item>> = Vec::new();
    let mut memo = Memo::default();
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| take(b, i, n);
    let pop = |stack: &mut Vec<Option<Item>>, memo: &mut Memo| -> Result<V, String> {
        let it = stack.pop().flatten().ok_or("stack underflow")?;
        Ok(settle(it, memo))
    };
    let to_mark = |stack: &mut Vec<Option<Item>>, memo: &mut Memo| -> Result<Vec<V>, String> {
        let at = stack.iter().rposition(Option::is_none).ok_or("no mark")?;
        let items = stack.split_off(at + 1);
        stack.pop();
        Ok(items
            .into_iter()
            .flatten()
            .map(|it| settle(it, memo))
            .collect())
    };
    let pairs = |items: Vec<V>| -> Result<Vec<(V, V)>, String> {
        if !items.len().is_multiple_of(2) {
            return Err("odd number of dict items".into());
        }
        let mut it = items.into_iter();
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        Ok(out)
    };
    while i < b.len() {
        let op = b[i];
        i += 1;
        match op {
            b'.' => {
                let root = pop(&mut stack, &mut memo)?;
                return Ok(Doc { root, strings, ids });
            }
            b'(' => stack.push(None),
            b'N' => stack.push(item(V::None)),
            0x88 => stack.push(item(V::Bool(true))),
            0x89 => stack.push(item(V::Bool(false))),
            b'K' => {
                let v = le(take(&mut i, 1)?) as i64;
                stack.push(item(V::Int(v)));
            }
            b'M' => {
                let v = le(take(&mut i, 2)?) as i64;
                stack.push(item(V::Int(v)));
            }
            b'J' => {
                let v = le(take(&mut i, 4)?) as u32 as i32 as i64;
                stack.push(item(V::Int(v)));
            }
            0x8a => {
                let n = le(take(&mut i, 1)?) as usize;
                let bytes = take(&mut i, n)?;
                // Little-endian two's complement; past 8 bytes it does not fit: saturated.
                let v = if n == 0 {
                    0
                } else if n <= 8 {
                    let neg = bytes[n - 1] & 0x80 != 0;
                    let mut x = le(bytes);
                    if neg && n < 8 {
                        x |= u64::MAX << (8 * n);
                    }
                    x as i64
                } else if bytes[n - 1] & 0x80 != 0 {
                    i64::MIN
                } else {
                    i64::MAX
                };
                stack.push(item(V::Int(v)));
            }
            b'G' => {
                let s = take(&mut i, 8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(s);
                stack.push(item(V::Float(f64::from_be_bytes(a))));
            }
            0x8c | b'U' => {
                let n = le(take(&mut i, 1)?) as usize;
                let s = take(&mut i, n)?;
                stack.push(item(V::Str(intern(s))));
            }
            b'X' | b'T' => {
                let n = le(take(&mut i, 4)?) as usize;
                let s = take(&mut i, n)?;
                stack.push(item(V::Str(intern(s))));
            }
            0x8d => {
                let n = usize::try_from(le(take(&mut i, 8)?)).map_err(|_| "too long")?;
                let s = take(&mut i, n)?;
                stack.push(item(V::Str(intern(s))));
            }
            b'C' => {
                let n = le(take(&mut i, 1)?) as usize;
                take(&mut i, n)?;
                stack.push(item(V::Bytes));
            }
            b'B' => {
                let n = le(take(&mut i, 4)?) as usize;
                take(&mut i, n)?;
                stack.push(item(V::Bytes));
            }
            0x8e => {
                let n = usize::try_from(le(take(&mut i, 8)?)).map_err(|_| "too long")?;
                take(&mut i, n)?;
                stack.push(item(V::Bytes));
            }
            0x80 => {
                take(&mut i, 1)?;
            }
            0x95 => {
                take(&mut i, 8)?;
            }
            b']' | 0x8f => stack.push(item(V::List(Vec::new()))),
            b')' => stack.push(item(V::Tuple(Vec::new()))),
            b'}' => stack.push(item(V::Dict(Vec::new()))),
            b'l' => {
                let items = to_mark(&mut stack, &mut memo)?;
                stack.push(item(V::List(items)));
            }
            b't' | 0x91 => {
                let items = to_mark(&mut stack, &mut memo)?;
                stack.push(item(V::Tuple(items)));
            }
            b'd' => {
                let items = to_mark(&mut stack, &mut memo)?;
                stack.push(item(V::Dict(pairs(items)?)));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(pop(&mut stack, &mut memo)?);
                }
                items.reverse();
                stack.push(item(V::Tuple(items)));
            }
            b'a' => {
                let x = pop(&mut stack, &mut memo)?;
                match stack.last_mut() {
                    Some(Some(Item { v: V::List(l), .. })) => l.push(x),
                    _ => return Err("APPEND to a non-list".into()),
                }
            }
            b'e' | 0x90 => {
                let items = to_mark(&mut stack, &mut memo)?;
                match stack.last_mut() {
                    Some(Some(Item { v: V::List(l), .. })) => l.extend(items),
                    _ => return Err("APPENDS to a non-list".into()),
                }
            }
            b's' => {
                let v = pop(&mut stack, &mut memo)?;
                let k = pop(&mut stack, &mut memo)?;
                match stack.last_mut() {
                    Some(Some(Item { v: V::Dict(d), .. })) => d.push((k, v)),
                    _ => return Err("SETITEM on a non-dict".into()),
                }
            }
            b'u' => {
                let items = pairs(to_mark(&mut stack, &mut memo)?)?;
                match stack.last_mut() {
                    Some(Some(Item { v: V::Dict(d), .. })) => d.extend(items),
                    _ => return Err("SETITEMS on a non-dict".into()),
                }
            }
            b'0' => {
                let it = stack.pop().ok_or("stack underflow")?;
                if let Some(it) = it {
                    settle(it, &mut memo);
                }
            }
            b'1' => {
                to_mark(&mut stack, &mut memo)?;
            }
            b'2' => {
                let v = stack
                    .last()
                    .and_then(|t| t.as_ref())
                    .map(|t| t.v.clone())
                    .ok_or("stack underflow")?;
                stack.push(item(v));
            }
            b'q' | b'r' | 0x94 => {
                let k = match op {
                    b'q' => le(take(&mut i, 1)?),
                    b'r' => le(take(&mut i, 4)?),
                    _ => memo.done.len() as u64 + memo.pending_keys,
                };
                let at = stack.len().wrapping_sub(1);
                match stack.last_mut() {
                    Some(Some(t)) => t.keys.push(k),
                    _ => return Err("stack underflow".into()),
                }
                memo.pending_keys += 1;
                memo.pending.insert(k, at);
            }
            b'h' | b'j' => {
                let k = if op == b'h' {
                    le(take(&mut i, 1)?)
                } else {
                    le(take(&mut i, 4)?)
                };
                let v = match memo.done.get(&k) {
                    Some(v) => V::clone(v),
                    // Still on the stack (not yet in a container): as it is now.
                    None => memo
                        .pending
                        .get(&k)
                        .and_then(|&at| stack.get(at))
                        .and_then(|t| t.as_ref())
                        .map(|t| t.v.clone())
                        .ok_or("memo key not set")?,
                };
                stack.push(item(v));
            }
            other => return Err(format!("opcode {other:#04x} is not read here")),
        }
    }
    Err("no STOP: cut short".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Python writes: in fast mode (as the bridge does), or with the memo.
    fn python(program: &str, fast: bool) -> Vec<u8> {
        crate::pickle_depth::python_written(program, !fast)
    }

    /// The value as Python's `repr` would show it, for comparing with Python itself.
    fn show(d: &Doc, v: &V) -> String {
        match v {
            V::None => "None".into(),
            V::Bool(b) => if *b { "True" } else { "False" }.into(),
            V::Int(i) => i.to_string(),
            V::Float(f) => format!("{f:?}"),
            V::Str(_) => format!("'{}'", d.str(v).unwrap()),
            V::Bytes => "b''".into(),
            V::List(l) => format!(
                "[{}]",
                l.iter().map(|x| show(d, x)).collect::<Vec<_>>().join(", ")
            ),
            V::Tuple(l) if l.len() == 1 => format!("({},)", show(d, &l[0])),
            V::Tuple(l) => format!(
                "({})",
                l.iter().map(|x| show(d, x)).collect::<Vec<_>>().join(", ")
            ),
            V::Dict(p) => format!(
                "{{{}}}",
                p.iter()
                    .map(|(k, x)| format!("{}: {}", show(d, k), show(d, x)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    #[test]
    fn what_python_writes_is_read_back_as_python_sees_it_with_and_without_the_memo() {
        let program = "f = [dict(filename='a.py', line=3, name='f')]\n\
                       v = dict(device_traces=[[dict(action='alloc', addr=1 << 40, size=-5, big=1 << 62, \
                       t=(1, 2.5, None, True), frames=f) for _ in range(3)]], segments=[], e={}, \
                       s=frozenset(), b=b'x', n=-(1 << 70))";
        let want = std::process::Command::new("python3")
            .args([
                "-c",
                &format!(
                    "{}\nprint(repr(v))",
                    program
                        .replace("frozenset()", "()")
                        .replace("b'x'", "b''")
                        .replace("-(1 << 70)", "-9223372036854775808")
                ),
            ])
            .output()
            .unwrap();
        let want = String::from_utf8(want.stdout).unwrap().trim().to_string();
        for fast in [true, false] {
            let d = read(&python(program, fast)).unwrap();
            assert_eq!(show(&d, &d.root), want, "fast {fast}");
        }
    }

    #[test]
    fn bad_input_is_an_error_never_a_panic() {
        for b in [
            &b""[..],
            b"\x80\x04",
            b"\x80\x04a.",
            b"\x80\x04]K\x01s.",
            b"\x80\x04}K\x01u.",
            b"\x80\x04h\x07.",
            b"\x80\x04\x8c\xff",
            b"\x80\x04(\x85.",
            b"\x80\x04cos\nsystem\n.",
        ] {
            assert!(read(b).is_err(), "{b:?}");
        }
    }

    #[test]
    fn mutated_snapshots_are_read_or_refused_never_a_panic() {
        // A snapshot as the bridge writes it, then 3,000 mutants: bytes changed, cut, duplicated, shuffled.
        let good = python(
            "f = [dict(filename='a.py', line=3, name='f')]\n\
             v = dict(segments=[dict(device=0, total_size=1 << 21, blocks=[dict(address=1, size=2, \
             state='active_allocated', frames=f)])], device_traces=[[dict(action=a, addr=i, size=i * 512, \
             stream=0, time_us=i, frames=f) for i, a in enumerate(['alloc', 'free_completed', 'segment_alloc', \
             'oom'] * 5)]], allocator_settings=dict(max_split_size=-1, roundup_power2_divisions={'1': 4}))",
            true,
        );
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let mut read_ok = 0;
        for _ in 0..3000 {
            let mut b = good.clone();
            for _ in 0..1 + next(4) {
                if b.is_empty() {
                    break;
                }
                match next(4) {
                    0 => {
                        let at = next(b.len());
                        b[at] = next(256) as u8;
                    }
                    1 => b.truncate(next(b.len())),
                    2 => {
                        let (at, n) = (next(b.len()), next(16));
                        let piece: Vec<u8> = b[at..(at + n).min(b.len())].to_vec();
                        let to = next(b.len());
                        b.splice(to..to, piece);
                    }
                    _ => {
                        let (i, j) = (next(b.len()), next(b.len()));
                        b.swap(i, j);
                    }
                }
            }
            if let Ok(d) = read(&b) {
                read_ok += 1;
                // What was read can be taken apart as the what-if does.
                let mut notes = Vec::new();
                let hs = crate::whatif::history::from_snapshot(&d, 1, "m", "exit", &mut notes);
                if !hs.is_empty() {
                    let n = hs.len();
                    let _ = crate::whatif::answer::answer(
                        hs,
                        vec![0; n],
                        Default::default(),
                        Default::default(),
                        &crate::whatif::settings::default_grid()[..3],
                        None,
                    );
                }
            }
        }
        assert!(
            read_ok > 100,
            "{read_ok} of 3000 mutants read: the mutations are too harsh to test reading"
        );
    }
}
