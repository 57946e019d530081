//! A small streaming pickle writer (protocol 4, no framing): exactly the opcodes PyTorch's memory_viz
//! unpickler (`MemoryViz.js`) reads, integers as at most 64-bit signed, lists appended in batches of at most
//! [`BATCH`] (its `APPENDS` spreads a batch into a JavaScript call's arguments).

use std::io::{self, Write};

/// The most items one `APPENDS` or `SETITEMS` carries.
pub const BATCH: usize = 1000;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const TUPLE2: u8 = 0x86;
const LONG_BINPUT: u8 = b'r';
const LONG_BINGET: u8 = b'j';

pub struct Pickler<W: Write> {
    pub w: W,
}

impl<W: Write> Pickler<W> {
    pub fn new(mut w: W) -> io::Result<Self> {
        w.write_all(&[PROTO, 4])?;
        Ok(Pickler { w })
    }

    pub fn stop(mut self) -> io::Result<W> {
        self.w.write_all(&[STOP])?;
        Ok(self.w)
    }

    pub fn mark(&mut self) -> io::Result<()> {
        self.w.write_all(&[MARK])
    }
    pub fn empty_dict(&mut self) -> io::Result<()> {
        self.w.write_all(&[EMPTY_DICT])
    }
    pub fn empty_list(&mut self) -> io::Result<()> {
        self.w.write_all(&[EMPTY_LIST])
    }
    /// Appends everything since the last mark to the list below it.
    pub fn appends(&mut self) -> io::Result<()> {
        self.w.write_all(&[APPENDS])
    }
    /// Sets every (key, value) since the last mark in the dict below it.
    pub fn setitems(&mut self) -> io::Result<()> {
        self.w.write_all(&[SETITEMS])
    }
    pub fn none(&mut self) -> io::Result<()> {
        self.w.write_all(&[NONE])
    }
    pub fn bool(&mut self, b: bool) -> io::Result<()> {
        self.w.write_all(&[if b { NEWTRUE } else { NEWFALSE }])
    }
    /// The two values before it as a tuple.
    pub fn tuple2(&mut self) -> io::Result<()> {
        self.w.write_all(&[TUPLE2])
    }

    /// A signed integer in the shortest form memory_viz reads: `BININT1`/`BININT2`/`BININT`, else an 8-byte
    /// at most `LONG1` (two's complement, little-endian).
    pub fn int(&mut self, v: i64) -> io::Result<()> {
        if (0..=0xff).contains(&v) {
            self.w.write_all(&[BININT1, v as u8])
        } else if (0..=0xffff).contains(&v) {
            let b = (v as u16).to_le_bytes();
            self.w.write_all(&[BININT2, b[0], b[1]])
        } else if (i32::MIN as i64..=i32::MAX as i64).contains(&v) {
            self.w.write_all(&[BININT])?;
            self.w.write_all(&(v as i32).to_le_bytes())
        } else {
            let b = v.to_le_bytes();
            // The fewest bytes that keep the sign.
            let mut n = 8;
            while n > 1 {
                let top = b[n - 1];
                let next_sign = b[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.w.write_all(&[LONG1, n as u8])?;
            self.w.write_all(&b[..n])
        }
    }

    /// An unsigned figure, which must fit in 64-bit signed (memory_viz's unpickler turns wider ones into
    /// BigInt, which its arithmetic then rejects): larger values are clamped, never wrapped.
    pub fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(v.min(i64::MAX as u64) as i64)
    }

    pub fn str(&mut self, s: &str) -> io::Result<()> {
        let b = s.as_bytes();
        if b.len() < 256 {
            self.w.write_all(&[SHORT_BINUNICODE, b.len() as u8])?;
        } else {
            self.w.write_all(&[BINUNICODE])?;
            self.w.write_all(&(b.len() as u32).to_le_bytes())?;
        }
        self.w.write_all(b)
    }

    /// Keeps the value on top of the stack as memo entry `i`.
    pub fn put(&mut self, i: u32) -> io::Result<()> {
        self.w.write_all(&[LONG_BINPUT])?;
        self.w.write_all(&i.to_le_bytes())
    }
    /// Memo entry `i` again (the same object).
    pub fn get(&mut self, i: u32) -> io::Result<()> {
        self.w.write_all(&[LONG_BINGET])?;
        self.w.write_all(&i.to_le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_take_the_shortest_signed_form() {
        let enc = |v: i64| {
            let mut p = Pickler { w: Vec::new() };
            p.int(v).unwrap();
            p.w
        };
        assert_eq!(enc(5), vec![BININT1, 5]);
        assert_eq!(enc(300), vec![BININT2, 44, 1]);
        assert_eq!(enc(-1), vec![BININT, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(enc(1 << 31), vec![LONG1, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(
            enc(i64::MAX),
            vec![LONG1, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]
        );
        let mut p = Pickler { w: Vec::new() };
        p.uint(u64::MAX).unwrap();
        assert_eq!(p.w, enc(i64::MAX));
    }
}
