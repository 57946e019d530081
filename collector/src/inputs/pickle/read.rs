//! The pickle machine: one walk of the opcodes that builds the value and counts what it builds as it goes
//! ([`super::bound`]), refusing before it copies past the budget. Every opcode costs constant time besides the
//! items it moves (a memo key is found in a map, never by a search of the stack), and an item memoized under
//! many keys is copied into the memo once.

use std::collections::HashMap;
use std::rc::Rc;

use super::bound::{Bound, Figures, MEMO_BYTES, VALUE_BYTES};

const _: () = assert!(std::mem::size_of::<Option<Item>>() == 56);
use super::doc::{Doc, V};

/// A stack item: its value, its figures, and the memo keys it was stored under. The memo keeps objects, not
/// copies: a list memoized empty and filled afterwards is read back full. So an item enters the memo when it
/// leaves the stack (into its container, or as the result), complete; a get of one still on the stack copies
/// it as it is.
struct Item {
    v: V,
    fig: Figures,
    /// Boxed: few items have keys, and a smaller item is a faster stack (56 bytes, as before the figures);
    /// the second allocation is made only for a memoized item.
    #[allow(clippy::box_collection)]
    keys: Option<Box<Vec<u64>>>,
}

/// The memo: complete values by key (one copy, however many keys), and where the items still on the stack that
/// have keys are.
#[derive(Default)]
struct Memo {
    done: HashMap<u64, (Rc<V>, Figures)>,
    /// Key to stack position, for an item not yet settled.
    pending: HashMap<u64, usize>,
    /// Keys given to items still on the stack (MEMOIZE's next key is `done` and these).
    pending_keys: u64,
}

struct Machine<'b> {
    b: &'b [u8],
    i: usize,
    /// `None` marks a MARK.
    stack: Vec<Option<Item>>,
    memo: Memo,
    bound: Bound,
    strings: Vec<String>,
    ids: HashMap<String, u32>,
}

/// A little-endian unsigned integer of up to 8 bytes.
fn le(s: &[u8]) -> u64 {
    s.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64)
}

/// A LONG's little-endian two's complement: past 64-bit signed it is saturated (PyTorch writes none).
fn long(bytes: &[u8]) -> V {
    let Some(&last) = bytes.last() else {
        return V::Int(0);
    };
    let neg = last & 0x80 != 0;
    let (low, high) = bytes.split_at(bytes.len().min(8));
    // Past 8 bytes it fits only if every further byte, and the 64th bit, repeat the sign.
    let sign = if neg { 0xff } else { 0 };
    let fits = high.iter().all(|&x| x == sign) && (high.is_empty() || (low[7] & 0x80 != 0) == neg);
    if !fits {
        return V::BigInt(if neg { i64::MIN } else { i64::MAX });
    }
    let mut x = le(low);
    if neg && low.len() < 8 {
        x |= u64::MAX << (8 * low.len());
    }
    V::Int(x as i64)
}

/// A dict's items from alternating keys and values.
fn pairs(items: Vec<V>) -> Result<Vec<(V, V)>, String> {
    if !items.len().is_multiple_of(2) {
        return Err("odd number of dict items".into());
    }
    let mut it = items.into_iter();
    let mut out = Vec::with_capacity(it.len() / 2);
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}

/// Figures of items side by side: the deepest and the bytes of all.
fn beside(a: Figures, b: Figures) -> Figures {
    (a.0.max(b.0), a.1.saturating_add(b.1))
}

impl<'b> Machine<'b> {
    /// The next `n` bytes, moving past them; "cut short" where the input ends first.
    fn take(&mut self, n: usize) -> Result<&'b [u8], String> {
        let b: &'b [u8] = self.b;
        let end = self
            .i
            .checked_add(n)
            .filter(|&e| e <= b.len())
            .ok_or("cut short")?;
        let s = &b[self.i..end];
        self.i = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        Ok(le(self.take(n)?))
    }

    /// The bytes after a length of `n` bytes.
    fn counted(&mut self, n: usize) -> Result<&'b [u8], String> {
        let len = usize::try_from(self.uint(n)?).map_err(|_| "too long")?;
        self.take(len)
    }

    fn intern(&mut self, s: &[u8]) -> u32 {
        let text = String::from_utf8_lossy(s);
        if let Some(&i) = self.ids.get(text.as_ref()) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(text.clone().into_owned());
        self.ids.insert(text.into_owned(), i);
        i
    }

    fn push(&mut self, v: V, fig: Figures) -> Result<(), String> {
        self.stack.push(Some(Item { v, fig, keys: None }));
        self.bound.nest(fig.0)?;
        self.bound.stack(self.stack.len())
    }

    /// A value without items, of `text` bytes besides: counted, then pushed.
    fn scalar(&mut self, text: usize, v: impl FnOnce(&mut Self) -> V) -> Result<(), String> {
        let fig = (0, VALUE_BYTES.saturating_add(text as u64));
        self.bound.spend(fig.1)?;
        let v = v(self);
        self.push(v, fig)
    }

    /// The item's value, leaving the stack: copied into the memo under its keys, once.
    fn settle(&mut self, it: Item) -> Result<(V, Figures), String> {
        if let Some(keys) = it.keys {
            self.bound.spend(it.fig.1)?;
            let v = Rc::new(it.v.clone());
            self.memo.pending_keys -= keys.len() as u64;
            for k in *keys {
                self.memo.pending.remove(&k);
                self.memo.done.insert(k, (v.clone(), it.fig));
            }
        }
        Ok((it.v, it.fig))
    }

    fn pop(&mut self) -> Result<(V, Figures), String> {
        let it = self.stack.pop().flatten().ok_or("stack underflow")?;
        self.settle(it)
    }

    /// The items above the last MARK, and their figures together; the MARK goes.
    fn pop_to_mark(&mut self) -> Result<(Vec<V>, Figures), String> {
        let at = self
            .stack
            .iter()
            .rposition(Option::is_none)
            .ok_or("no mark")?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        self.bound.close_mark();
        let mut inner = (0, 0);
        let mut out = Vec::with_capacity(items.len());
        for it in items.into_iter().flatten() {
            let (v, fig) = self.settle(it)?;
            inner = beside(inner, fig);
            out.push(v);
        }
        Ok((out, inner))
    }

    /// A new container holding `inner`.
    fn make(&mut self, v: V, inner: Figures) -> Result<(), String> {
        self.bound.spend(VALUE_BYTES)?;
        self.push(v, (inner.0 + 1, VALUE_BYTES.saturating_add(inner.1)))
    }

    /// The container on top, to be filled with items of figures `inner`: `what` says which kind it must be.
    fn top(&mut self, inner: Figures, what: &str) -> Result<&mut V, String> {
        let Some(Some(top)) = self.stack.last_mut() else {
            return Err(format!("{what} on an empty stack"));
        };
        top.fig = (
            top.fig.0.max(inner.0 + 1),
            top.fig.1.saturating_add(inner.1),
        );
        self.bound.nest(top.fig.0)?;
        Ok(&mut top.v)
    }

    /// A copy of the top, or of a memoized value: counted, then made.
    fn copy(&mut self, v: &V, fig: Figures) -> Result<(), String> {
        self.bound.spend(fig.1)?;
        self.push(v.clone(), fig)
    }

    fn memoize(&mut self, k: u64) -> Result<(), String> {
        self.bound.spend(MEMO_BYTES)?;
        let at = self.stack.len().wrapping_sub(1);
        match self.stack.last_mut() {
            Some(Some(t)) => t.keys.get_or_insert_default().push(k),
            _ => return Err("stack underflow".into()),
        }
        self.memo.pending_keys += 1;
        self.memo.pending.insert(k, at);
        self.bound
            .memo(self.memo.done.len() + self.memo.pending.len())
    }

    fn get(&mut self, k: u64) -> Result<(), String> {
        if let Some((v, fig)) = self.memo.done.get(&k).cloned() {
            return self.copy(&v, fig);
        }
        // Still on the stack (not yet in a container): as it is now.
        let at = *self.memo.pending.get(&k).ok_or("memo key not set")?;
        self.copy_at(at)
            .map_err(|e| e.unwrap_or_else(|| "memo key not set".into()))
    }

    /// A copy of the stack item at `at`: counted, then made; `Err(None)` if there is none.
    fn copy_at(&mut self, at: usize) -> Result<(), Option<String>> {
        let Some(Some(it)) = self.stack.get(at) else {
            return Err(None);
        };
        self.bound.spend(it.fig.1)?;
        let (v, fig) = (it.v.clone(), it.fig);
        Ok(self.push(v, fig)?)
    }

    /// One opcode, `op`, read: a mark, a value read from the input (a scalar, a string, bytes), framing; the
    /// rest in [`Machine::build`].
    fn step(&mut self, op: u8) -> Result<(), String> {
        match op {
            b'(' => {
                self.stack.push(None);
                self.bound.open_mark()?;
                self.bound.stack(self.stack.len())?;
            }
            b'N' => self.scalar(0, |_| V::None)?,
            0x88 => self.scalar(0, |_| V::Bool(true))?,
            0x89 => self.scalar(0, |_| V::Bool(false))?,
            b'K' => {
                let v = self.uint(1)? as i64;
                self.scalar(0, |_| V::Int(v))?;
            }
            b'M' => {
                let v = self.uint(2)? as i64;
                self.scalar(0, |_| V::Int(v))?;
            }
            b'J' => {
                let v = self.uint(4)? as u32 as i32 as i64;
                self.scalar(0, |_| V::Int(v))?;
            }
            0x8a | 0x8b => {
                let s = self.counted(if op == 0x8a { 1 } else { 4 })?;
                self.scalar(s.len(), |_| long(s))?;
            }
            b'G' => {
                let mut a = [0u8; 8];
                a.copy_from_slice(self.take(8)?);
                self.scalar(0, |_| V::Float(f64::from_be_bytes(a)))?;
            }
            // Strings (BINUNICODE and Python 2's BINSTRING, short, 4- and 8-byte lengths).
            0x8c | b'U' | b'X' | b'T' | 0x8d => {
                let s = self.counted(match op {
                    0x8c | b'U' => 1,
                    0x8d => 8,
                    _ => 4,
                })?;
                self.scalar(s.len(), |m| V::Str(m.intern(s)))?;
            }
            // Bytes and bytearrays.
            b'C' | b'B' | 0x8e | 0x96 => {
                let s = self.counted(match op {
                    b'C' => 1,
                    b'B' => 4,
                    _ => 8,
                })?;
                self.scalar(s.len(), |_| V::Bytes)?;
            }
            // PROTO, FRAME: nothing to build.
            0x80 => {
                self.take(1)?;
            }
            0x95 => {
                self.take(8)?;
            }
            _ => self.build(op)?,
        }
        Ok(())
    }

    /// The opcodes [`Machine::step`] does not read a value for: those that build from the stack (containers
    /// and their filling), work on the stack itself, or on the memo; and any other, refused. Apart from
    /// `step`'s values read from the input so that each half reads as one kind of work.
    #[inline]
    fn build(&mut self, op: u8) -> Result<(), String> {
        match op {
            b']' | 0x8f => self.make(V::List(Vec::new()), (0, 0))?,
            b')' => self.make(V::Tuple(Vec::new()), (0, 0))?,
            b'}' => self.make(V::Dict(Vec::new()), (0, 0))?,
            b'l' => {
                let (items, inner) = self.pop_to_mark()?;
                self.make(V::List(items), inner)?;
            }
            b't' | 0x91 => {
                let (items, inner) = self.pop_to_mark()?;
                self.make(V::Tuple(items), inner)?;
            }
            b'd' => {
                let (items, inner) = self.pop_to_mark()?;
                self.make(V::Dict(pairs(items)?), inner)?;
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let (mut items, mut inner) = (Vec::with_capacity(n), (0, 0));
                for _ in 0..n {
                    let (v, fig) = self.pop()?;
                    inner = beside(inner, fig);
                    items.push(v);
                }
                items.reverse();
                self.make(V::Tuple(items), inner)?;
            }
            b'a' => {
                let (x, fig) = self.pop()?;
                match self.top(fig, "APPEND")? {
                    V::List(l) => l.push(x),
                    _ => return Err("APPEND to a non-list".into()),
                }
            }
            b'e' | 0x90 => {
                let (items, inner) = self.pop_to_mark()?;
                match self.top(inner, "APPENDS")? {
                    V::List(l) => l.extend(items),
                    _ => return Err("APPENDS to a non-list".into()),
                }
            }
            b's' => {
                let (v, vf) = self.pop()?;
                let (k, kf) = self.pop()?;
                match self.top(beside(kf, vf), "SETITEM")? {
                    V::Dict(d) => d.push((k, v)),
                    _ => return Err("SETITEM on a non-dict".into()),
                }
            }
            b'u' => {
                let (items, inner) = self.pop_to_mark()?;
                let items = pairs(items)?;
                match self.top(inner, "SETITEMS")? {
                    V::Dict(d) => d.extend(items),
                    _ => return Err("SETITEMS on a non-dict".into()),
                }
            }
            b'0' => match self.stack.pop().ok_or("stack underflow")? {
                Some(it) => {
                    self.settle(it)?;
                }
                None => self.bound.close_mark(),
            },
            b'1' => {
                self.pop_to_mark()?;
            }
            b'2' => {
                let at = self.stack.len().wrapping_sub(1);
                self.copy_at(at)
                    .map_err(|e| e.unwrap_or_else(|| "stack underflow".into()))?;
            }
            b'q' | b'r' | 0x94 => {
                let k = match op {
                    b'q' => self.uint(1)?,
                    b'r' => self.uint(4)?,
                    _ => self.memo.done.len() as u64 + self.memo.pending_keys,
                };
                self.memoize(k)?;
            }
            b'h' | b'j' => {
                let k = self.uint(if op == b'h' { 1 } else { 4 })?;
                self.get(k)?;
            }
            other => return Err(format!("opcode {other:#04x} is not read here")),
        }
        Ok(())
    }
}

/// Reads the pickle `b`, or says why not: an opcode it does not read, input cut short or malformed, or a bound
/// of [`super::bound`] passed (checked before what would pass it is built).
pub fn read(b: &[u8]) -> Result<Doc, String> {
    let mut m = Machine {
        b,
        i: 0,
        stack: Vec::new(),
        memo: Memo::default(),
        bound: Bound::default(),
        strings: Vec::new(),
        ids: HashMap::new(),
    };
    while let Some(&op) = b.get(m.i) {
        m.i += 1;
        if op == b'.' {
            let (root, _) = m.pop()?;
            return Ok(Doc {
                root,
                strings: m.strings,
                ids: m.ids,
                depth: m.bound.deepest,
            });
        }
        // Each bound is checked where what it bounds grows (bound.rs).
        m.step(op)?;
    }
    Err("no STOP: cut short".into())
}
