//! Issue 36 ("Hostile input, round 2"): files a traced program or anyone else can put where a trace's readers
//! look, run through every verb that reads them as a user would, under an address-space limit and a deadline.
//! Each verb ends by itself with exit 0 (a partial answer that says what it could not read) or 2 (one line),
//! never a signal (an abort for memory is 134), never a hang.

mod common;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::{text, TempDir};
use common::MIB;

/// The address space each verb gets: about four times what the readers need for these inputs (the binary, a
/// 100 MB input read whole, thread stacks), a quarter of what the unbounded readers asked for.
const ADDRESS_SPACE: u64 = 1 << 30;
/// Far more than any of these takes (a debug build reads each in under a second); past it the verb hangs.
const DEADLINE: Duration = Duration::from_secs(60);

struct Ran {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `vramtrace ARGS` under [`ADDRESS_SPACE`], killed at [`DEADLINE`] (the test then fails: it hung).
fn bounded(args: &[&str], dir: &Path) -> Ran {
    bounded_to(args, dir, ADDRESS_SPACE)
}

/// [`bounded`] under `space` bytes of address space.
fn bounded_to(args: &[&str], dir: &Path, space: u64) -> Ran {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vramtrace"));
    c.args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: space,
                rlim_max: space,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    // Drained on threads: a verb that writes much must not stall on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut s).ok();
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut s).ok();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > DEADLINE {
            child.kill().ok();
            child.wait().ok();
            panic!("vramtrace {args:?} still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        code: status.code(),
        signal: status.signal(),
        stdout: String::from_utf8_lossy(&o.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&e.join().unwrap()).into_owned(),
    }
}

/// Exit 0, or 2 with one line; never a signal or a panic.
fn assert_ended_well(args: &[&str], r: &Ran) {
    assert_eq!(
        r.signal, None,
        "vramtrace {args:?} died of signal {:?}: {}",
        r.signal, r.stderr
    );
    assert!(
        matches!(r.code, Some(0) | Some(2)),
        "vramtrace {args:?} exited {:?}: {}",
        r.code,
        r.stderr
    );
    assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.stderr);
    if r.code == Some(2) {
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
    }
}

/// Every verb that reads a trace and the files it names.
const VERBS: &[&[&str]] = &[
    &["report", "t.vtrace"],
    &["report", "t.vtrace", "--json"],
    &["oom", "t.vtrace"],
    &["oom", "t.vtrace", "--full"],
    &["oom", "t.vtrace", "--json"],
    &["whatif", "t.vtrace"],
    &[
        "export",
        "t.vtrace",
        "--format",
        "memory-viz",
        "--out",
        "out.pickle",
        "--force",
    ],
    &[
        "export", "t.vtrace", "--format", "html", "--out", "out.html", "--force",
    ],
    &[
        "export",
        "t.vtrace",
        "--format",
        "perfetto",
        "--out",
        "out.pftrace",
        "--force",
    ],
];

/// A GPU run's trace (an out-of-memory error and an exit, each with a PyTorch snapshot named) in `dir`, as
/// `t.vtrace`; its snapshots are looked for beside it under these names.
fn trace_naming_snapshots(dir: &TempDir) -> [PathBuf; 2] {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu");
    std::fs::copy(
        fixtures.join("verdict_growth_late.vtrace"),
        dir.0.join("t.vtrace"),
    )
    .unwrap();
    [
        dir.0.join("t.vtrace.torch-561-oom1.pickle"),
        dir.0.join("t.vtrace.torch-561-exit.pickle"),
    ]
}

/// Every verb on `t.vtrace` in `dir`: ended well; `oom --full` says why the snapshot was not read.
fn every_verb_ends_well(dir: &TempDir, why: &str) {
    for args in VERBS {
        let r = bounded(args, &dir.0);
        assert_ended_well(args, &r);
        if args == &["oom", "t.vtrace", "--full"] {
            assert_eq!(r.code, Some(0), "{}", r.stderr);
            assert!(
                r.stdout.contains("could not read it") && r.stdout.contains(why),
                "want {why:?} in: {}",
                r.stdout
            );
        }
    }
}

#[test]
fn snapshots_of_a_hundred_megabytes_of_none_or_mark_are_refused_in_bounded_memory() {
    // 100 MB of NONE (each a value the reader would keep) and of MARK (each a stack serde-pickle would set
    // aside), then STOP: before issue 36 each verb asked for 2 GiB and aborted (134) under a 2 GiB limit.
    let dir = TempDir::new("hostile-none-mark");
    let [oom, exit] = trace_naming_snapshots(&dir);
    for (op, why) in [(b'N', "on its stack"), (b'(', "MiB to build")] {
        let mut b = vec![0x80, 4];
        b.extend(std::iter::repeat_n(op, 100 << 20));
        b.push(b'.');
        std::fs::write(&oom, &b).unwrap();
        std::fs::write(&exit, &b).unwrap();
        every_verb_ends_well(&dir, why);
    }
    // The trace is still read: the error is there, only its snapshot is said missing.
    let r = bounded(&["oom", "t.vtrace"], &dir.0);
    assert!(
        r.stdout.contains("CAUSE: growth"),
        "{}",
        text(r.stdout.as_bytes())
    );
}

/// A FIFO at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn snapshots_that_are_fifos_or_devices_are_said_missing_not_waited_on() {
    // A FIFO nobody writes would hold a plain open for good; /dev/zero (through a link) never ends.
    let dir = TempDir::new("hostile-fifo");
    let [oom, exit] = trace_naming_snapshots(&dir);
    mkfifo(&oom);
    std::os::unix::fs::symlink("/dev/zero", &exit).unwrap();
    every_verb_ends_well(&dir, "not found");
}

#[test]
fn a_trace_that_is_a_fifo_is_refused_in_one_line_not_waited_on() {
    let dir = TempDir::new("hostile-fifo-trace");
    mkfifo(&dir.0.join("t.vtrace"));
    for args in VERBS {
        let r = bounded(args, &dir.0);
        assert_ended_well(args, &r);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("a FIFO"), "{args:?}: {}", r.stderr);
    }
}

#[test]
fn a_snapshot_that_is_the_kernel_log_is_not_read() {
    // /proc/kmsg is a regular file by stat that says it holds 0 bytes, waits for the kernel's next message
    // and hands each out once: root's `run`, reading the snapshot a traced process named there, never
    // returned, and took the log's messages from whoever reads them. Only root may open it.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("VRAMTRACE_ALLOW_NO_ROOT").is_some(),
            "needs root to open /proc/kmsg (VRAMTRACE_ALLOW_NO_ROOT=1 skips it)"
        );
        eprintln!("SKIPPED: not root (VRAMTRACE_ALLOW_NO_ROOT)");
        return;
    }
    let dir = TempDir::new("hostile-kmsg");
    let [oom, exit] = trace_naming_snapshots(&dir);
    std::os::unix::fs::symlink("/proc/kmsg", &oom).unwrap();
    std::os::unix::fs::symlink("/proc/kmsg", &exit).unwrap();
    every_verb_ends_well(&dir, "empty");
}

/// A trace of one process allocating 1 MiB on each of `devices` (freeing none), an event each.
fn devices_trace(devices: &[u32]) -> Vec<u8> {
    use common::*;
    let evs = devices
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            alloc(
                1 + i as u64 / 1000,
                d,
                0x1_0000_0000 + (i as u64) * MIB,
                MIB,
            )
        })
        .collect();
    trace(&[
        hello(100, 0),
        events(100, evs),
        goodbye(100, 1 + devices.len() as u64 / 1000),
    ])
}

/// `python3 -c SCRIPT` on the snapshot `out.pickle` in `dir` (as `d`); its stdout.
fn python_on_pickle(dir: &Path, script: &str) -> String {
    let out = Command::new("python3")
        .current_dir(dir)
        .args([
            "-c",
            &format!("import pickle\nd = pickle.load(open('out.pickle', 'rb'))\n{script}"),
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every verb on `t.vtrace` in `dir`, each ending with exit 0.
fn every_verb_answers(dir: &TempDir) {
    for args in VERBS {
        let r = bounded(args, &dir.0);
        assert_ended_well(args, &r);
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
    }
}

#[test]
fn a_device_numbered_2_to_the_31_costs_what_device_0_does() {
    // 236 bytes of trace: `export --format memory-viz` sized a list by the device's number and asked for
    // 154 GB (an abort). No host has such a GPU (the shim records the driver's ordinal): its allocation counts
    // on the unknown device, and the report says a process wrote it.
    let dir = TempDir::new("hostile-device-2-31");
    std::fs::write(dir.0.join("t.vtrace"), devices_trace(&[1 << 31])).unwrap();
    every_verb_answers(&dir);
    let r = bounded(&["report", "t.vtrace", "--json"], &dir.0);
    let got = common::cli::python_check(
        r.stdout.as_bytes(),
        "print([(x['device'], x['peak_bytes']) for x in d['devices']], d['implausible_devices'])",
    );
    assert_eq!(got.trim(), format!("[(None, {MIB})] 1"));
    let r = bounded(&["report", "t.vtrace"], &dir.0);
    assert!(
        r.stdout.contains("named a GPU ordinal no host has"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_hundred_thousand_devices_cost_time_and_memory_in_proportion() {
    // 128,000 devices (a 2 MiB trace) took 33 s a verb in release, every device looked for among all the
    // others, and each device's timeline held 2,048 buckets whatever the count (1 GB at 32,000 devices; the
    // HTML page 4 GB); 3 M of them (48 MB) aborted `report` under 4 GiB. Ordinals no GPU has fold into the
    // unknown device: the state is the real devices', whatever the count.
    let dir = TempDir::new("hostile-devices-128k");
    let devices: Vec<u32> = (0..128_000).map(|i| i * 7 + 3).collect();
    std::fs::write(dir.0.join("t.vtrace"), devices_trace(&devices)).unwrap();
    every_verb_answers(&dir);
    let plausible = devices.iter().filter(|&&d| d < 1024).count();
    let folded = devices.len() - plausible;
    let r = bounded(&["report", "t.vtrace", "--json"], &dir.0);
    let got = common::cli::python_check(
        r.stdout.as_bytes(),
        "ds = [x['device'] for x in d['devices'] if x['device'] is not None]\n\
         u = [x['peak_bytes'] for x in d['devices'] if x['device'] is None]\n\
         print(len(ds), ds == sorted(ds), ds[0], ds[-1], u, d['implausible_devices'])",
    );
    assert_eq!(
        got.trim(),
        format!("{plausible} True 3 1018 [{}] {folded}", folded as u64 * MIB)
    ); // memory_viz draws the real devices (a list per ordinal up to the largest), every allocation on them once; it
       // has no unknown device to draw the rest on.
    let got = python_on_pickle(
        &dir.0,
        "print(len(d['device_traces']), sum(map(len, d['device_traces'])))",
    );
    assert_eq!(got.trim(), format!("1019 {}", 4 * plausible));
}

/// Issue 50: a process that sends a million small records with no driver event to move its front (3 M
/// `holders` records aborted `run` under 4 GiB) costs what the merge's bound allows: the oldest go out early.
#[test]
fn a_million_records_cost_bounded_memory() {
    use common::*;
    use vramtrace_format::{Bridge, Record};
    let dir = TempDir::new("hostile-records-1m");
    let n: u64 = 1_000_000;
    let mut recs = vec![hello(100, 0)];
    recs.extend((0..n).map(|i| {
        Record::Bridge(Bridge {
            pid: 100,
            tid: 1,
            ts_ns: START + (1 + i / 1000) * MS,
            what: "holders".into(),
            device: 0,
            ack: false,
            doc: format!(
                r#"{{"at":"exit","holders":[{{"kind":"variable","name":"x{i}","bytes":4096}}]}}"#
            ),
        })
    }));
    recs.push(goodbye(100, 1 + n / 1000));
    std::fs::write(dir.0.join("t.vtrace"), trace(&recs)).unwrap();
    drop(recs);
    // 512 MiB of address space: the binary and its threads take most of it; the records held whole took
    // about 900 MB.
    let r = bounded_to(&["report", "t.vtrace"], &dir.0, 512 * MIB);
    assert_ended_well(&["report", "t.vtrace"], &r);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}
