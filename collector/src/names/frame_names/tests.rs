use super::*;
use vramtrace_format::{Object, Objects, Stack};

fn sym(function: Option<&str>, file: Option<&str>, line: Option<u32>, inlined: bool) -> SymFrame {
    SymFrame {
        function: function.map(str::to_string),
        file: file.map(str::to_string),
        line,
        inlined,
    }
}

/// Records written as `run` writes them, read back as a reader keeps them.
fn through_the_trace(records: &[FrameNames]) -> Stored {
    let r = Resolution {
        records: records.to_vec(),
        ..Default::default()
    };
    let bytes = encode(&r);
    let mut stored = Stored::default();
    for (k, p) in codec::frames(&bytes) {
        assert_eq!(k, kind::FRAME_NAMES);
        match codec::decode_record(k, p) {
            Ok(Some(Record::FrameNames(n))) => stored.add(n),
            other => panic!("{other:?}"),
        }
    }
    stored
}

#[test]
fn stored_names_read_back_as_the_symboliser_gave_them() {
    let inlined = vec![
        sym(Some("Gpu::alloc"), Some("src/main.rs"), Some(218), true),
        sym(Some("training"), Some("src/main.rs"), Some(332), false),
    ];
    let bare = vec![sym(
        Some("c10::cuda::CUDACachingAllocator::malloc"),
        None,
        None,
        false,
    )];
    let mut out = Vec::new();
    let mut w = RecordWriter::default();
    w.object(
        "/bin/prog",
        &[1, 2],
        vec![(0x1234, inlined.clone())],
        &mut out,
    );
    w.object(
        "/lib/libc10_cuda.so",
        &[],
        vec![(0x43c0b, bare.clone())],
        &mut out,
    );
    w.finish(&mut out);
    assert_eq!(out.len(), 1);
    // One string table: "src/main.rs" once.
    assert_eq!(
        out[0]
            .strings
            .iter()
            .filter(|s| *s == "src/main.rs")
            .count(),
        1
    );
    let stored = through_the_trace(&out);
    assert_eq!(stored.get("/bin/prog", &[1, 2], 0x1234), Some(inlined));
    assert_eq!(stored.get("/lib/libc10_cuda.so", &[], 0x43c0b), Some(bare));
    // Another build of the object, another offset: not named by the trace.
    assert_eq!(stored.get("/bin/prog", &[9], 0x1234), None);
    assert_eq!(stored.get("/bin/prog", &[1, 2], 0x1235), None);
    assert_eq!(stored.not_kept, 0);
}

#[test]
fn large_sets_of_names_go_in_several_records_each_under_the_frame_limit() {
    let long = "f".repeat(MAX_NAME_BYTES * 2);
    let frames: Vec<(u64, Vec<SymFrame>)> = (0..3000u64)
        .map(|i| (i, vec![sym(Some(&format!("{i}{long}")), None, None, false)]))
        .collect();
    let mut out = Vec::new();
    let mut w = RecordWriter::default();
    w.object("/lib/big.so", &[7], frames, &mut out);
    w.finish(&mut out);
    assert!(out.len() >= 2, "{} records", out.len());
    let bytes = encode(&Resolution {
        records: out.clone(),
        ..Default::default()
    });
    for (_, p) in codec::frames(&bytes) {
        assert!(
            p.len() < (vramtrace_format::MAX_FRAME as usize) / 4,
            "{}",
            p.len()
        );
    }
    let stored = through_the_trace(&out);
    for i in [0u64, 1500, 2999] {
        let f = stored.get("/lib/big.so", &[7], i).unwrap();
        let name = f[0].function.as_deref().unwrap();
        assert_eq!(name.len(), MAX_NAME_BYTES, "cut when written");
        assert!(name.starts_with(&i.to_string()));
    }
}

#[test]
fn a_forged_record_is_bounded_and_its_text_kept_for_the_printable_filter() {
    let escape = "evil\u{1b}[2J\u{7}\nname";
    let forged = FrameNames {
        strings: vec![escape.into(), "é".repeat(MAX_NAME_BYTES)],
        objects: vec![NamedObject {
            path: "/lib/x.so".into(),
            build_id: vec![],
            frames: vec![
                // Control characters, a name past the bound (cut on a character's boundary), indices to
                // strings the record does not have, more functions than a frame has.
                NamedFrame {
                    offset: 1,
                    functions: (0..1000)
                        .map(|i| NamedFunction {
                            function: Some(i % 2),
                            file: Some(u32::MAX),
                            line: u32::MAX,
                        })
                        .collect(),
                },
                // Names nothing at all: not kept.
                NamedFrame {
                    offset: 2,
                    functions: vec![NamedFunction {
                        function: Some(77),
                        file: None,
                        line: 3,
                    }],
                },
                // The same frame again: the first wins.
                NamedFrame {
                    offset: 1,
                    functions: vec![],
                },
            ],
        }],
    };
    let stored = through_the_trace(&[forged]);
    let f = stored.get("/lib/x.so", &[], 1).unwrap();
    assert_eq!(f.len(), MAX_FUNCTIONS_PER_FRAME);
    assert_eq!(f[0].function.as_deref(), Some(escape));
    assert_eq!(f[0].file, None);
    let cut = f[1].function.as_deref().unwrap();
    assert!(cut.len() <= MAX_NAME_BYTES && cut.chars().all(|c| c == 'é'));
    assert!(f[..31].iter().all(|g| g.inlined) && !f[31].inlined);
    assert_eq!(stored.get("/lib/x.so", &[], 2), None);
    assert_eq!(stored.not_kept, 2);
    // Shown as a frame's label through the filter every string of a trace goes through: escaped.
    let frame = crate::callsites::Frame {
        kind: crate::callsites::FrameKind::Native,
        function: f[0].function.clone(),
        file: None,
        line: None,
        module: Some("/lib/x.so".into()),
        offset: Some(1),
        address: Some(1),
        inlined: false,
        note: None,
    };
    let shown = crate::names::units::printable(&frame.label());
    assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
    assert!(shown.starts_with("evil\\u{1b}[2J"), "{shown}");
}

#[test]
fn a_forged_flood_of_frames_is_kept_to_the_bound() {
    let frames = (0..(MAX_STORED_FRAMES as u64 + 5))
        .map(|offset| NamedFrame {
            offset,
            functions: vec![NamedFunction {
                function: Some(0),
                file: None,
                line: 1,
            }],
        })
        .collect();
    let mut stored = Stored::default();
    stored.add(FrameNames {
        strings: vec!["f".into()],
        objects: vec![NamedObject {
            path: "/lib/y.so".into(),
            build_id: vec![],
            frames,
        }],
    });
    assert_eq!(stored.not_kept, 5);
    assert!(stored.get("/lib/y.so", &[], 0).is_some());
    assert!(stored
        .get("/lib/y.so", &[], MAX_STORED_FRAMES as u64)
        .is_none());
}

/// The frames of an `Objects` and a `Stack` record, as the writer sees them.
fn written(pid: u32, objects: Vec<Object>, stacks: &[Vec<u64>]) -> Vec<u8> {
    let mut b = Vec::new();
    codec::put_record(
        &mut b,
        &Record::Objects(Objects {
            pid,
            ts_ns: 1,
            objects,
        }),
    );
    for (i, native) in stacks.iter().enumerate() {
        codec::put_record(
            &mut b,
            &Record::Stack(Stack {
                pid,
                id: i as u32 + 1,
                native: native.clone(),
                python: vec![],
            }),
        );
    }
    b
}

#[test]
fn each_distinct_frame_is_resolved_once_across_processes() {
    let obj = |bias: u64| Object {
        path: "/nonexistent/libgone.so".into(),
        bias,
        text: vec![(bias + 0x1000, bias + 0x9000)],
        build_id: vec![4],
    };
    let mut g = Gather::default();
    // Two processes, the library at two biases: the same three frames (offsets 0x1100, 0x1200, 0x1300).
    g.frames(&written(
        1,
        vec![obj(0x10_0000)],
        &[vec![0x10_1100, 0x10_1200], vec![0x10_1100, 0x10_1300, 0x5]],
    ));
    g.frames(&written(2, vec![obj(0x20_0000)], &[vec![0x20_1300]]));
    assert_eq!(g.addresses(), 5, "per process, each address once");
    let mut s = Symbolizer::with_debug_dirs(vec![]);
    let r = g.resolve(&mut s, Instant::now() + Duration::from_secs(5));
    // The file is gone: nothing named, nothing written, each offset asked once (0x5 is in no object).
    assert_eq!((r.named, r.unnamed, r.left), (0, 3, 0));
    assert!(r.records.is_empty());
    // Past the deadline, every frame is left to the reader.
    let r = g.resolve(&mut s, Instant::now());
    assert_eq!((r.named, r.left), (0, 3));
}

#[test]
fn a_forged_flood_of_objects_is_kept_to_the_bound() {
    let named = |i: usize| NamedObject {
        path: format!("/lib/{i}.so"),
        build_id: vec![],
        frames: vec![NamedFrame {
            offset: 1,
            functions: vec![NamedFunction {
                function: Some(0),
                file: None,
                line: 0,
            }],
        }],
    };
    let mut objects: Vec<NamedObject> = (0..MAX_STORED_OBJECTS + 3).map(named).collect();
    // Objects that name nothing cost nothing, however many.
    objects.splice(
        0..0,
        (0..1000).map(|i| NamedObject {
            path: format!("/empty/{i}"),
            build_id: vec![],
            frames: vec![],
        }),
    );
    let mut stored = Stored::default();
    stored.add(FrameNames {
        strings: vec!["f".into()],
        objects,
    });
    assert_eq!(stored.not_kept, 3);
    assert!(stored.get("/lib/0.so", &[], 1).is_some());
    assert!(stored
        .get(&format!("/lib/{MAX_STORED_OBJECTS}.so"), &[], 1)
        .is_none());
}
