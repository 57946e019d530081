//! Nothing lost: an event is out of the process the moment the call returns (the shared-memory ring), so a
//! process that `_exit`s or is SIGKILLed right after allocating, or a forked child that ends in `_exit`, leaves
//! every allocation in the trace; what a full ring could not hold is counted exactly, with its cause; a
//! stopped collector loses nothing the ring can hold and says why it lost the rest; `--lossless` loses nothing.

use std::process::Stdio;
use std::time::Duration;

use vramtrace_e2e::traced::{assert_replays_exactly, read_trace, vramtrace};
use vramtrace_e2e::*;
use vramtrace_format::{Api, EndKind, ExitStatus, LossCause};

/// The hellos of the test's `probe` processes.
fn probes(t: &vramtrace_e2e::traced::Trace) -> impl Iterator<Item = &vramtrace_format::Hello> {
    t.hellos
        .iter()
        .filter(|h| h.cmdline.first().is_some_and(|c| c.ends_with("probe")))
}

fn allocs(t: &vramtrace_e2e::traced::Trace, pid: u32) -> usize {
    t.events.get(&pid).map_or(0, |e| {
        e.iter()
            .filter(|e| e.api == Api::MemAlloc && e.ok())
            .count()
    })
}

#[test]
fn exit_and_kill_right_after_allocating_lose_nothing() {
    let fc = FakeCuda::new();
    let p = program("probe").display().to_string();
    let five = "'alloc 1048576' 'alloc 2097152' 'alloc 3145728' 'alloc 4194304' 'alloc 5242880'";
    // 20 processes end in `_exit` and 20 SIGKILL themselves, each on the instruction after its fifth
    // allocation returned: no atexit handler, no flush, nothing but the ring.
    // Each in a subshell that leaves it orphaned: vramtrace (their subreaper) reaps it and learns how it ended.
    let script = format!(
        "for i in $(seq 20); do ( {p} {five} '_exit 3' >/dev/null & ); ( {p} {five} kill >/dev/null 2>&1 & ); \
         sleep 0.05; done; true"
    );
    let (run, path) = fc.traced(
        "exitkill",
        &["--python-agent", "off"],
        "bash",
        &["-c", &script],
    );
    run.assert_success("exit and kill");
    let t = read_trace(&path);
    assert_eq!(t.pids().len(), 40, "{}", run.stderr);
    let log = fc.log();
    for pid in t.pids() {
        assert_eq!(allocs(&t, pid), 5, "pid {pid}: {:?}", t.events.get(&pid));
        // The driver's own log agrees: five allocations of this process, all in the trace.
        let driver = log
            .iter()
            .filter(|l| l.pid == pid && l.func == "cuMemAlloc_v2")
            .count();
        assert_eq!(driver, 5, "pid {pid}");
        assert!(t.ends.contains(&(pid, EndKind::Vanished)), "{:?}", t.ends);
    }
    assert_eq!(t.dropped, 0);
    // How each ended, from the wait statuses: 20 exited with 3 and 20 were killed.
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    let code3 = a
        .processes
        .iter()
        .filter(|p| p.exit == Some(ExitStatus::Code(3)))
        .count();
    let killed = a
        .processes
        .iter()
        .filter(|p| matches!(p.exit, Some(ExitStatus::Signal { signal: 9, .. })))
        .count();
    assert_eq!((code3, killed), (20, 20), "{}", run.stderr);
    assert_eq!(a.device(0).unwrap().allocations, 200);
}

#[test]
fn two_hundred_forked_children_ending_in_exit_are_all_traced() {
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "forks",
        &["--python-agent", "off"],
        program("probe"),
        &["forks 200 1048576"],
    );
    run.assert_success("forks");
    assert!(run.stdout.lines().any(|l| l == "0"), "{}", run.stdout);
    let t = read_trace(&path);
    let children: Vec<u32> = t
        .pids()
        .into_iter()
        .filter(|pid| allocs(&t, *pid) > 0)
        .collect();
    assert_eq!(children.len(), 200, "{}", run.stderr);
    let total: usize = children.iter().map(|pid| allocs(&t, *pid)).sum();
    assert_eq!(total, 400);
    assert_eq!(t.dropped, 0);
}

/// bench_pairs under `vramtrace run`, with extra run arguments; returns (events recorded, dropped counted).
fn pairs(fc: &FakeCuda, name: &str, vt: &[&str], n: u64) -> (u64, u64, String) {
    let n = n.to_string();
    let mut args = vec!["--python-agent", "off", "--stacks", "none"];
    args.extend_from_slice(vt);
    let (run, path) = fc.traced(name, &args, program("bench_pairs"), &["--pairs", &n]);
    run.assert_success(name);
    let t = read_trace(&path);
    (t.all_events().len() as u64, t.dropped, run.stderr)
}

#[test]
fn a_full_ring_counts_every_event_it_drops_and_lossless_drops_none() {
    let fc = FakeCuda::new();
    let n = 200_000u64;
    // The smallest ring (1,024 slots) against a tight loop: some are dropped; every one is recorded or counted.
    let (recorded, dropped, stderr) = pairs(&fc, "small", &["--ring-size", "68KiB"], n);
    assert_eq!(recorded + dropped, 2 * n, "{stderr}");
    if dropped > 0 {
        assert!(stderr.contains("dropped"), "{stderr}");
    }
    // Lossless: the same ring, nothing dropped.
    let (recorded, dropped, stderr) =
        pairs(&fc, "lossless", &["--ring-size", "68KiB", "--lossless"], n);
    assert_eq!((recorded, dropped), (2 * n, 0), "{stderr}");
}

#[test]
fn a_stopped_collector_loses_nothing_its_rings_hold_and_says_why_it_lost_the_rest() {
    for (ring, expect_loss) in [("4MiB", false), ("68KiB", true)] {
        let fc = FakeCuda::new();
        let path = fc.dir().join("stopped.vtrace");
        let script = format!(
            "sleep 0.5; {} --pairs 3000 >/dev/null; exit 7",
            program("bench_pairs").display()
        );
        let mut c = fc.command(vramtrace());
        c.args([
            "run",
            "--python-agent",
            "off",
            "--stacks",
            "none",
            "--ring-size",
            ring,
            "--out",
            path.to_str().unwrap(),
            "--",
            "bash",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let child = c.spawn().unwrap();
        let pid = child.id() as i32;
        // Stopped before the program allocates, continued after it exited.
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_secs(3));
        // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        let run = wait_with_timeout(child, Duration::from_secs(60), "stopped");
        assert_eq!(run.status.code(), Some(7), "{}", run.stderr);
        let t = read_trace(&path);
        let recorded = t.all_events().len() as u64;
        assert_eq!(recorded + t.dropped, 6000, "{ring}: {}", run.stderr);
        if expect_loss {
            assert!(
                t.dropped > 0 && recorded >= 1000,
                "{ring}: {recorded} {}",
                t.dropped
            );
            // Every loss has its cause, and here it is the stalled collector.
            let stalled: u64 = t
                .lost
                .iter()
                .filter(|(_, c, _)| *c == LossCause::CollectorStalled)
                .map(|(_, _, n)| n)
                .sum();
            assert_eq!(stalled, t.dropped, "{:?}", t.lost);
            assert!(
                run.stderr.contains("the collector was stalled"),
                "{}",
                run.stderr
            );
        } else {
            assert_eq!(t.dropped, 0, "{ring}");
        }
        // The program exited (its goodbye had room kept for it even in a full ring), not "killed or crashed".
        let prog = *t.events.keys().next().unwrap();
        assert!(
            t.ends.contains(&(prog, EndKind::Goodbye)),
            "{ring}: {:?}",
            t.ends
        );
        assert!(!run.stderr.contains("killed or crashed"), "{}", run.stderr);
    }
}

#[test]
fn a_process_that_cannot_make_its_ring_is_named() {
    let fc = FakeCuda::new();
    // A file-size limit below the ring's size: the shim cannot size its memfd (and must not die of SIGXFSZ).
    let script = format!(
        "ulimit -f 64; {} 'alloc 1048576'",
        program("probe").display()
    );
    let (run, path) = fc.traced(
        "fsize",
        &["--python-agent", "off"],
        "bash",
        &["-c", &script],
    );
    run.assert_success("ulimit -f");
    let t = read_trace(&path);
    assert_eq!(t.hellos.len(), 1, "{}", run.stderr);
    assert!(
        t.notes
            .iter()
            .any(|(_, n)| n.contains("its event ring was not usable") && n.contains("ulimit -f")),
        "{:?}",
        t.notes
    );
    // The summary names it, and never says the job allocated nothing.
    assert!(run.stderr.contains("not traced"), "{}", run.stderr);
    assert!(run.stderr.contains("ulimit -f"), "{}", run.stderr);
    assert!(
        !run.stderr.contains("no GPU memory was allocated"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_process_the_collector_cannot_start_a_receiver_for_is_named() {
    // No thread to be had for its receiver (a container's pids limit): the process is named untraced, why
    // said, and the summary never says the job allocated nothing.
    let fc = FakeCuda::new().env("VRAMTRACE_TEST_NO_CONN_THREADS", "1");
    let (run, path) = fc.traced(
        "nothreads",
        &["--python-agent", "off"],
        program("probe"),
        &["alloc 1048576"],
    );
    run.assert_success("no threads");
    let t = read_trace(&path);
    assert_eq!(t.hellos.len(), 1, "{}", run.stderr);
    assert!(
        t.hellos[0]
            .extra
            .iter()
            .any(|(k, v)| k == "no_ring" && v.contains("no thread could be started")),
        "{:?}",
        t.hellos[0]
    );
    run.says("0 processes traced (1 not traced")
        .never_says("no GPU memory was allocated");
}

#[test]
fn two_hundred_processes_exiting_as_the_command_ends_on_a_loaded_machine_are_all_traced() {
    let fc = FakeCuda::new();
    let p = program("probe").display().to_string();
    // Two busy loops load the machine; 200 processes each allocate once and exit normally, the last of them
    // right as the command ends (connections still in the backlog then): every one must be in the trace,
    // whole, with its goodbye.
    let script = format!(
        "(timeout 3 sh -c 'while :; do :; done' &) ; (timeout 3 sh -c 'while :; do :; done' &) ; \
         for i in $(seq 200); do {p} 'alloc 1048576' >/dev/null & done; wait"
    );
    let (run, path) = fc.traced(
        "busy200",
        &["--python-agent", "off"],
        "bash",
        &["-c", &script],
    );
    run.assert_success("200 exits");
    let t = read_trace(&path);
    let probes: Vec<u32> = probes(&t).map(|h| h.pid).collect();
    assert_eq!(probes.len(), 200, "{}", run.stderr);
    for pid in probes {
        assert_eq!(allocs(&t, pid), 1, "pid {pid}");
        assert!(
            t.ends.contains(&(pid, EndKind::Goodbye)),
            "pid {pid}: {:?}",
            t.ends
        );
    }
    assert_eq!(t.dropped, 0);
}

/// `vramtrace run --python-agent off --out <dir>/<name>.vtrace -- JOB...` with its descriptor limit set first
/// by `limit` (a shell's `ulimit` command). The run and the trace's path.
fn traced_under_limit(
    fc: &FakeCuda,
    name: &str,
    limit: &str,
    job: &[&str],
) -> (RunResult, std::path::PathBuf) {
    let trace = fc.dir().join(format!("{name}.vtrace"));
    let child = fc
        .command("bash")
        .arg("-c")
        .arg(format!("{limit} && exec \"$@\""))
        .arg("limit")
        .arg(vramtrace())
        .args(["run", "--python-agent", "off", "--out"])
        .arg(&trace)
        .arg("--")
        .args(job)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vramtrace run");
    (
        wait_with_timeout(child, Duration::from_secs(120), name),
        trace,
    )
}

#[test]
fn more_live_processes_than_the_collector_has_descriptors_are_all_traced() {
    // One socket per live process in the collector, and a ring passed with each hello: 120 processes alive at
    // once under a hard limit of 48 descriptors. The collector takes what it can; the rest wait in the backlog
    // (recording into their rings) until descriptors free up, and no ring is lost in transit for want of one.
    // A second run leaves the hard limit alone and lowers the soft one: the collector raises its own, and the
    // command still gets 48.
    let fc = FakeCuda::new();
    let p = program("probe").display().to_string();
    for (name, limit) in [("hard48", "ulimit -n 48"), ("soft48", "ulimit -Sn 48")] {
        let seen = fc.dir().join(format!("{name}.limit"));
        let script = format!(
            "ulimit -Sn > {seen}; for i in $(seq 120); do {p} 'alloc 1048576' 'sleep 3000' >/dev/null & done; wait",
            seen = seen.display()
        );
        let (run, trace) = traced_under_limit(&fc, name, limit, &["bash", "-c", &script]);
        run.assert_success(name);
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap().trim(),
            "48",
            "{name}: the command's own limit"
        );
        let t = read_trace(&trace);
        let probes: Vec<u32> = probes(&t).map(|h| h.pid).collect();
        assert_eq!(probes.len(), 120, "{name}: {}", run.stderr);
        for pid in probes {
            assert_eq!(allocs(&t, pid), 1, "{name}: pid {pid}: {}", run.stderr);
            assert!(
                t.ends.contains(&(pid, EndKind::Goodbye)),
                "{name}: pid {pid}"
            );
        }
        run.never_says("not traced");
        // Processes taken late are merged in time all the same: the report is the time-ordered replay's.
        assert_replays_exactly(&trace, 120, name);
    }
}

#[test]
fn another_users_processes_past_the_collectors_descriptors_are_traced_or_named() {
    // As above, but the job runs as another user (root runs vramtrace, `setpriv` drops the job's privileges).
    // The kernel then also limits the rings in flight to the job's user (the sender's own descriptor limit):
    // a shim whose ring cannot be passed says so in its hello. Every process is traced whole or named.
    if !can_drop_privileges() {
        return;
    }
    let fc = FakeCuda::new();
    let p = program("probe").display().to_string();
    let script =
        format!("for i in $(seq 120); do {p} 'alloc 1048576' 'sleep 3000' >/dev/null & done; wait");
    let setpriv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let job = [&setpriv[..], &["bash", "-c", &script]].concat();
    let (run, trace) = traced_under_limit(&fc, "nobody48", "ulimit -n 48", &job);
    run.assert_success("nobody48");
    let t = read_trace(&trace);
    let probes: Vec<&vramtrace_format::Hello> = probes(&t).collect();
    assert_eq!(probes.len(), 120, "{}", run.stderr);
    let mut named = 0;
    for h in probes {
        match h.extra.iter().find(|(k, _)| k == "no_ring") {
            Some((_, why)) => {
                named += 1;
                // Refused by the kernel on the way (said by the shim), or, rarely, dropped in transit when
                // another of the collector's threads took the descriptor freed for it.
                assert!(
                    why.contains("could not be passed")
                        || why.contains("no file descriptor was free"),
                    "pid {}: {why}",
                    h.pid
                );
                assert_eq!(allocs(&t, h.pid), 0);
            }
            None => assert_eq!(allocs(&t, h.pid), 1, "pid {}: {}", h.pid, run.stderr),
        }
    }
    if named > 0 {
        run.says(&format!(
            "{} processes traced ({named} not traced",
            120 - named
        ));
    }
}

#[test]
fn a_process_that_connects_and_hangs_up_without_a_hello_is_named() {
    // What a shim whose ring could not be passed leaves, when it could not even say so: a connection that
    // closes with nothing on it. Named by the kernel's word for its peer, and /proc's when it was accepted.
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("skipped: no python3");
        return;
    }
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "silent",
        &["--python-agent", "off"],
        "python3",
        &[
            "-c",
            "import os, socket, time; s = socket.socket(socket.AF_UNIX); \
             s.connect(os.environ['VRAMTRACE_SOCKET']); s.close(); print(os.getpid(), flush=True); time.sleep(1)",
        ],
    );
    run.assert_success("silent");
    let pid: u32 = run.stdout.trim().parse().unwrap();
    let t = read_trace(&path);
    let h = t
        .hellos
        .iter()
        .find(|h| h.pid == pid)
        .expect("named in a hello");
    assert!(
        h.extra
            .iter()
            .any(|(k, v)| k == "no_ring" && v.contains("without saying hello")),
        "{h:?}"
    );
    assert!(
        h.cmdline.first().is_some_and(|c| c.contains("python")),
        "{h:?}"
    );
    run.says(&format!("pid {pid} ("))
        .says("hung up without saying hello");
    // Its hello and end, written by the collector, are in time with everything else.
    assert_eq!(
        vramtrace_collector::whatif::trace_file::analyze(&path)
            .unwrap()
            .merge_inexact_events,
        0
    );
}

#[test]
fn processes_the_collector_had_no_descriptor_for_at_the_end_are_said_to_be_missing() {
    // 40 processes outlive the command, holding the collector's descriptors (limit 48); 10 more allocate and
    // exit while none is free, and are still waiting to be taken when the job is over. They cannot be traced:
    // the summary must say so, never pass them over.
    let fc = FakeCuda::new();
    let p = program("probe").display().to_string();
    let script = format!(
        "for i in $(seq 40); do ({p} 'alloc 1048576' 'sleep 8000' >/dev/null & echo $! >> {pids}) ; done; \
         sleep 2; for i in $(seq 10); do {p} 'alloc 2097152' >/dev/null & done; wait",
        pids = fc.dir().join("orphans").display()
    );
    let (run, trace) = traced_under_limit(&fc, "starved", "ulimit -n 48", &["bash", "-c", &script]);
    let t = read_trace(&trace);
    let traced_small = t
        .all_events()
        .iter()
        .filter(|e| e.api == Api::MemAlloc && e.size == 2 << 20)
        .count();
    // The orphans are not needed any more.
    for pid in std::fs::read_to_string(fc.dir().join("orphans"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
    {
        // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // The 40 hold more descriptors than the collector has: some of the 10 cannot be taken, and that is said,
    // in the summary and in the trace.
    assert!(traced_small < 10, "{}", run.stderr);
    run.says("their processes are not in the trace: the collector ran out of file descriptors")
        .never_says("no GPU memory was allocated");
    assert!(
        t.notes
            .iter()
            .any(|(pid, n)| *pid == 0 && n.contains("ran out of file descriptors")),
        "{:?}",
        t.notes
    );
}

#[test]
fn a_process_that_closes_every_descriptor_is_still_traced_to_its_end() {
    let fc = FakeCuda::new();
    // The shim's socket goes with the rest; the ring does not, and the collector drains it while the process
    // maps it.
    let (run, path) = fc.traced(
        "closefds",
        &["--python-agent", "off"],
        program("probe"),
        &[
            "alloc 1048576",
            "closefds",
            "sleep 400",
            "alloc 2097152",
            "alloc 3145728",
            "sleep 200",
        ],
    );
    run.assert_success("closefds");
    let t = read_trace(&path);
    let pid = t.pids()[0];
    let sizes: Vec<u64> = t.events[&pid]
        .iter()
        .filter(|e| e.api == Api::MemAlloc)
        .map(|e| e.size)
        .collect();
    assert_eq!(sizes, vec![1 << 20, 2 << 20, 3 << 20], "{}", run.stderr);
    assert!(t.ends.contains(&(pid, EndKind::Goodbye)), "{:?}", t.ends);
}
