//! The reader against what Python writes, and against pickles made to exhaust it (issue 36).

use super::*;

fn python_pickle(expr: &str) -> Vec<u8> {
    python_written(&format!("v = {expr}"), false)
}

fn depth(b: &[u8]) -> Result<usize, String> {
    read(b).map(|d| d.depth)
}

/// The value as Python's `repr` would show it, for comparing with Python itself.
fn show(d: &Doc, v: &V) -> String {
    match v {
        V::None => "None".into(),
        V::Bool(b) => if *b { "True" } else { "False" }.into(),
        V::Int(i) | V::BigInt(i) => i.to_string(),
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
                   s=frozenset(), b=b'x', n=-(1 << 70), w=(1 << 63) - 1, m=-(1 << 63), l=1 << 800)";
    let want = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "{}\nprint(repr(v))",
                program
                    .replace("frozenset()", "()")
                    .replace("b'x'", "b''")
                    .replace("-(1 << 70)", "-9223372036854775808")
                    .replace("1 << 800", "9223372036854775807")
            ),
        ])
        .output()
        .unwrap();
    let want = String::from_utf8(want.stdout).unwrap().trim().to_string();
    for shared in [false, true] {
        let d = read(&python_written(program, shared)).unwrap();
        assert_eq!(show(&d, &d.root), want, "shared {shared}");
        // Past 64-bit signed is said, not taken for the saturated figure; the extremes that fit are exact.
        let n = d.get(&d.root, "n").unwrap();
        assert_eq!((n.int(), n.exact_int()), (Some(i64::MIN), None));
        assert_eq!(d.get(&d.root, "m").unwrap().exact_int(), Some(i64::MIN));
        assert_eq!(d.get(&d.root, "w").unwrap().exact_int(), Some(i64::MAX));
    }
}

#[test]
fn a_key_given_twice_is_found_at_its_last_as_python_keeps_it() {
    // {'a': 1} then SETITEM 'a' 2: Python's dict says 2.
    let b = b"\x80\x04}\x8c\x01a\x94K\x01s\x8c\x01aK\x02s.";
    let d = read(b).unwrap();
    assert_eq!(d.get(&d.root, "a"), Some(&V::Int(2)));
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
    assert!(depth(&b).unwrap_err().contains("nests more than 200 deep"));
    // x = []; then a thousand times x = [x], kept only in the memo: the stack never holds more than two.
    let mut b = vec![0x80, 4, b']', b'q', 0, b'0'];
    for _ in 0..1_000 {
        b.extend([b']', b'h', 0, b'a', b'q', 0, b'0']);
    }
    b.extend([b'h', 0, b'.']);
    assert!(
        depth(&b).unwrap_err().contains("nests more than 200 deep"),
        "{:?}",
        depth(&b)
    );
    // 200 deep is read (and dropped: the value's own recursion stays within the bound).
    let mut b = vec![0x80, 4];
    b.extend(std::iter::repeat_n(b']', 200));
    b.extend(std::iter::repeat_n(b'a', 199));
    b.push(b'.');
    assert_eq!(depth(&b).unwrap(), 200);
}

#[test]
fn a_hundred_megabytes_of_none_or_mark_is_refused_early() {
    // Issue 36: 100 MB of NONE (a 32-byte value each) or of MARK asked the readers for gigabytes. Each is
    // refused before the read has looked at much of it: NONE by the stack's bound, MARK by the budget.
    for (op, why) in [
        (b'N', "more than 1048576 items on its stack"),
        (b'(', "more than 1024 MiB to build"),
    ] {
        let mut b = vec![0x80, 4];
        b.extend(std::iter::repeat_n(op, 100 << 20));
        b.push(b'.');
        let e = read(&b).unwrap_err();
        assert!(e.contains(why), "{e}");
    }
    // A million MARKs closed as they are opened cost nothing held: read.
    let mut b = vec![0x80, 4];
    for _ in 0..1_000_000 {
        b.extend([b'(', b'1']);
    }
    b.extend([b'N', b'.']);
    assert_eq!(read(&b).unwrap().root, V::None);
    // Built and dropped again and again (NONE, POP): the bytes built still add up.
    let mut b = vec![0x80, 4];
    for _ in 0..(40 << 20) {
        b.extend([b'N', b'0']);
    }
    b.push(b'.');
    assert!(read(&b).unwrap_err().contains("MiB to build"));
}

#[test]
fn a_memo_of_millions_of_entries_is_refused() {
    // One memo entry after another, each for a value dropped at once: bounded by the count.
    let mut b = vec![0x80, 4];
    for _ in 0..(5 << 20) {
        b.extend([b'N', 0x94, b'0']);
    }
    b.extend([b'N', b'.']);
    assert!(read(&b)
        .unwrap_err()
        .contains(&format!("memoizes more than {MAX_MEMO} values")));
    // The same under explicit keys (BINPUT's four-byte form).
    let mut b = vec![0x80, 4];
    for k in 0..(5u32 << 20) {
        b.push(b'N');
        b.push(b'r');
        b.extend(k.to_le_bytes());
        b.push(b'0');
    }
    b.extend([b'N', b'.']);
    assert!(read(&b).unwrap_err().contains("memoizes more than"));
}

#[test]
fn copies_through_the_memo_are_counted_before_they_are_made() {
    // A list of a million NONEs memoized at each of 40 levels: each level is copied into the memo as it leaves
    // the stack, so the leaves are copied 40 times (1.3 GB from 1 MB of input).
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
    assert!(read(&b).unwrap_err().contains("MiB to build"));
    b.truncate(b.len() - 1 - 2 * 30);
    b.push(b'.');
    let d = read(&b).unwrap();
    assert_eq!(d.depth, 11);
    let mut v = &d.root;
    for _ in 0..10 {
        v = &v.list()[0];
    }
    assert_eq!(v.list().len(), 1_000_000);
}

#[test]
fn a_pickle_that_shares_one_list_thousands_of_times_is_refused_before_it_is_built() {
    // The audit's bomb: one list of 50,000 ints, then a list referring to it 50,000 times through the memo:
    // 350 KB that a reader copying at each use would make into 2.5 billion values.
    let b = python_written("x = list(range(50000))\nv = [x] * 50000", true);
    assert!(b.len() < 1 << 20, "{} bytes", b.len());
    let e = read(&b).unwrap_err();
    assert!(e.contains("more than 1024 MiB to build"), "{e}");
    // Shared by DUP, the same.
    let mut b = vec![0x80, 4, b']', b'('];
    b.extend(std::iter::repeat_n(b'N', 1_000_000));
    b.push(b'e');
    b.extend(std::iter::repeat_n(b'2', 40));
    b.push(b'.');
    assert!(read(&b).unwrap_err().contains("MiB to build"));
    // A PyTorch snapshot that shares its frames the same way, but a few times each, is read.
    let b = python_written(
        "f = [dict(filename='a.py', line=3, name='f')]\nv = dict(device_traces=[[dict(action='alloc', frames=f) for _ in range(20000)]])",
        true,
    );
    let d = read(&b).unwrap();
    assert_eq!(d.depth, 6);
    let trace = &d.get(&d.root, "device_traces").unwrap().list()[0];
    assert_eq!(trace.list().len(), 20_000);
}

#[test]
fn bad_input_is_an_error_never_a_panic() {
    for b in [
        &b""[..],
        b"\x80\x04",
        b"\x80\x04]",
        b"\xff",
        b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\x80\x04a.",
        b"\x80\x04]K\x01s.",
        b"\x80\x04}K\x01u.",
        b"\x80\x04h\x07.",
        b"\x80\x04\x8c\xff",
        b"\x80\x04(\x85.",
        b"\x80\x04(2.",
        b"\x80\x04(\x94.",
        b"\x80\x04cos\nsystem\n.",
        b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
        b"I1\n.",
    ] {
        assert!(read(b).is_err(), "{b:?}");
    }
}
