//! How deeply a pickle nests, and how many values it stands for, found without building it. serde-pickle builds
//! values (and drops them) by recursion, so a forged pickle of a list in a list in a list ... a million deep
//! overflows the stack and aborts whoever reads it (`run`'s post-mortem, `report`, `oom`, the exports,
//! `whatif`). And a value the pickle shares through its memo is copied at each use: a few hundred kilobytes that
//! refer to one list fifty thousand times build billions of values and exhaust memory. This walks the opcodes
//! once with a stack of (depth, values), memo included (a pickle can nest and multiply through the memo at a
//! constant stack height), and says how deep the value would be, or why it will not be built.

use std::collections::HashMap;

/// Nesting deeper than this is refused (PyTorch's snapshots nest about 8 deep).
pub const MAX_DEPTH: usize = 200;
/// More values than this are refused: at serde-pickle's 32 to 64 bytes a value, about 2 to 4 GB. A
/// million-entry allocation history without frames is about 20 M.
pub const MAX_VALUES: u64 = 60_000_000;

/// How deep an item nests and how many values it stands for.
type Figures = (usize, u64);

/// A stack item: its figures, and the memoized object it is, if any. The memo keeps objects, not copies: a list
/// memoized empty and filled afterwards is read back full, so a memoized object's figures live in `objects`
/// and grow as items go into it.
#[derive(Clone, Copy)]
struct Slot {
    fig: Figures,
    object: Option<usize>,
}

const SCALAR: Slot = Slot {
    fig: (0, 1),
    object: None,
};
const EMPTY: Slot = Slot {
    fig: (1, 1),
    object: None,
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

/// The deepest nesting of containers the pickle `b` builds, or why it cannot tell (an opcode it does not know,
/// input cut short, nesting past [`MAX_DEPTH`], more than [`MAX_VALUES`] values once shared ones are copied).
pub fn depth(b: &[u8]) -> Result<usize, String> {
    // `None` marks a MARK.
    let mut stack: Vec<Option<Slot>> = Vec::new();
    let mut objects: Vec<Figures> = Vec::new();
    let mut memo: HashMap<u64, usize> = HashMap::new();
    let mut deepest = 0usize;
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| take(b, i, n);
    let line = |i: &mut usize| -> Result<(), String> {
        let n = b[*i..]
            .iter()
            .position(|&c| c == b'\n')
            .ok_or("cut short")?;
        *i += n + 1;
        Ok(())
    };
    let pop = |stack: &mut Vec<Option<Slot>>| -> Result<Slot, String> {
        stack
            .pop()
            .flatten()
            .ok_or_else(|| "stack underflow".to_string())
    };
    // Pops to the last MARK: the deepest item above it and the values of all of them.
    let to_mark = |stack: &mut Vec<Option<Slot>>| -> Result<Figures, String> {
        let (mut d, mut n) = (0, 0u64);
        loop {
            match stack.pop() {
                Some(Some(x)) => {
                    d = d.max(x.fig.0);
                    n = n.saturating_add(x.fig.1);
                }
                Some(None) => return Ok((d, n)),
                None => return Err("no mark".into()),
            }
        }
    };
    let both = |a: Figures, b: Figures| (a.0.max(b.0), a.1.saturating_add(b.1));
    // Container `c` now also holds `inner`: its new figures, kept in its object if it is one.
    let fill = |objects: &mut Vec<Figures>, c: Slot, inner: Figures| -> Slot {
        let fig = (c.fig.0.max(inner.0 + 1), c.fig.1.saturating_add(inner.1));
        if let Some(o) = c.object {
            objects[o] = fig;
        }
        Slot {
            fig,
            object: c.object,
        }
    };
    let memoize =
        |stack: &mut Vec<Option<Slot>>, objects: &mut Vec<Figures>| -> Result<usize, String> {
            let top = stack
                .last_mut()
                .and_then(|s| s.as_mut())
                .ok_or("stack underflow")?;
            Ok(match top.object {
                Some(o) => o,
                None => {
                    objects.push(top.fig);
                    top.object = Some(objects.len() - 1);
                    objects.len() - 1
                }
            })
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
            b'(' => stack.push(None),
            // Scalars with fixed-size arguments.
            b'N' | 0x88 | 0x89 => stack.push(Some(SCALAR)),
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
                stack.push(Some(SCALAR));
            }
            // Scalars with a length, then bytes.
            b'U' | b'C' | 0x8c | 0x8a => {
                let n = le(take(&mut i, 1)?) as usize;
                take(&mut i, n)?;
                stack.push(Some(SCALAR));
            }
            b'T' | b'X' | b'B' | 0x8b => {
                let n = le(take(&mut i, 4)?) as usize;
                take(&mut i, n)?;
                stack.push(Some(SCALAR));
            }
            0x8d | 0x8e | 0x96 => {
                let n = usize::try_from(le(take(&mut i, 8)?)).map_err(|_| "too long")?;
                take(&mut i, n)?;
                stack.push(Some(SCALAR));
            }
            // Scalars up to a newline.
            b'I' | b'L' | b'F' | b'S' | b'V' => {
                line(&mut i)?;
                stack.push(Some(SCALAR));
            }
            b'c' => {
                line(&mut i)?;
                line(&mut i)?;
                stack.push(Some(SCALAR));
            }
            0x93 => {
                pop(&mut stack)?;
                pop(&mut stack)?;
                stack.push(Some(SCALAR));
            }
            0x80 => {
                take(&mut i, 1)?;
            }
            0x95 => {
                take(&mut i, 8)?;
            }
            // Empty containers.
            b']' | b'}' | b')' | 0x8f => stack.push(Some(EMPTY)),
            // Containers from the items above the mark.
            b'l' | b't' | b'd' | 0x91 => {
                let inner = to_mark(&mut stack)?;
                stack.push(Some(fill(&mut objects, EMPTY, inner)));
            }
            0x85..=0x87 => {
                let mut inner = (0, 0u64);
                for _ in 0..(op - 0x84) {
                    inner = both(inner, pop(&mut stack)?.fig);
                }
                stack.push(Some(fill(&mut objects, EMPTY, inner)));
            }
            // Items into the container below them.
            b'a' => {
                let x = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(fill(&mut objects, c, x.fig)));
            }
            b's' => {
                let v = pop(&mut stack)?;
                let k = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(fill(&mut objects, c, both(v.fig, k.fig))));
            }
            b'e' | b'u' | 0x90 => {
                let x = to_mark(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(fill(&mut objects, c, x)));
            }
            // Objects: a callable and its arguments make a value as deep and as large as they are.
            b'R' | 0x81 => {
                let x = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(fill(&mut objects, Slot { object: None, ..c }, x.fig)));
            }
            b'b' => {
                let x = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(fill(&mut objects, c, x.fig)));
            }
            0x92 => {
                let k = pop(&mut stack)?;
                let a = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(fill(
                    &mut objects,
                    Slot { object: None, ..c },
                    both(a.fig, k.fig),
                )));
            }
            b'0' => {
                stack.pop().ok_or("stack underflow")?;
            }
            b'1' => {
                to_mark(&mut stack)?;
            }
            b'2' => {
                let top = *stack.last().ok_or("stack underflow")?;
                stack.push(top);
            }
            // The memo.
            b'p' | b'q' | b'r' => {
                let k = memo_key(&mut i, op)?;
                let o = memoize(&mut stack, &mut objects)?;
                memo.insert(k, o);
            }
            0x94 => {
                let k = memo.len() as u64;
                let o = memoize(&mut stack, &mut objects)?;
                memo.insert(k, o);
            }
            b'g' | b'h' | b'j' => {
                let k = memo_key(&mut i, op)?;
                let o = *memo.get(&k).ok_or("memo key not set")?;
                stack.push(Some(Slot {
                    fig: objects[o],
                    object: Some(o),
                }));
            }
            other => return Err(format!("opcode {other:#04x} is not read here")),
        }
        if let Some(Some(top)) = stack.last() {
            deepest = deepest.max(top.fig.0);
            if deepest > MAX_DEPTH {
                return Err(format!("it nests more than {MAX_DEPTH} deep"));
            }
            if top.fig.1 > MAX_VALUES {
                return Err(format!(
                    "it stands for more than {} M values once the values it shares are copied",
                    MAX_VALUES / 1_000_000
                ));
            }
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
    fn a_pickle_that_shares_one_list_thousands_of_times_is_refused_before_it_is_built() {
        // The audit's bomb: one list of 50,000 ints, then a list referring to it 50,000 times through the memo:
        // 350 KB that serde-pickle would copy into 2.5 billion values.
        let b = python_written("x = list(range(50000))\nv = [x] * 50000", true);
        assert!(b.len() < 1 << 20, "{} bytes", b.len());
        let e = depth(&b).unwrap_err();
        assert!(e.contains("more than 60 M values"), "{e}");
        // A PyTorch snapshot that shares its frames the same way, but a few times each, is read.
        let b = python_written(
            "f = [dict(filename='a.py', line=3, name='f')]\nv = dict(device_traces=[[dict(action='alloc', frames=f) for _ in range(20000)]])",
            true,
        );
        assert_eq!(depth(&b).unwrap(), 6);
    }
}
