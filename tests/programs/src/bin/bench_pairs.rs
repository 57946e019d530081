//! Times alloc/free pairs through the driver, for the shim's cost benchmark (scripts/bench.sh): the same
//! binary runs bare, under the shim, and under the shim with a cap, and the differences are the shim's cost.
//!
//! `bench_pairs [--pairs N] [--batch B] [--bytes S] [--depth D] [--sites K] [--async]`: N pairs of
//! cuMemAlloc_v2 + cuMemFree_v2 (with `--async`, cuMemAllocAsync + cuMemFreeAsync on the default stream, which
//! the driver serves from its memory pool; synchronised between batches, untimed) of S bytes, timed in batches
//! of B, called from D extra nested frames (a recursion before the
//! loop: the shim's stack capture costs by the frame), and with `--sites K` (at most 16) each allocation from
//! the next of K different functions in turn (K call chains, the shim's per-thread chain cache defeated when K
//! is more than the 8 it holds); prints `pairs: median_ns=<per pair> p10_ns=.. p90_ns=.. pairs=N depth=<frames>`,
//! where depth counts the return addresses above the call to the driver (glibc's `backtrace`), what the shim's
//! native stack of each allocation holds (at most 64).

use std::ffi::{c_void, CStr};
use std::time::Instant;

type Init = unsafe extern "C" fn(u32) -> u32;
type DeviceGet = unsafe extern "C" fn(*mut i32, i32) -> u32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type Free = unsafe extern "C" fn(u64) -> u32;
type AllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> u32;
type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> u32;
type Sync = unsafe extern "C" fn(*mut c_void) -> u32;

/// The allocation functions the pairs use.
#[derive(Clone, Copy)]
enum Fns {
    Plain(Alloc, Free),
    Async(AllocAsync, FreeAsync, Sync),
}

impl Fns {
    #[inline(always)]
    unsafe fn alloc(self, p: &mut u64, bytes: usize) -> u32 {
        match self {
            Fns::Plain(a, _) => a(p, bytes),
            Fns::Async(a, _, _) => a(p, bytes, std::ptr::null_mut()),
        }
    }

    #[inline(always)]
    unsafe fn free(self, p: u64) -> u32 {
        match self {
            Fns::Plain(_, f) => f(p),
            Fns::Async(_, f, _) => f(p, std::ptr::null_mut()),
        }
    }
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

unsafe fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> T {
    let p = libc::dlsym(lib, name.as_ptr());
    if p.is_null() {
        eprintln!("bench_pairs: {name:?} not found");
        std::process::exit(1);
    }
    std::mem::transmute_copy(&p)
}

extern "C" {
    fn backtrace(buffer: *mut *mut c_void, size: i32) -> i32;
}

/// Runs `f` under `depth` more frames.
#[inline(never)]
fn nested(depth: u64, f: &mut dyn FnMut()) -> u64 {
    if depth == 0 {
        f();
        return 0;
    }
    // Not a tail call: the frame stays while `f` runs.
    std::hint::black_box(nested(depth - 1, f)) + std::hint::black_box(1)
}

/// Call sites: each calls the driver from its own frame (the result goes through `black_box`, so the call is
/// not a tail call and the frame stays; the constant keeps the functions from being merged into one).
macro_rules! sites {
    ($($name:ident = $n:literal),*) => {
        $(
            #[inline(never)]
            fn $name(fns: Fns, p: &mut u64, bytes: usize) -> u32 {
                // SAFETY: `fns` holds the driver's functions, a context is current, `p` is a live u64.
                std::hint::black_box(unsafe { fns.alloc(p, bytes) } ^ $n) ^ $n
            }
        )*
        const SITES: &[fn(Fns, &mut u64, usize) -> u32] = &[$($name),*];
    };
}
sites!(
    site0 = 0,
    site1 = 1,
    site2 = 2,
    site3 = 3,
    site4 = 4,
    site5 = 5,
    site6 = 6,
    site7 = 7,
    site8 = 8,
    site9 = 9,
    site10 = 10,
    site11 = 11,
    site12 = 12,
    site13 = 13,
    site14 = 14,
    site15 = 15
);

fn main() {
    let pairs = arg("--pairs", 2_000_000);
    let batch = arg("--batch", 1000).max(1);
    let bytes = arg("--bytes", 1 << 20) as usize;
    let depth = arg("--depth", 0);
    let sites = arg("--sites", 0).min(SITES.len() as u64) as usize;
    nested(depth, &mut || run(pairs, batch, bytes, sites));
}

#[inline(never)]
fn run(pairs: u64, batch: u64, bytes: usize, sites: usize) {
    // SAFETY: the driver's functions, called with the types cuda.h gives them on locals of the sizes they write;
    // `backtrace` writes at most `frames.len()` pointers into the local array.
    unsafe {
        // The return addresses from here outwards: what the shim sees above its entry point (the driver is
        // called from this function through a pointer, or from one of the sites).
        let mut frames = [std::ptr::null_mut(); 256];
        let frames = backtrace(frames.as_mut_ptr(), frames.len() as i32) + (sites > 0) as i32;
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            eprintln!("bench_pairs: cannot load libcuda.so.1");
            std::process::exit(1);
        }
        let init: Init = sym(lib, c"cuInit");
        let get: DeviceGet = sym(lib, c"cuDeviceGet");
        let retain: Retain = sym(lib, c"cuDevicePrimaryCtxRetain");
        let set: SetCurrent = sym(lib, c"cuCtxSetCurrent");
        let fns = if std::env::args().any(|a| a == "--async") {
            Fns::Async(
                sym(lib, c"cuMemAllocAsync"),
                sym(lib, c"cuMemFreeAsync"),
                sym(lib, c"cuStreamSynchronize"),
            )
        } else {
            Fns::Plain(sym(lib, c"cuMemAlloc_v2"), sym(lib, c"cuMemFree_v2"))
        };
        let (mut dev, mut ctx) = (0, std::ptr::null_mut());
        if init(0) != 0 || get(&mut dev, 0) != 0 || retain(&mut ctx, dev) != 0 || set(ctx) != 0 {
            eprintln!("bench_pairs: no device");
            std::process::exit(1);
        }
        let mut per_pair = Vec::with_capacity((pairs / batch) as usize);
        let mut done = 0;
        let mut turn = 0;
        // `--thrash BYTES`: read that much memory before each pair and time the pair alone, so that it runs with
        // cold caches and TLB, as after a real driver's trip through the kernel (the shim's cost is then its
        // cache misses, not its instructions).
        let thrash = arg("--thrash", 0) as usize;
        if thrash > 0 {
            let junk = vec![1u8; thrash];
            let mut times = Vec::with_capacity(pairs as usize);
            let mut sum = 0u64;
            for _ in 0..pairs {
                for i in (0..thrash).step_by(64) {
                    sum = sum.wrapping_add(std::ptr::read_volatile(&junk[i]) as u64);
                }
                let mut p = 0u64;
                let t = Instant::now();
                let r = fns.alloc(&mut p, bytes);
                let f = fns.free(p);
                times.push(t.elapsed().as_nanos() as f64);
                if r != 0 || f != 0 {
                    eprintln!("bench_pairs: the driver refused a pair");
                    std::process::exit(1);
                }
            }
            std::hint::black_box(sum);
            report(
                times,
                &format!("pairs={pairs} depth={frames} thrash={thrash}"),
            );
            return;
        }
        while done < pairs {
            let t = Instant::now();
            for _ in 0..batch {
                let mut p = 0u64;
                let r = if sites == 0 {
                    fns.alloc(&mut p, bytes)
                } else {
                    turn = (turn + 1) % sites;
                    SITES[turn](fns, &mut p, bytes)
                };
                if r != 0 || fns.free(p) != 0 {
                    eprintln!("bench_pairs: the driver refused a pair");
                    std::process::exit(1);
                }
            }
            per_pair.push(t.elapsed().as_nanos() as f64 / batch as f64);
            done += batch;
            if let Fns::Async(_, _, sync) = fns {
                if sync(std::ptr::null_mut()) != 0 {
                    eprintln!("bench_pairs: cuStreamSynchronize failed");
                    std::process::exit(1);
                }
            }
        }
        report(per_pair, &format!("pairs={done} depth={frames}"));
    }
}

/// The line the scripts read: the median and spread of `ns` (per pair), then `rest`.
fn report(mut ns: Vec<f64>, rest: &str) {
    ns.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| ns[((ns.len() - 1) as f64 * f) as usize];
    println!(
        "pairs: median_ns={:.1} p10_ns={:.1} p90_ns={:.1} {rest}",
        q(0.5),
        q(0.1),
        q(0.9)
    );
}
