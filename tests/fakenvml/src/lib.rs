//! A simulated `libnvidia-ml.so.1`: the devices of the simulated driver (tests/fakecuda) as NVML shows them.
//!
//! Environment, read once per process (the first four as the simulated driver reads them):
//! - `FAKECUDA_DEVICES`: number of devices (default 2, at most 16).
//! - `FAKECUDA_DEVICE_BYTES`: size of each device (default 16 GiB; `K`/`M`/`G`/`T` suffixes, a comma-separated
//!   list gives each device its own size, the last one repeats).
//! - `FAKECUDA_STATE`: the simulated driver's shared device accounting; each device's bytes in use are read
//!   from it at every call. Without it nothing is in use (the driver's process-local counts are not visible).
//! - `FAKENVML_RESERVED`: bytes each device keeps for the driver (default 0): v1's `used` includes them, v2
//!   reports them apart as `reserved`.
//! - `FAKENVML_CONTEXT_BYTES`: bytes each process listed by `nvmlDeviceGetComputeRunningProcesses` holds beyond
//!   its allocations (default 0): the real driver counts a process's context, its modules and libraries there.
//! - `FAKENVML_NO_FIGURE=1`: every process listed has no figure (`NVML_VALUE_NOT_AVAILABLE`), as under MIG or
//!   for another user's process read without the right.
//! - `FAKENVML_REVERSE=1`: NVML index `i` is CUDA device `n - 1 - i` (NVML enumerates in PCI order, CUDA in
//!   its own), so that only a mapping by UUID finds the right device.
//!
//! UUIDs: `nvmlDeviceGetUUID` gives "GPU-" and the 16 bytes the simulated driver's `cuDeviceGetUuid_v2` gives
//! for the same device, as 8-4-4-4-12 hex digits, like the real NVML.
//!
//! Functions: `nvmlInit_v2`, `nvmlInit`, `nvmlInitWithFlags`, `nvmlShutdown`, `nvmlErrorString`,
//! `nvmlDeviceGetCount[_v2]`, `nvmlDeviceGetHandleByIndex[_v2]`, `nvmlDeviceGetIndex`, `nvmlDeviceGetUUID`,
//! `nvmlDeviceGetMemoryInfo`, `nvmlDeviceGetMemoryInfo_v2` (which checks the struct's version like NVML),
//! `nvmlDeviceGetComputeRunningProcesses[_v2|_v3]` (each process of the shared state holding bytes on the device,
//! from the driver's per-process slots: what `nvidia-smi --query-compute-apps` reads).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

type NvmlReturn = c_uint;
type NvmlDevice = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;

const MAX_DEVICES: usize = 16;

#[repr(C)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const NVML_MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

struct Config {
    devices: usize,
    device_bytes: Vec<u64>,
    /// Opened at each call: the driver creates the file at its first allocation, maybe after `nvmlInit`.
    state: Option<std::path::PathBuf>,
    reserved: u64,
    reverse: bool,
    context_bytes: u64,
    no_figure: bool,
}

impl Config {
    fn device_bytes(&self, dev: usize) -> u64 {
        self.device_bytes[dev.min(self.device_bytes.len() - 1)]
    }

    /// The CUDA device behind NVML index `i`.
    fn cuda_of(&self, i: usize) -> usize {
        if self.reverse {
            self.devices - 1 - i
        } else {
            i
        }
    }

    /// Bytes of CUDA device `dev` in use, from the simulated driver's shared state (layout in
    /// tests/fakecuda/src/state.rs: magic at 0, `used[d]` at 64 + 16 d).
    fn in_use(&self, dev: usize) -> u64 {
        let Some(f) = self
            .state
            .as_ref()
            .and_then(|p| std::fs::File::open(p).ok())
        else {
            return 0;
        };
        let word = |off: u64| {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, off)
                .map_or(0, |_| u64::from_le_bytes(b))
        };
        if word(0) != u64::from_le_bytes(*b"FAKECUDA") {
            return 0;
        }
        word(64 + 16 * dev as u64)
    }

    /// (pid, bytes) of each process of the shared state holding bytes of CUDA device `dev` (slots at
    /// 320 + 136 s: the pid, then 16 words of bytes per device). Processes that are gone are not listed.
    fn processes(&self, dev: usize) -> Vec<(u32, u64)> {
        let Some(f) = self
            .state
            .as_ref()
            .and_then(|p| std::fs::File::open(p).ok())
        else {
            return Vec::new();
        };
        let mut all = vec![0u8; 320 + 136 * 256];
        if f.read_exact_at(&mut all, 0).is_err() || all[..8] != *b"FAKECUDA" {
            return Vec::new();
        }
        let word = |off: usize| u64::from_le_bytes(all[off..off + 8].try_into().expect("8 bytes"));
        (0..256)
            .filter_map(|s| {
                let base = 320 + 136 * s;
                let pid = word(base) as u32;
                let bytes = word(base + 8 + 8 * dev);
                let alive = pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists();
                let figure = if self.no_figure {
                    u64::MAX // NVML_VALUE_NOT_AVAILABLE
                } else {
                    bytes + self.context_bytes
                };
                (alive && bytes > 0).then_some((pid, figure))
            })
            .collect()
    }
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
        let devices = var("FAKECUDA_DEVICES")
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(2)
            .min(MAX_DEVICES);
        let device_bytes = var("FAKECUDA_DEVICE_BYTES")
            .and_then(|s| s.split(',').map(parse_bytes).collect::<Option<Vec<u64>>>())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec![16 << 30]);
        Config {
            devices,
            device_bytes,
            state: var("FAKECUDA_STATE").map(Into::into),
            reserved: var("FAKENVML_RESERVED")
                .and_then(|s| parse_bytes(&s))
                .unwrap_or(0),
            reverse: var("FAKENVML_REVERSE").is_some_and(|s| s == "1"),
            context_bytes: var("FAKENVML_CONTEXT_BYTES")
                .and_then(|s| parse_bytes(&s))
                .unwrap_or(0),
            no_figure: var("FAKENVML_NO_FIGURE").is_some_and(|s| s == "1"),
        }
    })
}

/// `123`, `64M`, `16GiB` (whole numbers, binary suffixes), as the simulated driver reads them.
fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// The simulated driver's UUID of device `dev` (tests/fakecuda/src/device.rs derives it the same way).
fn uuid(dev: usize) -> [u8; 16] {
    let mut u = *b"fakecuda-gpu-\0\0\0";
    u[13] = b'0' + (dev / 10) as u8;
    u[14] = b'0' + (dev % 10) as u8;
    u
}

fn uuid_text(dev: usize) -> String {
    let h: String = uuid(dev).iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

// ---- state ----------------------------------------------------------------------------------------------

static INIT: AtomicUsize = AtomicUsize::new(0);

/// One per CUDA device; a handle is the address of its device's entry.
static DEVICES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

fn handle_of(dev: usize) -> NvmlDevice {
    (&DEVICES[dev] as *const u8).cast_mut().cast()
}

/// The CUDA device of a handle, checked.
fn device_of(h: NvmlDevice) -> Result<usize, NvmlReturn> {
    if INIT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    let base = DEVICES.as_ptr() as usize;
    let p = h as usize;
    if p < base || p >= base + config().devices {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(p - base)
}

fn rc(r: Result<(), NvmlReturn>) -> NvmlReturn {
    r.err().unwrap_or(NVML_SUCCESS)
}

unsafe fn put<T>(p: *mut T, v: T) -> Result<(), NvmlReturn> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    p.write(v);
    Ok(())
}

// ---- the API --------------------------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    config();
    INIT.fetch_add(1, Ordering::AcqRel);
    NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    match INIT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) {
        Ok(_) => NVML_SUCCESS,
        Err(_) => NVML_ERROR_UNINITIALIZED,
    }
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    if INIT.load(Ordering::Acquire) == 0 {
        return NVML_ERROR_UNINITIALIZED;
    }
    rc(put(count, config().devices as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    nvmlDeviceGetCount_v2(count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    if INIT.load(Ordering::Acquire) == 0 {
        return NVML_ERROR_UNINITIALIZED;
    }
    let c = config();
    if index as usize >= c.devices {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    rc(put(device, handle_of(c.cuda_of(index as usize))))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    nvmlDeviceGetHandleByIndex_v2(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    rc(device_of(device).and_then(|d| {
        // cuda_of is its own inverse.
        put(index, config().cuda_of(d) as c_uint)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    rc(device_of(device).and_then(|d| {
        let t = uuid_text(d);
        if uuid.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if (length as usize) < t.len() + 1 {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        std::ptr::copy_nonoverlapping(t.as_ptr(), uuid.cast::<u8>(), t.len());
        *uuid.add(t.len()) = 0;
        Ok(())
    }))
}

/// (total, reserved, used apart from the reservation, free) of a device.
fn figures(d: usize) -> (u64, u64, u64, u64) {
    let c = config();
    let total = c.device_bytes(d);
    let reserved = c.reserved.min(total);
    let used = c.in_use(d).min(total - reserved);
    (total, reserved, used, total - reserved - used)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    rc(device_of(device).and_then(|d| {
        let (total, reserved, used, free) = figures(d);
        put(
            memory,
            NvmlMemory {
                total,
                free,
                used: reserved + used,
            },
        )
    }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    rc(device_of(device).and_then(|d| {
        if memory.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if (*memory).version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used, free) = figures(d);
        put(
            memory,
            NvmlMemoryV2 {
                version: NVML_MEMORY_V2,
                total,
                reserved,
                free,
                used,
            },
        )
    }))
}

/// `nvmlProcessInfo_t` (v2 and v3): pid, bytes, and the MIG instance ids (0xFFFFFFFF: not on a MIG instance).
#[repr(C)]
pub struct NvmlProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t`: pid and bytes.
#[repr(C)]
pub struct NvmlProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// The listing as NVML does it: with room for fewer than there are, `INSUFFICIENT_SIZE` and the count needed.
unsafe fn running<T>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> NvmlReturn {
    rc(device_of(device).and_then(|d| {
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let list = config().processes(d);
        let room = *count as usize;
        *count = list.len() as c_uint;
        if room < list.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if !list.is_empty() && infos.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (k, (pid, bytes)) in list.into_iter().enumerate() {
            infos.add(k).write(make(pid, bytes));
        }
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    running(device, count, infos, |pid, bytes| NvmlProcessInfo {
        pid,
        used_gpu_memory: bytes,
        gpu_instance_id: u32::MAX,
        compute_instance_id: u32::MAX,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfoV1,
) -> NvmlReturn {
    running(device, count, infos, |pid, bytes| NvmlProcessInfoV1 {
        pid,
        used_gpu_memory: bytes,
    })
}
