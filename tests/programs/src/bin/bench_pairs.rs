//! Times alloc/free pairs through the driver, for the shim's cost benchmark (scripts/bench.sh): the same
//! binary runs bare, under the shim, and under the shim with a cap, and the differences are the shim's cost.
//!
//! `bench_pairs [--pairs N] [--batch B] [--bytes S]`: N pairs of cuMemAlloc_v2 + cuMemFree_v2 of S bytes,
//! timed in batches of B; prints `pairs: median_ns=<per pair> p10_ns=.. p90_ns=.. pairs=N`.

use std::ffi::{c_void, CStr};
use std::time::Instant;

type Init = unsafe extern "C" fn(u32) -> u32;
type DeviceGet = unsafe extern "C" fn(*mut i32, i32) -> u32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type Free = unsafe extern "C" fn(u64) -> u32;

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

fn main() {
    let pairs = arg("--pairs", 2_000_000);
    let batch = arg("--batch", 1000).max(1);
    let bytes = arg("--bytes", 1 << 20) as usize;
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            eprintln!("bench_pairs: cannot load libcuda.so.1");
            std::process::exit(1);
        }
        let init: Init = sym(lib, c"cuInit");
        let get: DeviceGet = sym(lib, c"cuDeviceGet");
        let retain: Retain = sym(lib, c"cuDevicePrimaryCtxRetain");
        let set: SetCurrent = sym(lib, c"cuCtxSetCurrent");
        let alloc: Alloc = sym(lib, c"cuMemAlloc_v2");
        let free: Free = sym(lib, c"cuMemFree_v2");
        let (mut dev, mut ctx) = (0, std::ptr::null_mut());
        if init(0) != 0 || get(&mut dev, 0) != 0 || retain(&mut ctx, dev) != 0 || set(ctx) != 0 {
            eprintln!("bench_pairs: no device");
            std::process::exit(1);
        }
        let mut per_pair = Vec::with_capacity((pairs / batch) as usize);
        let mut done = 0;
        while done < pairs {
            let t = Instant::now();
            for _ in 0..batch {
                let mut p = 0u64;
                if alloc(&mut p, bytes) != 0 || free(p) != 0 {
                    eprintln!("bench_pairs: the driver refused a pair");
                    std::process::exit(1);
                }
            }
            per_pair.push(t.elapsed().as_nanos() as f64 / batch as f64);
            done += batch;
        }
        per_pair.sort_by(|a, b| a.total_cmp(b));
        let q = |f: f64| per_pair[((per_pair.len() - 1) as f64 * f) as usize];
        println!(
            "pairs: median_ns={:.1} p10_ns={:.1} p90_ns={:.1} pairs={done}",
            q(0.5),
            q(0.1),
            q(0.9)
        );
    }
}
