//! The shim never harms its host: no collector, a collector that dies, a program that dies, fork, signals,
//! and `dlsym` lookups that must keep glibc's own semantics. And `vramtrace run`'s exit codes.

use std::process::Stdio;
use std::time::Duration;

use vramtrace_collector::model;
use vramtrace_e2e::traced::{assert_trace_matches_log, read_trace, shim, vramtrace};
use vramtrace_e2e::*;
use vramtrace_format::EndKind;

#[test]
fn no_collector_or_a_missing_one_leaves_the_program_unharmed_and_silent() {
    for socket in [None, Some("/nonexistent/vramtrace.sock")] {
        let mut fc = FakeCuda::new().env("LD_PRELOAD", shim());
        if let Some(s) = socket {
            fc = fc.env("VRAMTRACE_SOCKET", s);
        }
        let run = fc.run(program("door_runtime"), &[] as &[&str]);
        run.assert_success("door_runtime preloaded without a collector");
        assert!(run.stdout.contains("PASS"));
        assert_eq!(run.stderr, "", "the shim must be silent unless asked");
        // The driver saw the whole pattern: the shim forwarded everything.
        check_pattern_log(&fc.log(), 1, 1, DEFAULT_DEVICE_BYTES);
    }
}

#[test]
fn a_dead_collector_never_stops_the_program() {
    let fc = FakeCuda::new();
    let path = fc.dir().join("dead.vtrace");
    let mut c = fc.command(vramtrace());
    c.args(["run", "--out"])
        .arg(&path)
        .arg("--")
        .arg(program("probe"));
    let mut p = Probe::start(c);
    assert_eq!(p.cmd2("alloc 1048576").0, 0);
    std::thread::sleep(Duration::from_millis(300));
    // SIGKILL the collector (the probe's parent): the program goes on.
    // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
    unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..100 {
        let (rc, a) = p.cmd2("alloc 2097152");
        assert_eq!(rc, 0);
        assert_eq!(p.cmd(&format!("free {a}")).trim(), "0");
    }
    // The trace holds what arrived before the kill, readable.
    let t = read_trace(&path);
    assert!(!t.all_events().is_empty());
    assert!(t.all_events().iter().any(|e| e.size == 1 << 20));
    p.finish();
}

#[test]
fn a_killed_program_leaves_a_readable_trace_and_its_signal_as_exit_code() {
    let fc = FakeCuda::new();
    let script = format!(
        "{} 'alloc 3145728' 'alloc 5242880' >/dev/null; (echo 'alloc 7340032'; sleep 5) 2>/dev/null | {} & sleep 1; kill -9 $!; wait $!",
        program("probe").display(),
        program("probe").display()
    );
    let (run, path) = fc.traced("killed", &[], "bash", &["-c", &script]);
    assert_eq!(run.status.code(), Some(137), "{}", run.stderr);
    let t = read_trace(&path);
    assert_eq!(t.pids().len(), 2);
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert_eq!(a.device(0).unwrap().peak_bytes, 8 << 20);
    let killed = t
        .events
        .iter()
        .find(|(_, e)| e.iter().any(|e| e.size == 7 << 20))
        .unwrap()
        .0;
    assert!(
        t.ends.contains(&(*killed, EndKind::Vanished)),
        "{:?}",
        t.ends
    );
    assert!(!t.goodbyes.contains(killed));
}

/// `a; b` in a shell, where `a` holds 8 MiB when it ends (by its goodbye, or killed) and `b` allocates 7 MiB at
/// once: the two never held memory together, so the device's peak is 8 MiB. The collector notices `a`'s end only
/// at its next drain (up to 50 ms later, after `b` started): `a`'s memory goes at its goodbye, or at the moment
/// its connection hung up, not then.
#[test]
fn a_process_ended_just_before_the_next_one_started_is_not_summed_with_it() {
    let fc = FakeCuda::new();
    for (name, how) in [("goodbye", "exit 0"), ("killed", "kill")] {
        for round in 0..3 {
            let script = format!(
                "{p} 'alloc 8388608' 'sleep 200' '{how}' >/dev/null; {p} 'alloc 7340032' >/dev/null",
                p = program("probe").display(),
            );
            let (run, path) = fc.traced(&format!("{name}{round}"), &[], "bash", &["-c", &script]);
            assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
            let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
            let d = a.device(0).unwrap();
            assert_eq!(d.peak_bytes, 8 << 20, "{name}: {:?}", a.processes);
            assert_eq!(a.processes.len(), 2);
            let (first, second) = (&a.processes[0], &a.processes[1]);
            assert_eq!(first.peak_bytes, 8 << 20);
            let expect = if how == "kill" {
                model::Ended::Vanished
            } else {
                model::Ended::Goodbye
            };
            assert_eq!(first.ended, expect);
            assert!(
                first.end_ns.unwrap() < second.peak_time_ns.unwrap(),
                "{name}: {:?}",
                a.processes
            );
        }
    }
}

#[test]
fn forked_children_are_traced_as_themselves() {
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "fork",
        &[],
        program("hammer"),
        &[
            "--procs",
            "3",
            "--threads",
            "2",
            "--iters",
            "400",
            "--size",
            "1048576",
            "--init-before-fork",
        ],
    );
    run.assert_success("hammer");
    let t = read_trace(&path);
    let log = fc.log();
    assert_eq!(t.pids().len(), 3, "pids {:?}", t.pids());
    for pid in t.pids() {
        let mine: Vec<LogLine> = log.iter().filter(|l| l.pid == pid).cloned().collect();
        assert_eq!(assert_trace_matches_log(&mine, &t.events[&pid], 0), 1600);
        assert!(
            t.hellos.iter().any(|h| h.pid == pid),
            "pid {pid} announced itself"
        );
    }
    assert_eq!(t.dropped, 0);
}

/// A process that is already recording forks: the child must not touch the parent's channel or thread, must
/// announce itself under its own pid, and the parent must go on recording.
#[test]
fn a_recording_parent_forks_and_both_stay_traced() {
    let fc = FakeCuda::new();
    let (run, path) = fc.traced(
        "forkparent",
        &[],
        program("probe"),
        &[
            "alloc 1048576",
            "fork 3145728",
            "fork 5242880",
            "alloc 2097152",
        ],
    );
    run.assert_success("probe fork");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines[2].starts_with("0 ") && lines[3].starts_with("0 "),
        "{}",
        run.stdout
    );
    let kids: Vec<u32> = lines[2..4]
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    let t = read_trace(&path);
    let parent = t
        .hellos
        .iter()
        .find(|h| !kids.contains(&h.pid))
        .unwrap()
        .pid;
    for (pid, size) in [(kids[0], 3u64 << 20), (kids[1], 5 << 20)] {
        let ev = &t.events[&pid];
        assert_eq!(ev.len(), 2, "child {pid}: {ev:?}");
        assert_eq!(ev[0].size, size);
        assert!(t.hellos.iter().any(|h| h.pid == pid && h.ppid == parent));
    }
    let sizes: Vec<u64> = t.events[&parent].iter().map(|e| e.size).collect();
    assert_eq!(
        sizes,
        vec![1 << 20, 2 << 20],
        "the parent kept recording after its forks"
    );
    for pid in t.pids() {
        let mine: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
        assert_trace_matches_log(&mine, &t.events[&pid], 0);
    }
}

#[test]
fn an_oom_reaches_the_trace_even_when_the_process_dies_right_after() {
    let fc = FakeCuda::new();
    let path = fc.dir().join("oomkill.vtrace");
    let mut c = fc.command(vramtrace());
    c.args(["run", "--out"])
        .arg(&path)
        .arg("--")
        .arg(program("probe"));
    let mut p = Probe::start(c);
    assert_eq!(p.cmd2("alloc 4194304").0, 0);
    assert_eq!(p.cmd2(&format!("alloc {}", DEFAULT_DEVICE_BYTES * 2)).0, 2);
    // The allocation returned: the collector already holds the evidence. Kill the program at once.
    let child =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", p.pid, p.pid)).unwrap();
    let probe_pid: i32 = child.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
    unsafe { libc::kill(probe_pid, libc::SIGKILL) };
    let status = p.finish();
    assert_eq!(status.code(), Some(137));
    let t = read_trace(&path);
    assert_eq!(t.ooms.len(), 1);
    assert_eq!(t.ooms[0].requested_bytes, DEFAULT_DEVICE_BYTES * 2);
    assert_eq!(t.ooms[0].pid, probe_pid as u32);
}

#[test]
fn exit_codes_follow_the_command() {
    let fc = FakeCuda::new();
    let (r, _) = fc.traced("code3", &[], "sh", &["-c", "exit 3"]);
    assert_eq!(r.status.code(), Some(3));
    let (r, _) = fc.traced("term", &[], "sh", &["-c", "kill -TERM $$"]);
    assert_eq!(r.status.code(), Some(143));
    let (r, p) = fc.traced("nf", &[], "/nonexistent/command", &[] as &[&str]);
    assert_eq!(r.status.code(), Some(127));
    assert!(r.stderr.contains("command not found"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(!p.exists(), "nothing ran, so no trace is left behind");
    let noexec = fc.dir().join("noexec.sh");
    std::fs::write(&noexec, "#!/bin/sh\n").unwrap();
    let (r, _) = fc.traced("ne", &[], &noexec, &[] as &[&str]);
    assert_eq!(r.status.code(), Some(126));
}

fn vt(args: &[&str]) -> RunResult {
    let child = std::process::Command::new(vramtrace())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_with_timeout(child, Duration::from_secs(30), "vramtrace")
}

#[test]
fn bad_usage_is_one_line_and_exit_2() {
    let dir = TempDir::new("badusage");
    let existing = dir.path().join("keep.vtrace");
    std::fs::write(&existing, b"precious").unwrap();
    let existing = existing.to_str().unwrap().to_string();
    for args in [
        vec!["run"],
        vec!["run", "--"],
        vec!["run", "--bogus", "--", "true"],
        vec!["frobnicate"],
        vec!["run", "--out", "/nonexistent/dir/x.vtrace", "--", "true"],
        vec!["run", "--out", &existing, "--", "true"],
    ] {
        let r = vt(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.trim().lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{args:?}");
    }
    assert_eq!(
        std::fs::read(&existing).unwrap(),
        b"precious",
        "an existing file is never overwritten"
    );
}

#[test]
fn signals_sent_to_vramtrace_reach_the_command() {
    let fc = FakeCuda::new();
    let path = fc.dir().join("sig.vtrace");
    let mut c = fc.command(vramtrace());
    c.args(["run", "--out"])
        .arg(&path)
        .args(["--", "sleep", "30"]);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill takes integers only; a pid gone meanwhile only makes it fail.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = std::time::Instant::now();
    let r = wait_with_timeout(child, Duration::from_secs(20), "vramtrace run sleep");
    assert_eq!(r.status.code(), Some(143));
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// A program that resolves symbols with RTLD_DEFAULT and RTLD_NEXT: under the shim it must get exactly what it
/// gets without it (the trampoline hands untracked lookups to glibc with the caller's return address).
#[test]
fn dlsym_keeps_glibc_semantics_for_everything_else() {
    let dir = TempDir::new("dlsym");
    let src = dir.path().join("lookups.c");
    std::fs::write(
        &src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
/* An interposer-style malloc: resolves the next one with RTLD_NEXT, as profilers and other shims do. */
static void *(*next_malloc)(size_t);
void *malloc(size_t n) {
    if (!next_malloc) next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    return next_malloc ? next_malloc(n) : NULL;
}
int main(void) {
    void *p = malloc(64);
    printf("next_malloc_is_not_self=%d\n", next_malloc != NULL && (void *)next_malloc != (void *)malloc);
    printf("printf=%p\n", dlsym(RTLD_DEFAULT, "printf"));
    printf("missing=%p\n", dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere"));
    printf("err=%s\n", dlerror() ? "set" : "clear");
    free(p);
    return 0;
}
"#,
    )
    .unwrap();
    let bin = dir.path().join("lookups");
    let ok = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(ok.success());
    let plain = FakeCuda::new().run(&bin, &[] as &[&str]);
    plain.assert_success("plain");
    let shimmed = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .run(&bin, &[] as &[&str]);
    shimmed.assert_success("under the shim");
    assert!(plain.stdout.contains("next_malloc_is_not_self=1"));
    assert!(plain.stdout.contains("missing=(nil)") && plain.stdout.contains("err=set"));
    // Same answers; printf's address differs only if the library moved, so compare presence.
    let norm = |s: &str| {
        s.lines()
            .map(|l| {
                if l.starts_with("printf=") {
                    "printf=<addr>".into()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(norm(&plain.stdout), norm(&shimmed.stdout));
    assert!(!shimmed.stdout.contains("printf=(nil)"));
}

/// A fork while another thread is inside the shim's first-call set-up (settings, the cap): the child, which has
/// only the forking thread, must still get through its own first call.
#[test]
fn a_fork_during_the_first_calls_set_up_leaves_the_child_usable() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/fork_while_starting.py");
    for cap in [None, Some("1GiB")] {
        let mut fc = FakeCuda::new()
            .env("LD_PRELOAD", shim())
            .env("VRAMTRACE_TEST_SLOW_INIT_MS", "400");
        if let Some(c) = cap {
            fc = fc.env("VRAMTRACE_CAP", c);
        }
        let run = fc.run("python3", &[&script]);
        run.assert_success("fork_while_starting.py");
        assert!(
            run.stdout.contains("child ok"),
            "cap {cap:?}: {} {}",
            run.stdout,
            run.stderr
        );
    }
}

/// A second interposer of `dlsym` preloaded after the shim (HAMi-core's libvgpu.so does this) must still see
/// every lookup that passes through the shim: untracked ones through the trampoline's jump, tracked ones
/// through the shim's own lookup. The program still gets the shim's wrapper for a tracked name.
#[test]
fn a_dlsym_interposer_after_the_shim_stays_in_the_chain() {
    let dir = TempDir::new("second-dlsym");
    let lib_src = dir.path().join("second.c");
    std::fs::write(
        &lib_src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
static int count;
int second_count(void) { return count; }
void *dlsym(void *handle, const char *name) {
    static void *(*next)(void *, const char *);
    if (!next) next = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!next) next = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (name && strncmp(name, "cu", 2) == 0) __atomic_add_fetch(&count, 1, __ATOMIC_SEQ_CST);
    return next(handle, name);
}
"#,
    )
    .unwrap();
    let lib = dir.path().join("libsecond.so");
    compile_c(&lib_src, &lib, &["-shared", "-fPIC"], &["-ldl"]);
    let prog_src = dir.path().join("lookups.c");
    std::fs::write(
        &prog_src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("no driver\n"); return 1; }
    void *init = dlsym(h, "cuInit");
    void *info = dlsym(h, "cuMemGetInfo_v2");
    Dl_info where;
    int ours = info && dladdr(info, &where) && strstr(where.dli_fname, "libvramtrace") != NULL;
    int (*count)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "second_count");
    printf("init=%d wrapper=%d second=%d\n", init != NULL, ours, count ? count() : -1);
    return 0;
}
"#,
    )
    .unwrap();
    let prog = dir.path().join("lookups");
    compile_c(&prog_src, &prog, &[], &["-ldl"]);
    let preload = format!("{}:{}", shim().display(), lib.display());
    let r = FakeCuda::new()
        .env("LD_PRELOAD", preload)
        .run(&prog, &[] as &[&str]);
    r.assert_success("lookups under the shim and a second interposer");
    let line = r.stdout.lines().find(|l| l.starts_with("init=")).unwrap();
    assert!(line.starts_with("init=1 wrapper=1 second="), "{line}");
    let seen: i32 = line.rsplit('=').next().unwrap().parse().unwrap();
    assert!(
        seen >= 2,
        "the second interposer saw {seen} lookups of cu* names: {line}"
    );
}

/// The trampoline can be unwound through at every instruction (profilers sample inside it) and starts with
/// `endbr64` (hosts enforcing indirect-branch tracking): its FDE covers it, with the CFA moving as it pushes.
#[test]
fn the_dlsym_trampoline_has_unwind_information() {
    let so = shim();
    let nm = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .expect("nm");
    let text = String::from_utf8_lossy(&nm.stdout);
    let addr = text
        .lines()
        .find(|l| l.ends_with(" T dlsym"))
        .and_then(|l| u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).ok())
        .expect("dlsym exported");
    let frames = std::process::Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(&so)
        .output()
        .expect("readelf");
    let frames = String::from_utf8_lossy(&frames.stdout);
    let fde = frames
        .split("\n\n")
        .find(|b| b.contains(&format!("pc={addr:016x}..")))
        .unwrap_or_else(|| panic!("no FDE for dlsym at {addr:#x}"));
    for cfa in ["rsp+8", "rsp+16", "rsp+24", "rsp+32"] {
        assert!(fde.contains(cfa), "{cfa} missing from\n{fde}");
    }
    let dis = std::process::Command::new("objdump")
        .arg("-d")
        .arg(format!("--start-address={addr:#x}"))
        .arg(format!("--stop-address={:#x}", addr + 4))
        .arg(&so)
        .output()
        .expect("objdump");
    let dis = String::from_utf8_lossy(&dis.stdout);
    assert!(dis.contains("endbr64"), "endbr64 first:\n{dis}");
}

/// Programs probe for the driver with `dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")`: without a driver the answer must
/// stay null under the shim (its own export of that name is not a driver); with one linked in, it is the
/// shim's wrapper.
#[test]
fn a_driver_probe_through_the_global_scope_answers_as_without_the_shim() {
    let dir = TempDir::new("probe-default");
    let src = dir.path().join("probe.c");
    std::fs::write(
        &src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    void *a = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    void *b = dlsym(dlopen(NULL, RTLD_NOW), "cuMemGetInfo_v2");
    Dl_info where;
    int ours = a && dladdr(a, &where) && strstr(where.dli_fname, "libvramtrace") != NULL;
    printf("default=%d global=%d wrapper=%d\n", a != NULL, b != NULL, ours);
    return 0;
}
"#,
    )
    .unwrap();
    let bare = dir.path().join("probe");
    compile_c(&src, &bare, &[], &["-ldl"]);
    let linked = dir.path().join("probe-linked");
    compile_c(&src, &linked, &["-Wl,--no-as-needed"], &["-lcuda", "-ldl"]);
    let run = |prog: &std::path::Path, preload: bool| {
        let mut fc = FakeCuda::new();
        if preload {
            fc = fc.env("LD_PRELOAD", shim());
        }
        let r = fc.run(prog, &[] as &[&str]);
        r.assert_success("probe");
        r.stdout.trim().to_string()
    };
    assert_eq!(run(&bare, false), "default=0 global=0 wrapper=0");
    assert_eq!(run(&bare, true), "default=0 global=0 wrapper=0");
    assert_eq!(run(&linked, false), "default=1 global=1 wrapper=0");
    assert_eq!(run(&linked, true), "default=1 global=1 wrapper=1");
}

/// A thread's first allocation with a call site must not wait for the dynamic loader's lock: here another
/// thread is inside `dlopen` (whose constructor holds that lock and waits), and a thread that was already
/// running makes its first 1 MiB allocation. It must finish while the constructor still waits (before the fix
/// it waited for the lock, registering a thread-local destructor: a deadlock when the constructor waits for it).
#[test]
fn a_threads_first_allocation_never_waits_for_the_loader_lock() {
    let dir = TempDir::new("loader-lock");
    let ctor_src = dir.path().join("slowctor.c");
    std::fs::write(
        &ctor_src,
        r#"
#include <stdlib.h>
#include <unistd.h>
#include <poll.h>
/* Holds the loader's lock (it runs inside dlopen) until told to go on, or 5 s. */
__attribute__((constructor)) static void wait_for_go(void) {
    int started = atoi(getenv("CTOR_STARTED_FD")), go = atoi(getenv("CTOR_GO_FD"));
    char c = 1;
    (void)!write(started, &c, 1);
    struct pollfd p = {.fd = go, .events = POLLIN};
    poll(&p, 1, 5000);
}
"#,
    )
    .unwrap();
    let ctor = dir.path().join("libslowctor.so");
    compile_c(&ctor_src, &ctor, &["-shared", "-fPIC"], &[]);
    let prog_src = dir.path().join("prog.c");
    std::fs::write(
        &prog_src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0
CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
#define cuCtxCreate cuCtxCreate_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
static int started[2], go[2], start_b[2], done_b[2], ready_b[2];
static const char *lib;
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static void *loader(void *arg) { (void)arg; dlopen(lib, RTLD_NOW); return NULL; }
static double b_ms = -1;
static void *first_alloc(void *ctx) {
    char c;
    cuCtxSetCurrent((CUcontext)ctx); /* the driver's own per-thread set-up, before the loader is busy */
    c = 1;
    (void)!write(ready_b[1], &c, 1);
    (void)!read(start_b[0], &c, 1);
    CUdeviceptr p;
    double t = now_ms();
    CUresult r = cuMemAlloc(&p, 1 << 20);
    b_ms = now_ms() - t;
    if (r == CUDA_SUCCESS) cuMemFree(p);
    c = 1;
    (void)!write(done_b[1], &c, 1); /* (the thread's exit itself may wait for the loader: glibc's business) */
    return NULL;
}
int main(int argc, char **argv) {
    lib = argv[1];
    if (pipe(started) || pipe(go) || pipe(start_b) || pipe(done_b) || pipe(ready_b)) return 2;
    char buf[16];
    sprintf(buf, "%d", started[1]); setenv("CTOR_STARTED_FD", buf, 1);
    sprintf(buf, "%d", go[0]); setenv("CTOR_GO_FD", buf, 1);
    CUdevice d; CUcontext ctx; CUdeviceptr w;
    cuInit(0); cuDeviceGet(&d, 0); cuCtxCreate(&ctx, 0, d);
    /* The process's first tracked call (allowed to set things up), on the main thread. */
    if (cuMemAlloc(&w, 1 << 20) != CUDA_SUCCESS) return 3;
    cuMemFree(w);
    pthread_t b, l;
    pthread_create(&b, NULL, first_alloc, ctx); /* before the loader's lock is taken */
    char c;
    (void)!read(ready_b[0], &c, 1);          /* b's driver-side set-up done */
    pthread_create(&l, NULL, loader, NULL);
    (void)!read(started[0], &c, 1);          /* the constructor runs: the loader's lock is held */
    double t = now_ms();
    (void)!write(start_b[1], &c, 1);
    (void)!read(done_b[0], &c, 1);
    double waited = now_ms() - t;
    (void)!write(go[1], &c, 1);
    pthread_join(b, NULL);
    pthread_join(l, NULL);
    printf("first_alloc_ms=%.0f waited_ms=%.0f\n", b_ms, waited);
    return 0;
}
"#,
    )
    .unwrap();
    let prog = dir.path().join("prog");
    compile_c(&prog_src, &prog, &[], &["-lcuda", "-lpthread", "-ldl"]);
    // Under `vramtrace run`, so that allocations are recorded with their call sites.
    let fc = FakeCuda::new();
    let (r, trace) = fc.traced("loader", &["--stacks", "native"], &prog, &[&ctor]);
    r.assert_success("the loader-lock program");
    let t = vramtrace_e2e::traced::read_trace(&trace);
    let sited = t.all_events().iter().filter(|e| e.stack != 0).count();
    assert!(
        sited >= 2,
        "both first allocations carry a call site ({sited})"
    );
    let waited: f64 = r
        .stdout
        .split("waited_ms=")
        .nth(1)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(
        waited < 2000.0,
        "the first allocation waited {waited} ms for the loader: {}",
        r.stdout
    );
}

/// A host that closes the shim's socket and reuses its number for a socket of its own must never receive the
/// shim's bytes (nor have its data read as an acknowledgement): the shim checks the descriptor is still the
/// socket it made before every write, and its descriptor sits high, out of the way of the host's own.
#[test]
fn a_reused_socket_descriptor_never_receives_the_shims_bytes() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/steal_socket_fd.py");
    let fc = FakeCuda::new();
    let (r, _) = fc.traced("stolen", &[], "python3", &[&script]);
    r.assert_success("steal_socket_fd.py");
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("stolen_fd"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(line.ends_with("received 0"), "{line}");
    let fd: i32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(fd >= 100, "the shim's socket sat at descriptor {fd}");
}

/// The kernel's version, (major, minor).
fn kernel_version() -> (u32, u32) {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r.trim().split(['.', '-']).map(|s| s.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// The ring's pages are faulted in by the shim's own thread ahead of the writers (`prefault.rs`): a thread that
/// records 40,000 events (625 pages of ring) takes no more page faults traced than bare, give or take a
/// descheduled courier now and then.
#[test]
fn a_recording_thread_does_not_fault_the_ring_in_itself() {
    if kernel_version() < (5, 14) {
        eprintln!(
            "skipped: MADV_POPULATE_WRITE needs Linux 5.14; the writers fault the ring in there"
        );
        return;
    }
    let fc = FakeCuda::new();
    // Batches of 1,000 events (16 pages of ring), well inside the shim's look-ahead, with a pause after each
    // for the courier to catch up.
    let mut args = vec!["alloc 1048576".to_string(), "sleep 50".to_string()];
    for _ in 0..40 {
        args.push("pairs 500 1048576".into());
        args.push("sleep 5".into());
    }
    let faults = |stdout: &str| -> u64 {
        let answers: Vec<(u64, u64)> = stdout
            .lines()
            .filter_map(|l| {
                let w: Vec<u64> = l
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                (w.len() == 2).then(|| (w[0], w[1]))
            })
            .collect();
        assert_eq!(answers.len(), 40, "{stdout}");
        assert!(answers.iter().all(|a| a.0 == 0), "failed pairs: {stdout}");
        answers.iter().map(|a| a.1).sum()
    };
    let bare = fc.run(program("probe"), &args);
    bare.assert_success("probe bare");
    let (run, path) = fc.traced("prefault", &["-q"], program("probe"), &args);
    run.assert_success("probe traced");
    let t = read_trace(&path);
    assert_eq!(t.all_events().len(), 40_001, "every event recorded");
    assert_eq!(t.dropped, 0);
    let ring_pages = 40_000 * 64 / 4096;
    let (bare_f, traced_f) = (faults(&bare.stdout), faults(&run.stdout));
    assert!(
        traced_f <= bare_f + ring_pages / 4,
        "the recording thread took {traced_f} page faults traced, {bare_f} bare: it faulted the ring's \
         {ring_pages} pages in itself"
    );
}
