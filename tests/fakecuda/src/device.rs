//! Initialisation, devices and their attributes (an H100-like device of compute capability 9.0), error
//! strings, and `cuGetExportTable`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::{check_device, set_initialized};
use crate::types::*;
use crate::{config, put, rc};

fn init(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if config::get().devices == 0 {
        return CUDA_ERROR_NO_DEVICE;
    }
    set_initialized();
    CUDA_SUCCESS
}

/// Writes a NUL-terminated string into a caller buffer of `len` bytes (truncating).
fn put_str(dst: *mut c_char, len: c_int, s: &str) -> Result<(), CUresult> {
    if dst.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst.cast::<u8>(), n);
        *dst.add(n) = 0;
    }
    Ok(())
}

fn uuid(dev: usize) -> [u8; 16] {
    let mut u = *b"fakecuda-gpu-\0\0\0";
    u[13] = b'0' + (dev / 10) as u8;
    u[14] = b'0' + (dev % 10) as u8;
    u
}

fn attribute(attr: c_int, dev: usize) -> Result<c_int, CUresult> {
    let v = match attr {
        1 => 1024,                 // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,             // MAX_BLOCK_DIM_X / Y
        4 => 64,                   // MAX_BLOCK_DIM_Z
        5 => i32::MAX,             // MAX_GRID_DIM_X
        6 | 7 => 65535,            // MAX_GRID_DIM_Y / Z
        8 => 49152,                // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                // TOTAL_CONSTANT_MEMORY
        10 => 32,                  // WARP_SIZE
        11 => i32::MAX,            // MAX_PITCH
        12 => 65536,               // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,           // CLOCK_RATE (kHz)
        14 => 512,                 // TEXTURE_ALIGNMENT
        15 => 1,                   // GPU_OVERLAP
        16 => 132,                 // MULTIPROCESSOR_COUNT
        17 | 18 => 0,              // KERNEL_EXEC_TIMEOUT, INTEGRATED
        19 => 1,                   // CAN_MAP_HOST_MEMORY
        20 => 0,                   // COMPUTE_MODE (default)
        30 => 512,                 // SURFACE_ALIGNMENT
        31 | 32 => 1,              // CONCURRENT_KERNELS, ECC_ENABLED
        33 => dev as c_int + 0x18, // PCI_BUS_ID
        34 | 35 => 0,              // PCI_DEVICE_ID, TCC_DRIVER
        36 => 2_619_000,           // MEMORY_CLOCK_RATE
        37 => 5120,                // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,            // L2_CACHE_SIZE
        39 => 2048,                // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                   // ASYNC_ENGINE_COUNT
        41 => 1,                   // UNIFIED_ADDRESSING
        50 => 0,                   // PCI_DOMAIN_ID
        51 => 32,                  // TEXTURE_PITCH_ALIGNMENT
        75 => 9,                   // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                   // COMPUTE_CAPABILITY_MINOR
        78..=80 => 1,              // STREAM_PRIORITIES, GLOBAL_L1, LOCAL_L1
        81 => 233_472,             // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,               // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                   // MANAGED_MEMORY
        84 | 85 => 0,              // MULTI_GPU_BOARD(_GROUP_ID)
        86 | 88 => 0,              // HOST_NATIVE_ATOMIC, PAGEABLE_MEMORY_ACCESS
        87 => 2,                   // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        89..=96 => 1,              // CONCURRENT_MANAGED_ACCESS .. COOPERATIVE_MULTI_DEVICE_LAUNCH
        97 => 232_448,             // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 | 99 => 1,              // CAN_FLUSH_REMOTE_WRITES, HOST_REGISTER_SUPPORTED
        100 | 101 => 0, // PAGEABLE..USES_HOST_PAGE_TABLES, DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
        102 | 103 => 1, // VIRTUAL_ADDRESS_MANAGEMENT, HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        104 | 105 => 0, // WIN32 handle types
        106 => 32,      // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => 1,       // GENERIC_COMPRESSION_SUPPORTED
        108 => 50 << 20, // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 128 << 20, // MAX_ACCESS_POLICY_WINDOW_SIZE
        110 => 1,       // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
        111 => 1024,    // RESERVED_SHARED_MEMORY_PER_BLOCK
        112..=116 => 1, // SPARSE_ARRAY .. MEMORY_POOLS_SUPPORTED (115) .. GPU_DIRECT_RDMA
        117 | 118 => 1, // GPU_DIRECT_RDMA flush options / ordering
        119 => 1,       // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX fd)
        120..=129 => 1, // CLUSTER_LAUNCH .. UNIFIED_FUNCTION_POINTERS
        130 => 0,       // NUMA_CONFIG (none)
        131 | 134 => -1, // NUMA_ID, HOST_NUMA_ID
        132 | 133 | 135 => 0, // MULTICAST, MPS_ENABLED, D3D12_CIG
        a if (1..CU_DEVICE_ATTRIBUTE_MAX).contains(&a) => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    Ok(v)
}

fn total_mem(dev: CUdevice) -> Result<u64, CUresult> {
    let d = check_device(dev)?;
    Ok(config::get().device_bytes(d))
}

fn error_entry(e: CUresult) -> Option<&'static (CUresult, &'static str, &'static str)> {
    ERRORS.iter().find(|x| x.0 == e)
}

fn error_text(e: CUresult, p: *mut *const c_char, name: bool) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match error_entry(e) {
        Some(&(_, n, s)) => rc(put(p, if name { n } else { s }.as_ptr().cast())),
        None => {
            let _ = put(p, std::ptr::null());
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

/// A question about the devices, logged with its answer (`aux`) where `FAKECUDA_LOG_QUERIES` asks.
fn query(name: &str, answer: Result<u64, CUresult>) -> Result<u64, CUresult> {
    if config::get().log_queries {
        match answer {
            Ok(v) => crate::log::call(name, 0, 0, 0, v),
            Err(e) => crate::log::call(name, e, 0, 0, u32::MAX as u64),
        }
    }
    answer
}

export! {
    fn cuInit(flags: c_uint) => init(flags);
    fn cuDriverGetVersion(version: *mut c_int) => rc(put(version, 12080));
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) => rc(check_device(ordinal).and_then(|_| put(device, ordinal)));
    fn cuDeviceGetCount(count: *mut c_int) => rc(query("cuDeviceGetCount", crate::driver::check_init().map(|_| config::get().devices as u64)).and_then(|n| put(count, n as c_int)));
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) => rc(check_device(dev).and_then(|d| put_str(name, len, &format!("NVIDIA H100 80GB HBM3 (fakecuda {d})"))));
    fn cuDeviceGetUuid(uuid_out: *mut [u8; 16], dev: CUdevice) => rc(check_device(dev).and_then(|d| put(uuid_out, uuid(d))));
    fn cuDeviceGetUuid_v2(uuid_out: *mut [u8; 16], dev: CUdevice) => rc(query("cuDeviceGetUuid_v2", check_device(dev).map(|d| d as u64)).and_then(|d| put(uuid_out, uuid(d as usize))));
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => rc(total_mem(dev).and_then(|b| put(bytes, b as usize)));
    /// Legacy (pre-3.2): `unsigned int` size, saturated.
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) => rc(total_mem(dev).and_then(|b| put(bytes, b.min(c_uint::MAX as u64) as c_uint)));
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) => rc(check_device(dev).and_then(|d| attribute(attrib, d)).and_then(|v| put(pi, v)));
    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) => rc(check_device(dev).and_then(|_| { put(major, 9)?; put(minor, 0) }));
    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) => rc(check_device(dev).and_then(|d| put_str(bus_id, len, &format!("00000000:{:02X}:00.0", d + 0x18))));
    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) => rc(check_device(dev).and_then(|_| check_device(peer)).and_then(|_| put(can, (dev != peer) as c_int)));
    fn cuDeviceGetP2PAttribute(value: *mut c_int, attrib: c_int, src: CUdevice, dst: CUdevice) => rc(check_device(src).and_then(|_| check_device(dst)).and_then(|_| put(value, if attrib == 1 { 0 } else { 1 })));
    fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) => error_text(error, pstr, true);
    fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) => error_text(error, pstr, false);
    /// Private tables of the real driver: not provided, and nothing is touched or initialised.
    fn cuGetExportTable(_table: *mut *const c_void, _id: *const c_void) => CUDA_ERROR_NOT_SUPPORTED;
}
