//! `probe [COMMAND]...`: a scriptable driver client for tests. It calls `cuInit`, makes device 0's primary
//! context current, prints `ready pid=<pid>`, then runs each argument as a command, or, with no arguments,
//! each line of stdin (answering each on one flushed stdout line, so a test can drive it step by step).
//! Functions are found with `dlsym` of their exact names. Numbers are decimal or 0x-hex.
//!
//! ```text
//! alloc <bytes>          -> <rc> <addr>        cuMemAlloc_v2
//! alloc_async <bytes>    -> <rc> <addr>        cuMemAllocAsync (stream 0)
//! free <addr>            -> <rc>               cuMemFree_v2
//! pairs <n> <bytes>      -> <failed> <faults>  n cuMemAlloc_v2 + cuMemFree_v2 pairs; the page faults this
//!                                              thread took meanwhile (getrusage RUSAGE_THREAD, minor)
//! free_async <addr>      -> <rc>               cuMemFreeAsync (stream 0)
//! pulse <n> <bytes> <on> <off> -> <failed>    n times: cuMemAlloc_v2 of <bytes>, held <on> ms, cuMemFree_v2,
//!                                              then <off> ms with nothing held
//! alloc32 <bytes>        -> <rc> <addr>        legacy cuMemAlloc (32-bit pointer)
//! free32 <addr>          -> <rc>               legacy cuMemFree
//! info                   -> <rc> <free> <total>   cuMemGetInfo_v2
//! info32                 -> <rc> <free> <total>   legacy cuMemGetInfo (unsigned int)
//! create <dev> <bytes>   -> <rc> <handle>      cuMemCreate (pinned, on device <dev>)
//! createhost <bytes>     -> <rc> <handle>      cuMemCreate of pinned host memory (a host location)
//! release <handle>       -> <rc>               cuMemRelease
//! device <n>             -> <rc>               make device n's primary context current
//! ctxreset <n>           -> <rc>               cuDevicePrimaryCtxReset_v2 (frees what was allocated in it)
//! ctxrelease <n>         -> <rc>               cuDevicePrimaryCtxRelease_v2
//! ctxrelease7 <n>        -> <rc>               cuDevicePrimaryCtxRelease as cuGetProcAddress answers it for
//!                                              version 7000 (the legacy function; PyTorch asks this)
//! ctxreset7 <n>          -> <rc>               cuDevicePrimaryCtxReset likewise
//! ctxcreate <n>          -> <rc> <ctx>         cuCtxCreate_v2 on device n (current from then on)
//! ctxdestroy <ctx>       -> <rc>               cuCtxDestroy_v2
//! fork <bytes>           -> <status> <pid>     fork; the child re-initialises CUDA, allocates and frees
//!                                              <bytes> and exits 0 if both succeeded; the parent waits
//! forks <n> <bytes>      -> <failed>          n children at once; each allocates <bytes> twice (no free)
//!                                              and ends in `_exit(0)` right after; the parent waits for all
//! exit [code]            -> (exits normally with code, default 0)
//! _exit [code]           -> (ends at once with `_exit`: no atexit handlers, nothing flushed)
//! sleep <ms>             -> (an empty line, after sleeping)
//! closefds               -> <closed>           closes every descriptor above 2 (the shim's socket among them)
//! kill                   -> (SIGKILLs itself)
//! ```

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::io::{BufRead, Write};

use vramtrace_test_programs::*;

struct Probe {
    h: LibCuda,
}

impl Probe {
    fn f<T: Copy>(&self, name: &str) -> T {
        self.h.func(name)
    }

    fn device(&self, n: c_int) -> CUresult {
        type Retain = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult;
        type SetCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: driver calls with valid out-pointers.
        unsafe {
            let rc = self.f::<Retain>("cuDevicePrimaryCtxRetain")(&mut ctx, n);
            if rc != 0 {
                return rc;
            }
            self.f::<SetCurrent>("cuCtxSetCurrent")(ctx)
        }
    }

    /// Runs one command; `None` means exit with that code.
    fn run(&self, line: &str) -> Result<String, i32> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 {
            let s = w.get(i).copied().unwrap_or("");
            let v = match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            v.unwrap_or_else(|_| fail(&format!("probe: bad number {s:?} in {line:?}")))
        };
        type Alloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
        type AllocAsync = unsafe extern "C" fn(*mut u64, usize, CUstream) -> CUresult;
        type Free = unsafe extern "C" fn(u64) -> CUresult;
        type FreeAsync = unsafe extern "C" fn(u64, CUstream) -> CUresult;
        type Alloc32 = unsafe extern "C" fn(*mut c_uint, c_uint) -> CUresult;
        type Free32 = unsafe extern "C" fn(c_uint) -> CUresult;
        type Info = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
        type Info32 = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CUresult;
        type Create =
            unsafe extern "C" fn(*mut u64, usize, *const CUmemAllocationProp, u64) -> CUresult;
        type Release = unsafe extern "C" fn(u64) -> CUresult;
        let null = std::ptr::null_mut();
        // SAFETY: driver calls with valid out-pointers.
        let out = unsafe {
            match w.first().copied().unwrap_or("") {
                "alloc" => {
                    let mut p = 0;
                    let rc = self.f::<Alloc>("cuMemAlloc_v2")(&mut p, num(1) as usize);
                    format!("{rc} {p:#x}")
                }
                "pairs" => {
                    let minflt = || {
                        let mut u: libc::rusage = std::mem::zeroed();
                        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
                        u.ru_minflt
                    };
                    let (alloc, free) = (
                        self.f::<Alloc>("cuMemAlloc_v2"),
                        self.f::<Free>("cuMemFree_v2"),
                    );
                    let before = minflt();
                    let mut failed = 0;
                    for _ in 0..num(1) {
                        let mut p = 0;
                        let ok = alloc(&mut p, num(2) as usize) == 0 && free(p) == 0;
                        failed += u64::from(!ok);
                    }
                    format!("{failed} {}", minflt() - before)
                }
                "pulse" => {
                    let (alloc, free) = (
                        self.f::<Alloc>("cuMemAlloc_v2"),
                        self.f::<Free>("cuMemFree_v2"),
                    );
                    let ms = |i: usize| std::time::Duration::from_millis(num(i));
                    let mut failed = 0;
                    for _ in 0..num(1) {
                        let mut p = 0;
                        if alloc(&mut p, num(2) as usize) == 0 {
                            std::thread::sleep(ms(3));
                            failed += u64::from(free(p) != 0);
                        } else {
                            failed += 1;
                        }
                        std::thread::sleep(ms(4));
                    }
                    format!("{failed}")
                }
                "alloc_async" => {
                    let mut p = 0;
                    let rc = self.f::<AllocAsync>("cuMemAllocAsync")(&mut p, num(1) as usize, null);
                    format!("{rc} {p:#x}")
                }
                "free" => format!("{}", self.f::<Free>("cuMemFree_v2")(num(1))),
                "free_async" => format!("{}", self.f::<FreeAsync>("cuMemFreeAsync")(num(1), null)),
                "alloc32" => {
                    let mut p: c_uint = 0;
                    let rc = self.f::<Alloc32>("cuMemAlloc")(&mut p, num(1) as c_uint);
                    format!("{rc} {p:#x}")
                }
                "free32" => format!("{}", self.f::<Free32>("cuMemFree")(num(1) as c_uint)),
                "info" => {
                    let (mut free, mut total) = (0, 0);
                    let rc = self.f::<Info>("cuMemGetInfo_v2")(&mut free, &mut total);
                    format!("{rc} {free} {total}")
                }
                "info32" => {
                    let (mut free, mut total) = (0, 0);
                    let rc = self.f::<Info32>("cuMemGetInfo")(&mut free, &mut total);
                    format!("{rc} {free} {total}")
                }
                "create" | "createhost" => {
                    let host = w[0] == "createhost";
                    let prop = CUmemAllocationProp {
                        type_: 1,
                        requested_handle_types: 0,
                        // Device location (1), or host (2) as NCCL's host buffers.
                        location: CUmemLocation {
                            type_: if host { 2 } else { 1 },
                            id: if host { 0 } else { num(1) as c_int },
                        },
                        win32_handle_meta_data: null,
                        alloc_flags: [0; 8],
                    };
                    let mut h = 0;
                    let size = num(if host { 1 } else { 2 }) as usize;
                    let rc = self.f::<Create>("cuMemCreate")(&mut h, size, &prop, 0);
                    format!("{rc} {h:#x}")
                }
                "release" => format!("{}", self.f::<Release>("cuMemRelease")(num(1))),
                "device" => format!("{}", self.device(num(1) as c_int)),
                "ctxreset" => {
                    type Reset = unsafe extern "C" fn(c_int) -> CUresult;
                    format!(
                        "{}",
                        self.f::<Reset>("cuDevicePrimaryCtxReset_v2")(num(1) as c_int)
                    )
                }
                "ctxrelease" => {
                    type Rel = unsafe extern "C" fn(c_int) -> CUresult;
                    format!(
                        "{}",
                        self.f::<Rel>("cuDevicePrimaryCtxRelease_v2")(num(1) as c_int)
                    )
                }
                "ctxrelease7" | "ctxreset7" => {
                    type GetProc = unsafe extern "C" fn(
                        *const c_char,
                        *mut *mut c_void,
                        c_int,
                        u64,
                    ) -> CUresult;
                    type Rel = unsafe extern "C" fn(c_int) -> CUresult;
                    let name = if w[0] == "ctxrelease7" {
                        c"cuDevicePrimaryCtxRelease"
                    } else {
                        c"cuDevicePrimaryCtxReset"
                    };
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let rc = self.f::<GetProc>("cuGetProcAddress")(name.as_ptr(), &mut p, 7000, 0);
                    if rc != 0 || p.is_null() {
                        format!("lookup {rc}")
                    } else {
                        let f: Rel = std::mem::transmute::<*mut c_void, Rel>(p);
                        format!("{}", f(num(1) as c_int))
                    }
                }
                "ctxcreate" => {
                    type CtxCreate =
                        unsafe extern "C" fn(*mut CUcontext, c_uint, c_int) -> CUresult;
                    let mut ctx: CUcontext = std::ptr::null_mut();
                    let rc = self.f::<CtxCreate>("cuCtxCreate_v2")(&mut ctx, 0, num(1) as c_int);
                    format!("{rc} {:#x}", ctx as usize)
                }
                "ctxdestroy" => {
                    type CtxDestroy = unsafe extern "C" fn(CUcontext) -> CUresult;
                    format!(
                        "{}",
                        self.f::<CtxDestroy>("cuCtxDestroy_v2")(num(1) as usize as CUcontext)
                    )
                }
                "fork" => {
                    let bytes = num(1) as usize;
                    let pid = libc::fork();
                    if pid == 0 {
                        // The child: CUDA state does not survive fork, so start again, as real programs must.
                        type Init = unsafe extern "C" fn(c_uint) -> CUresult;
                        let mut p = 0;
                        let ok = self.f::<Init>("cuInit")(0) == 0
                            && self.device(0) == 0
                            && self.f::<Alloc>("cuMemAlloc_v2")(&mut p, bytes) == 0
                            && self.f::<Free>("cuMemFree_v2")(p) == 0;
                        libc::exit(if ok { 0 } else { 1 });
                    }
                    let mut status = 0;
                    libc::waitpid(pid, &mut status, 0);
                    format!("{} {pid}", libc::WEXITSTATUS(status))
                }
                "forks" => {
                    let (n, bytes) = (num(1) as usize, num(2) as usize);
                    let mut pids = Vec::with_capacity(n);
                    for _ in 0..n {
                        let pid = libc::fork();
                        if pid == 0 {
                            type Init = unsafe extern "C" fn(c_uint) -> CUresult;
                            let (mut p, mut q) = (0, 0);
                            let ok = self.f::<Init>("cuInit")(0) == 0
                                && self.device(0) == 0
                                && self.f::<Alloc>("cuMemAlloc_v2")(&mut p, bytes) == 0
                                && self.f::<Alloc>("cuMemAlloc_v2")(&mut q, bytes) == 0;
                            libc::_exit(if ok { 0 } else { 1 });
                        }
                        pids.push(pid);
                    }
                    let mut failed = 0;
                    for pid in pids {
                        let mut status = 0;
                        libc::waitpid(pid, &mut status, 0);
                        failed +=
                            usize::from(!libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0);
                    }
                    format!("{failed}")
                }
                "sleep" => {
                    std::thread::sleep(std::time::Duration::from_millis(num(1)));
                    String::new()
                }
                "closefds" => {
                    // What a daemon's clean-up does: every descriptor above stderr closed, the shim's among them.
                    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
                        .map(|d| {
                            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                                .collect()
                        })
                        .unwrap_or_default();
                    let mut n = 0;
                    for fd in fds.into_iter().filter(|fd| *fd > 2) {
                        n += usize::from(libc::close(fd) == 0);
                    }
                    format!("{n}")
                }
                "_exit" => libc::_exit(if w.len() > 1 { num(1) as i32 } else { 0 }),
                "kill" => {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                    String::new()
                }
                "exit" => return Err(if w.len() > 1 { num(1) as i32 } else { 0 }),
                "" => String::new(),
                other => fail(&format!("probe: unknown command {other:?}")),
            }
        };
        Ok(out)
    }
}

fn main() {
    let probe = Probe { h: open_libcuda() };
    type Init = unsafe extern "C" fn(c_uint) -> CUresult;
    // SAFETY: a driver call.
    let rc = unsafe { probe.f::<Init>("cuInit")(0) };
    if rc != 0 {
        fail(&format!("cuInit returned {rc}"));
    }
    let rc = probe.device(0);
    if rc != 0 {
        fail(&format!("device 0 context setup returned {rc}"));
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ready pid={}", std::process::id());
    let _ = out.flush();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut step = |line: &str| match probe.run(line) {
        Ok(s) => {
            let _ = writeln!(out, "{s}");
            let _ = out.flush();
        }
        Err(code) => std::process::exit(code),
    };
    if args.is_empty() {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => step(&l),
                Err(_) => break,
            }
        }
    } else {
        for a in &args {
            step(a);
        }
    }
}
