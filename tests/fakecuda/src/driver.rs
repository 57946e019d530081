//! The process-wide driver state behind one lock, initialisation, the per-thread context stack, and fork.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, Once};
use std::time::Instant;

use crate::config;
use crate::types::*;

/// Device `d`'s allocations live in `[DEVICE_VA_BASE + d * DEVICE_VA_SPAN, ... + DEVICE_VA_SPAN)`.
pub const DEVICE_VA_BASE: u64 = 0x6000_0000_0000;
pub const DEVICE_VA_SPAN: u64 = 1 << 40;
/// `cuMemAddressReserve` ranges.
pub const VMM_VA_BASE: u64 = 0x5000_0000_0000;
pub const VMM_VA_SPAN: u64 = 1 << 44;
/// The legacy 32-bit `cuMemAlloc` / `cuMemAllocPitch` (all devices).
pub const LEGACY_VA_BASE: u64 = 0x1000_0000;
pub const LEGACY_VA_END: u64 = 0xF000_0000;
/// Alignment of ordinary allocations.
pub const ALIGN: u64 = 512;

/// Opaque handles (contexts, streams, events, pools, `cuMemCreate` handles): never dereferenced.
const HANDLE_BASE: usize = 0x7a00_0000_0000;
#[derive(Clone, Copy)]
pub enum HandleKind {
    PrimaryCtx = 0,
    Ctx = 1,
    Stream = 2,
    Event = 3,
    Pool = 4,
    DefaultPool = 5,
    MemHandle = 6,
}

pub fn handle_value(kind: HandleKind, n: usize) -> usize {
    HANDLE_BASE + ((kind as usize) << 32) + n * 0x40
}

/// The primary context of device `dev`.
pub fn primary_ctx(dev: usize) -> usize {
    handle_value(HandleKind::PrimaryCtx, dev)
}

/// The default memory pool of device `dev`.
pub fn default_pool(dev: usize) -> usize {
    handle_value(HandleKind::DefaultPool, dev)
}

/// A bump allocator over a virtual address range with per-size free lists: a freed address goes back to
/// the list of its size and is the next one handed out for that size (as the real driver tends to do).
pub struct Region {
    next: u64,
    limit: u64,
    align: u64,
    free: HashMap<u64, Vec<u64>>,
}

impl Region {
    pub fn new(base: u64, end: u64, align: u64) -> Region {
        Region {
            next: base,
            limit: end,
            align,
            free: HashMap::new(),
        }
    }

    /// An address for `size` bytes aligned to `align` (a power of two, at least the region's), and the
    /// slot size to give back later.
    pub fn take(&mut self, size: u64, align: u64) -> Option<(u64, u64)> {
        let align = align.max(self.align);
        let slot = size.max(1).checked_next_multiple_of(self.align)?;
        if let Some(list) = self.free.get_mut(&slot) {
            if let Some(pos) = list.iter().rposition(|a| a % align == 0) {
                return Some((list.remove(pos), slot));
            }
        }
        let addr = self.next.checked_next_multiple_of(align)?;
        let end = addr.checked_add(slot)?;
        if end > self.limit {
            return None;
        }
        self.next = end;
        Some((addr, slot))
    }

    pub fn give(&mut self, addr: u64, slot: u64) {
        self.free.entry(slot).or_default().push(addr);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Device,
    Legacy,
    /// Host memory (an anonymous mapping), usable from the host like real managed memory.
    Managed,
    /// Stream-ordered, from this pool.
    Pool(usize),
}

pub struct Alloc {
    /// Bytes accounted (requested).
    pub size: u64,
    /// Bytes of address space taken.
    pub slot: u64,
    pub device: usize,
    pub kind: Kind,
    /// The context current when it was made (0: none): destroying or resetting that context frees it.
    pub ctx: usize,
    /// Contents, once written (see `FAKECUDA_SHADOW_MAX`).
    pub shadow: Option<Box<[u8]>>,
}

/// A `cuMemCreate` allocation.
pub struct Handle {
    pub size: u64,
    pub device: usize,
    /// Outstanding references (`cuMemCreate` + `cuMemRetainAllocationHandle` - `cuMemRelease`).
    pub refs: u32,
    /// Live mappings of it.
    pub maps: u32,
}

pub struct Mapping {
    pub size: u64,
    pub handle: u64,
}

pub struct Stream {
    pub device: usize,
    pub ctx: usize,
    pub flags: u32,
    pub priority: i32,
}

pub struct Event {
    pub flags: u32,
    pub recorded: Option<Instant>,
}

/// A stream-ordered pool, as the real driver keeps one: `reserved` is the device memory it holds (what the device
/// counts), `used` what its live allocations take; freed memory stays reserved up to `release_threshold` (the
/// real driver gives the excess back at the next synchronisation; here at once), and `cuMemPoolTrimTo` gives
/// back the rest.
#[derive(Default)]
pub struct Pool {
    pub device: usize,
    pub release_threshold: u64,
    pub used: u64,
    pub used_high: u64,
    pub reserved: u64,
    pub reserved_high: u64,
}

impl Pool {
    /// Bytes the pool must add to serve `bytes` more (0: its cache covers them).
    pub fn growth_for(&self, bytes: u64) -> u64 {
        let cached = self.reserved.saturating_sub(self.used);
        bytes.saturating_sub(cached)
    }

    /// Gives back reserved memory down to `max(used, keep)`; returns the bytes given back.
    pub fn shrink_to(&mut self, keep: u64) -> u64 {
        let target = self.reserved.min(keep.max(self.used));
        let freed = self.reserved - target;
        self.reserved = target;
        freed
    }
}

#[derive(Default, Clone, Copy)]
pub struct Primary {
    pub refs: u32,
    pub flags: u32,
}

pub struct Driver {
    pub regions: Vec<Region>,
    pub legacy: Region,
    pub vas: Region,
    pub allocs: BTreeMap<u64, Alloc>,
    pub handles: HashMap<u64, Handle>,
    /// `cuMemAddressReserve` ranges: base -> (size, slot).
    pub reservations: BTreeMap<u64, (u64, u64)>,
    /// `cuMemMap` mappings by address.
    pub mappings: BTreeMap<u64, Mapping>,
    pub streams: HashMap<usize, Stream>,
    pub events: HashMap<usize, Event>,
    pub pools: HashMap<usize, Pool>,
    /// `cuDeviceGetMemPool` per device.
    pub current_pool: Vec<usize>,
    pub primary: Vec<Primary>,
    /// Created (non-primary) contexts: handle -> (device, flags).
    pub contexts: HashMap<usize, (usize, u32)>,
    /// `cuMemHostAlloc` blocks: address -> size.
    pub host: HashMap<usize, usize>,
    next_id: usize,
}

impl Driver {
    fn new() -> Driver {
        let n = config::get().devices;
        let regions = (0..n as u64)
            .map(|d| {
                let base = DEVICE_VA_BASE + d * DEVICE_VA_SPAN;
                Region::new(base, base + DEVICE_VA_SPAN, ALIGN)
            })
            .collect();
        let mut pools = HashMap::new();
        for d in 0..n {
            pools.insert(
                default_pool(d),
                Pool {
                    device: d,
                    ..Pool::default()
                },
            );
        }
        Driver {
            regions,
            legacy: Region::new(LEGACY_VA_BASE, LEGACY_VA_END, ALIGN),
            vas: Region::new(VMM_VA_BASE, VMM_VA_BASE + VMM_VA_SPAN, config::GRANULARITY),
            allocs: BTreeMap::new(),
            handles: HashMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            pools,
            current_pool: (0..n).map(default_pool).collect(),
            primary: vec![Primary::default(); n],
            contexts: HashMap::new(),
            host: HashMap::new(),
            next_id: 1,
        }
    }

    pub fn new_handle(&mut self, kind: HandleKind) -> usize {
        let n = self.next_id;
        self.next_id += 1;
        handle_value(kind, n)
    }

    /// The device of a context handle (primary or created).
    pub fn ctx_device(&self, ctx: usize) -> Option<usize> {
        let n = self.primary.len();
        (0..n)
            .find(|&d| primary_ctx(d) == ctx)
            .or_else(|| self.contexts.get(&ctx).map(|c| c.0))
    }

    /// The device a stream belongs to; `None` for the built-in streams (the current context decides).
    pub fn stream_device(&self, stream: usize) -> Result<Option<usize>, CUresult> {
        if is_builtin_stream(stream) {
            return Ok(None);
        }
        self.streams
            .get(&stream)
            .map(|s| Some(s.device))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

static DRIVER: LazyLock<Mutex<Driver>> = LazyLock::new(|| Mutex::new(Driver::new()));
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static RESET_PENDING: AtomicBool = AtomicBool::new(false);

/// The driver's tables (poison is ignored: no invariant spans a panic).
pub fn lock() -> MutexGuard<'static, Driver> {
    DRIVER.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn set_initialized() {
    reset_after_fork();
    static FORK: Once = Once::new();
    FORK.call_once(|| {
        // SAFETY: registering plain extern "C" handlers.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
    INITIALIZED.store(true, Ordering::Release);
}

pub fn check_init() -> Result<(), CUresult> {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_INITIALIZED)
    }
}

/// Valid device ordinal (after `cuInit`).
pub fn check_device(dev: CUdevice) -> Result<usize, CUresult> {
    check_init()?;
    if dev >= 0 && (dev as usize) < config::get().devices {
        Ok(dev as usize)
    } else {
        Err(CUDA_ERROR_INVALID_DEVICE)
    }
}

thread_local! {
    /// This thread's context stack: (context, device); the top is the current context.
    static CTX_STACK: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
    /// The lock held across `fork` (taken in the prepare handler, dropped on both sides).
    static FORK_GUARD: RefCell<Option<MutexGuard<'static, Driver>>> = const { RefCell::new(None) };
}

pub fn with_stack<R>(f: impl FnOnce(&mut Vec<(usize, usize)>) -> R) -> R {
    CTX_STACK.with(|s| f(&mut s.borrow_mut()))
}

/// The calling thread's current context and its device.
pub fn current() -> Option<(usize, usize)> {
    CTX_STACK.with(|s| s.borrow().last().copied())
}

/// `cuInit` done and a current context: its device.
pub fn current_device() -> Result<usize, CUresult> {
    check_init()?;
    current().map(|c| c.1).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

extern "C" fn fork_prepare() {
    let g = lock();
    FORK_GUARD.with(|f| *f.borrow_mut() = Some(g));
}

extern "C" fn fork_parent() {
    FORK_GUARD.with(|f| f.borrow_mut().take());
}

/// The child starts afresh, as with the real driver: no CUDA until it calls `cuInit` again, no contexts,
/// and none of the parent's allocations (the tables are replaced at that `cuInit`, outside the handler).
extern "C" fn fork_child() {
    FORK_GUARD.with(|f| drop(f.borrow_mut().take()));
    INITIALIZED.store(false, Ordering::Release);
    RESET_PENDING.store(true, Ordering::Release);
    CTX_STACK.with(|s| s.borrow_mut().clear());
    crate::state::after_fork_child();
}

/// In a forked child's `cuInit`: drop the parent's tables.
fn reset_after_fork() {
    if !RESET_PENDING.swap(false, Ordering::AcqRel) {
        return;
    }
    let old = std::mem::replace(&mut *lock(), Driver::new());
    for (addr, a) in old.allocs.iter() {
        if a.kind == Kind::Managed {
            // SAFETY: our own mapping, copied into the child by fork.
            unsafe { libc::munmap(*addr as *mut _, a.slot as usize) };
        }
    }
}

/// At exit (normal or `dlclose`): memory still held goes back to the shared devices.
extern "C" fn on_exit() {
    crate::state::release_process();
}

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = on_exit;
