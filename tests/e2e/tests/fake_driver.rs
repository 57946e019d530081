//! The simulated driver itself, without any shim: every door program passes its PATTERN and the driver log
//! shows exactly the expected calls; fragmentation; devices shared between processes.

use std::process::Command;

use vramtrace_e2e::*;

/// Runs a door program and checks its exit and the driver log.
fn run_door(exe: &std::path::Path, repeat: usize, threads: usize) {
    let fake = FakeCuda::new();
    let args = [
        "--repeat".to_string(),
        repeat.to_string(),
        "--threads".to_string(),
        threads.to_string(),
    ];
    let r = fake.run(exe, &args);
    r.assert_success(&format!("{} {args:?}", exe.display()));
    assert!(r.stdout.contains("PASS"), "{}", r.stdout);
    let log = fake.log();
    check_pattern_log(&log, repeat, threads, DEFAULT_DEVICE_BYTES);
}

#[test]
fn door_dlsym_pattern() {
    run_door(&program("door_dlsym"), 2, 1);
}

#[test]
fn door_runtime_pattern() {
    run_door(&program("door_runtime"), 2, 1);
}

#[test]
fn door_linked_pattern() {
    run_door(&door_linked(), 2, 1);
}

#[test]
fn door_patterns_on_threads() {
    run_door(&program("door_dlsym"), 3, 4);
    run_door(&program("door_runtime"), 2, 3);
    run_door(&door_linked(), 3, 4);
}

/// `cuGetProcAddress` hands out the driver's own functions even when a preloaded library exports the same
/// names (as the real driver does): the runtime door still reaches the fake, the linked one does not.
#[test]
fn proc_address_returns_driver_functions_under_preload() {
    let dir = TempDir::new("preload");
    let src = dir.path().join("evil.c");
    let lib = dir.path().join("libevil.so");
    std::fs::write(
        &src,
        "int cuMemAlloc_v2(void *p, unsigned long n) { (void)p; (void)n; return 999; }\n",
    )
    .unwrap();
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success());
    let fake = FakeCuda::new().env("LD_PRELOAD", &lib);
    fake.run(program("door_runtime"), &[] as &[&str])
        .assert_success("door_runtime under LD_PRELOAD");
    fake.run(program("door_dlsym"), &[] as &[&str])
        .assert_success("door_dlsym under LD_PRELOAD");
    let r = fake.run(door_linked(), &[] as &[&str]);
    assert!(
        !r.success() && r.stdout.contains("returned 999"),
        "{}",
        r.stdout
    );
}

/// `FAKECUDA_LARGEST_FREE`: a large request fails while cuMemGetInfo shows enough free.
#[test]
fn largest_free_refuses_large_allocation() {
    let fake = FakeCuda::new().env(ENV_LARGEST_FREE, "1GiB");
    let r = fake.run(
        program("probe"),
        &["info", "alloc 2147483648", "alloc 1073741824", "info"],
    );
    r.assert_success("probe");
    let out: Vec<&str> = r.stdout.lines().collect();
    let total = DEFAULT_DEVICE_BYTES;
    assert_eq!(out[1], format!("0 {total} {total}"));
    assert_eq!(out[2], "2 0x0", "2 GiB refused");
    assert!(out[3].starts_with("0 0x"), "1 GiB granted: {}", out[3]);
    assert_eq!(out[4], format!("0 {} {total}", total - (1 << 30)));
    let log = fake.log();
    let funcs: Vec<(&str, u32, u64)> = log
        .iter()
        .map(|l| (l.func.as_str(), l.rc, l.size))
        .collect();
    assert_eq!(
        funcs,
        [
            ("cuMemGetInfo_v2", 0, total),
            ("cuMemAlloc_v2", 2, 2 << 30),
            ("cuMemAlloc_v2", 0, 1 << 30),
            ("cuMemGetInfo_v2", 0, total - (1 << 30)),
        ]
    );
}

/// The legacy 32-bit entry points are distinct functions with 32-bit results.
#[test]
fn legacy_entry_points() {
    let fake = FakeCuda::new();
    let mut p = fake.probe();
    let (rc, addr) = p.cmd2("alloc32 1048576");
    assert_eq!(rc, 0);
    assert!(addr > 0 && addr < 1 << 32, "32-bit pointer {addr:#x}");
    assert_eq!(
        p.cmd("info32"),
        format!("0 {} {}", u32::MAX, u32::MAX),
        "saturated sizes"
    );
    assert_eq!(p.cmd(&format!("free32 {addr:#x}")), "0");
    assert_eq!(p.cmd(&format!("free32 {addr:#x}")), "1", "double free");
    assert_eq!(p.cmd2("alloc 1048576").0, 0);
    assert!(p.finish().success());
    let log = fake.log();
    let funcs: Vec<(&str, u32, u64)> = log
        .iter()
        .map(|l| (l.func.as_str(), l.rc, l.size))
        .collect();
    assert_eq!(
        funcs,
        [
            ("cuMemAlloc", 0, MIB),
            ("cuMemGetInfo", 0, DEFAULT_DEVICE_BYTES - MIB),
            ("cuMemFree", 0, MIB),
            ("cuMemFree", 1, 0),
            ("cuMemAlloc_v2", 0, MIB),
        ]
    );
}

#[test]
fn no_device() {
    let fake = FakeCuda::new().env(ENV_DEVICES, "0");
    let r = fake.run(program("probe"), &["info"]);
    assert!(
        !r.success() && r.stdout.contains("cuInit returned 100"),
        "{}",
        r.stdout
    );
}

/// Two processes sharing `FAKECUDA_STATE` cannot together exceed the device; memory comes back when a
/// process frees it or exits; the peak is the highest total.
#[test]
fn shared_state_between_processes() {
    let fake = FakeCuda::new().with_state().env(ENV_DEVICE_BYTES, "64MiB");
    let mut p1 = fake.probe();
    let mut p2 = fake.probe();
    let (rc, a1) = p1.cmd2(&format!("alloc {}", 40 * MIB));
    assert_eq!(rc, 0);
    assert_eq!(
        p2.cmd2(&format!("alloc {}", 40 * MIB)),
        (2, 0),
        "would pass the device size"
    );
    let (rc, _) = p2.cmd2(&format!("alloc {}", 24 * MIB));
    assert_eq!(rc, 0);
    assert_eq!(
        p2.cmd("info"),
        format!("0 0 {}", 64 * MIB),
        "device full, seen by both"
    );
    assert_eq!(
        fake.state()[0],
        DevCounters {
            used: 64 * MIB,
            peak: 64 * MIB
        }
    );
    assert_eq!(
        fake.state()[1],
        DevCounters::default(),
        "device 1 untouched"
    );
    assert_eq!(p1.cmd(&format!("free {a1:#x}")), "0");
    assert_eq!(fake.state()[0].used, 24 * MIB);
    let (rc, _) = p1.cmd2(&format!("alloc {}", 8 * MIB));
    assert_eq!(rc, 0);
    assert!(p1.finish().success());
    assert_eq!(
        fake.state()[0].used,
        24 * MIB,
        "exit gives back what p1 still held"
    );
    let (rc, _) = p2.cmd2(&format!("alloc {}", 40 * MIB));
    assert_eq!(rc, 0);
    assert!(p2.finish().success());
    assert_eq!(
        fake.state()[0],
        DevCounters {
            used: 0,
            peak: 64 * MIB
        }
    );
}

/// A process killed with memory held: the next process that would be refused reclaims it.
#[test]
fn shared_state_reclaims_killed_process() {
    let fake = FakeCuda::new().with_state().env(ENV_DEVICE_BYTES, "64MiB");
    let mut p1 = fake.probe();
    assert_eq!(p1.cmd2(&format!("alloc {}", 40 * MIB)).0, 0);
    p1.kill();
    assert_eq!(fake.state()[0].used, 40 * MIB, "nothing ran at SIGKILL");
    let mut p2 = fake.probe();
    assert_eq!(
        p2.cmd2(&format!("alloc {}", 40 * MIB)).0,
        0,
        "reclaimed from the dead process"
    );
    assert_eq!(fake.state()[0].used, 40 * MIB);
    assert!(p2.finish().success());
    assert_eq!(fake.state()[0].used, 0);
}

/// Many threads in many processes: the device is never exceeded, everything comes back.
#[test]
fn shared_state_under_hammer() {
    let fake = FakeCuda::new().with_state().env(ENV_DEVICE_BYTES, "64MiB");
    let size = 16 * MIB;
    for extra in [&[][..], &["--init-before-fork"][..]] {
        let mut args: Vec<String> = [
            "--threads",
            "4",
            "--procs",
            "3",
            "--iters",
            "150",
            "--hold-us",
            "200",
        ]
        .map(String::from)
        .to_vec();
        args.extend(["--size".to_string(), size.to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let r = fake.run(program("hammer"), &args);
        r.assert_success("hammer");
        let line = r.stdout.lines().last().unwrap_or("");
        let nums: Vec<u64> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('=').and_then(|(_, v)| v.parse().ok()))
            .collect();
        assert_eq!(nums.len(), 2, "{line}");
        assert_eq!(
            nums[0] + nums[1],
            4 * 3 * 150,
            "every attempt counted: {line}"
        );
        assert!(nums[0] > 0, "{line}");
        let st = fake.state()[0];
        assert_eq!(st.used, 0, "all given back");
        assert!(
            st.peak <= 64 * MIB && st.peak >= size && st.peak % size == 0,
            "peak {st:?}"
        );
    }
    // The log agrees: every success was freed, every refusal was CUDA_ERROR_OUT_OF_MEMORY.
    let log = fake.log();
    let allocs = log
        .iter()
        .filter(|l| l.func.starts_with("cuMemAlloc"))
        .count();
    let ok = log
        .iter()
        .filter(|l| l.func.starts_with("cuMemAlloc") && l.rc == 0)
        .count();
    let oom = log
        .iter()
        .filter(|l| l.func.starts_with("cuMemAlloc") && l.rc == 2)
        .count();
    let frees = log
        .iter()
        .filter(|l| l.func.starts_with("cuMemFree") && l.rc == 0)
        .count();
    assert_eq!((ok + oom, ok), (allocs, frees));
}
