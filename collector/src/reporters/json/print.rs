//! How the JSON outputs are printed: serde_json writes the typed reports through one of two formatters.
//!
//! [`pretty`] (`report --json`, `oom --json`): a container holding only scalars goes on one line (`[1, 2]`,
//! `{"t_ns": 0, "bytes": 5}`), any other one member per line, indented by two; empty ones are `[]` and `{}`.
//! serde_json's own `PrettyFormatter` spreads every container, so a timeline of thousands of buckets would take
//! five lines each; whether a container holds only scalars is known only once it closes, so [`Pretty`] holds
//! the innermost container's members until then, or until a container opens inside it.
//!
//! [`compact`] (the HTML export's data): one line, no spaces.
//!
//! Both escape strings as the reports always have (RFC 8259): `"`, `\` and control characters, `\n` `\r` `\t`
//! by name and the rest (backspace and form feed too) as `\u00xx`, and DEL as `\u007f`; everything else is
//! written as UTF-8.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

/// `v` as the reports print it: the layout above, no newline at the end.
pub fn pretty<T: Serialize + ?Sized>(v: &T) -> String {
    write_with(v, Pretty::default())
}

/// `v` on one line, no spaces.
pub fn compact<T: Serialize + ?Sized>(v: &T) -> String {
    write_with(v, Compact)
}

fn write_with<T: Serialize + ?Sized, F: Formatter>(v: &T, f: F) -> String {
    let mut out = Vec::with_capacity(64 << 10);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, f);
    // The reports are structs, sequences and scalars written to memory: nothing in them can fail.
    v.serialize(&mut ser)
        .expect("a report serialises without error");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// A run of a string between escapes, DEL escaped (serde_json leaves it as it is).
fn write_fragment<W: ?Sized + Write>(w: &mut W, mut s: &str) -> io::Result<()> {
    while let Some(i) = s.find('\u{7f}') {
        w.write_all(&s.as_bytes()[..i])?;
        w.write_all(b"\\u007f")?;
        s = &s[i + 1..];
    }
    w.write_all(s.as_bytes())
}

/// A character serde_json escapes: backspace and form feed as `\u00xx` (it would write `\b`, `\f`).
fn write_escape<W: ?Sized + Write>(w: &mut W, e: CharEscape) -> io::Result<()> {
    match e {
        CharEscape::Backspace => w.write_all(b"\\u0008"),
        CharEscape::FormFeed => w.write_all(b"\\u000c"),
        e => CompactFormatter.write_char_escape(w, e),
    }
}

/// serde_json's compact layout with the reports' escapes.
struct Compact;

impl Formatter for Compact {
    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, s: &str) -> io::Result<()> {
        write_fragment(w, s)
    }

    fn write_char_escape<W: ?Sized + Write>(&mut self, w: &mut W, e: CharEscape) -> io::Result<()> {
        write_escape(w, e)
    }
}

/// An open container.
struct Open {
    object: bool,
    /// Written one member per line: a container opened inside it. Until then its members are held.
    spread: bool,
}

/// The reports' layout (see the module's documentation). Only the innermost open container can still be on
/// one line: a container opening inside another spreads that one.
#[derive(Default)]
struct Pretty {
    open: Vec<Open>,
    /// The members of the innermost container so far, while it is not spread, as they would be written on one
    /// line (`"key": value` for an object's), without separators.
    held: Vec<u8>,
    /// Where each held member starts in `held`.
    starts: Vec<usize>,
}

/// Writes to the held members while the innermost container is not spread, else to the output.
macro_rules! sink {
    ($self:ident, $w:ident, |$o:ident| $e:expr) => {
        if $self.holding() {
            let $o = &mut $self.held;
            $e
        } else {
            let $o = $w;
            $e
        }
    };
}

/// Scalars go wherever [`sink`] says; serde_json's compact formatter writes them.
macro_rules! scalars {
    ($($name:ident($t:ty)),* $(,)?) => {$(
        fn $name<W: ?Sized + Write>(&mut self, w: &mut W, v: $t) -> io::Result<()> {
            sink!(self, w, |o| CompactFormatter.$name(o, v))
        }
    )*};
}

impl Pretty {
    fn holding(&self) -> bool {
        self.open.last().is_some_and(|o| !o.spread)
    }

    fn pad<W: ?Sized + Write>(w: &mut W, depth: usize) -> io::Result<()> {
        const SPACES: &[u8] = &[b' '; 64];
        let mut n = 2 * depth;
        while n > 0 {
            let k = n.min(SPACES.len());
            w.write_all(&SPACES[..k])?;
            n -= k;
        }
        Ok(())
    }

    /// The innermost container's held members, once a container opens inside the last of them: one a line.
    fn spread<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        let depth = self.open.len();
        let Some(top) = self.open.last_mut() else {
            return Ok(());
        };
        top.spread = true;
        w.write_all(if top.object { b"{\n" } else { b"[\n" })?;
        for (i, &start) in self.starts.iter().enumerate() {
            if i > 0 {
                w.write_all(b",\n")?;
            }
            Self::pad(w, depth)?;
            let end = self.starts.get(i + 1).copied().unwrap_or(self.held.len());
            w.write_all(&self.held[start..end])?;
        }
        Ok(())
    }

    fn begin<W: ?Sized + Write>(&mut self, w: &mut W, object: bool) -> io::Result<()> {
        if self.holding() {
            self.spread(w)?;
        }
        self.open.push(Open {
            object,
            spread: false,
        });
        self.held.clear();
        self.starts.clear();
        Ok(())
    }

    fn end<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        let Some(o) = self.open.pop() else {
            return Ok(());
        };
        let (open, close) = if o.object { (b'{', b'}') } else { (b'[', b']') };
        if o.spread {
            w.write_all(b"\n")?;
            Self::pad(w, self.open.len())?;
            return w.write_all(&[close]);
        }
        w.write_all(&[open])?;
        for (i, &start) in self.starts.iter().enumerate() {
            if i > 0 {
                w.write_all(b", ")?;
            }
            let end = self.starts.get(i + 1).copied().unwrap_or(self.held.len());
            w.write_all(&self.held[start..end])?;
        }
        // The container around it was spread when this one opened: nothing of it is held.
        self.held.clear();
        self.starts.clear();
        w.write_all(&[close])
    }

    fn member<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if self.holding() {
            self.starts.push(self.held.len());
            return Ok(());
        }
        if !first {
            w.write_all(b",\n")?;
        }
        Self::pad(w, self.open.len())
    }
}

impl Formatter for Pretty {
    scalars!(
        write_bool(bool),
        write_i8(i8),
        write_i16(i16),
        write_i32(i32),
        write_i64(i64),
        write_i128(i128),
        write_u8(u8),
        write_u16(u16),
        write_u32(u32),
        write_u64(u64),
        write_u128(u128),
        write_f32(f32),
        write_f64(f64),
        write_number_str(&str),
        write_raw_fragment(&str),
    );

    fn write_null<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        sink!(self, w, |o| o.write_all(b"null"))
    }

    fn begin_string<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        sink!(self, w, |o| o.write_all(b"\""))
    }

    fn end_string<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        sink!(self, w, |o| o.write_all(b"\""))
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, s: &str) -> io::Result<()> {
        sink!(self, w, |o| write_fragment(o, s))
    }

    fn write_char_escape<W: ?Sized + Write>(&mut self, w: &mut W, e: CharEscape) -> io::Result<()> {
        sink!(self, w, |o| write_escape(o, e))
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.begin(w, false)
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end(w)
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.member(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.begin(w, true)
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end(w)
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.member(w, first)
    }

    fn end_object_key<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        Ok(())
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        sink!(self, w, |o| o.write_all(b": "))
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct X {
        x: bool,
    }

    #[derive(Serialize)]
    struct Doc {
        a: Vec<Option<u64>>,
        b: Vec<X>,
        c: Vec<u64>,
        d: X,
        e: Vec<Vec<u64>>,
        f: Option<X>,
        s: &'static str,
    }

    fn doc() -> Doc {
        Doc {
            a: vec![Some(1), None],
            b: vec![X { x: true }],
            c: vec![],
            d: X { x: false },
            e: vec![vec![], vec![2, 3]],
            f: None,
            s: "a\"b\\c\nd\u{1}\u{8}\u{c}\u{7f}é\u{2028}</",
        }
    }

    #[test]
    fn scalar_containers_go_on_one_line_the_rest_one_member_a_line() {
        assert_eq!(
            pretty(&doc()),
            "{\n  \"a\": [1, null],\n  \"b\": [\n    {\"x\": true}\n  ],\n  \"c\": [],\n  \"d\": {\"x\": false},\n  \
             \"e\": [\n    [],\n    [2, 3]\n  ],\n  \"f\": null,\n  \
             \"s\": \"a\\\"b\\\\c\\nd\\u0001\\u0008\\u000c\\u007fé\u{2028}</\"\n}"
        );
        assert_eq!(pretty(&X { x: true }), "{\"x\": true}");
        assert_eq!(pretty(&Vec::<u64>::new()), "[]");
        assert_eq!(pretty(&7u64), "7");
    }

    #[test]
    fn compact_is_one_line_with_the_same_escapes() {
        assert_eq!(
            compact(&doc()),
            "{\"a\":[1,null],\"b\":[{\"x\":true}],\"c\":[],\"d\":{\"x\":false},\"e\":[[],[2,3]],\"f\":null,\
             \"s\":\"a\\\"b\\\\c\\nd\\u0001\\u0008\\u000c\\u007fé\u{2028}</\"}"
        );
    }

    #[test]
    fn both_parse_back_to_the_same_value() {
        let p: serde_json::Value = serde_json::from_str(&pretty(&doc())).unwrap();
        let c: serde_json::Value = serde_json::from_str(&compact(&doc())).unwrap();
        assert_eq!(p, c);
        assert_eq!(p["s"], "a\"b\\c\nd\u{1}\u{8}\u{c}\u{7f}é\u{2028}</");
    }
}
