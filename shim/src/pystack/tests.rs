use super::*;

#[test]
fn a_process_without_python_has_no_frames() {
    let mut out: Vec<PyFrame> = Vec::new();
    assert_eq!(walk(&mut out), Walk::NoPython);
    assert!(out.is_empty());
    let mut buf = [0xffu8; 16];
    assert_eq!(
        // SAFETY: `buf` is a local array of `buf.len()` bytes.
        unsafe { vramtrace_debug_pystack(buf.as_mut_ptr(), buf.len()) },
        0
    );
    assert_eq!(buf[0], 0);
}

/// `_Py_DebugOffsets` of 3.13.0 as 64-bit words (what x86-64 `python3.13` holds).
fn slots_313() -> Vec<u64> {
    let mut s = vec![u64::from_ne_bytes(*b"xdebugpy"), 0x030d00f0, 0];
    s.extend([50_000, 1000, 1008]); // runtime_state
    s.extend([
        9000, 8, 0, 7000, 7100, 7200, 7300, 7400, 7500, 7600, 0, 7700, 7800,
    ]); // interpreter_state
    s.extend([400, 0, 8, 16, 72, 152, 160, 200, 32]); // thread_state
    s.extend([80, 8, 0, 56, 72, 70]); // interpreter_frame
    s.extend([208, 112, 120, 128, 136, 68, 60, 96, 104, 200]); // code_object
    s.extend([16, 8]); // pyobject
    s.extend([920, 24, 88, 168]); // type_object
    s.extend([
        32, 24, 16, 40, 24, 16, 48, 32, 40, 24, 16, 24, 16, 33, 16, 32,
    ]); // tuple..bytes
    s.extend([64, 32, 16, 40]); // unicode_object
    s.extend([400, 60]); // gc
    s
}

/// 3.14's layout: sections gained fields (`threads_main`, `stackpointer`, `co_tlbc`, a set section, ...).
fn slots_314() -> Vec<u64> {
    let mut s = vec![u64::from_ne_bytes(*b"xdebugpy"), 0x030e00f0, 0];
    s.extend([60_000, 1000, 1008]);
    s.extend([
        9000, 8, 0, 7000, 7008, 7100, 7200, 7300, 7400, 7500, 7600, 0, 7700, 7800, 7900, 0,
    ]);
    s.extend([420, 0, 8, 16, 80, 160, 168, 208, 40]);
    s.extend([88, 8, 0, 56, 80, 74, 64, 0]);
    s.extend([216, 112, 120, 128, 136, 68, 60, 96, 104, 208, 0]);
    s.extend([
        16, 8, 920, 24, 88, 168, 32, 24, 16, 40, 24, 16, 200, 24, 40, 32,
    ]);
    s.extend([48, 32, 40, 24, 16, 24, 16, 33, 16, 32]);
    s.extend([64, 32, 16, 40, 400, 60, 120, 80, 96, 88]);
    s
}

#[test]
fn debug_offsets_are_found_by_content() {
    let o = parse_debug_offsets(&slots_313(), 0x030d00f0).unwrap();
    assert_eq!(
        o,
        Offsets {
            shape: Shape::Direct,
            ts_frame: 72,
            ts_thread_id: 152,
            fr_previous: 8,
            fr_code: 0,
            fr_instr: 56,
            fr_owner: Some(70),
            co_filename: 112,
            co_name: 128,
            co_code: 200,
            co_linetable: 136,
            co_firstlineno: 68,
            str_ascii_data: 40,
            str_compact_data: 56,
            str_ready_bit: false,
        }
    );
    let o = parse_debug_offsets(&slots_314(), 0x030e01f0).unwrap();
    assert_eq!(
        (
            o.ts_frame,
            o.ts_thread_id,
            o.fr_instr,
            o.fr_owner,
            o.co_name,
            o.co_code
        ),
        (80, 160, 56, Some(74), 128, 208)
    );
}

#[test]
fn debug_offsets_that_do_not_fit_are_refused() {
    let good = slots_313();
    let mut s = good.clone();
    s[0] = u64::from_ne_bytes(*b"xdebugpz");
    assert!(parse_debug_offsets(&s, 0x030d00f0).is_err(), "cookie");
    assert!(
        parse_debug_offsets(&good, 0x030e00f0).is_err(),
        "another version"
    );
    let mut s = good.clone();
    s[2] = 1;
    assert!(parse_debug_offsets(&s, 0x030d00f0)
        .unwrap_err()
        .contains("free-threaded"));
    let mut s = good.clone();
    let i = s.iter().position(|&v| v == 152).unwrap();
    s[i] = 100_000; // thread_id outside the thread state
    assert!(parse_debug_offsets(&s, 0x030d00f0).is_err(), "thread_id");
    let mut s = good;
    let i = s.windows(4).position(|w| w == [64, 32, 16, 40]).unwrap();
    s[i + 3] = 48; // another string header
    assert!(
        parse_debug_offsets(&s, 0x030d00f0).is_err(),
        "string layout"
    );
    assert!(parse_debug_offsets(&[], 0x030d00f0).is_err());
}

/// A fake `str` object in our own memory: header words, then `data` at `data_at`.
fn fake_str(ty: usize, len: usize, state: u32, data_at: usize, data: &[u8]) -> Vec<u64> {
    let mut b = vec![0u8; data_at + data.len() + 8];
    b[OB_TYPE..OB_TYPE + 8].copy_from_slice(&ty.to_ne_bytes());
    b[STR_LENGTH..STR_LENGTH + 8].copy_from_slice(&len.to_ne_bytes());
    b[STR_STATE..STR_STATE + 4].copy_from_slice(&state.to_ne_bytes());
    b[data_at..data_at + data.len()].copy_from_slice(data);
    b.chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_ne_bytes(w)
        })
        .collect()
}

const COMPACT: u32 = 1 << 5;
const ASCII: u32 = 1 << 6;
const READY: u32 = 1 << 7;

fn kind(k: u32) -> u32 {
    k << 2
}

#[test]
fn strings_of_every_kind_decode() {
    let ty = 0x5555_0000usize;
    for o in [OFFSETS_311, OFFSETS_312] {
        let ready = if o.str_ready_bit { READY } else { 0 };
        let check = |obj: &[u64], want: Option<&str>| {
            let addr = obj.as_ptr() as usize;
            assert_eq!(decode_str(&o, &Direct, addr).as_deref(), want);
            assert_eq!(decode_str(&o, &Safe::new(), addr).as_deref(), want);
        };
        let a = fake_str(
            ty,
            5,
            kind(1) | COMPACT | ASCII | ready,
            o.str_ascii_data,
            b"train",
        );
        check(&a, Some("train"));
        let l1 = fake_str(
            ty,
            3,
            kind(1) | COMPACT | ready,
            o.str_compact_data,
            &[0x66, 0xe9, 0x65],
        );
        check(&l1, Some("f\u{e9}e"));
        let u2: Vec<u8> = "関数x"
            .encode_utf16()
            .flat_map(|c| c.to_ne_bytes())
            .collect();
        let s2 = fake_str(ty, 3, kind(2) | COMPACT | ready, o.str_compact_data, &u2);
        check(&s2, Some("関数x"));
        let u4: Vec<u8> = [0x2_0000u32, 'a' as u32, 0xd800]
            .iter()
            .flat_map(|c| c.to_ne_bytes())
            .collect();
        let s4 = fake_str(ty, 3, kind(4) | COMPACT | ready, o.str_compact_data, &u4);
        check(&s4, Some("𠀀a\u{fffd}"));
        // A legacy (non-compact) string: a pointer to its characters.
        let chars = *b"legacy\0\0";
        let ptr = (chars.as_ptr() as usize).to_ne_bytes();
        let legacy = fake_str(ty, 6, kind(1) | ASCII | ready, o.str_compact_data, &ptr);
        check(&legacy, Some("legacy"));
        // Cut to MAX_CHARS.
        let long = vec![b'x'; MAX_CHARS + 10];
        let l = fake_str(
            ty,
            long.len(),
            kind(1) | COMPACT | ASCII | ready,
            o.str_ascii_data,
            &long,
        );
        check(&l, Some(&"x".repeat(MAX_CHARS)));
        // Nonsense kinds and lengths.
        check(
            &fake_str(ty, 1, kind(3) | COMPACT | ready, o.str_compact_data, b"a"),
            None,
        );
        check(
            &fake_str(
                ty,
                1,
                kind(2) | COMPACT | ASCII | ready,
                o.str_ascii_data,
                b"a",
            ),
            None,
        );
        check(
            &fake_str(
                ty,
                usize::MAX,
                kind(1) | COMPACT | ASCII | ready,
                o.str_ascii_data,
                b"a",
            ),
            None,
        );
    }
    // 3.10/3.11 strings that are not ready are refused.
    let o = OFFSETS_311;
    let nr = fake_str(ty, 1, kind(1) | COMPACT | ASCII, o.str_ascii_data, b"a");
    assert_eq!(decode_str(&o, &Direct, nr.as_ptr() as usize), None);
}

#[test]
fn safe_reads_report_unreadable_memory() {
    // SAFETY: a fresh anonymous private mapping chosen by the kernel (null hint, no fd): it overlaps nothing.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    assert_ne!(page as *mut c_void, libc::MAP_FAILED);
    // SAFETY: `page` is the start of the 8192 writable bytes just mapped (page-aligned); the second page is
    // ours to unmap, and nothing refers to it.
    unsafe {
        *(page as *mut u64) = 0x1122_3344_5566_7788;
        libc::munmap((page + 4096) as *mut c_void, 4096);
    }
    let safe = Safe::new();
    assert_eq!(safe.word(page), Some(0x1122_3344_5566_7788));
    assert_eq!(safe.word(page + 4096), None, "unmapped");
    let mut b = [0u8; 16];
    assert!(
        !safe.copy(page + 4088, &mut b),
        "straddles the unmapped page"
    );
    assert_eq!(safe.word(0), None);
    assert_eq!(safe.word(page + 4), None, "misaligned word");
    // The pipe fallback agrees.
    let mut w = [0u8; 8];
    assert!(safe.through_pipe(page, &mut w));
    assert_eq!(u64::from_ne_bytes(w), 0x1122_3344_5566_7788);
    assert!(!safe.through_pipe(page + 4096, &mut w));
    assert!(!safe.through_pipe(page + 4088, &mut b));
    let mut big = vec![0u8; 4096];
    assert!(safe.through_pipe(page, &mut big));
    assert!(safe.through_pipe(page, &mut w), "the pipe is left empty");
    assert_eq!(u64::from_ne_bytes(w), 0x1122_3344_5566_7788);
    // SAFETY: the first page of our own mapping, which nothing refers to any more.
    unsafe { libc::munmap(page as *mut c_void, 4096) };
}

unsafe extern "C" fn fake_addr2line(_code: *mut c_void, offset: c_int) -> c_int {
    1000 + offset
}

/// Objects laid out in our own memory as `off` says, for walking without an interpreter.
struct Heap {
    blocks: Vec<Vec<u64>>,
    code_type: Vec<u64>,
    unicode_type: Vec<u64>,
}

impl Heap {
    fn new() -> Heap {
        Heap {
            blocks: Vec::new(),
            code_type: vec![0; 64],
            unicode_type: vec![0; 64],
        }
    }

    fn alloc(&mut self, words: usize) -> usize {
        self.blocks.push(vec![0; words]);
        self.blocks.last().unwrap().as_ptr() as usize
    }

    fn set(&mut self, addr: usize, value: u64) {
        // SAFETY: every caller passes an address inside one of this heap's blocks (`alloc`, `code`, `frame`,
        // `tstate` plus an offset their sizes cover), 8-aligned (block bases are, every offset used is a
        // multiple of 8). The blocks' buffers do not move when `blocks` grows. The pointer comes from
        // `Vec::as_ptr`, whose docs ask for no writes through it: test code only, nothing else holds a
        // reference into the block meanwhile.
        unsafe { *(addr as *mut u64) = value };
    }

    fn set_u8(&mut self, addr: usize, value: u8) {
        // SAFETY: as in `set`, for one byte (no alignment needed).
        unsafe { *(addr as *mut u8) = value };
    }

    fn python(&self, off: Offsets) -> Python {
        Python {
            off,
            addr2line: fake_addr2line,
            code_type: self.code_type.as_ptr() as usize,
            unicode_type: self.unicode_type.as_ptr() as usize,
            bytes_type: 0,
        }
    }

    fn str(&mut self, off: &Offsets, s: &str) -> usize {
        let ty = self.unicode_type.as_ptr() as usize;
        let state = kind(1) | COMPACT | ASCII | if off.str_ready_bit { READY } else { 0 };
        let words = fake_str(ty, s.len(), state, off.str_ascii_data, s.as_bytes());
        self.blocks.push(words);
        self.blocks.last().unwrap().as_ptr() as usize
    }

    /// A code object named `name` whose frames will be at code unit `unit`.
    fn code(&mut self, off: &Offsets, name: &str) -> usize {
        let code = self.alloc(off.co_code / 8 + 64);
        let (file, func) = (self.str(off, "f.py"), self.str(off, name));
        self.set(code + OB_TYPE, self.code_type.as_ptr() as u64);
        self.set(code + OB_SIZE, 100);
        self.set(code + off.co_filename, file as u64);
        self.set(code + off.co_name, func as u64);
        code
    }

    /// A frame running `code` at code unit `unit`, called from `previous`.
    fn frame(
        &mut self,
        off: &Offsets,
        code: usize,
        unit: usize,
        previous: usize,
        tag: u64,
    ) -> usize {
        let f = self.alloc(16);
        self.set(f + off.fr_code, code as u64 | tag);
        self.set(f + off.fr_previous, previous as u64);
        self.set(f + off.fr_instr, (code + off.co_code + 2 * unit) as u64);
        f
    }

    fn tstate(&mut self, off: &Offsets, innermost: usize, thread: usize) -> usize {
        let ts = self.alloc(64);
        self.set(ts + off.ts_thread_id, thread as u64);
        match off.shape {
            Shape::CFrame { current } => {
                let cf = self.alloc(4);
                self.set(cf + current, innermost as u64);
                self.set(ts + off.ts_frame, cf as u64);
            }
            _ => self.set(ts + off.ts_frame, innermost as u64),
        }
        ts
    }
}

fn me() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

fn names(frames: &[PyFrame]) -> Vec<(&str, u32)> {
    frames
        .iter()
        .map(|f| (f.function.as_str(), f.line))
        .collect()
}

#[test]
fn chains_walk_innermost_first_hiding_entry_frames() {
    let direct = parse_debug_offsets(&slots_313(), 0x030d00f0).unwrap();
    for off in [OFFSETS_311, OFFSETS_312, direct] {
        let mut h = Heap::new();
        let (outer, entry, inner) = (
            h.code(&off, "outer"),
            h.code(&off, "entry"),
            h.code(&off, "inner"),
        );
        let f3 = h.frame(&off, outer, 7, 0, 0);
        let f2 = h.frame(&off, entry, 0, f3, 0);
        let tag = if off.shape == Shape::Direct { 1 } else { 0 };
        let f1 = h.frame(&off, inner, 3, f2, tag);
        if let Some(at) = off.fr_owner {
            h.set_u8(f2 + at, OWNER_HIDDEN);
        }
        let ts = h.tstate(&off, f1, me());
        let py = h.python(off);
        for strict in [true, false] {
            let mut out: Vec<PyFrame> = Vec::new();
            assert_eq!(walk_frames(&py, &Safe::new(), ts, &mut out, strict), Ok(()));
            let mut want = vec![("inner", 1006), ("entry", 1000), ("outer", 1014)];
            if off.fr_owner.is_some() {
                want.remove(1);
            }
            assert_eq!(names(&out), want, "{off:?}");
            assert!(out.iter().all(|f| f.file == "f.py"));
            let mut direct: Vec<PyFrame> = Vec::new();
            let _ = walk_frames(&py, &Direct, ts, &mut direct, strict);
            assert_eq!(direct, out);
        }
        // Another thread's state.
        let other = h.tstate(&off, f1, me() + 8);
        let mut out: Vec<PyFrame> = Vec::new();
        assert_eq!(
            walk_frames(&py, &Direct, other, &mut out, false),
            Err(Stop::OtherThread)
        );
        assert!(out.is_empty());
    }
}

/// Keys name frames by content: two code objects of the same name (their strings apart in memory) at the
/// same line have one key, another name or line another; and there is a key for each frame the strings'
/// walk keeps, under every layout.
#[test]
fn keys_name_frames_by_content() {
    let direct = parse_debug_offsets(&slots_313(), 0x030d00f0).unwrap();
    for off in [OFFSETS_311, OFFSETS_312, direct] {
        let mut h = Heap::new();
        let (a, a_again, b) = (h.code(&off, "f"), h.code(&off, "f"), h.code(&off, "g"));
        let f4 = h.frame(&off, b, 3, 0, 0);
        let f3 = h.frame(&off, a, 5, f4, 0);
        let f2 = h.frame(&off, a_again, 3, f3, 0);
        let f1 = h.frame(&off, a, 3, f2, 0);
        let ts = h.tstate(&off, f1, me());
        let py = h.python(off);
        let mut keys: Vec<FrameKey> = Vec::new();
        assert_eq!(walk_frames(&py, &Direct, ts, &mut keys, false), Ok(()));
        let mut frames: Vec<PyFrame> = Vec::new();
        assert_eq!(walk_frames(&py, &Direct, ts, &mut frames, false), Ok(()));
        assert_eq!(keys.len(), 4, "{off:?}");
        assert_eq!(keys.len(), frames.len());
        assert_eq!(
            keys[0], keys[1],
            "same name and line, another code object: {off:?}"
        );
        assert_ne!(keys[0], keys[2], "another line");
        assert_ne!(keys[0].function, keys[3].function, "another name");
        assert_eq!(keys[0].file, keys[3].file, "the same file");
        assert_eq!(
            keys.iter().map(|k| k.line).collect::<Vec<_>>(),
            frames.iter().map(|f| f.line).collect::<Vec<_>>()
        );
    }
}

#[test]
fn odd_chains_stop_the_walk() {
    let off = OFFSETS_312;
    let mut h = Heap::new();
    let code = h.code(&off, "f");
    let py = h.python(off);
    // A loop: kept frames stay, strict walks fail.
    let a = h.frame(&off, code, 1, 0, 0);
    let b = h.frame(&off, code, 2, a, 0);
    h.set(a + off.fr_previous, b as u64);
    let ts = h.tstate(&off, b, me());
    let mut out: Vec<PyFrame> = Vec::new();
    assert_eq!(
        walk_frames(&py, &Direct, ts, &mut out, false),
        Err(Stop::Bad(B_LOOP))
    );
    assert_eq!(names(&out), [("f", 1004), ("f", 1002)]);
    assert_eq!(
        walk_frames(&py, &Safe::new(), ts, &mut Vec::<PyFrame>::new(), true),
        Err(Stop::Bad(B_LOOP))
    );
    // A long chain is cut at MAX_FRAMES.
    let mut f = 0;
    for _ in 0..MAX_FRAMES + 10 {
        f = h.frame(&off, code, 1, f, 0);
    }
    let ts = h.tstate(&off, f, me());
    let mut out: Vec<PyFrame> = Vec::new();
    assert_eq!(walk_frames(&py, &Direct, ts, &mut out, true), Ok(()));
    assert_eq!(out.len(), MAX_FRAMES);
    // Not a code object.
    let bogus = h.alloc(64);
    let f = h.frame(&off, bogus, 0, 0, 0);
    let g = h.frame(&off, code, 1, f, 0);
    let ts = h.tstate(&off, g, me());
    let mut out: Vec<PyFrame> = Vec::new();
    assert_eq!(
        walk_frames(&py, &Direct, ts, &mut out, false),
        Err(Stop::Bad(B_CODE))
    );
    assert_eq!(out.len(), 1);
    // An unmapped frame pointer: the safe reader says so.
    let ts = h.tstate(&off, 0x10_0000_0000, me());
    assert_eq!(
        walk_frames(&py, &Safe::new(), ts, &mut Vec::<PyFrame>::new(), true),
        Err(Stop::Bad(B_FRAME))
    );
    // An instruction outside its code: strict walks fail, others say line 0.
    let f = h.frame(&off, code, 1000, 0, 0);
    let ts = h.tstate(&off, f, me());
    assert_eq!(
        walk_frames(&py, &Direct, ts, &mut Vec::<PyFrame>::new(), true),
        Err(Stop::Bad(B_INSTR))
    );
    let mut out: Vec<PyFrame> = Vec::new();
    assert_eq!(walk_frames(&py, &Direct, ts, &mut out, false), Ok(()));
    assert_eq!(names(&out), [("f", 0)]);
    // A name that is not a string.
    h.set(code + off.co_name, bogus as u64);
    let f = h.frame(&off, code, 1, 0, 0);
    let ts = h.tstate(&off, f, me());
    assert_eq!(
        walk_frames(&py, &Direct, ts, &mut Vec::<PyFrame>::new(), true),
        Err(Stop::Bad(B_STRING))
    );
    let mut out: Vec<PyFrame> = Vec::new();
    assert_eq!(walk_frames(&py, &Direct, ts, &mut out, false), Ok(()));
    assert_eq!(names(&out), [("?", 1002)]);
}
