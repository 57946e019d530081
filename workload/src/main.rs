//! `vramtrace-workload`: the demo's GPU program. A training-like allocation pattern through cudarc's safe API,
//! with its own exact bookkeeping of the bytes it holds, so a trace's peak can be checked against it.
//!
//! Modes:
//! - default: weights (kept), then per step: forward activations layer by layer, a workspace, gradients and
//!   activation frees in reverse (backward), an optimizer state allocated on the first step and kept, then the
//!   gradients and the workspace freed. Ends with `workload: peak_expected_bytes=<n> steps=<n> allocations=<n>`.
//! - `--tiny-loop N --bytes B`: N x (cuMemAlloc_v2 + cuMemFree_v2) of B bytes, timed; ends with
//!   `loop: iters=<n> bytes=<b> total_ns=<t> ns_per_pair=<x>` (the overhead benchmark).
//! - `--probe`: is a real driver with at least one device here? `dlopen("libcuda.so.1")`, `cuInit(0)`,
//!   `cuDeviceGetCount`; exit 0 when there is a device, 1 otherwise. Used by `vramtrace demo`.
//!
//! Sizes: `--scale S` MiB is the whole model's weights, split evenly over `--layers L`; call one layer's share w.
//! Each layer's activation is 16w, its gradient w, the optimizer state 2w per layer (Adam's m and v), the
//! per-step workspace S/2. With the defaults (S = 64, L = 8) the run peaks at 1256 MiB; `--small` makes S = 4.
//!
//! Exit codes: 0 done; 1 CUDA failed (one line on stderr, never a backtrace); 2 bad usage.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DriverError};

const MIB: u64 = 1 << 20;
const PROG: &str = "vramtrace-workload";

#[derive(Parser)]
#[command(
    name = "vramtrace-workload",
    version,
    about = "A training-like GPU allocation pattern (vramtrace's demo)"
)]
struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 20)]
    steps: u32,
    /// Layers: one weight, activation and gradient buffer each.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    layers: u32,
    /// Size of all the weights together, MiB (default 64, or 4 with --small).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    scale: Option<u64>,
    /// Small sizes (for the simulated driver): --scale 4 unless given.
    #[arg(long)]
    small: bool,
    /// Allocate with cuMemAlloc_v2/cuMemFree_v2 instead of the stream-ordered cuMemAllocAsync/cuMemFreeAsync.
    #[arg(long)]
    sync_alloc: bool,
    /// Overhead benchmark: N iterations of one cuMemAlloc_v2 + cuMemFree_v2 of --bytes, timed.
    #[arg(long, value_name = "N")]
    tiny_loop: Option<u64>,
    /// Bytes per allocation in --tiny-loop.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    bytes: u64,
    /// Only check for a real driver with a device (exit 0) or not (exit 1); loads nothing else.
    #[arg(long)]
    probe: bool,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// No `workload:` lines (its sizes and counts, for tests and benchmarks): `vramtrace demo` passes it
    /// unless `--verbose`.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    #[cfg(feature = "glibc217")]
    vramtrace_glibc217::link();
    // cudarc panics when a driver entry point is missing; a panic here is one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let msg = msg.lines().next().unwrap_or("").to_string();
        eprintln!("{PROG}: CUDA failed: {msg}");
    }));
    let args = Args::parse();
    let outcome = if args.probe {
        probe()
    } else if let Some(iters) = args.tiny_loop {
        tiny_loop(&args, iters)
    } else {
        training(&args)
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{PROG}: {msg}");
            ExitCode::from(1)
        }
    }
}

/// The CUresult's name, e.g. `CUDA_ERROR_OUT_OF_MEMORY` (without calling into the driver for it).
fn cu(e: DriverError) -> String {
    format!("{:?}", e.0)
}

// ---------------------------------------------------------------------------------------------------------------
// --probe

fn probe() -> Result<(), String> {
    type Init = unsafe extern "C" fn(u32) -> i32;
    type Count = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: plain dlopen/dlsym of the driver's documented entry points with their C signatures; the handle is
    // never closed (the process exits right after).
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return Err("probe: libcuda.so.1 cannot be loaded (no NVIDIA driver)".into());
        }
        let init = libc::dlsym(h, c"cuInit".as_ptr());
        let count = libc::dlsym(h, c"cuDeviceGetCount".as_ptr());
        if init.is_null() || count.is_null() {
            return Err("probe: libcuda.so.1 lacks cuInit or cuDeviceGetCount".into());
        }
        let init: Init = std::mem::transmute::<*mut libc::c_void, Init>(init);
        let count: Count = std::mem::transmute::<*mut libc::c_void, Count>(count);
        let rc = init(0);
        if rc != 0 {
            return Err(format!("probe: cuInit(0) failed with CUresult {rc}"));
        }
        let mut n = 0i32;
        let rc = count(&mut n);
        if rc != 0 {
            return Err(format!("probe: cuDeviceGetCount failed with CUresult {rc}"));
        }
        if n < 1 {
            return Err("probe: the driver reports no device".into());
        }
        println!("probe: driver=libcuda.so.1 devices={n}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Context

fn open(device: usize) -> Result<Arc<CudaContext>, String> {
    // SAFETY: only tries to load the library.
    if !unsafe { sys::is_culib_present() } {
        return Err("CUDA failed: libcuda not found (no NVIDIA driver on this machine?)".into());
    }
    let ctx = CudaContext::new(device).map_err(|e| {
        format!(
            "CUDA failed: creating a context on device {device}: {}",
            cu(e)
        )
    })?;
    // One stream only: cudarc's per-buffer events are not needed, and would add driver calls per allocation.
    // SAFETY: all work goes to the default stream, which orders it.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

// ---------------------------------------------------------------------------------------------------------------
// --tiny-loop

fn tiny_loop(args: &Args, iters: u64) -> Result<(), String> {
    let ctx = open(args.device)?;
    let bytes = usize::try_from(args.bytes).map_err(|_| "--bytes too large".to_string())?;
    ctx.bind_to_thread()
        .map_err(|e| format!("CUDA failed: binding the context: {}", cu(e)))?;
    let start = Instant::now();
    for i in 0..iters {
        // SAFETY: a context is current; the pointer is freed right away and never used.
        let p = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            format!(
                "CUDA failed: cuMemAlloc_v2({bytes}) at iteration {i}: {}",
                cu(e)
            )
        })?;
        // SAFETY: `p` was allocated just above in the current context and is freed once.
        unsafe { result::free_sync(p) }
            .map_err(|e| format!("CUDA failed: cuMemFree_v2 at iteration {i}: {}", cu(e)))?;
    }
    let total_ns = start.elapsed().as_nanos();
    let per = if iters == 0 {
        0.0
    } else {
        total_ns as f64 / iters as f64
    };
    println!("loop: iters={iters} bytes={bytes} total_ns={total_ns} ns_per_pair={per:.1}");
    drop(ctx);
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Training-like pattern

/// One device buffer, from whichever path allocated it.
enum Buf {
    Slice(CudaSlice<f32>),
    Raw(sys::CUdeviceptr),
}

/// Allocates and frees, counting exactly what this process holds.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sync: bool,
    held: u64,
    peak: u64,
    allocations: u64,
}

impl Gpu {
    fn alloc(&mut self, bytes: u64, what: &str) -> Result<(Buf, u64), String> {
        let len = (bytes / 4) as usize;
        let buf = if self.sync {
            // SAFETY: the context is current (CudaContext::new bound it to this thread).
            Buf::Raw(unsafe { result::malloc_sync(len * 4) }.map_err(|e| {
                format!(
                    "CUDA failed: cuMemAlloc_v2 of {bytes} bytes ({what}): {}",
                    cu(e)
                )
            })?)
        } else {
            Buf::Slice(self.stream.alloc_zeros::<f32>(len).map_err(|e| {
                format!(
                    "CUDA failed: alloc_zeros of {bytes} bytes ({what}): {}",
                    cu(e)
                )
            })?)
        };
        self.took(bytes);
        Ok((buf, bytes))
    }

    /// Like `alloc`, with contents copied from the host (weights).
    fn upload(&mut self, data: &[f32], what: &str) -> Result<(Buf, u64), String> {
        let bytes = (data.len() * 4) as u64;
        let buf = if self.sync {
            // SAFETY: as in `alloc`; the copy is synchronous and within the allocation.
            unsafe {
                let p = result::malloc_sync(data.len() * 4).map_err(|e| {
                    format!(
                        "CUDA failed: cuMemAlloc_v2 of {bytes} bytes ({what}): {}",
                        cu(e)
                    )
                })?;
                result::memcpy_htod_sync(p, data).map_err(|e| {
                    format!(
                        "CUDA failed: copying {bytes} bytes to the device ({what}): {}",
                        cu(e)
                    )
                })?;
                Buf::Raw(p)
            }
        } else {
            Buf::Slice(self.stream.clone_htod(data).map_err(|e| {
                format!(
                    "CUDA failed: memcpy_stod of {bytes} bytes ({what}): {}",
                    cu(e)
                )
            })?)
        };
        self.took(bytes);
        Ok((buf, bytes))
    }

    fn took(&mut self, bytes: u64) {
        self.allocations += 1;
        self.held += bytes;
        self.peak = self.peak.max(self.held);
    }

    fn free(&mut self, (buf, bytes): (Buf, u64)) -> Result<(), String> {
        match buf {
            Buf::Slice(s) => {
                drop(s); // cuMemFreeAsync on the stream; an error is recorded in the context
                self.ctx
                    .check_err()
                    .map_err(|e| format!("CUDA failed: cuMemFreeAsync: {}", cu(e)))?;
            }
            Buf::Raw(p) => {
                // SAFETY: allocated by `alloc`/`upload` and freed once.
                unsafe { result::free_sync(p) }
                    .map_err(|e| format!("CUDA failed: cuMemFree_v2: {}", cu(e)))?;
            }
        }
        self.held -= bytes;
        Ok(())
    }
}

fn training(args: &Args) -> Result<(), String> {
    let scale = args.scale.unwrap_or(if args.small { 4 } else { 64 });
    let layers = args.layers as u64;
    // One layer's weights: a multiple of 256 bytes (of 4 at the least), so every size is whole f32s.
    let w = {
        let share = scale * MIB / layers;
        if share >= 256 {
            share & !255
        } else {
            (share & !3).max(4)
        }
    };
    let act = 16 * w;
    let workspace = (scale * MIB / 2) & !3;
    let ctx = open(args.device)?;
    let stream = ctx.default_stream();
    let mut gpu = Gpu {
        ctx: ctx.clone(),
        stream,
        sync: args.sync_alloc,
        held: 0,
        peak: 0,
        allocations: 0,
    };
    if !args.quiet {
        println!(
        "workload: device={} alloc={} scale_mib={scale} layers={layers} steps={} weight_bytes={w} \
         activation_bytes={act} gradient_bytes={w} optimizer_bytes={} workspace_bytes={workspace} (per layer unless said)",
        args.device,
        if args.sync_alloc { "cuMemAlloc_v2" } else { "stream-ordered" },
        args.steps,
        2 * w,
    );
    }

    // Weights: uploaded once, kept to the end.
    let host: Vec<f32> = (0..w / 4).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let mut weights = Vec::new();
    for _ in 0..layers {
        weights.push(gpu.upload(&host, "weights")?);
    }
    drop(host);

    let mut optimizer = Vec::new();
    for step in 0..args.steps {
        // Forward: activations held layer by layer.
        let mut acts = Vec::new();
        for _ in 0..layers {
            acts.push(gpu.alloc(act, "activation")?);
        }
        // Backward: a workspace for the step, then per layer (last first) its gradient, and its activation freed.
        let ws = gpu.alloc(workspace, "workspace")?;
        let mut grads = Vec::new();
        while let Some(a) = acts.pop() {
            grads.push(gpu.alloc(w, "gradient")?);
            gpu.free(a)?;
        }
        // Optimizer: its state is allocated on the first step and kept.
        if step == 0 {
            for _ in 0..2 * layers {
                optimizer.push(gpu.alloc(w, "optimizer state")?);
            }
        }
        for g in grads {
            gpu.free(g)?;
        }
        gpu.free(ws)?;
    }

    for b in optimizer.into_iter().chain(weights) {
        gpu.free(b)?;
    }
    ctx.synchronize()
        .map_err(|e| format!("CUDA failed: synchronize: {}", cu(e)))?;
    ctx.check_err()
        .map_err(|e| format!("CUDA failed: {}", cu(e)))?;
    if !args.quiet {
        println!(
            "workload: peak_expected_bytes={} steps={} allocations={}",
            gpu.peak, args.steps, gpu.allocations
        );
    }
    drop(gpu);
    drop(ctx);
    Ok(())
}
