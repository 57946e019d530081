//! A hostile process of the job: it speaks the collector's protocol by hand (`forger`), lies about its pid,
//! writes records for other processes and records only the collector writes, sends frames that do not decode,
//! and hoards memory with unfinished frames. It can cost only its own records: they are refused, counted
//! against it (by the kernel's pid), and nothing it forged reaches the trace.

use vramtrace_e2e::traced::{read_trace, vramtrace, BridgeBody};
use vramtrace_e2e::*;
use vramtrace_format::{Api, ExitStatus, LossCause};

#[test]
fn a_process_speaks_only_for_itself_whatever_its_hello_says() {
    let fc = FakeCuda::new();
    // It claims pid 1, and forges for pid 2.
    let (run, path) = fc.traced(
        "forger",
        &["--python-agent", "off"],
        program("forger"),
        &["speak", "1", "2"],
    );
    run.assert_success("forger");
    let mut out = run.stdout.split_whitespace();
    let pid: u32 = out.next().unwrap().parse().unwrap();
    let forged: u64 = out.next().unwrap().parse().unwrap();
    // Its out-of-memory record for the victim was answered no (it is not in the trace), its own yes, and its
    // bridge record of an older shim's kind (13) yes: read as today's, in the trace.
    let answers: Vec<&str> = out.skip(1).collect();
    assert_eq!(answers, ["no", "yes", "yes"], "{}", run.stdout);
    let t = read_trace(&path);
    let legacy: Vec<_> = t.bridge.iter().filter(|(_, b)| b.what == "note").collect();
    assert_eq!(legacy.len(), 1, "{:?}", t.bridge);
    assert_eq!(legacy[0].1.pid, pid);
    assert_eq!(
        legacy[0].1.text("text").as_deref(),
        Some("forger's legacy bridge note")
    );
    // One hello, under the kernel's pid, saying what it claimed.
    assert_eq!(t.hellos.len(), 1, "{:?}", t.hellos);
    let h = &t.hellos[0];
    assert_eq!(h.pid, pid);
    assert!(
        h.extra
            .iter()
            .any(|(k, v)| k == "pid_in_its_namespace" && v == "1"),
        "{h:?}"
    );
    // Its parent is the kernel's (vramtrace), not the 1 its hello said.
    assert_ne!(h.ppid, 1);
    // Nothing for pid 1 or 2, or for anyone else.
    for (p, text) in &t.notes {
        assert_eq!(*p, pid, "a note under another pid: {text}");
    }
    let own: Vec<&str> = t.notes.iter().map(|(_, n)| n.as_str()).collect();
    assert!(own.contains(&"forger's own note"), "{own:?}");
    assert!(own.contains(&"forger's own ring note"), "{own:?}");
    assert!(!own.iter().any(|n| n.contains("forged")), "{own:?}");
    assert!(t.events.keys().all(|p| *p == pid));
    assert_eq!(
        t.events[&pid]
            .iter()
            .filter(|e| e.api == Api::MemAlloc)
            .count(),
        1
    );
    assert!(t.ends.iter().all(|(p, _)| *p == pid), "{:?}", t.ends);
    // Its exit is the one vramtrace reaped: 0, not the SIGSEGV it forged; no exit for the victim.
    assert_eq!(t.exits.len(), 1, "{:?}", t.exits);
    assert_eq!(t.exits[0].pid, pid);
    assert_eq!(t.exits[0].status, ExitStatus::Code(0));
    assert_eq!(t.dropped, 0, "a forged drop count was taken");
    // Every forged record refused, counted against it, and said.
    let refused: u64 = t
        .lost
        .iter()
        .filter(|(p, c, _)| *p == pid && *c == LossCause::Refused)
        .map(|l| l.2)
        .sum();
    assert_eq!(refused, forged, "{:?}", t.lost);
    assert!(t
        .notes
        .iter()
        .any(|(_, n)| n.contains("records this process sent were refused")));
    run.says("refused");
    let report = fc
        .command(vramtrace())
        .arg("report")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(!text.contains("pid 2 "), "{text}");
}

#[test]
fn hoarding_unfinished_frames_costs_the_hoarders_own_records() {
    // A pool of 4 MB for every connection's unfinished frame: three processes each hold 3 MB of one note
    // unfinished for a while. One gets the room; the others' notes are refused and skipped as they come; every
    // one's later small note arrives.
    let fc = FakeCuda::new().env("VRAMTRACE_TEST_UNFINISHED_POOL", "4000000");
    let forger = program("forger");
    let f = forger.display();
    let script =
        format!("{f} hoard 3000000 1500 & {f} hoard 3000000 1500 & {f} hoard 3000000 1500 & wait");
    let (run, path) = fc.traced(
        "hoard",
        &["--python-agent", "off"],
        "sh",
        &["-c", script.as_str()],
    );
    run.assert_success("hoarders");
    let pids: Vec<u32> = run
        .stdout
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    let t = read_trace(&path);
    let big = t.notes.iter().filter(|(_, n)| n.len() > 1_000_000).count();
    let refused: Vec<u32> = t
        .lost
        .iter()
        .filter(|(_, c, _)| *c == LossCause::Refused)
        .map(|l| l.0)
        .collect();
    assert_eq!(big, 1, "exactly one hoarder had room");
    assert_eq!(refused.len(), 2, "{:?}", t.lost);
    assert!(refused.iter().all(|p| pids.contains(p)));
    for p in &pids {
        assert!(
            t.notes
                .iter()
                .any(|(q, n)| q == p && n == "hoarder's small note"),
            "pid {p} lost more than its own large note"
        );
    }
}

#[test]
fn a_process_scribbling_over_its_live_ring_costs_only_its_own_records() {
    // Noise over the ring's header (head, tail, drop count) and slots, fifty times while it is drained, beside an
    // honest process. The collector neither spins nor believes the counts; the scribbler's end is recorded; the
    // honest process is whole.
    let fc = FakeCuda::new();
    let script = format!(
        "{f} scribble & {p} 'alloc 2097152' 'sleep 1500' 'alloc 4194304' >/dev/null; wait",
        f = program("forger").display(),
        p = program("probe").display()
    );
    let start = std::time::Instant::now();
    let (run, path) = fc.traced(
        "scribble",
        &["--python-agent", "off"],
        "sh",
        &["-c", &script],
    );
    let took = start.elapsed();
    run.assert_success("scribbler and probe");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    let pid: u32 = run.stdout.trim().parse().unwrap();
    let t = read_trace(&path);
    assert!(
        t.dropped < 1 << 40,
        "a scribbled drop count was believed: {}",
        t.dropped
    );
    assert!(t.ends.iter().any(|(p, _)| *p == pid), "{:?}", t.ends);
    let probe = t
        .hellos
        .iter()
        .find(|h| h.cmdline.first().is_some_and(|c| c.ends_with("probe")))
        .expect("the probe is traced")
        .pid;
    let sizes: Vec<u64> = t.events[&probe]
        .iter()
        .filter(|e| e.api == Api::MemAlloc && e.ok())
        .map(|e| e.size)
        .collect();
    assert_eq!(sizes, [2 << 20, 4 << 20]);
    assert!(t.ends.iter().any(|(p, _)| *p == probe));
}

#[test]
fn a_drop_count_written_into_a_ring_never_full_is_not_called_lost_events() {
    // The count sits in the process's own memory: one that adds 5000 to it, its ring holding one event, is told
    // as having written over its ring, not as having recorded faster than the collector drained.
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "dropcount",
        &["--python-agent", "off"],
        program("forger"),
        &["dropcount", "5000"],
    );
    run.assert_success("the forger");
    assert!(!run.stderr.contains("faster than"), "{}", run.stderr);
    let t = read_trace(&path);
    assert_eq!(t.dropped, 0);
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert!(
        a.call_sites
            .notes
            .iter()
            .any(|n| n.text.contains("written over by the process itself")),
        "{:?}",
        a.call_sites.notes
    );
    let o = std::process::Command::new(vramtrace_e2e::traced::vramtrace())
        .arg("report")
        .arg(&path)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && !report.contains("faster than"),
        "{report}"
    );
}

/// Issue 50: a Python bridge record too large for the ring or the socket (64 MiB of fields, offered and sent
/// acknowledged) is refused at the shim's door, and said once in the trace; before, the ring's drop count rose
/// for it and the collector told the process it had written over its own ring.
#[test]
fn an_oversized_bridge_record_is_refused_and_said_not_taken_for_a_forged_drop() {
    let fc = FakeCuda::new();
    let script = "import ctypes\n\
        f = ctypes.CDLL(None).vramtrace_bridge_record\n\
        f.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]\n\
        big = b'{\"text\":\"' + b'x' * (64 << 20) + b'\"}'\n\
        small = b'{\"text\":\"v\"}'\n\
        print(f(b'note', 0xffffffff, big, len(big), 0), f(b'note', 0xffffffff, big, len(big), 1), \
        f(b'note', 0xffffffff, small, len(small), 0))\n\
        ctypes.CDLL('libcuda.so.1').cuInit(0)\n";
    let (run, path) = fc.traced(
        "oversized",
        &["--python-agent", "off"],
        "python3",
        &["-c", script],
    );
    run.assert_success("the program");
    // Refused (4) both ways; a small one still goes (0).
    assert_eq!(run.stdout.trim(), "4 4 0", "{}", run.stderr);
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    let notes: Vec<&str> = a.call_sites.notes.iter().map(|n| n.text.as_str()).collect();
    assert!(
        notes
            .iter()
            .filter(|n| n.contains("were not recorded"))
            .count()
            == 1,
        "{notes:?}"
    );
    assert!(
        !notes.iter().any(|n| n.contains("written over")),
        "{notes:?}"
    );
    assert_eq!(a.dropped_events, 0);
}
