//! `libvramtrace.so`: preloaded into every process of a job, it sees the CUDA driver's memory calls through
//! every door programs use, records each one for the collector, and (with a cap) refuses what would pass it.
//!
//! One module per concern:
//! - `exports`: the exported C symbols, nothing but unpacking and calling `hooks`.
//! - `driver`: finding the real driver: the real `dlsym`, the table of tracked functions, wrapper swapping.
//! - `hooks`: what each intercepted call does around the real one.
//! - `record`: events into the shared-memory ring (stamped with the CPU's time-stamp counter where the kernel
//!   keeps time with it, format's `ticks`), the courier thread, fork and exit handling; `transport`: the ring's
//!   memory and the socket that hands it to the collector; `prefault`: the ring's pages faulted in ahead of
//!   its writers, by the courier.
//! - `cap`: the cap's policy (admission, what the process holds, the figures frameworks see), over `ledger`,
//!   the per-device counts shared by every process of the job; `pools`: stream-ordered pools counted by what
//!   they reserve.
//! - `stacks`: each allocation's call site (native return addresses and, through `pystack`, Python frames),
//!   interned per process; `objects`: the loaded objects the collector needs to resolve them.
//! - `contexts`: contexts torn down (`cuCtxDestroy`, `cudaDeviceReset`) free what was allocated in them.
//! - `settings`: what the environment says, read once.
//! - `lazy`: building that state lazily, so that a `fork` in any state leaves it usable.
//! - `tls`: each thread's own state (in a hook, its id), reached without `__tls_get_addr`.
//! - `cuda`: the few driver types and codes the shim needs.
//! - `reap`: the wait functions: a child the process reaps itself is reported to the collector (in the ring,
//!   or on a one-shot connection), async-signal-safely.
//! - `bridge`: the C functions the Python bridge calls to put a framework allocator's figures in the stream.
//!
//! Rules the code keeps (the host must never notice us): no work in ELF constructors, nothing allocated or
//! locked on the `dlsym` path, the driver's result codes returned unchanged, no blocking of the host's threads,
//! silent unless `VRAMTRACE_DEBUG` is set, and a fresh start after `fork`.

// Every unsafe function here is a driver entry point or its hook: its contract is the CUDA API's own.
#![allow(clippy::missing_safety_doc)]
// Every unsafe block says why it is sound here (issue 26; the lint is the workspace's, Cargo.toml).

pub mod bridge;
pub mod cap;
pub mod contexts;
pub mod cuda;
pub mod devices;
pub mod driver;
pub mod exports;
pub mod fds;
pub mod hooks;
pub mod lazy;
pub mod ledger;
pub mod live;
pub mod nvml;
pub mod objects;
pub mod pools;
pub mod prefault;
pub mod pystack;
pub mod reap;
pub mod record;
pub mod settings;
pub mod stack_table;
pub mod stacks;
pub mod tls;
pub mod transport;
pub mod waits;

/// The hot path's data: the driver's functions, the recorder, the settings, the cap and a few flags, together in
/// `.vramtrace.hotdata` so that an allocation reads one page of the shim's data, not four (after the driver's
/// trip through the kernel each page is a page walk: docs/GPU-RESULTS.md, issue 27). Aligned past its size so
/// it never straddles a page; `tests/e2e/tests/shim_layout.rs` checks both.
#[repr(C, align(2048))]
struct HotDataAlign([std::sync::atomic::AtomicU8; 0]);
#[used]
#[link_section = ".vramtrace.hotdata"]
static HOT_DATA_ALIGN: HotDataAlign = HotDataAlign([]);
