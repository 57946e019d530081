//! `forger MODE ...`: a hostile process of the job, speaking the collector's protocol by hand (no shim, no
//! driver), for the tests of what a process may say (`collector/src/receive/ingest.rs`, `budget.rs`).
//!
//! ```text
//! forger speak <claimed-pid> <victim-pid>   hello claiming <claimed-pid>, with a ring; then, on the socket and
//!                                           through the ring, records for <victim-pid>, records only the
//!                                           collector writes, a second hello, undecodable and unknown frames,
//!                                           and a few records of its own (claimed pid); one event of 1 MiB in
//!                                           the ring. Prints its real pid and the count of forged frames.
//! forger hoard <bytes> <hold-ms>            hello with its own pid; then a note of <bytes> sent all but its
//!                                           last byte, held <hold-ms>, then finished. Prints its real pid.
//! forger dash <ppid> <n>                    n times: a child says hello (its own pid, parent <ppid>), sends a
//!                                           note and an event of 6 GiB, and exits at once. Prints the pids.
//! forger scribble                          hello with its own pid and a ring; publishes a note and an event,
//!                                           then writes noise over its ring's header (past the magic) and its
//!                                           slots while the collector drains it, and exits 0 a second later.
//!                                           Prints its real pid.
//! forger grandparent <probe>              hello; runs `forger parent <probe>`, which says hello, runs the
//!                                           probe (alloc, sleep 700 ms, exit 0) and reaps it itself; while the
//!                                           probe lives, reports it killed by SIGKILL on a connection of its
//!                                           own, as its grandparent. Prints the probe's pid.
//! forger dropcount <n>                    hello with its own pid and a ring; publishes one event, then adds n
//!                                           to its ring's drop count (a ring never full), and exits 0 after
//!                                           300 ms. Prints its real pid.
//! forger attack <uid>                       another user: finds vramtrace's sockets in /proc/net/unix whose
//!                                           folder is <uid>'s, and tries each (connect, list its folder, open
//!                                           its ledger). Prints
//!                                           `found <n> connected <n> listed <n> opened <n>`.
//! ```

use std::io::Write;
use std::os::unix::net::UnixStream;

use vramtrace_format::codec::{self, kind};
use vramtrace_format::ring::{self, Ring};
use vramtrace_format::{Api, EndKind, Event, Exit, ExitStatus, Hello, Record};

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a local timespec the call writes.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A ring as the shim makes one: sealed memfd, mapped shared.
fn make_ring(pid: u32) -> (Ring, i32) {
    vramtrace_test_wire::memfd_ring(pid, 1 << 12)
}

use vramtrace_test_wire::send_with_fd;

fn hello(pid: u32) -> Record {
    hello_from(pid, 1)
}

fn hello_from(pid: u32, ppid: u32) -> Record {
    Record::Hello(Hello {
        pid,
        ppid,
        ts_ns: mono_ns(),
        cmdline: vec!["forger".into()],
        hostname: String::new(),
        rank: None,
        local_rank: None,
        slurm_procid: None,
        shim_version: "forged".into(),
        extra: vec![],
    })
}

fn note(pid: u32, text: &str) -> Record {
    Record::Note {
        pid,
        ts_ns: mono_ns(),
        text: text.into(),
    }
}

/// bincode 2's standard varint, by hand (this program speaks the wire without the format's private encoder).
fn varint(o: &mut Vec<u8>, v: u64) {
    match v {
        0..=250 => o.push(v as u8),
        251..=0xffff => {
            o.push(251);
            o.extend_from_slice(&(v as u16).to_le_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            o.push(252);
            o.extend_from_slice(&(v as u32).to_le_bytes());
        }
        _ => {
            o.push(253);
            o.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn string(o: &mut Vec<u8>, t: &str) {
    varint(o, t.len() as u64);
    o.extend_from_slice(t.as_bytes());
}

/// A kind-13 body: (pid, tid, ts_ns, what, device, ack, fields), acknowledged.
fn legacy_bridge(o: &mut Vec<u8>, pid: u32, what: &str, fields: &[(&str, &str)]) {
    varint(o, pid as u64);
    varint(o, pid as u64);
    varint(o, mono_ns());
    string(o, what);
    varint(o, vramtrace_format::NO_DEVICE as u64);
    o.push(1);
    varint(o, fields.len() as u64);
    for (k, v) in fields {
        string(o, k);
        string(o, v);
    }
}

/// A successful `cuMemAlloc_v2` of `size` bytes on device 0.
fn alloc(size: u64) -> Event {
    Event {
        ts_ns: mono_ns(),
        tid: 1,
        api: Api::MemAlloc,
        flags: 0,
        device: 0,
        result: 0,
        addr: 0x7000_0000,
        size,
        aux: 0,
        stack: 0,
    }
}

fn oom(pid: u32) -> Record {
    Record::Oom(vramtrace_format::Oom {
        pid,
        tid: pid,
        ts_ns: mono_ns(),
        device: 0,
        api: Api::MemAlloc as u8,
        flags: 0,
        requested_bytes: 1 << 30,
        result: 2,
        device_free_bytes: None,
        device_total_bytes: None,
        cap_bytes: None,
        job_used_bytes: None,
        process_used_bytes: None,
        extra: vec![],
    })
}

fn connect(pid: u32) -> (UnixStream, Ring) {
    connect_from(pid, 1)
}

fn connect_from(pid: u32, ppid: u32) -> (UnixStream, Ring) {
    let path = std::env::var_os("VRAMTRACE_SOCKET").expect("VRAMTRACE_SOCKET");
    let s = UnixStream::connect(path).expect("connect");
    let (ring, fd) = make_ring(pid);
    let mut buf = Vec::new();
    codec::put_record(&mut buf, &hello_from(pid, ppid));
    send_with_fd(&s, &buf, fd);
    // The collector answers a hello with the job's settings (one line), before any answer to a record.
    let mut r = std::io::BufReader::new(&s);
    let mut line = Vec::new();
    let _ = std::io::BufRead::read_until(&mut r, b'\n', &mut line);
    assert!(
        r.buffer().is_empty(),
        "the collector sent more than its settings after the hello"
    );
    (s, ring)
}

fn speak(claimed: u32, victim: u32) {
    let (mut s, ring) = connect(claimed);
    let mut forged = 0u32;
    let mut bad = Vec::new();
    let mut put = |buf: &mut Vec<u8>, r: &Record| {
        codec::put_record(buf, r);
        forged += 1;
    };
    put(&mut bad, &note(victim, "forged for the victim"));
    put(
        &mut bad,
        &Record::ProcessEnd {
            pid: victim,
            ts_ns: mono_ns(),
            kind: EndKind::Vanished,
        },
    );
    put(
        &mut bad,
        &Record::Exit(Exit {
            pid: victim,
            ts_ns: mono_ns(),
            status: ExitStatus::Signal {
                signal: 9,
                core: false,
            },
        }),
    );
    put(
        &mut bad,
        &Record::Exit(Exit {
            pid: claimed,
            ts_ns: mono_ns(),
            status: ExitStatus::Signal {
                signal: 11,
                core: true,
            },
        }),
    );
    put(
        &mut bad,
        &Record::Dropped {
            pid: claimed,
            ts_ns: mono_ns(),
            count: 1 << 60,
        },
    );
    put(
        &mut bad,
        &Record::Tick {
            pid: claimed,
            ts_ns: u64::MAX / 2,
        },
    );
    put(&mut bad, &hello(victim));
    put(&mut bad, &Record::End { ts_ns: 1 });
    // Undecodable, and of a kind nobody knows.
    codec::put_frame(&mut bad, kind::NOTE, |o| o.extend_from_slice(&[0xff; 9]));
    codec::put_frame(&mut bad, 200, |o| o.extend_from_slice(b"what"));
    forged += 2;
    let mut good = Vec::new();
    codec::put_record(&mut good, &note(claimed, "forger's own note"));
    s.write_all(&bad).unwrap();
    s.write_all(&good).unwrap();
    // Two out-of-memory records, each waiting for its answer: one for the victim (refused: no), one of its
    // own (in the trace: yes).
    let mut ooms = Vec::new();
    codec::put_record(&mut ooms, &oom(victim));
    forged += 1;
    codec::put_record(&mut ooms, &oom(claimed));
    // A bridge record as an older shim sent it (kind 13, text pairs), waiting for its answer too.
    codec::put_frame(&mut ooms, kind::BRIDGE_PAIRS, |o| {
        legacy_bridge(
            o,
            claimed,
            "note",
            &[("text", "forger's legacy bridge note")],
        )
    });
    s.write_all(&ooms).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .unwrap();
    let mut answers = [0u8; 3];
    let got = std::io::Read::read_exact(&mut s, &mut answers).is_ok();
    let said = |b: u8| match b {
        vramtrace_format::OOM_ACK => "yes",
        vramtrace_format::OOM_NAK => "no",
        _ => "?",
    };
    // Through the ring: one forged note, one of its own, and an event of its own.
    let mut blob = Vec::new();
    codec::put_record(&mut blob, &note(victim, "forged through the ring"));
    forged += 1;
    assert!(ring.try_blob(&blob));
    blob.clear();
    codec::put_record(&mut blob, &note(claimed, "forger's own ring note"));
    assert!(ring.try_blob(&blob));
    assert!(ring.try_event(&alloc(1 << 20)));
    println!(
        "{} {forged} answers {} {} {}",
        std::process::id(),
        if got { said(answers[0]) } else { "none" },
        if got { said(answers[1]) } else { "none" },
        if got { said(answers[2]) } else { "none" }
    );
    std::io::stdout().flush().unwrap();
    // Time for the collector to take it all before the connection closes.
    std::thread::sleep(std::time::Duration::from_millis(300));
}

fn hoard(bytes: usize, hold_ms: u64) {
    let me = std::process::id();
    let (mut s, _ring) = connect(me);
    let mut big = Vec::new();
    codec::put_record(&mut big, &note(me, &"x".repeat(bytes)));
    let (head, last) = big.split_at(big.len() - 1);
    s.write_all(head).unwrap();
    println!("{me}");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
    s.write_all(last).unwrap();
    let mut small = Vec::new();
    codec::put_record(&mut small, &note(me, "hoarder's small note"));
    s.write_all(&small).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
}

fn dash(ppid: u32, n: u64) {
    let mut pids = Vec::new();
    for _ in 0..n {
        // SAFETY: the child only connects, writes and `_exit`s: no lock another thread held is taken.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let me = std::process::id();
            let (mut s, ring) = connect_from(me, ppid);
            let mut buf = Vec::new();
            codec::put_record(&mut buf, &note(me, "dashed in"));
            let _ = s.write_all(&buf);
            ring.try_event(&alloc(6 << 30));
            // SAFETY: ends the child at once, running nothing of the parent's state.
            unsafe { libc::_exit(0) };
        }
        pids.push(child);
    }
    for p in &pids {
        // SAFETY: a null status pointer is allowed; the pid is an integer.
        unsafe { libc::waitpid(*p, std::ptr::null_mut(), 0) };
    }
    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    println!("{}", list.join(" "));
}

fn attack(uid: u32) {
    use std::os::unix::fs::MetadataExt;
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let (mut found, mut connected, mut listed, mut opened) = (0, 0, 0, 0);
    for path in unix
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.contains("/vramtrace-") && p.contains("/sock-"))
        .filter(|p| {
            std::fs::metadata(std::path::Path::new(p).parent().unwrap())
                .is_ok_and(|m| m.uid() == uid)
        })
    {
        found += 1;
        if UnixStream::connect(path).is_ok() {
            connected += 1;
        }
        let dir = std::path::Path::new(path).parent().unwrap();
        if let Ok(entries) = std::fs::read_dir(dir) {
            listed += 1;
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("ledger-")
                    && std::fs::File::open(e.path()).is_ok()
                {
                    opened += 1;
                }
            }
        }
    }
    println!("found {found} connected {connected} listed {listed} opened {opened}");
}

fn scribble() {
    let me = std::process::id();
    let (mut s, ring) = connect(me);
    let mut buf = Vec::new();
    codec::put_record(&mut buf, &note(me, "before the noise"));
    s.write_all(&buf).unwrap();
    assert!(ring.try_event(&alloc(1 << 20)));
    println!("{me}");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (slots, len) = ring.slot_memory();
    // The header lies before the slots; its first 8 bytes are the magic.
    let header = ring::bytes_for(ring.slots()) - len;
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ me as u64;
    let mut noise = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..50 {
        // SAFETY: scribbling on our own ring is the point: `slots`/`header` bound the writes to its mapping,
        // which stays mapped while the process lives.
        unsafe {
            let base = slots.sub(header);
            for off in (8..header).step_by(8) {
                base.add(off).cast::<u64>().write_volatile(noise());
            }
            for off in (0..len).step_by(8) {
                if noise() % 4 == round % 4 {
                    slots.add(off).cast::<u64>().write_volatile(noise());
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn grandparent(probe: &str) {
    // Both it and the parent say hello, as processes of the job that touched CUDA would: the collector knows
    // the line grandparent -> parent -> probe from the kernel.
    let (_conn, _ring) = connect(std::process::id());
    let mut parent = std::process::Command::new(std::env::current_exe().expect("own path"))
        .args(["parent", probe])
        .spawn()
        .expect("parent");
    let children = format!("/proc/{0}/task/{0}/children", parent.id());
    let start = std::time::Instant::now();
    let child: u32 = loop {
        if let Some(c) = std::fs::read_to_string(&children)
            .ok()
            .and_then(|t| t.split_whitespace().next().and_then(|w| w.parse().ok()))
        {
            break c;
        }
        assert!(
            start.elapsed().as_secs() < 10,
            "the parent started no child"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // Let it connect (its first allocation), then speak for it while it still runs: this report comes first.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut buf = [0u8; codec::REAPED_FRAME_MAX];
    let n = codec::encode_reaped_into(
        &mut buf,
        std::process::id(),
        mono_ns(),
        child,
        ExitStatus::Signal {
            signal: 9,
            core: false,
        },
    )
    .expect("a reaped frame");
    let path = std::env::var_os("VRAMTRACE_SOCKET").expect("VRAMTRACE_SOCKET");
    let mut s = UnixStream::connect(path).expect("connect");
    s.write_all(&buf[..n]).expect("send");
    drop(s);
    assert!(parent.wait().expect("wait").success());
    println!("{child}");
}

/// The probe's parent: says hello, runs it, reaps it (its shim reports how it ended).
fn parent(probe: &str) {
    let (_conn, _ring) = connect(std::process::id());
    let st = std::process::Command::new(probe)
        .args(["alloc 1048576", "sleep 700"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("probe");
    assert!(st.success());
}

fn dropcount(n: u64) {
    let me = std::process::id();
    let (_s, ring) = connect(me);
    assert!(ring.try_event(&alloc(1 << 20)));
    for _ in 0..n {
        ring.count_drop();
    }
    println!("{me}");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> u64 { args[i].parse().expect("a number") };
    match args.first().map(String::as_str) {
        Some("speak") => speak(num(1) as u32, num(2) as u32),
        Some("hoard") => hoard(num(1) as usize, num(2)),
        Some("dash") => dash(num(1) as u32, num(2)),
        Some("attack") => attack(num(1) as u32),
        Some("scribble") => scribble(),
        Some("grandparent") => grandparent(&args[1]),
        Some("dropcount") => dropcount(num(1)),
        Some("parent") => parent(&args[1]),
        _ => {
            eprintln!("usage: forger speak <claimed-pid> <victim-pid> | hoard <bytes> <hold-ms>");
            std::process::exit(2);
        }
    }
}
