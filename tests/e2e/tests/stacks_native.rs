//! Native call sites: each allocation names the stack it came from, and the stack resolves to the program's
//! own function. A C program with known allocating functions runs under `vramtrace run` on the simulated
//! driver; its trace's stacks, read against its loaded objects and `nm`, must land in those functions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use vramtrace_e2e::traced::shim;
use vramtrace_e2e::traced::{read_trace, Trace};
use vramtrace_e2e::*;
use vramtrace_format::{Effect, Event};

const SOURCE: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

#define MIB ((size_t)1 << 20)

static void check(CUresult r, const char *what) {
    if (r != 0) {
        fprintf(stderr, "%s: %d\n", what, r);
        exit(1);
    }
}

__attribute__((noinline)) CUdeviceptr alloc_weights(void) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 64 * MIB), "alloc_weights");
    return p;
}

__attribute__((noinline)) CUdeviceptr alloc_activations(void) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 16 * MIB), "alloc_activations");
    return p;
}

__attribute__((noinline)) CUdeviceptr alloc_small(void) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 4096), "alloc_small");
    return p;
}

/* Two callers with the same frame: the same stack depth, different return addresses. */
__attribute__((noinline)) CUdeviceptr via_a(void) { return alloc_weights() + 0; }
__attribute__((noinline)) CUdeviceptr via_b(void) { return alloc_weights() + 0; }

/* More than the device: fails. */
__attribute__((noinline)) CUresult alloc_too_much(void) {
    CUdeviceptr p = 0;
    return cuMemAlloc_v2(&p, (size_t)1 << 40);
}

static CUcontext ctx;

/* Forked children initialise the driver again, as CUDA requires. */
static void setup(void) {
    CUdevice dev;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
    check(cuCtxSetCurrent(ctx), "set");
}

static void *worker(void *arg) {
    (void)arg;
    check(cuCtxSetCurrent(ctx), "set");
    for (int i = 0; i < 50; i++)
        check(cuMemFree_v2(alloc_weights()), "free");
    return NULL;
}

static void run(int argc, char **argv, int from);

int main(int argc, char **argv) {
    setup();
    printf("alloc_weights=%p\n", (void *)alloc_weights);
    printf("alloc_activations=%p\n", (void *)alloc_activations);
    printf("alloc_small=%p\n", (void *)alloc_small);
    printf("alloc_too_much=%p\n", (void *)alloc_too_much);
    fflush(stdout);
    run(argc, argv, 1);
    return 0;
}

/* Each argument is one step; every step of a kind calls its function from the same place. */
static void run(int argc, char **argv, int from) {
    CUdeviceptr held[256];
    int n = 0;
    for (int i = from; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "weights")) held[n++] = alloc_weights();
        else if (!strcmp(a, "activations")) held[n++] = alloc_activations();
        else if (!strcmp(a, "small")) held[n++] = alloc_small();
        else if (!strcmp(a, "via_a")) held[n++] = via_a();
        else if (!strcmp(a, "via_b")) held[n++] = via_b();
        else if (!strcmp(a, "oom")) {
            if (alloc_too_much() == 0) { fprintf(stderr, "1 TiB allocated?\n"); exit(1); }
        } else if (!strcmp(a, "threads")) {
            pthread_t t[4];
            for (int k = 0; k < 4; k++) pthread_create(&t[k], NULL, worker, NULL);
            for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
        } else if (!strcmp(a, "fork") || !strcmp(a, "split")) {
            /* The child runs the steps after it up to "end"; the parent skips them. After "fork" the child runs
               them in a call of its own; after "split" it goes on from here, in this very frame: the same call
               chains as the parent's before the fork. */
            int end = i + 1;
            while (end < argc && strcmp(argv[end], "end")) end++;
            fflush(stdout);
            pid_t c = fork();
            if (c == 0) {
                setup();
                if (!strcmp(a, "split")) {
                    n = 0; /* the parent's allocations are not the child's to free */
                    continue;
                }
                run(argc, argv, i + 1);
                exit(0);
            }
            int st = 0;
            waitpid(c, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child failed\n"); exit(1); }
            printf("child=%d\n", (int)c);
            fflush(stdout);
            i = end;
        } else if (!strcmp(a, "end")) {
            break;
        } else {
            fprintf(stderr, "unknown step %s\n", a);
            exit(2);
        }
    }
    for (int k = 0; k < n; k++) check(cuMemFree_v2(held[k]), "free");
}
"#;

/// The program, built once per test process.
fn program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = scratch_dir();
        let src = dir.join("stacks_native.c");
        std::fs::write(&src, SOURCE).unwrap();
        let out = dir.join("stacks_native");
        compile_c(
            &src,
            &out,
            &["-g", "-O0", "-fno-omit-frame-pointer", "-rdynamic", "-Wall"],
            &["-lcuda", "-lpthread"],
        );
        out
    })
    .clone()
}

/// `nm -S`: each function of the program's file -> (file address, size).
fn symbols(exe: &Path) -> BTreeMap<String, (u64, u64)> {
    let out = Command::new("nm")
        .arg("-S")
        .arg(exe)
        .output()
        .expect("nm (binutils) is needed");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 4 && matches!(w[2], "T" | "t")).then(|| {
                (
                    w[3].to_string(),
                    (
                        u64::from_str_radix(w[0], 16).unwrap(),
                        u64::from_str_radix(w[1], 16).unwrap(),
                    ),
                )
            })
        })
        .collect()
}

/// The addresses the program printed (`name=0x...`), and the children it forked.
fn printed(stdout: &str) -> (BTreeMap<String, u64>, Vec<u32>) {
    let mut addrs = BTreeMap::new();
    let mut kids = Vec::new();
    for l in stdout.lines() {
        if let Some((k, v)) = l.split_once('=') {
            if k == "child" {
                kids.push(v.trim().parse().unwrap());
            } else if let Some(h) = v.trim().strip_prefix("0x") {
                addrs.insert(k.to_string(), u64::from_str_radix(h, 16).unwrap());
            }
        }
    }
    (addrs, kids)
}

struct Run {
    trace: Trace,
    /// The trace file, kept while `_fc` (its directory) lives.
    path: PathBuf,
    _fc: FakeCuda,
    addrs: BTreeMap<String, u64>,
    kids: Vec<u32>,
    stderr: String,
}

fn traced(name: &str, env: &[(&str, &str)], steps: &[&str]) -> Run {
    let mut fc = FakeCuda::new();
    for (k, v) in env {
        fc = fc.env(k, v);
    }
    let (run, path) = fc.traced(name, &["--quiet"], program(), steps);
    run.assert_success(name);
    let (addrs, kids) = printed(&run.stdout);
    Run {
        trace: read_trace(&path),
        path,
        _fc: fc,
        addrs,
        kids,
        stderr: run.stderr,
    }
}

fn allocations(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .filter(|e| matches!(e.api.effect(), Effect::AllocPtr | Effect::CreateHandle))
        .copied()
        .collect()
}

impl Run {
    fn main_pid(&self) -> u32 {
        *self
            .trace
            .pids()
            .iter()
            .find(|p| !self.kids.contains(p))
            .expect("the program's events")
    }

    /// The program's function that stack `id` of `pid` was called from: the innermost frame inside the
    /// program's own object (by the objects the process sent), looked up in `nm`'s table.
    fn function_of(&self, pid: u32, id: u32) -> String {
        let exe = program();
        let stack = self.trace.stack(pid, id).expect("the stack");
        let objects = self
            .trace
            .objects_for(pid, id)
            .expect("objects before the stack");
        let me = objects
            .objects
            .iter()
            .find(|o| Path::new(&o.path) == exe)
            .unwrap_or_else(|| panic!("the program is not among {:#?}", objects.objects));
        assert!(!me.text.is_empty(), "the program's code ranges");
        let syms = symbols(&exe);
        // The bias the objects give puts each function where the program says it is.
        for (f, at) in &self.addrs {
            assert_eq!(me.bias + syms[f].0, *at, "{f}: bias {:#x}", me.bias);
        }
        let ip = *stack
            .native
            .iter()
            .find(|ip| me.text.iter().any(|&(s, e)| **ip >= s && **ip < e))
            .unwrap_or_else(|| panic!("no frame in the program: {stack:x?}"));
        // A return address: the instruction after the call, inside the calling function.
        let file = ip - me.bias;
        syms.iter()
            .find(|(_, &(a, n))| file > a && file < a + n)
            .map(|(f, _)| f.clone())
            .unwrap_or_else(|| panic!("{ip:#x} is in no function of the program"))
    }
}

#[test]
fn each_allocation_names_its_call_site() {
    let r = traced(
        "sites",
        &[("VRAMTRACE_STACK_MIN_BYTES", "65536")],
        &[
            "weights",
            "activations",
            "weights",
            "small",
            "oom",
            "activations",
        ],
    );
    let t = &r.trace;
    t.assert_stacks_precede_their_events();
    assert_eq!(t.pids().len(), 1);
    let pid = r.main_pid();
    let events = &t.events[&pid];
    for e in events.iter().filter(|e| e.api.effect() != Effect::AllocPtr) {
        assert_eq!(e.stack, 0, "only allocations get stacks: {e:?}");
    }
    let allocs = allocations(events);
    let sizes: Vec<u64> = allocs.iter().map(|e| e.size).collect();
    assert_eq!(
        sizes,
        vec![64 * MIB, 16 * MIB, 64 * MIB, 4096, 1 << 40, 16 * MIB]
    );
    let ids: Vec<u32> = allocs.iter().map(|e| e.stack).collect();
    assert!(ids[..3].iter().all(|i| *i != 0), "{ids:?}");
    assert_eq!(ids[3], 0, "4 KiB is under the threshold");
    assert_ne!(ids[4], 0, "a failed allocation always gets its stack");
    assert_ne!(allocs[4].result, 0);
    // The same site, the same id; different sites, different ids.
    assert_eq!(ids[0], ids[2]);
    assert_eq!(ids[1], ids[5]);
    let distinct: BTreeSet<u32> = [ids[0], ids[1], ids[4]].into();
    assert_eq!(distinct.len(), 3, "{ids:?}");
    assert_eq!(t.stacks.len(), 3, "each stack sent once");
    assert_eq!(r.function_of(pid, ids[0]), "alloc_weights");
    assert_eq!(r.function_of(pid, ids[1]), "alloc_activations");
    assert_eq!(r.function_of(pid, ids[4]), "alloc_too_much");
    // The post-mortem names the failed request's site: the out-of-memory record (stamped with CLOCK_MONOTONIC,
    // sent on the socket) comes after its failed allocation (an event, its time converted from the counter).
    // The program went on allocating from that thread: a refusal it recovered from, not an error, still named
    // by its request's site.
    let an = vramtrace_collector::whatif::trace_file::analyze(&r.path).unwrap();
    assert_eq!((an.oom_records, an.refusals_recovered), (0, 1));
    let site = an.refusals[0].site.expect("the request's site");
    let label = an.call_sites.sites[site].label();
    assert!(label.starts_with("alloc_too_much"), "{label}");
    // Innermost first, bounded, and the frames beyond the function lead back to main.
    let s = t.stack(pid, ids[0]).unwrap();
    assert!(s.native.len() >= 3 && s.native.len() <= 64, "{s:x?}");
    assert!(s.python.is_empty());
    let syms = symbols(&program());
    let me = t.objects_for(pid, ids[0]).unwrap();
    let main = me
        .objects
        .iter()
        .find(|o| Path::new(&o.path) == program())
        .unwrap();
    let (ma, mn) = syms["main"];
    let (ra, rn) = syms["run"];
    let in_fn = |ip: u64, (a, n): (u64, u64)| ip > main.bias + a && ip <= main.bias + a + n;
    assert!(in_fn(s.native[0], syms["alloc_weights"]), "{s:x?}");
    assert!(in_fn(s.native[1], (ra, rn)), "{s:x?}");
    assert!(in_fn(s.native[2], (ma, mn)), "{s:x?}");
    // Objects: the program, libc and the shim itself, each with code and (linked with a build id) its id.
    let paths: Vec<&str> = me.objects.iter().map(|o| o.path.as_str()).collect();
    assert!(paths.iter().any(|p| p.contains("libc.so")), "{paths:?}");
    assert!(
        paths.iter().any(|p| p.ends_with("libvramtrace.so")),
        "{paths:?}"
    );
    let libc = me
        .objects
        .iter()
        .find(|o| o.path.contains("libc.so"))
        .unwrap();
    assert!(
        !libc.text.is_empty() && !libc.build_id.is_empty(),
        "{libc:?}"
    );
    assert!(t.notes.is_empty(), "{:?}", t.notes);
    assert_eq!(r.stderr, "", "silent");
}

/// The shim remembers each thread's recent call chains by stack position and return addresses: two callers
/// that put the allocating function at the same depth must still be told apart, every time.
#[test]
fn callers_at_the_same_depth_are_told_apart() {
    let steps = [
        "via_a", "via_b", "via_a", "via_a", "via_b", "via_b", "via_a",
    ];
    let r = traced("depth", &[], &steps);
    let t = &r.trace;
    t.assert_stacks_precede_their_events();
    let pid = r.main_pid();
    let ids: Vec<u32> = allocations(&t.events[&pid])
        .iter()
        .map(|e| e.stack)
        .collect();
    assert_eq!(ids.len(), steps.len());
    let (a, b) = (ids[0], ids[1]);
    assert!(a != 0 && b != 0 && a != b, "{ids:?}");
    let want: Vec<u32> = steps
        .iter()
        .map(|s| if *s == "via_a" { a } else { b })
        .collect();
    assert_eq!(ids, want);
    assert_eq!(t.stacks.len(), 2);
    let syms = symbols(&program());
    for (id, caller) in [(a, "via_a"), (b, "via_b")] {
        assert_eq!(r.function_of(pid, id), "alloc_weights");
        let s = t.stack(pid, id).unwrap();
        let me = t.objects_for(pid, id).unwrap();
        let bias = me
            .objects
            .iter()
            .find(|o| Path::new(&o.path) == program())
            .unwrap()
            .bias;
        let (start, size) = syms[caller];
        let second = s.native[1] - bias;
        assert!(second > start && second <= start + size, "{caller}: {s:x?}");
        // Same length as the other: only the return address into via_a / via_b differs.
        assert_eq!(s.native.len(), t.stack(pid, a).unwrap().native.len());
    }
    // The report: both sites are alloc_weights at one line, a wrapper its two callers tell apart, so each
    // label leads with its caller and says what it came through.
    let an = vramtrace_collector::whatif::trace_file::analyze(&r.path).unwrap();
    let labels: Vec<String> = an.call_sites.sites.iter().map(|s| s.label()).collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    for (l, caller) in labels.iter().zip(["via_a", "via_b"]) {
        assert!(
            l.starts_with(&format!("{caller} at ")) && l.contains(" via alloc_weights at "),
            "{labels:?}"
        );
    }
    assert_ne!(labels[0], labels[1]);
}

#[test]
fn threads_share_one_site_and_one_stack_record() {
    let r = traced("threads", &[], &["threads"]);
    let t = &r.trace;
    t.assert_stacks_precede_their_events();
    let allocs = allocations(&t.all_events());
    assert_eq!(allocs.len(), 200);
    let ids: BTreeSet<u32> = allocs.iter().map(|e| e.stack).collect();
    assert_eq!(ids.len(), 1, "four threads, one site: {ids:?}");
    let id = *ids.iter().next().unwrap();
    assert_ne!(id, 0);
    assert_eq!(t.stacks.len(), 1);
    assert_eq!(r.function_of(r.main_pid(), id), "alloc_weights");
    let tids: BTreeSet<u32> = allocs.iter().map(|e| e.tid).collect();
    assert_eq!(tids.len(), 4);
}

#[test]
fn stacks_none_records_no_call_sites() {
    for mode in ["none", "python"] {
        let r = traced(
            &format!("none-{mode}"),
            &[
                ("VRAMTRACE_STACKS", mode),
                ("VRAMTRACE_STACK_MIN_BYTES", "0"),
            ],
            &["weights", "activations", "small", "oom"],
        );
        let t = &r.trace;
        let events = t.all_events();
        assert_eq!(allocations(&events).len(), 4);
        assert!(events.iter().all(|e| e.stack == 0), "{mode}: {events:?}");
        assert!(t.stacks.is_empty() && t.objects.is_empty(), "{mode}");
        assert_eq!(r.stderr, "");
        // The report says why there are no sites: the capture was off, not a threshold; with Python frames
        // alone, an allocation made outside Python (this program is C) has none whatever its size.
        let an = vramtrace_collector::whatif::trace_file::analyze(&r.path).unwrap();
        let label = vramtrace_collector::reporters::text::no_site_label(&an);
        if mode == "none" {
            assert_eq!(label, "(no call sites: capture was off, --stacks none)");
        } else {
            assert!(
                label.contains("or outside Python: --stacks python"),
                "{label}"
            );
        }
    }
}

#[test]
fn the_threshold_skips_small_allocations() {
    let r = traced(
        "min",
        &[
            ("VRAMTRACE_STACKS", "native"),
            ("VRAMTRACE_STACK_MIN_BYTES", "32MiB"),
        ],
        &["weights", "activations", "small", "oom"],
    );
    let allocs = allocations(&r.trace.all_events());
    let got: Vec<(u64, bool)> = allocs.iter().map(|e| (e.size, e.stack != 0)).collect();
    assert_eq!(
        got,
        vec![
            (64 * MIB, true),
            (16 * MIB, false),
            (4096, false),
            (1 << 40, true)
        ]
    );
    r.trace.assert_stacks_precede_their_events();
    assert_eq!(r.trace.stacks.len(), 2);
    // The report names the job's own threshold (from the trace's header), not the default.
    let an = vramtrace_collector::whatif::trace_file::analyze(&r.path).unwrap();
    let text = vramtrace_collector::reporters::text::render(&an, None);
    assert!(
        text.contains("(no call site: below the 32.00 MiB threshold of --stack-min-bytes)"),
        "{text}"
    );
}

#[test]
fn a_bad_setting_says_so_in_one_line() {
    // Preloaded without `run` (which may check the variables itself): the shim's own word.
    let fc = FakeCuda::new()
        .env("LD_PRELOAD", shim())
        .env("VRAMTRACE_STACKS", "sometimes")
        .env("VRAMTRACE_STACK_MIN_BYTES", "lots");
    let r = fc.run(program(), &["weights", "weights"]);
    r.assert_success("bad settings");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stderr);
    assert!(lines[0].contains("VRAMTRACE_STACKS") && lines[0].contains("sometimes"));
    assert!(lines[1].contains("VRAMTRACE_STACK_MIN_BYTES") && lines[1].contains("lots"));
}

/// A process and the call-site ids of its allocations, in order.
type PidIds = (u32, Vec<u32>);

/// A run of steps that fork once: the run, the parent's and the child's pids, and the call-site ids of each
/// one's allocations.
fn forked(name: &str, steps: &[&str]) -> (Run, PidIds, PidIds) {
    let r = traced(name, &[], steps);
    r.trace.assert_stacks_precede_their_events();
    assert_eq!(r.kids.len(), 1);
    assert_eq!(r.trace.pids().len(), 2);
    let ids = |pid| -> Vec<u32> {
        allocations(&r.trace.events[&pid])
            .iter()
            .map(|e| e.stack)
            .collect()
    };
    let (parent, kid) = (r.main_pid(), r.kids[0]);
    let (p, k) = (ids(parent), ids(kid));
    (r, (parent, p), (kid, k))
}

#[test]
fn a_forked_child_on_its_parents_call_chain_gives_it_an_id_of_its_own() {
    // The child goes on in the frame the parent allocated from before the fork: the capture recognises the call
    // chain it remembered, and the id remembered with it is the parent's (1: weights), not the child's.
    let steps = [
        "weights",
        "split",
        "activations",
        "weights",
        "end",
        "weights",
    ];
    let (r, (parent, mine), (kid, child)) = forked("split", &steps);
    assert_eq!(child, vec![1, 2], "child");
    assert_eq!(r.function_of(kid, 1), "alloc_activations");
    assert_eq!(r.function_of(kid, 2), "alloc_weights");
    assert_eq!(mine, vec![1, 1], "parent");
    assert_eq!(r.function_of(parent, 1), "alloc_weights");
}

#[test]
fn a_forked_child_interns_its_own_stacks() {
    let steps = [
        "weights",
        "fork",
        "activations",
        "weights",
        "end",
        "activations",
        "weights",
    ];
    let (r, (parent, mine), (kid, child)) = forked("fork", &steps);
    let t = &r.trace;
    // The child starts its own table: ids from 1, its own records, its own objects.
    assert_eq!(child, vec![1, 2], "child");
    assert_eq!(r.function_of(kid, 1), "alloc_activations");
    assert_eq!(r.function_of(kid, 2), "alloc_weights");
    assert!(t.stacks.iter().filter(|s| s.pid == kid).count() == 2);
    assert!(t.objects.iter().any(|o| o.pid == kid));
    // The parent goes on with its own: its weights (1) from before the fork, then the two others.
    assert_eq!(mine.len(), 3);
    assert_eq!(mine[0], 1);
    assert_eq!(r.function_of(parent, mine[1]), "alloc_activations");
    assert_eq!(r.function_of(parent, mine[2]), "alloc_weights");
    // The same line of `run` as the first weights: the same site.
    assert_eq!(mine[2], 1);
    assert_eq!(mine[1], 2);
}

/// `vramtrace report --json FILE`'s call sites: (label, frames) of each, as it printed them.
fn reported_sites(trace: &Path) -> Vec<(String, serde_json::Value)> {
    let out = Command::new(vramtrace_e2e::traced::vramtrace())
        .arg("report")
        .arg(trace)
        .arg("--json")
        .output()
        .expect("vramtrace report --json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["call_sites"]
        .as_array()
        .expect("call sites")
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap().to_string(),
                s["frames"].clone(),
            )
        })
        .collect()
}

/// Portable traces (issue 53): `run` names the native frames before it closes the trace, so a trace read where
/// the program is gone (moved, deleted, or the trace copied to another machine) names its call sites by function
/// and file:line exactly as it did beside the program. Without the names (a trace of an older `run`) the same
/// frames are only `program+0xoffset` there.
#[test]
fn a_trace_names_its_frames_where_the_program_is_gone() {
    let fc = FakeCuda::new();
    let dir = TempDir::new("portable");
    let exe = dir.path().join("portable_prog");
    std::fs::copy(program(), &exe).unwrap();
    let (run, path) = fc.traced(
        "portable",
        &["--quiet"],
        &exe,
        &["weights", "via_a", "via_b", "activations", "oom"],
    );
    run.assert_success("portable");
    let t = read_trace(&path);
    assert!(!t.frame_names.is_empty(), "the trace names its frames");
    let before = reported_sites(&path);
    let labels: Vec<&str> = before.iter().map(|(l, _)| l.as_str()).collect();
    for want in [
        "via_a at ",
        "via_b at ",
        "alloc_activations at ",
        "alloc_too_much at ",
    ] {
        assert!(
            labels
                .iter()
                .any(|l| l.starts_with(want) && l.contains("stacks_native.c:")),
            "{want}: {labels:?}"
        );
    }
    // The program's binary gone, the trace in another folder: the same call sites, frame for frame.
    std::fs::remove_file(&exe).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let copied = elsewhere.join("portable.vtrace");
    std::fs::copy(&path, &copied).unwrap();
    assert_eq!(reported_sites(&copied), before);
    // The same trace without its names: what a trace of an older `run` says here.
    let bytes = std::fs::read(&copied).unwrap();
    let (_, header_len) = vramtrace_format::codec::decode_header_prefix(
        bytes[..vramtrace_format::codec::HEADER_PREFIX]
            .try_into()
            .unwrap(),
    )
    .unwrap();
    let body = vramtrace_format::codec::HEADER_PREFIX + header_len as usize;
    let mut old = bytes[..body].to_vec();
    for (k, p) in vramtrace_format::codec::frames(&bytes[body..]) {
        if k != vramtrace_format::codec::kind::FRAME_NAMES {
            vramtrace_format::codec::put_frame(&mut old, k, |o| o.extend_from_slice(p));
        }
    }
    let unnamed = elsewhere.join("unnamed.vtrace");
    std::fs::write(&unnamed, old).unwrap();
    let labels: Vec<String> = reported_sites(&unnamed).into_iter().map(|s| s.0).collect();
    assert!(
        labels.iter().all(|l| l.contains("portable_prog+0x")),
        "{labels:?}"
    );
}
