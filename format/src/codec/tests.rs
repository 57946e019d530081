use super::*;
use crate::flags;
use crate::{Hello, Objects, Oom, Stack};

fn sample(i: u64) -> Event {
    Event {
        ts_ns: 1_000_000_000 + i * 1500,
        tid: 4242 + (i % 3) as u32,
        api: Api::ALL[(i % 14) as usize],
        flags: if i.is_multiple_of(5) { flags::PTSZ } else { 0 },
        device: if i.is_multiple_of(4) {
            NO_DEVICE
        } else {
            (i % 2) as u32
        },
        result: if i.is_multiple_of(7) { 2 } else { 0 },
        addr: 0x7f00_0000_0000u64.wrapping_add(i.wrapping_mul(0x20_0000)),
        size: (i + 1) << 20,
        aux: if i.is_multiple_of(2) {
            0
        } else {
            0x5555_0000 + i
        },
        stack: (i % 5) as u32,
    }
}

#[test]
fn events_round_trip_including_extremes() {
    let mut evs: Vec<Event> = (0..500).map(sample).collect();
    // Time going backwards across threads, max values, a zero address after a large one.
    evs.push(Event {
        ts_ns: 5,
        tid: u32::MAX,
        addr: u64::MAX,
        size: u64::MAX,
        aux: u64::MAX,
        result: u32::MAX,
        device: NO_DEVICE,
        ..evs[0]
    });
    evs.push(Event {
        ts_ns: u64::MAX,
        tid: 0,
        addr: 0,
        size: 0,
        aux: 0,
        ..evs[1]
    });
    // The extremes again far from the end, where fields are read without bounds checks.
    let ends = evs[500..].to_vec();
    evs.splice(0..0, ends.iter().copied());
    evs.splice(250..250, ends);
    let mut buf = Vec::new();
    put_events(&mut buf, 77, &evs);
    let (k, payload) = frames(&buf).next().unwrap();
    assert_eq!(k, kind::EVENTS_STACKS);
    let mut back = Vec::new();
    assert_eq!(decode_events(payload, &mut back).unwrap(), 77);
    assert_eq!(back, evs);
}

#[test]
fn typical_events_are_compact() {
    // An alloc/free pair per step, same thread and stream: the 24-byte budget with room to spare.
    let mut evs = Vec::new();
    for i in 0..1000u64 {
        let addr = 0x7f12_3400_0000 + (i % 8) * 0x40_0000;
        let mut a = sample(0);
        a.ts_ns = 10_000_000 + i * 20_000;
        a.tid = 9000;
        a.api = Api::MemAllocAsync;
        a.flags = 0;
        a.device = 0;
        a.result = 0;
        a.addr = addr;
        a.size = 4 << 20;
        a.aux = 0x5600_1234_5000;
        let mut f = a;
        f.api = Api::MemFreeAsync;
        f.ts_ns += 9_000;
        f.size = 0;
        f.device = NO_DEVICE;
        evs.push(a);
        evs.push(f);
    }
    let mut buf = Vec::new();
    put_events(&mut buf, 1, &evs);
    let per_event = buf.len() as f64 / evs.len() as f64;
    assert!(per_event < 16.0, "{per_event} bytes/event");
}

#[test]
fn records_round_trip() {
    let recs = vec![
        Record::Hello(Hello {
            pid: 1,
            ppid: 0,
            ts_ns: 3,
            cmdline: vec!["python".into(), "train.py".into()],
            hostname: "h".into(),
            rank: Some(3),
            local_rank: None,
            slurm_procid: Some(7),
            shim_version: "0.1.0".into(),
            extra: vec![("k".into(), "v".into())],
        }),
        Record::Events {
            pid: 9,
            events: (0..3).map(sample).collect(),
        },
        Record::Dropped {
            pid: 9,
            ts_ns: 10,
            count: 12345,
        },
        Record::Goodbye { pid: 9, ts_ns: 11 },
        Record::Tick { pid: 9, ts_ns: 12 },
        Record::ProcessEnd {
            pid: 9,
            ts_ns: 13,
            kind: EndKind::CutMidFrame { partial_bytes: 17 },
        },
        Record::ContextGone {
            pid: 9,
            ts_ns: 15,
            device: 1,
            how: "cuCtxDestroy".into(),
        },
        Record::Lost {
            pid: 9,
            ts_ns: 14,
            count: 77,
            cause: crate::LossCause::CollectorStalled,
        },
        Record::Exit(crate::Exit {
            pid: 9,
            ts_ns: 14,
            status: crate::ExitStatus::Signal {
                signal: 9,
                core: false,
            },
        }),
        Record::Exit(crate::Exit {
            pid: 10,
            ts_ns: 15,
            status: crate::ExitStatus::Code(7),
        }),
        Record::End { ts_ns: 16 },
        Record::Devices {
            pid: 9,
            ts_ns: 19,
            uuids: vec![(0, [0xab; 16]), (3, *b"fakecuda-gpu-03\0")],
        },
        Record::Reaped {
            pid: 4,
            ts_ns: 17,
            child: 9,
            status: crate::ExitStatus::Signal {
                signal: 9,
                core: false,
            },
        },
        Record::Stack(Stack {
            pid: 9,
            id: 3,
            native: vec![0x55_0000_1234, 0x7f00_0000_0042],
            python: vec![crate::PyFrame {
                file: "train.py".into(),
                function: "forward".into(),
                line: 88,
            }],
        }),
        Record::Objects(Objects {
            pid: 9,
            ts_ns: 15,
            objects: vec![crate::Object {
                path: "/usr/lib/libtorch.so".into(),
                bias: 0x7f00_0000_0000,
                text: vec![(0x7f00_0001_0000, 0x7f00_0100_0000)],
                build_id: vec![1, 2, 3, 4],
            }],
        }),
        Record::Note {
            pid: 9,
            ts_ns: 16,
            text: "python 3.14 is not supported".into(),
        },
        Record::FrameNames(frame_names()),
        Record::FrameworkSample(crate::FrameworkSample {
            pid: 9,
            ts_ns: 17,
            framework: crate::Framework::Torch,
            device: 1,
            allocated: 28_991_029_248,
            reserved: 59_055_800_320,
            active: 28_991_029_248,
            inactive_split: 30_064_771_072,
            requested: 28_991_029_000,
            alloc_retries: 1,
            ooms: 1,
        }),
        Record::Bridge(crate::Bridge {
            pid: 9,
            tid: 11,
            ts_ns: 18,
            what: "oom".into(),
            device: 1,
            ack: true,
            doc: r#"{"requested":37580963840}"#.into(),
        }),
        Record::Oom(Oom {
            pid: 9,
            tid: 10,
            ts_ns: 14,
            device: 1,
            api: Api::MemAllocAsync as u8,
            flags: crate::flags::CAP_REFUSED,
            requested_bytes: 1 << 30,
            result: 2,
            device_free_bytes: Some(5 << 30),
            device_total_bytes: Some(80 << 30),
            cap_bytes: Some(4 << 30),
            job_used_bytes: Some(3 << 30),
            process_used_bytes: None,
            extra: vec![],
        }),
    ];
    let mut buf = Vec::new();
    for r in &recs {
        put_record(&mut buf, r);
    }
    let back: Vec<Record> = frames(&buf)
        .map(|(k, p)| decode_record(k, p).unwrap().unwrap())
        .collect();
    assert_eq!(back, recs);
    // Every kind the format declares is written by `put_record` (kind 2 only by writers before version 2),
    // and what the table says of it is what the record is.
    let mut written: Vec<u8> = frames(&buf).map(|(k, _)| k).collect();
    for ((k, _), r) in frames(&buf).zip(&recs) {
        assert_eq!(r.kind(), k, "a record says the kind it is written as");
        let info = kind_info(k).unwrap();
        assert_eq!(
            r.clone().process_time_mut().is_some(),
            info.process_time,
            "{}",
            info.name
        );
        assert_eq!(
            Record::has_process_time(k),
            info.process_time,
            "{}",
            info.name
        );
        if info.writer == Writer::Process {
            assert!(
                r.clone().pid_mut().is_some(),
                "{} speaks for a pid",
                info.name
            );
        }
    }
    written.push(kind::EVENTS);
    written.push(kind::BRIDGE_PAIRS); // read only, into `Record::Bridge` (codec/bridge_pairs.rs tests it)
    written.sort_unstable();
    written.dedup();
    let declared: Vec<u8> = KINDS.iter().map(|i| i.kind).collect();
    assert_eq!(written, declared);
}

#[test]
fn a_gpu_uuid_reads_as_nvidia_smi_writes_it() {
    let u: [u8; 16] = std::array::from_fn(|i| i as u8);
    assert_eq!(
        crate::gpu_uuid(&u),
        "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    );
    assert_eq!(crate::gpu_uuid(&[0xff; 16]).len(), 40);
}

#[test]
fn kinds_are_declared_once_with_numbers_never_shared() {
    let mut seen = std::collections::HashSet::new();
    for (i, k) in KINDS.iter().enumerate() {
        assert!(seen.insert(k.kind), "{} reuses {}", k.name, k.kind);
        assert_eq!(kind_info(k.kind), Some(k));
        if i > 0 {
            assert!(KINDS[i - 1].kind < k.kind, "in number order");
        }
    }
    assert_eq!(kind_info(kind::REAPED).unwrap().name, "REAPED");
    assert_eq!(kind_info(kind::HELLO).unwrap().writer, Writer::Hello);
    assert_eq!(kind_info(0), None);
}

#[test]
fn version_1_events_without_stack_ids_still_read() {
    // A kind-2 frame as version 1 wrote it: the same fields, no stack id.
    let mut p = Vec::new();
    for v in [42u64, 1, zigzag(1000), zigzag(7)] {
        put_varint(&mut p, v); // pid, count, ts delta, tid delta
    }
    p.push(Api::MemAlloc as u8);
    p.push(0);
    for v in [1u64, 0, zigzag(0x7000), 4096, 0] {
        put_varint(&mut p, v); // device+1, result, addr delta, size, aux delta
    }
    match decode_record(kind::EVENTS, &p).unwrap().unwrap() {
        Record::Events { pid, events } => {
            assert_eq!(pid, 42);
            assert_eq!(events.len(), 1);
            let e = events[0];
            assert_eq!(
                (e.ts_ns, e.tid, e.device, e.addr, e.size, e.stack),
                (1000, 7, 0, 0x7000, 4096, 0)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_kind_is_skipped_not_an_error() {
    assert_eq!(decode_record(200, b"whatever").unwrap(), None);
    // The next kinds after the last one this build knows, as an older reader finds a newer writer's.
    for k in (0..=255).filter(|&k| kind_info(k).is_none()) {
        assert_eq!(decode_record(k, b"whatever").unwrap(), None, "kind {k}");
    }
}

#[test]
fn reaped_frames_written_in_place_are_put_records_bytes() {
    use crate::ExitStatus;
    let statuses = [
        ExitStatus::Code(0),
        ExitStatus::Code(3),
        ExitStatus::Code(255),
        ExitStatus::Code(i32::MIN),
        ExitStatus::Signal {
            signal: 9,
            core: false,
        },
        ExitStatus::Signal {
            signal: 11,
            core: true,
        },
        ExitStatus::Signal {
            signal: i32::MAX,
            core: true,
        },
    ];
    for status in statuses {
        for (pid, ts_ns, child) in [
            (1, 0, 2),
            (u32::MAX, u64::MAX, u32::MAX),
            (4_194_304, 1 << 40, 7),
        ] {
            let rec = Record::Reaped {
                pid,
                ts_ns,
                child,
                status,
            };
            let mut want = Vec::new();
            put_record(&mut want, &rec);
            let mut buf = [0xAAu8; REAPED_FRAME_MAX];
            let n = encode_reaped_into(&mut buf, pid, ts_ns, child, status).unwrap();
            assert_eq!(&buf[..n], &want[..], "{rec:?}");
            assert!(n <= 31, "{n} bytes for {rec:?}");
            // Round trip through the frame reader and the decoder.
            let (k, p) = frames(&buf[..n]).next().unwrap();
            assert_eq!(k, kind::REAPED);
            assert_eq!(decode_record(k, p).unwrap(), Some(rec));
            // Too little room: nothing claimed, no panic.
            for short in 0..n {
                assert_eq!(
                    encode_reaped_into(&mut buf[..short], pid, ts_ns, child, status),
                    None,
                    "{short} bytes"
                );
            }
        }
    }
}

#[test]
fn corrupt_payloads_error_without_panicking() {
    let mut buf = Vec::new();
    put_events(&mut buf, 5, &(0..50).map(sample).collect::<Vec<_>>());
    let payload = &buf[5..];
    // Every truncation and a spread of single-byte corruptions: errors or (rarely) other events, no panic.
    for cut in 0..payload.len() {
        let _ = decode_events(&payload[..cut], &mut Vec::new());
    }
    for i in 0..payload.len() {
        let mut p = payload.to_vec();
        p[i] ^= 0xff;
        let _ = decode_events(&p, &mut Vec::new());
        let _ = decode_record(kind::HELLO, &p);
    }
    // A huge claimed count is refused before reserving memory.
    let mut huge = Vec::new();
    put_varint(&mut huge, 1);
    put_varint(&mut huge, u64::MAX >> 1);
    assert_eq!(
        decode_events(&huge, &mut Vec::new()),
        Err(DecodeError::Short)
    );
}

/// A kind-2 payload (version 1: no stack ids) of `evs`.
fn events_v1(pid: u32, evs: &[Event]) -> Vec<u8> {
    let mut p = Vec::new();
    put_varint(&mut p, pid as u64);
    put_varint(&mut p, evs.len() as u64);
    let (mut ts, mut tid, mut addr, mut aux) = (0u64, 0u32, 0u64, 0u64);
    for e in evs {
        put_varint(&mut p, zigzag(e.ts_ns.wrapping_sub(ts) as i64));
        put_varint(&mut p, zigzag(e.tid.wrapping_sub(tid) as i32 as i64));
        p.push(e.api as u8);
        p.push(e.flags);
        put_varint(&mut p, e.device.wrapping_add(1) as u64);
        put_varint(&mut p, e.result as u64);
        put_varint(&mut p, zigzag(e.addr.wrapping_sub(addr) as i64));
        put_varint(&mut p, e.size);
        put_varint(&mut p, zigzag(e.aux.wrapping_sub(aux) as i64));
        (ts, tid, addr, aux) = (e.ts_ns, e.tid, e.addr, e.aux);
    }
    p
}

#[test]
fn unchecked_reads_decode_any_bytes_as_the_checked_ones_do() {
    // Long payloads of both kinds (most events inside the unchecked window), corrupted at random: bits
    // flipped, runs of continuation bytes (the longest varints), bytes cut. Values and errors both match the
    // checked reads. (With the window too small, the debug build's assertion fails this.)
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut evs: Vec<Event> = (0..200).map(sample).collect();
    for i in (0..200).step_by(17) {
        evs[i].addr = u64::MAX - i as u64;
        evs[i].size = u64::MAX >> (i % 7);
    }
    let mut buf = Vec::new();
    put_events(&mut buf, 9, &evs);
    let with_stacks = buf[5..].to_vec();
    let without = events_v1(9, &evs);
    for (k, good) in [(kind::EVENTS, without), (kind::EVENTS_STACKS, with_stacks)] {
        // Intact, both decode every event.
        let mut all = Vec::new();
        assert_eq!(decode_events_with(k, &good, &mut all, true), Ok(9));
        assert_eq!(all.len(), evs.len(), "kind {k}");
        for round in 0..3000 {
            let mut p = good.clone();
            match round % 3 {
                0 => {
                    for _ in 0..1 + next() % 4 {
                        let i = (next() % p.len() as u64) as usize;
                        p[i] ^= 1 << (next() % 8);
                    }
                }
                1 => {
                    let i = (next() % p.len() as u64) as usize;
                    let run = (1 + next() % 12) as usize;
                    for b in p.iter_mut().skip(i).take(run) {
                        *b |= 0x80;
                    }
                }
                _ => p.truncate((next() % p.len() as u64) as usize),
            }
            let (mut fast, mut checked) = (Vec::new(), Vec::new());
            let a = decode_events_with(k, &p, &mut fast, true);
            let b = decode_events_with(k, &p, &mut checked, false);
            assert_eq!(a, b, "round {round}, kind {k}");
            assert_eq!(fast, checked, "round {round}, kind {k}");
        }
    }
}

#[test]
fn varints_of_every_length_read_back_whether_or_not_bytes_follow() {
    let mut values = vec![0u64, 1, u64::MAX, u64::MAX - 1];
    for bits in 1..64 {
        values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
    }
    for v in values {
        let mut b = Vec::new();
        put_varint(&mut b, v);
        let len = b.len();
        // Alone (the careful path near a payload's end), and followed by other bytes (the quick paths, which
        // read a whole word: the bytes after must not leak into the value).
        for tail in [
            &[][..],
            &[0x80, 0x80, 0x80, 0x01, 0x05][..],
            &[0xff; 8][..],
            &[0x7f, 0x80, 0xff, 0x01, 0x00, 0x81, 0xfe, 0x7f][..],
        ] {
            let mut bytes = b.clone();
            bytes.extend_from_slice(tail);
            let mut c = Cursor {
                bytes: &bytes,
                pos: 0,
            };
            assert_eq!(c.varint(), Ok(v), "{v:#x} with {} bytes after", tail.len());
            assert_eq!(c.pos, len, "{v:#x}");
            if bytes.len() >= 8 {
                // The unchecked path inside an event's window reads the same.
                let mut c = Cursor {
                    bytes: &bytes,
                    pos: 0,
                };
                assert_eq!(c.varint_in_window(), Ok(v), "{v:#x} in a window");
                assert_eq!(c.pos, len, "{v:#x} in a window");
            }
        }
        // Cut short: an error, never a value.
        for cut in 0..len {
            let mut c = Cursor {
                bytes: &b[..cut],
                pos: 0,
            };
            assert_eq!(c.varint(), Err(DecodeError::Short), "{v:#x} cut at {cut}");
        }
    }
    // Longer than a u64 can be, or a tenth byte above 1: refused.
    for bad in [
        &[0xffu8; 11][..],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..],
    ] {
        let mut c = Cursor { bytes: bad, pos: 0 };
        assert_eq!(c.varint(), Err(DecodeError::BadVarint));
    }
}

#[test]
fn splitter_yields_only_whole_frames() {
    let mut all = Vec::new();
    for i in 0..10 {
        put_record(
            &mut all,
            &Record::Tick {
                pid: i,
                ts_ns: i as u64,
            },
        );
    }
    let mut s = FrameSplitter::new();
    let mut got = 0;
    for chunk in all.chunks(3) {
        s.push(chunk);
        let whole = s.whole().unwrap().to_vec();
        got += frames(&whole).count();
        s.consume(whole.len());
    }
    assert_eq!(got, 10);
    assert_eq!(s.pending(), 0);
    let mut bad = FrameSplitter::new();
    bad.push(&(MAX_FRAME + 1).to_le_bytes());
    assert!(bad.whole().is_err());
}

#[test]
fn splitter_reads_in_place_and_ignores_what_a_read_left_unwritten() {
    let mut all = Vec::new();
    for i in 0..50 {
        put_record(
            &mut all,
            &Record::Tick {
                pid: i,
                ts_ns: i as u64 * 7,
            },
        );
    }
    let mut s = FrameSplitter::new();
    let mut out = Vec::new();
    let mut at = 0;
    let mut step = 0;
    while at < all.len() || s.pending() > 0 {
        step += 1;
        // A read of 0 to 12 bytes into 16 bytes of room; the room past it holds whatever it held.
        let n = (step * 5 % 13).min(all.len() - at);
        let room = s.spare(16);
        room[..n].copy_from_slice(&all[at..at + n]);
        room[n..].fill(0xEE);
        s.filled(16, n);
        at += n;
        let whole = s.whole().unwrap().to_vec();
        out.extend_from_slice(&whole);
        s.consume(whole.len());
        assert!(step < 10_000);
    }
    assert_eq!(out, all);
    assert_eq!(frames(&out).count(), 50);
}

#[test]
fn header_round_trip_and_version_check() {
    let h = TraceHeader {
        start_unix_ns: 1,
        start_mono_ns: 2,
        command: vec!["a".into()],
        hostname: "x".into(),
        vramtrace_version: "0.1.0".into(),
        extra: vec![],
    };
    let bytes = encode_header(&h);
    let prefix: [u8; HEADER_PREFIX] = bytes[..HEADER_PREFIX].try_into().unwrap();
    let (v, len) = decode_header_prefix(&prefix).unwrap();
    assert_eq!(v, VERSION);
    assert_eq!(
        decode_header_body(&bytes[HEADER_PREFIX..HEADER_PREFIX + len as usize]).unwrap(),
        h
    );
    let mut newer = prefix;
    newer[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
    assert!(matches!(
        decode_header_prefix(&newer),
        Err(DecodeError::NewerVersion { .. })
    ));
    let mut bad = prefix;
    bad[0] = b'X';
    assert_eq!(decode_header_prefix(&bad), Err(DecodeError::BadMagic));
}

/// A damaged record's error is in words: bincode's own `Display` is its `Debug` form, which the trace's warning
/// printed to users (`Utf8 { inner: Utf8Error { .. } }`).
#[test]
fn undecodable_records_are_said_in_words() {
    // A string of two bytes that are not UTF-8.
    let e = bincode_from::<String>(&[2, 0xff, 0xfe]).unwrap_err();
    let said = e.to_string();
    assert_eq!(said, "undecodable record: text that is not UTF-8");
    // Cut short.
    let e = bincode_from::<String>(&[9, b'a']).unwrap_err().to_string();
    assert_eq!(e, "undecodable record: it ends early");
    for e in [said, e] {
        assert!(!e.contains('{') && !e.contains("Utf8"), "{e}");
    }
}

/// Two objects' frames: one with an inlined function and its file and line, one with a name alone.
fn frame_names() -> crate::FrameNames {
    use crate::{NamedFrame, NamedFunction, NamedObject};
    crate::FrameNames {
        strings: vec![
            "c10::cuda::CUDACachingAllocator::malloc".into(),
            "alloc_weights".into(),
            "/src/prog.c".into(),
        ],
        objects: vec![
            NamedObject {
                path: "/usr/lib/libc10_cuda.so".into(),
                build_id: vec![1, 2, 3, 4],
                frames: vec![NamedFrame {
                    offset: 0x43c0b,
                    functions: vec![NamedFunction {
                        function: Some(0),
                        file: None,
                        line: 0,
                    }],
                }],
            },
            NamedObject {
                path: String::new(),
                build_id: vec![],
                frames: vec![NamedFrame {
                    offset: 0x1234,
                    functions: vec![
                        NamedFunction {
                            function: Some(1),
                            file: Some(2),
                            line: 12,
                        },
                        NamedFunction {
                            function: None,
                            file: Some(2),
                            line: 40,
                        },
                    ],
                }],
            },
        ],
    }
}

#[test]
fn frame_names_round_trip_and_a_forged_count_asks_for_nothing() {
    let rec = Record::FrameNames(frame_names());
    let mut buf = Vec::new();
    put_record(&mut buf, &rec);
    let (k, p) = frames(&buf).next().unwrap();
    assert_eq!(k, kind::FRAME_NAMES);
    assert_eq!(kind_info(k).unwrap().writer, Writer::Collector);
    assert_eq!(decode_record(k, p).unwrap(), Some(rec));
    // A count of 2^62 strings in a few bytes: refused by the frame's limit, not allocated.
    let mut forged = vec![0xfd]; // bincode's marker: a u64 follows
    forged.extend_from_slice(&(1u64 << 62).to_le_bytes());
    forged.push(0);
    assert!(decode_record(kind::FRAME_NAMES, &forged).is_err());
    // Cut anywhere, it does not decode (and does not panic).
    for n in 0..p.len() {
        assert!(decode_record(k, &p[..n]).is_err(), "cut at {n}");
    }
}
