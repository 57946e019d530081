//! How deeply a pickle nests, found without building it: serde-pickle builds values (and drops them) by
//! recursion, so a forged pickle of a list in a list in a list ... a million deep overflows the stack and aborts
//! whoever reads it (`run`'s post-mortem, `report`, `oom`, the exports). This walks the opcodes once with a stack
//! of depths, memo included (a pickle can nest through the memo at a constant stack height), and says how deep
//! the value would be, or why the input is not a pickle it can walk.

use std::collections::HashMap;

/// Nesting deeper than this is refused (PyTorch's snapshots nest about 8 deep).
pub const MAX_DEPTH: usize = 200;

/// The deepest nesting of containers the pickle `b` builds, or why it cannot tell (an opcode it does not know,
/// input cut short, nesting past [`MAX_DEPTH`]).
pub fn depth(b: &[u8]) -> Result<usize, String> {
    // Each stack item's depth (0 for a scalar); `None` marks a MARK.
    let mut stack: Vec<Option<usize>> = Vec::new();
    let mut memo: HashMap<u64, usize> = HashMap::new();
    let mut deepest = 0usize;
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = i
            .checked_add(n)
            .filter(|&e| e <= b.len())
            .ok_or("cut short")?;
        let s = &b[*i..end];
        *i = end;
        Ok(s)
    };
    let le = |s: &[u8]| s.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64);
    let line = |i: &mut usize| -> Result<(), String> {
        let n = b[*i..]
            .iter()
            .position(|&c| c == b'\n')
            .ok_or("cut short")?;
        *i += n + 1;
        Ok(())
    };
    let pop = |stack: &mut Vec<Option<usize>>| -> Result<usize, String> {
        stack
            .pop()
            .flatten()
            .ok_or_else(|| "stack underflow".to_string())
    };
    // Pops to the last MARK, returning the deepest item above it.
    let to_mark = |stack: &mut Vec<Option<usize>>| -> Result<usize, String> {
        let mut d = 0;
        loop {
            match stack.pop() {
                Some(Some(x)) => d = d.max(x),
                Some(None) => return Ok(d),
                None => return Err("no mark".into()),
            }
        }
    };
    while i < b.len() {
        let op = b[i];
        i += 1;
        match op {
            b'.' => return Ok(deepest),
            b'(' => stack.push(None),
            // Scalars with fixed-size arguments.
            b'N' | 0x88 | 0x89 => stack.push(Some(0)),
            b'K' => {
                take(&mut i, 1)?;
                stack.push(Some(0));
            }
            b'M' => {
                take(&mut i, 2)?;
                stack.push(Some(0));
            }
            b'J' => {
                take(&mut i, 4)?;
                stack.push(Some(0));
            }
            b'G' => {
                take(&mut i, 8)?;
                stack.push(Some(0));
            }
            // Scalars with a length, then bytes.
            b'U' | b'C' | 0x8c | 0x8a => {
                let n = le(take(&mut i, 1)?) as usize;
                take(&mut i, n)?;
                stack.push(Some(0));
            }
            b'T' | b'X' | b'B' | 0x8b => {
                let n = le(take(&mut i, 4)?) as usize;
                take(&mut i, n)?;
                stack.push(Some(0));
            }
            0x8d | 0x8e | 0x96 => {
                let n = usize::try_from(le(take(&mut i, 8)?)).map_err(|_| "too long")?;
                take(&mut i, n)?;
                stack.push(Some(0));
            }
            // Scalars up to a newline.
            b'I' | b'L' | b'F' | b'S' | b'V' => {
                line(&mut i)?;
                stack.push(Some(0));
            }
            b'c' => {
                line(&mut i)?;
                line(&mut i)?;
                stack.push(Some(0));
            }
            0x93 => {
                pop(&mut stack)?;
                pop(&mut stack)?;
                stack.push(Some(0));
            }
            0x80 => {
                take(&mut i, 1)?;
            }
            0x95 => {
                take(&mut i, 8)?;
            }
            // Empty containers.
            b']' | b'}' | b')' | 0x8f => stack.push(Some(1)),
            // Containers from the items above the mark.
            b'l' | b't' | b'd' | 0x91 => {
                let d = to_mark(&mut stack)? + 1;
                stack.push(Some(d));
            }
            0x85..=0x87 => {
                let mut d = 0;
                for _ in 0..(op - 0x84) {
                    d = d.max(pop(&mut stack)?);
                }
                stack.push(Some(d + 1));
            }
            // Items into the container below them.
            b'a' => {
                let x = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(c.max(x + 1)));
            }
            b's' => {
                let v = pop(&mut stack)?;
                let k = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(c.max(v.max(k) + 1)));
            }
            b'e' | b'u' | 0x90 => {
                let x = to_mark(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(c.max(x + 1)));
            }
            // Objects: a callable and its arguments make a value as deep as they are.
            b'R' | 0x81 | b'b' => {
                let x = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(c.max(x + 1)));
            }
            0x92 => {
                let k = pop(&mut stack)?;
                let a = pop(&mut stack)?;
                let c = pop(&mut stack)?;
                stack.push(Some(c.max(a.max(k) + 1)));
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
            b'p' => {
                let s = i;
                line(&mut i)?;
                let k = std::str::from_utf8(&b[s..i - 1])
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .ok_or("bad memo key")?;
                memo.insert(k, stack.last().copied().flatten().ok_or("stack underflow")?);
            }
            b'q' | b'r' | 0x94 => {
                let k = match op {
                    b'q' => le(take(&mut i, 1)?),
                    b'r' => le(take(&mut i, 4)?),
                    _ => memo.len() as u64,
                };
                memo.insert(k, stack.last().copied().flatten().ok_or("stack underflow")?);
            }
            b'g' | b'h' | b'j' => {
                let k = match op {
                    b'h' => le(take(&mut i, 1)?),
                    b'j' => le(take(&mut i, 4)?),
                    _ => {
                        let s = i;
                        line(&mut i)?;
                        std::str::from_utf8(&b[s..i - 1])
                            .ok()
                            .and_then(|t| t.trim().parse().ok())
                            .ok_or("bad memo key")?
                    }
                };
                stack.push(Some(*memo.get(&k).ok_or("memo key not set")?));
            }
            other => return Err(format!("opcode {other:#04x} is not read here")),
        }
        if let Some(Some(d)) = stack.last() {
            deepest = deepest.max(*d);
            if deepest > MAX_DEPTH {
                return Err(format!("it nests more than {MAX_DEPTH} deep"));
            }
        }
    }
    Err("no STOP: cut short".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python_pickle(expr: &str) -> Vec<u8> {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import pickle,sys\nv = {expr}\np = pickle.Pickler(sys.stdout.buffer, protocol=4)\np.fast = True\np.dump(v)"
                ),
            ])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
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
}
