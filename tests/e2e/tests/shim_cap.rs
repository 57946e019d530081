//! The cap on the simulated driver: exact at the boundary through every allocation path, never passed by many
//! processes and threads together (checked against the driver's own count), a killed process's share given
//! back, the virtual memory figures, warn mode, and bad specs refused before anything starts.

use vramtrace_e2e::traced::{read_trace, shim, vramtrace};
use vramtrace_e2e::*;
use vramtrace_format::{flags, Api};

const CAP: u64 = 10 * MIB;

fn ans(p: &mut Probe, cmd: &str) -> (u32, u64) {
    p.cmd2(cmd)
}

fn capped_probe(fc: &FakeCuda, name: &str, vt_args: &[&str]) -> (Probe, std::path::PathBuf) {
    let path = fc.dir().join(format!("{name}.vtrace"));
    let mut c = fc.command(vramtrace());
    c.arg("run")
        .args(vt_args)
        .arg("--out")
        .arg(&path)
        .arg("--")
        .arg(program("probe"));
    (Probe::start(c), path)
}

#[test]
fn refuses_exactly_at_the_boundary_on_every_path() {
    let fc = FakeCuda::new();
    let (mut p, path) = capped_probe(&fc, "boundary", &["--cap", "10MiB"]);
    let (rc, a) = ans(&mut p, "alloc 6291456");
    assert_eq!(rc, 0);
    let (rc, b) = ans(&mut p, "alloc_async 4194304");
    assert_eq!(rc, 0);
    // Exactly at the cap: one more byte is refused, on each path, with the driver's own out-of-memory code.
    assert_eq!(ans(&mut p, "alloc 1").0, 2);
    assert_eq!(ans(&mut p, "alloc_async 1").0, 2);
    assert_eq!(ans(&mut p, "create 0 2097152").0, 2);
    // cuMemCreate on device 1 is not under a "10MiB" cap of device 1? It is: a plain size caps every device.
    assert_eq!(ans(&mut p, "create 1 2097152").0, 0);
    // Giving back makes room again, exactly.
    assert_eq!(p.cmd(&format!("free_async {b}")).trim(), "0");
    let (rc, b2) = ans(&mut p, "alloc 4194304");
    assert_eq!(rc, 0);
    assert_eq!(ans(&mut p, "alloc 1").0, 2);
    assert_eq!(p.cmd(&format!("free {b2}")).trim(), "0");
    assert_eq!(p.cmd(&format!("free {a}")).trim(), "0");
    let (rc, _) = ans(&mut p, "alloc 10485760");
    assert_eq!(rc, 0, "the whole cap in one piece");
    p.finish();
    // The refused requests never reached the driver.
    let log = fc.log();
    assert!(
        !log.iter()
            .any(|l| l.size == 1 && l.func.starts_with("cuMemAlloc")),
        "{log:?}"
    );
    assert_eq!(log.iter().filter(|l| l.func == "cuMemCreate").count(), 1);
    let t = read_trace(&path);
    let refused: Vec<_> = t
        .all_events()
        .into_iter()
        .filter(|e| e.flags & flags::CAP_REFUSED != 0)
        .collect();
    assert_eq!(refused.len(), 4);
    assert!(refused.iter().all(|e| e.result == 2 && e.addr == 0));
    assert_eq!(t.ooms.len(), 4);
    assert!(t
        .ooms
        .iter()
        .all(|o| o.cap_bytes == Some(CAP) && o.flags & flags::CAP_REFUSED != 0));
    assert_eq!(t.ooms[0].job_used_bytes, Some(CAP));
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert_eq!(a.device(0).unwrap().peak_bytes, CAP);
    assert_eq!(a.processes[0].cap_refusals, 4);
}

#[test]
fn frameworks_see_the_cap_as_the_device() {
    let fc = FakeCuda::new();
    let (mut p, _) = capped_probe(&fc, "info", &["--cap", "10MiB"]);
    let info = |p: &mut Probe| -> (u64, u64) {
        let a = p.cmd("info");
        let w: Vec<u64> = a.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(w[0], 0, "cuMemGetInfo never fails because of the cap");
        (w[1], w[2])
    };
    assert_eq!(info(&mut p), (CAP, CAP));
    let (_, a) = ans(&mut p, "alloc 3145728");
    assert_eq!(info(&mut p), (CAP - 3 * MIB, CAP));
    let (_, b) = ans(&mut p, "alloc 7340032");
    assert_eq!(
        info(&mut p),
        (0, CAP),
        "saturates at zero, never underflows"
    );
    p.cmd(&format!("free {a}"));
    p.cmd(&format!("free {b}"));
    assert_eq!(info(&mut p), (CAP, CAP));
    p.finish();

    // A share of the device, and per-device caps that leave other devices alone.
    let (mut p, _) = capped_probe(&fc, "pct", &["--cap", "50%"]);
    assert_eq!(
        info(&mut p),
        (DEFAULT_DEVICE_BYTES / 2, DEFAULT_DEVICE_BYTES / 2)
    );
    p.finish();
    let (mut p, _) = capped_probe(&fc, "perdev", &["--cap", "1=10MiB"]);
    assert_eq!(info(&mut p), (DEFAULT_DEVICE_BYTES, DEFAULT_DEVICE_BYTES));
    assert_eq!(ans(&mut p, "alloc 20971520").0, 0, "device 0 is not capped");
    assert_eq!(p.cmd("device 1").trim(), "0");
    assert_eq!(info(&mut p), (CAP, CAP));
    assert_eq!(ans(&mut p, "alloc 20971520").0, 2, "device 1 is");
    p.finish();
}

#[test]
fn many_processes_and_threads_never_pass_the_cap() {
    // The driver's own shared count is the judge: its peak over every process must stay within the cap.
    let fc = FakeCuda::new().with_state();
    let (run, path) = fc.traced(
        "hammer",
        &["--cap", "64MiB"],
        program("hammer"),
        &[
            "--procs",
            "4",
            "--threads",
            "4",
            "--iters",
            "1500",
            "--size",
            "5242880",
            "--hold-us",
            "50",
        ],
    );
    run.assert_success("hammer under a cap");
    let counts: Vec<u64> = run
        .stdout
        .split_whitespace()
        .filter_map(|w| w.split_once('=').and_then(|(_, v)| v.parse().ok()))
        .collect();
    let (ok, oom) = (counts[0], counts[1]);
    assert!(
        ok > 0 && oom > 0,
        "the cap must have been reached: ok={ok} oom={oom}"
    );
    let state = fc.state();
    assert!(
        state[0].peak <= 64 * MIB,
        "the driver held {} bytes at its peak",
        state[0].peak
    );
    assert!(
        state[0].peak >= 40 * MIB,
        "peak {} is suspiciously low",
        state[0].peak
    );
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert!(a.device(0).unwrap().peak_bytes <= 64 * MIB);
    assert_eq!(a.processes.iter().map(|p| p.cap_refusals).sum::<u64>(), oom);
}

#[test]
fn a_killed_process_gives_its_share_back() {
    let fc = FakeCuda::new();
    let probe = program("probe");
    let script = format!(
        "(echo 'alloc 8388608'; sleep 5) 2>/dev/null | {p} & sleep 1; kill -9 $!; wait $! 2>/dev/null; {p} 'alloc 8388608'",
        p = probe.display()
    );
    let (run, _) = fc.traced("killshare", &["--cap", "10MiB"], "bash", &["-c", &script]);
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| !l.starts_with("ready"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(
        lines[0].starts_with("0 "),
        "the first process got its 8 MiB: {}",
        run.stdout
    );
    assert!(
        lines[1].starts_with("0 "),
        "the dead process's 8 MiB came back: {}",
        run.stdout
    );
}

#[test]
fn warn_mode_lets_through_and_flags() {
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "warn",
        &["--cap", "10MiB", "--cap-mode", "warn"],
        program("probe"),
        &["alloc 8388608", "alloc 8388608"],
    );
    run.assert_success("warn");
    assert_eq!(
        run.stdout.lines().filter(|l| l.starts_with("0 0x")).count(),
        2
    );
    let t = read_trace(&path);
    let evs = t.all_events();
    let allocs: Vec<_> = evs.iter().filter(|e| e.api == Api::MemAlloc).collect();
    assert_eq!(allocs[0].flags & flags::CAP_EXCEEDED, 0);
    assert_ne!(allocs[1].flags & flags::CAP_EXCEEDED, 0);
    assert!(
        run.stderr.contains("went past its cap with 1 allocation"),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_caps_are_refused_before_anything_starts() {
    let fc = FakeCuda::new();
    for cap in ["12XB", "0", "-1", "150%", "5=1GiB", "", "0=1GiB,0=2GiB"] {
        let (run, path) = fc.traced("bad", &["--cap", cap], program("probe"), &["alloc 1"]);
        assert_eq!(run.status.code(), Some(2), "--cap {cap:?}: {}", run.stderr);
        assert_eq!(
            run.stderr.trim().lines().count(),
            1,
            "--cap {cap:?}: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "nothing started for --cap {cap:?}");
        assert!(!path.exists());
    }
    // Above the device: a warning, then the run.
    let (run, _) = fc.traced("big", &["--cap", "100GiB"], program("probe"), &["alloc 1"]);
    run.assert_success("cap above the device");
    assert!(run.stderr.contains("above its memory"), "{}", run.stderr);
}

#[test]
fn the_shim_caps_without_the_wrapper_and_survives_a_bad_spec() {
    // A container that preloads the shim for every process: VRAMTRACE_CAP alone caps each process.
    let run = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_CAP", "4MiB")
        .run(
            program("probe"),
            &["alloc 3145728", "alloc 2097152", "info"],
        );
    run.assert_success("VRAMTRACE_CAP");
    let out: Vec<&str> = run.stdout.lines().skip(1).collect();
    assert!(
        out[0].starts_with("0 ") && out[1].starts_with("2 "),
        "{}",
        run.stdout
    );
    assert_eq!(out[2], format!("0 {} {}", MIB, 4 * MIB));
    assert_eq!(run.stderr, "");
    // A malformed one: one line, and the process runs uncapped rather than dying.
    let run = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_CAP", "12XB")
        .run(program("probe"), &["alloc 104857600"]);
    run.assert_success("bad VRAMTRACE_CAP");
    assert!(
        run.stdout.lines().nth(1).unwrap().starts_with("0 "),
        "{}",
        run.stdout
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("VRAMTRACE_CAP"));
    // A mode neither enforce nor warn: `run` refuses it; the shim preloaded by hand says so once and
    // enforces the cap it was given (the same parser decides both: format's `env`).
    let run = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_CAP", "4MiB")
        .env("VRAMTRACE_CAP_MODE", "loose")
        .run(program("probe"), &["alloc 3145728", "alloc 2097152"]);
    run.assert_success("VRAMTRACE_CAP_MODE=loose");
    let out: Vec<&str> = run.stdout.lines().skip(1).collect();
    assert!(out[1].starts_with("2 "), "enforced: {}", run.stdout);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("VRAMTRACE_CAP_MODE=\"loose\""),
        "{}",
        run.stderr
    );
    let refused = FakeCuda::new()
        .env("VRAMTRACE_CAP_MODE", "loose")
        .command(vramtrace())
        .args(["run", "--cap", "4MiB", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("VRAMTRACE_CAP_MODE=\"loose\""));
}

/// The ledger's filesystem is full: the shim must not map holes it cannot back (SIGBUS at the next
/// allocation); it caps the process on its own and says so once. Needs a mount namespace for a small tmpfs.
#[test]
fn a_full_filesystem_for_the_ledger_falls_back_to_a_process_cap() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/capped_allocs.py");
    let mut run = None;
    for ns in [
        &["--mount"][..],
        &["--user", "--map-root-user", "--mount"][..],
    ] {
        let probe = FakeCuda::new();
        let dir = probe.dir().join("full");
        std::fs::create_dir_all(&dir).unwrap();
        let fc = probe
            .env("LD_PRELOAD", shim())
            .env("VRAMTRACE_CAP", "1GiB")
            .env("VRAMTRACE_LEDGER", dir.join("ledger"));
        let inner = format!(
            "mount -t tmpfs -o size=64k tmpfs {d} && dd if=/dev/zero of={d}/filler bs=4k count=64 \
             2>/dev/null; exec python3 {s}",
            d = dir.display(),
            s = script.display()
        );
        let r = fc.run("unshare", &[ns, &["sh", "-c", &inner]].concat());
        // Ran (or died of a signal such as SIGBUS): the namespace worked.
        if r.stdout.contains("rcs")
            || std::os::unix::process::ExitStatusExt::signal(&r.status).is_some()
        {
            run = Some(r);
            break;
        }
    }
    let Some(r) = run else {
        eprintln!("SKIP: no mount namespace here (unshare --mount failed)");
        return;
    };
    assert!(r.success(), "{:?} {} {}", r.status, r.stdout, r.stderr);
    assert!(r.stdout.contains("rcs 0 2"), "{}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].contains("cannot reserve the cap ledger"),
        "{}",
        r.stderr
    );
    assert!(lines[0].contains("capped on its own"), "{}", r.stderr);
}

/// A pitched allocation refused after the driver made it (its real pitch passed the cap): the driver's memory
/// is freed and the caller's `dptr` and `pitch` no longer hold the driver's answer (a caller that frees on its
/// error path must not free an address that is not its own).
#[test]
fn a_pitch_refused_after_the_fact_takes_its_answer_back() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/pitch_over_cap.py");
    let fc = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_CAP", "1536MiB")
        .env("FAKECUDA_PITCH_ALIGN", "2048");
    let r = fc.run("python3", &[&script]);
    r.assert_success("pitch_over_cap.py");
    assert!(r.stdout.contains("rc 2 dptr 0x0 pitch 0"), "{}", r.stdout);
    let log = fc.log();
    let alloc = log
        .iter()
        .find(|l| l.func == "cuMemAllocPitch_v2" && l.rc == 0)
        .expect("the driver allocated it");
    assert_eq!(alloc.size, 2 << 30);
    assert!(
        log.iter()
            .any(|l| l.func == "cuMemFree_v2" && l.addr == alloc.addr && l.rc == 0),
        "{log:?}"
    );
}

/// `VRAMTRACE_CAP_MODE` is `run`'s default for `--cap-mode`, as the README says: `warn` lets an allocation past
/// the cap through (the driver makes it) and the trace says warn; a value that is neither is bad usage.
#[test]
fn the_cap_mode_from_the_environment_is_runs_default() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/capped_allocs.py");
    let fc = FakeCuda::new().env("VRAMTRACE_CAP_MODE", "warn");
    let (r, trace) = fc.traced("warn", &["--cap", "1GiB"], "python3", &[&script]);
    r.assert_success("capped_allocs.py in warn mode");
    assert!(r.stdout.contains("rcs 0 0"), "{}", r.stdout);
    let t = read_trace(&trace);
    assert!(
        t.header
            .extra
            .iter()
            .any(|(k, v)| k == "cap_mode" && v == "warn"),
        "{:?}",
        t.header.extra
    );
    assert!(fc
        .log()
        .iter()
        .any(|l| l.func == "cuMemAlloc_v2" && l.size == 2 << 30 && l.rc == 0));
    let fc = FakeCuda::new().env("VRAMTRACE_CAP_MODE", "loose");
    let (r, _) = fc.traced("bad", &["--cap", "1GiB"], "python3", &[&script]);
    assert_eq!(r.status.code(), Some(2));
    assert!(r.stderr.contains("VRAMTRACE_CAP_MODE"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

/// A tracked function looked up through `cuGetProcAddress` and answered with something the shim cannot wrap
/// (here the legacy 32-bit `cuMemAlloc`) escapes the cap: under a cap that is said once on stderr; without a cap
/// nothing is said.
#[test]
fn an_unwrappable_lookup_under_a_cap_is_said_once() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/legacy_lookup.py");
    let capped = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_CAP", "1GiB")
        .run("python3", &[&script]);
    capped.assert_success("legacy_lookup.py capped");
    assert!(
        capped.stdout.contains("lookups 0:1 0:1"),
        "{}",
        capped.stdout
    );
    let lines: Vec<&str> = capped.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", capped.stderr);
    assert!(
        lines[0].contains("\"cuMemAlloc\"") && lines[0].contains("not capped"),
        "{}",
        lines[0]
    );
    let plain = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .run("python3", &[&script]);
    plain.assert_success("legacy_lookup.py uncapped");
    assert_eq!(plain.stderr, "");
}

/// Stream-ordered pools keep freed memory (PyTorch's `cudaMallocAsync` backend keeps all of it): the cap counts
/// a pool by what it reserves, so a second process of the job cannot take what the first one's pool holds, and
/// the device (the simulated driver's own count, all processes) never holds more than the cap. After the pool is
/// trimmed, the memory is the job's again.
#[test]
fn a_pool_keeping_freed_memory_counts_against_the_cap() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/pool_two_processes.py");
    let fc = FakeCuda::new().with_state().env("FAKECUDA_DEVICES", "1");
    let (r, _) = fc.traced("pools", &["--cap", "4GiB"], "python3", &[&script]);
    r.assert_success("pool_two_processes.py");
    assert!(
        r.stdout.contains("second 2"),
        "the second process is refused: {}",
        r.stdout
    );
    assert!(
        r.stdout.contains("third 0"),
        "after the trim, the third gets it: {}",
        r.stdout
    );
    let st = fc.state();
    assert!(
        st[0].peak <= 4 << 30,
        "the device held {} bytes at most, over the 4 GiB cap",
        st[0].peak
    );
}

/// `cuMemRelease` of a handle still mapped does not free its memory (the driver frees it at the last unmap):
/// the cap keeps counting it until then, so the device never holds more than the cap.
#[test]
fn a_handle_released_while_mapped_counts_until_its_last_unmap() {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/release_while_mapped.py");
    let fc = FakeCuda::new()
        .with_state()
        .env("FAKECUDA_DEVICES", "1")
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_CAP", "1GiB");
    let r = fc.run("python3", &[&script]);
    r.assert_success("release_while_mapped.py");
    assert!(r.stdout.contains("rcs 2 0"), "{}", r.stdout);
    let st = fc.state();
    assert!(
        st[0].peak <= 1 << 30,
        "the device held {} bytes at most",
        st[0].peak
    );
}
