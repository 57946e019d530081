//! `hammer --threads T --iters N --size BYTES [--procs P] [--hold-us U] [--device D] [--init-before-fork]`
//!
//! Allocates and frees as fast as it can from T threads (in each of P forked processes when `--procs` is
//! given): iteration i uses `cuMemAlloc_v2`/`cuMemFree_v2` when i is even and
//! `cuMemAllocAsync`/`cuMemFreeAsync` (stream 0) when odd, all found with `dlsym`, holding each allocation
//! U microseconds. Counts successes and `CUDA_ERROR_OUT_OF_MEMORY`, prints `ok=<n> oom=<n>` (totals) and
//! exits 0, unless another code came back (printed, exit 1). Forked children call `cuInit` themselves; with
//! `--init-before-fork` the parent initialises CUDA first (the children re-initialise after the fork).

use std::ffi::{c_int, c_uint};
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vramtrace_test_programs::*;

struct Fns {
    init: unsafe extern "C" fn(c_uint) -> CUresult,
    retain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult,
    set_current: unsafe extern "C" fn(CUcontext) -> CUresult,
    alloc: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult,
    free: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    alloc_async: unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult,
    free_async: unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult,
}

fn load(h: LibCuda) -> Fns {
    Fns {
        init: h.func("cuInit"),
        retain: h.func("cuDevicePrimaryCtxRetain"),
        set_current: h.func("cuCtxSetCurrent"),
        alloc: h.func("cuMemAlloc_v2"),
        free: h.func("cuMemFree_v2"),
        alloc_async: h.func("cuMemAllocAsync"),
        free_async: h.func("cuMemFreeAsync"),
    }
}

#[derive(Clone, Copy)]
struct Args {
    threads: usize,
    iters: u64,
    size: usize,
    procs: usize,
    hold_us: u64,
    device: c_int,
    init_before_fork: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        threads: 1,
        iters: 1000,
        size: 1 << 20,
        procs: 0,
        hold_us: 0,
        device: 0,
        init_before_fork: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--init-before-fork" {
            a.init_before_fork = true;
            continue;
        }
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        let n: u64 = v.parse().map_err(|_| format!("{k}: not a number: {v}"))?;
        match k.as_str() {
            "--threads" => a.threads = n.max(1) as usize,
            "--iters" => a.iters = n,
            "--size" => a.size = n as usize,
            "--procs" => a.procs = n as usize,
            "--hold-us" => a.hold_us = n,
            "--device" => a.device = n as c_int,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    Ok(a)
}

/// (ok, oom, unexpected) for this process's threads.
fn hammer(f: &Fns, a: Args) -> (u64, u64, u64) {
    let (ok, oom, bad) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    // SAFETY: driver calls.
    let rc = unsafe { (f.init)(0) };
    if rc != CUDA_SUCCESS {
        println!("unexpected cuInit result {rc}");
        return (0, 0, 1);
    }
    std::thread::scope(|s| {
        for _ in 0..a.threads {
            s.spawn(|| {
                let mut ctx: CUcontext = std::ptr::null_mut();
                // SAFETY: driver calls with valid out-pointers.
                unsafe {
                    let rc = (f.retain)(&mut ctx, a.device);
                    let rc = if rc == 0 { (f.set_current)(ctx) } else { rc };
                    if rc != CUDA_SUCCESS {
                        println!("unexpected context setup result {rc}");
                        bad.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
                for i in 0..a.iters {
                    let sync = i % 2 == 0;
                    let mut p = 0u64;
                    // SAFETY: driver calls.
                    let rc = unsafe {
                        if sync {
                            (f.alloc)(&mut p, a.size)
                        } else {
                            (f.alloc_async)(&mut p, a.size, std::ptr::null_mut())
                        }
                    };
                    match rc {
                        CUDA_SUCCESS => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            if a.hold_us > 0 {
                                std::thread::sleep(Duration::from_micros(a.hold_us));
                            }
                            // SAFETY: freeing what was just allocated.
                            let rc = unsafe {
                                if sync {
                                    (f.free)(p)
                                } else {
                                    (f.free_async)(p, std::ptr::null_mut())
                                }
                            };
                            if rc != CUDA_SUCCESS {
                                println!("unexpected free result {rc} ({})", code_name(rc));
                                bad.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        CUDA_ERROR_OUT_OF_MEMORY => {
                            oom.fetch_add(1, Ordering::Relaxed);
                        }
                        rc => {
                            println!("unexpected allocation result {rc} ({})", code_name(rc));
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    (ok.into_inner(), oom.into_inner(), bad.into_inner())
}

fn main() {
    let a = parse().unwrap_or_else(|e| fail(&e));
    let h = open_libcuda();
    let f = load(h);
    let (ok, oom, bad) = if a.procs == 0 {
        hammer(&f, a)
    } else {
        if a.init_before_fork {
            // SAFETY: a driver call.
            unsafe { (f.init)(0) };
        }
        let mut kids = Vec::new();
        for _ in 0..a.procs {
            let mut fds = [0 as c_int; 2];
            // SAFETY: pipe + fork; the child only runs this program's code, then exits.
            unsafe {
                if libc::pipe(fds.as_mut_ptr()) != 0 {
                    fail("pipe failed");
                }
                match libc::fork() {
                    -1 => fail("fork failed"),
                    0 => {
                        libc::close(fds[0]);
                        let (ok, oom, bad) = hammer(&f, a);
                        let mut w = std::fs::File::from_raw_fd(fds[1]);
                        let _ = writeln!(w, "{ok} {oom} {bad}");
                        drop(w);
                        std::process::exit(0);
                    }
                    pid => {
                        libc::close(fds[1]);
                        kids.push((pid, fds[0]));
                    }
                }
            }
        }
        let (mut ok, mut oom, mut bad) = (0, 0, 0);
        for (pid, fd) in kids {
            let mut s = String::new();
            // SAFETY: the read end of the child's pipe, owned here.
            let mut r = unsafe { std::fs::File::from_raw_fd(fd) };
            let _ = r.read_to_string(&mut s);
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let v: Vec<u64> = s
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() != 3 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                println!("child {pid} failed: status {status}, said {s:?}");
                bad += 1;
                continue;
            }
            ok += v[0];
            oom += v[1];
            bad += v[2];
        }
        (ok, oom, bad)
    };
    println!("ok={ok} oom={oom}");
    if bad > 0 {
        println!("unexpected={bad}");
        std::process::exit(1);
    }
}
