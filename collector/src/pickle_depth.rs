//! How deeply a pickle nests, and what building it would cost, found without building it. serde-pickle builds
//! values (and drops them) by recursion, so a forged pickle of a list in a list in a list ... a million deep
//! overflows the stack and aborts whoever reads it (`run`'s post-mortem, `report`, `oom`, the exports,
//! `whatif`). And a reader's memory is whatever the opcodes make it build: a value the pickle shares through its
//! memo is copied at each use (a few hundred kilobytes that refer to one list fifty thousand times build
//! billions of values), a one-byte NONE is a 32-byte value, a one-byte MARK makes serde-pickle set aside room for
//! 128 values (4 KiB): 100 MB of either asked for gigabytes. This walks the opcodes once, in time linear in the
//! input, with a stack of (depth, bytes), memo included (a pickle can nest and multiply through the memo at a
//! constant stack height), and counts the bytes the readers (serde-pickle, `whatif::pickle_reader`) would
//! allocate: every value, string, memo entry and copy, and every open MARK. Past [`BUDGET`] it refuses, and so
//! it does past [`MAX_STACK`] items waiting on the stack or [`MAX_MEMO`] memo entries, which bound its own
//! memory to a few tens of megabytes whatever the input.

use std::collections::HashMap;

/// Nesting deeper than this is refused (PyTorch's snapshots nest about 8 deep).
pub const MAX_DEPTH: usize = 200;
/// What a reader may build, in bytes (by [`VALUE_BYTES`] a value, and the rest below). A million-entry
/// allocation history (the what-if's benchmark, 148 MB of pickle, 20 M values) counts about 700 MB.
pub const BUDGET: u64 = 1 << 30;
/// Items on the stack at once, marks included. Python's pickler adds a container's items a thousand at a time
/// (APPENDS, SETITEMS), so a snapshot's stack holds a few thousand.
pub const MAX_STACK: usize = 1 << 20;
/// Memo entries. Python memoizes each container and string once (none at all in fast mode, as the bridge
/// writes): a snapshot of a million entries dumped by PyTorch has a few million.
pub const MAX_MEMO: usize = 1 << 22;
/// A value as the readers hold it (serde-pickle's `Value`, the what-if's `V`: 32 bytes), before its own
/// text or items.
const VALUE_BYTES: u64 = 32;
/// A memo entry (its key and a copy's place, in a map).
const MEMO_BYTES: u64 = 64;
/// An open MARK: serde-pickle sets aside a stack for 128 values at each.
const MARK_BYTES: u64 = 128 * VALUE_BYTES;

/// How deep an item nests and the bytes it stands for.
type Figures = (usize, u64);

/// A stack item: its figures, the memoized object it is, if any, and whether it was memoized while on the stack
/// (the what-if's reader then copies it into the memo as it leaves). The memo keeps objects, not copies: a list
/// memoized empty and filled afterwards is read back full, so a memoized object's figures live in `objects` and
/// grow as items go into it.
#[derive(Clone, Copy)]
struct Slot {
    fig: Figures,
    object: Option<usize>,
    keyed: bool,
}

/// A value without items of its own.
fn scalar(text: usize) -> Slot {
    Slot {
        fig: (0, VALUE_BYTES.saturating_add(text as u64)),
        object: None,
        keyed: false,
    }
}

const EMPTY: Slot = Slot {
    fig: (1, VALUE_BYTES),
    object: None,
    keyed: false,
};

/// The `n` bytes of `b` at `*i`, moving `i` past them; "cut short" where `b` ends first. The pickle walkers'
/// reader (this one and the what-if's `pickle_reader`).
pub(crate) fn take<'a>(b: &'a [u8], i: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = i
        .checked_add(n)
        .filter(|&e| e <= b.len())
        .ok_or("cut short")?;
    let s = &b[*i..end];
    *i = end;
    Ok(s)
}

/// A little-endian unsigned integer of up to 8 bytes.
pub(crate) fn le(s: &[u8]) -> u64 {
    s.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64)
}

/// The walk's state: the stack (`None` marks a MARK), the memo's objects, and what building would cost.
#[derive(Default)]
struct Walk {
    stack: Vec<Option<Slot>>,
    objects: Vec<Figures>,
    memo: HashMap<u64, usize>,
    /// Bytes built so far (never less: what a reader drops it may have held at once).
    built: u64,
    marks: u64,
}

impl Walk {
    fn push(&mut self, s: Slot) {
        self.built = self.built.saturating_add(s.fig.1);
        self.stack.push(Some(s));
    }

    /// An item leaving the stack for good (into a container, or dropped): the what-if's reader copies a
    /// memoized one into its memo then.
    fn leave(&mut self, s: Slot) -> Slot {
        if s.keyed {
            self.built = self.built.saturating_add(s.fig.1);
        }
        s
    }

    fn pop(&mut self) -> Result<Slot, String> {
        let s = self
            .stack
            .pop()
            .flatten()
            .ok_or_else(|| "stack underflow".to_string())?;
        Ok(self.leave(s))
    }

    /// The container under the items just popped: it stays (popped and pushed back).
    fn container(&mut self) -> Result<Slot, String> {
        self.stack
            .pop()
            .flatten()
            .ok_or_else(|| "stack underflow".to_string())
    }

    /// Pops to the last MARK: the deepest item above it and the bytes of all of them.
    fn pop_to_mark(&mut self) -> Result<Figures, String> {
        let (mut d, mut n) = (0, 0u64);
        loop {
            match self.stack.pop() {
                Some(Some(x)) => {
                    let x = self.leave(x);
                    d = d.max(x.fig.0);
                    n = n.saturating_add(x.fig.1);
                }
                Some(None) => {
                    self.marks -= 1;
                    return Ok((d, n));
                }
                None => return Err("no mark".into()),
            }
        }
    }

    /// Container `c` now also holds `inner`: its new figures, kept in its object if it is one.
    fn fill(&mut self, c: Slot, inner: Figures) {
        let fig = (c.fig.0.max(inner.0 + 1), c.fig.1.saturating_add(inner.1));
        if let Some(o) = c.object {
            self.objects[o] = fig;
        }
        self.stack.push(Some(Slot { fig, ..c }));
    }

    /// What callable `c` makes of its arguments `args`: a new value, not `c` itself.
    fn call(&mut self, c: Slot, args: Figures) {
        let c = Slot {
            object: None,
            keyed: false,
            ..c
        };
        self.fill(c, args);
    }

    /// A new container of `inner`.
    fn make(&mut self, inner: Figures) {
        self.built = self.built.saturating_add(VALUE_BYTES);
        self.fill(EMPTY, inner);
    }

    fn memoize(&mut self, k: u64) -> Result<(), String> {
        let top = self
            .stack
            .last_mut()
            .and_then(|s| s.as_mut())
            .ok_or("stack underflow")?;
        top.keyed = true;
        let o = match top.object {
            Some(o) => o,
            None => {
                self.objects.push(top.fig);
                top.object = Some(self.objects.len() - 1);
                self.objects.len() - 1
            }
        };
        self.memo.insert(k, o);
        self.built = self.built.saturating_add(MEMO_BYTES);
        Ok(())
    }

    /// Why the walk stops here, if it must.
    fn over(&self, deepest: usize) -> Option<String> {
        if deepest > MAX_DEPTH {
            return Some(format!("it nests more than {MAX_DEPTH} deep"));
        }
        if self
            .built
            .saturating_add(self.marks.saturating_mul(MARK_BYTES))
            > BUDGET
        {
            return Some(format!(
                "it would take more than {} MiB to build once the values it shares are copied",
                BUDGET >> 20
            ));
        }
        if self.stack.len() > MAX_STACK {
            return Some(format!(
                "it holds more than {MAX_STACK} items on its stack at once"
            ));
        }
        if self.memo.len() > MAX_MEMO {
            return Some(format!("it memoizes more than {MAX_MEMO} values"));
        }
        None
    }
}

/// The deepest nesting of containers the pickle `b` builds, or why it will not be built (an opcode it does not
/// know, input cut short, nesting past [`MAX_DEPTH`], more than [`BUDGET`] bytes to build once shared values
/// are copied, a stack or memo past [`MAX_STACK`] or [`MAX_MEMO`]). Linear in `b`'s length.
pub fn depth(b: &[u8]) -> Result<usize, String> {
    let mut w = Walk::default();
    let mut deepest = 0usize;
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| take(b, i, n);
    // The bytes up to the next newline (its length), moving past it.
    let line = |i: &mut usize| -> Result<usize, String> {
        let n = b[*i..]
            .iter()
            .position(|&c| c == b'\n')
            .ok_or("cut short")?;
        *i += n + 1;
        Ok(n)
    };
    let memo_key = |i: &mut usize, op: u8| -> Result<u64, String> {
        Ok(match op {
            b'h' | b'q' => le(take(i, 1)?),
            b'j' | b'r' => le(take(i, 4)?),
            _ => {
                let s = *i;
                line(i)?;
                std::str::from_utf8(&b[s..*i - 1])
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .ok_or("bad memo key")?
            }
        })
    };
    while i < b.len() {
        let op = b[i];
        i += 1;
        match op {
            b'.' => return Ok(deepest),
            b'(' => {
                w.stack.push(None);
                w.marks += 1;
            }
            // Scalars with fixed-size arguments.
            b'N' | 0x88 | 0x89 => w.push(scalar(0)),
            b'K' | b'M' | b'J' | b'G' => {
                take(
                    &mut i,
                    match op {
                        b'K' => 1,
                        b'M' => 2,
                        b'J' => 4,
                        _ => 8,
                    },
                )?;
                w.push(scalar(0));
            }
            // Scalars with a length, then bytes.
            b'U' | b'C' | 0x8c | 0x8a => {
                let n = le(take(&mut i, 1)?) as usize;
                take(&mut i, n)?;
                w.push(scalar(n));
            }
            b'T' | b'X' | b'B' | 0x8b => {
                let n = le(take(&mut i, 4)?) as usize;
                take(&mut i, n)?;
                w.push(scalar(n));
            }
            0x8d | 0x8e | 0x96 => {
                let n = usize::try_from(le(take(&mut i, 8)?)).map_err(|_| "too long")?;
                take(&mut i, n)?;
                w.push(scalar(n));
            }
            // Scalars up to a newline.
            b'I' | b'L' | b'F' | b'S' | b'V' => {
                let n = line(&mut i)?;
                w.push(scalar(n));
            }
            b'c' => {
                let n = line(&mut i)? + line(&mut i)?;
                w.push(scalar(n));
            }
            0x93 => {
                w.pop()?;
                w.pop()?;
                w.push(scalar(0));
            }
            0x80 => {
                take(&mut i, 1)?;
            }
            0x95 => {
                take(&mut i, 8)?;
            }
            // Empty containers.
            b']' | b'}' | b')' | 0x8f => w.push(EMPTY),
            // Containers from the items above the mark.
            b'l' | b't' | b'd' | 0x91 => {
                let inner = w.pop_to_mark()?;
                w.make(inner);
            }
            0x85..=0x87 => {
                let mut inner = (0, 0u64);
                for _ in 0..(op - 0x84) {
                    let x = w.pop()?.fig;
                    inner = (inner.0.max(x.0), inner.1.saturating_add(x.1));
                }
                w.make(inner);
            }
            // Items into the container below them.
            b'a' => {
                let x = w.pop()?;
                let c = w.container()?;
                w.fill(c, x.fig);
            }
            b's' => {
                let v = w.pop()?;
                let k = w.pop()?;
                let c = w.container()?;
                w.fill(c, (v.fig.0.max(k.fig.0), v.fig.1.saturating_add(k.fig.1)));
            }
            b'e' | b'u' | 0x90 => {
                let x = w.pop_to_mark()?;
                let c = w.container()?;
                w.fill(c, x);
            }
            // Objects: a callable and its arguments make a value as deep and as large as they are.
            b'R' | 0x81 => {
                let x = w.pop()?;
                let c = w.pop()?;
                w.call(c, x.fig);
            }
            b'b' => {
                let x = w.pop()?;
                let c = w.container()?;
                w.fill(c, x.fig);
            }
            0x92 => {
                let k = w.pop()?;
                let a = w.pop()?;
                let c = w.pop()?;
                w.call(c, (a.fig.0.max(k.fig.0), a.fig.1.saturating_add(k.fig.1)));
            }
            b'0' => match w.stack.pop().ok_or("stack underflow")? {
                Some(x) => {
                    w.leave(x);
                }
                None => w.marks -= 1,
            },
            b'1' => {
                w.pop_to_mark()?;
            }
            // A copy of the top.
            b'2' => {
                let top = w.stack.last().copied().flatten().ok_or("stack underflow")?;
                w.push(Slot {
                    keyed: false,
                    object: None,
                    ..top
                });
            }
            // The memo.
            b'p' | b'q' | b'r' => {
                let k = memo_key(&mut i, op)?;
                w.memoize(k)?;
            }
            0x94 => w.memoize(w.memo.len() as u64)?,
            // A copy of a memoized object, as it is now.
            b'g' | b'h' | b'j' => {
                let k = memo_key(&mut i, op)?;
                let o = *w.memo.get(&k).ok_or("memo key not set")?;
                w.push(Slot {
                    fig: w.objects[o],
                    object: Some(o),
                    keyed: false,
                });
            }
            other => return Err(format!("opcode {other:#04x} is not read here")),
        }
        if let Some(Some(top)) = w.stack.last() {
            deepest = deepest.max(top.fig.0);
        }
        if let Some(why) = w.over(deepest) {
            return Err(why);
        }
    }
    Err("no STOP: cut short".into())
}

/// (Tests) What Python's pickle writes for `v` after `program` (protocol 4): in fast mode (no memo, as the bridge
/// writes), or `shared` (the memo: a value used twice is written once and referred to).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn python_pickle(expr: &str) -> Vec<u8> {
        python_written(&format!("v = {expr}"), false)
    }

    #[test]
    fn depths_of_what_python_writes() {
        assert_eq!(depth(&python_pickle("1")).unwrap(), 0);
        assert_eq!(depth(&python_pickle("[1, 2]")).unwrap(), 1);
        assert_eq!(
            depth(&python_pickle("{'a': [1, {'b': (1, 2)}]}")).unwrap(),
            4
        );
        assert_eq!(depth(&python_pickle("[[[[]]]]")).unwrap(), 4);
        let snap = "dict(segments=[dict(device=0, blocks=[dict(address=1, size=2, state='active_allocated', \
                    frames=[dict(filename='a.py', line=3, name='f')])])], device_traces=[[dict(action='alloc', \
                    addr=1, size=2, time_us=5)]])";
        assert_eq!(depth(&python_pickle(snap)).unwrap(), 7);
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        // A million nested lists, by the stack and through the memo at a constant stack height.
        let mut b = vec![0x80, 4];
        b.extend(std::iter::repeat_n(b']', 1_000_000));
        b.extend(std::iter::repeat_n(b'a', 999_999));
        b.push(b'.');
        assert!(depth(&b).unwrap_err().contains("nests more than"));
        // x = []; then a thousand times x = [x], kept only in the memo: the stack never holds more than two.
        let mut b = vec![0x80, 4, b']', b'q', 0, b'0'];
        for _ in 0..1_000 {
            b.extend([b']', b'h', 0, b'a', b'q', 0, b'0']);
        }
        b.extend([b'h', 0, b'.']);
        assert!(
            depth(&b).unwrap_err().contains("nests more than"),
            "{:?}",
            depth(&b)
        );
        // Garbage and cut input: an error, never a panic.
        assert!(depth(b"\x80\x04]").is_err());
        assert!(depth(b"\xff").is_err());
        assert!(depth(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff").is_err());
    }

    #[test]
    fn a_hundred_megabytes_of_none_or_mark_is_refused_early_and_in_small_memory() {
        // Issue 36: 100 MB of NONE (a 32-byte value each in a reader) or of MARK (4 KiB each in serde-pickle)
        // asked the readers for gigabytes. Each is refused before the walk has looked at much of it.
        for op in [b'N', b'('] {
            let mut b = vec![0x80, 4];
            b.extend(std::iter::repeat_n(op, 100 << 20));
            b.push(b'.');
            let e = depth(&b).unwrap_err();
            assert!(
                e.contains("more than 1024 MiB to build") || e.contains("items on its stack"),
                "{e}"
            );
        }
        // Built and dropped again and again (NONE, POP): the bytes a reader allocates still add up.
        let mut b = vec![0x80, 4];
        for _ in 0..(40 << 20) {
            b.extend([b'N', b'0']);
        }
        b.push(b'.');
        assert!(depth(&b).unwrap_err().contains("MiB to build"));
        // One memo entry after another: bounded too.
        let mut b = vec![0x80, 4];
        for _ in 0..(5 << 20) {
            b.extend([b'N', 0x94, b'0']);
        }
        b.extend([b'N', b'.']);
        assert!(depth(&b).unwrap_err().contains("memoizes more than"));
        // A list of a million NONEs memoized at each of 40 levels: the what-if's reader copies each level into
        // its memo as it leaves the stack, so the leaves are copied 40 times (1.3 GB from 1 MB of input).
        let mut b = vec![0x80, 4, b']'];
        for _ in 0..1_000 {
            b.push(b'(');
            b.extend(std::iter::repeat_n(b'N', 1_000));
            b.push(b'e');
        }
        for _ in 0..40 {
            b.extend([0x94, 0x85]);
        }
        b.push(b'.');
        assert!(depth(&b).unwrap_err().contains("MiB to build"));
        b.truncate(b.len() - 1 - 2 * 30);
        b.push(b'.');
        assert_eq!(depth(&b).unwrap(), 11);
    }

    #[test]
    fn a_pickle_that_shares_one_list_thousands_of_times_is_refused_before_it_is_built() {
        // The audit's bomb: one list of 50,000 ints, then a list referring to it 50,000 times through the memo:
        // 350 KB that serde-pickle would copy into 2.5 billion values.
        let b = python_written("x = list(range(50000))\nv = [x] * 50000", true);
        assert!(b.len() < 1 << 20, "{} bytes", b.len());
        let e = depth(&b).unwrap_err();
        assert!(e.contains("more than 1024 MiB to build"), "{e}");
        // A PyTorch snapshot that shares its frames the same way, but a few times each, is read.
        let b = python_written(
            "f = [dict(filename='a.py', line=3, name='f')]\nv = dict(device_traces=[[dict(action='alloc', frames=f) for _ in range(20000)]])",
            true,
        );
        assert_eq!(depth(&b).unwrap(), 6);
    }
}
