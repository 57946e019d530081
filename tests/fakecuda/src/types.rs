//! The driver ABI: types, structs and codes exactly as CUDA 12.8's `cuda.h` declares them (checked against
//! cudarc 0.19.10's `driver/sys` bindings for `cuda-12080`).

use std::ffi::{c_int, c_uint, c_ushort, c_void};

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
/// The 32-bit device pointer of the legacy (pre-3.2) entry points (`cuMemAlloc`, `cuMemFree`, ...).
pub type CUdeviceptr_v1 = c_uint;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUhostFn = Option<unsafe extern "C" fn(*mut c_void)>;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CUmemLocation` (8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes: the pointer sits at offset 16).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requestedHandleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    /// compressionType, gpuDirectRDMACapable, usage (u16), reserved[4].
    pub allocFlags: [u8; 8],
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

/// `CUmemPoolProps` as of CUDA 12.6..13.1 (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub allocType: c_uint,
    pub handleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: c_ushort,
    pub reserved: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<CUmemAccessDesc>() == 12);
const _: () = assert!(std::mem::size_of::<CUmemPoolProps>() == 88);

pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_uint = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_uint = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_uint = 4;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: c_uint = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_uint = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
pub const CU_MEM_ATTACH_HOST: c_uint = 2;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_uint = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_uint = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_uint = 2;
/// `CU_DEVICE_ATTRIBUTE_MAX`: attributes are 1..MAX.
pub const CU_DEVICE_ATTRIBUTE_MAX: c_int = 144;

/// The special stream handles: `0` (the legacy default stream), `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`.
pub fn is_builtin_stream(s: usize) -> bool {
    s <= 2
}

/// `(code, name, description)` for `cuGetErrorName` / `cuGetErrorString`.
pub const ERRORS: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
    (
        34,
        "CUDA_ERROR_STUB_LIBRARY\0",
        "CUDA driver is a stub library\0",
    ),
    (
        46,
        "CUDA_ERROR_DEVICE_UNAVAILABLE\0",
        "CUDA-capable device(s) is/are busy or unavailable\0",
    ),
    (
        100,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        200,
        "CUDA_ERROR_INVALID_IMAGE\0",
        "device kernel image is invalid\0",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        202,
        "CUDA_ERROR_CONTEXT_ALREADY_CURRENT\0",
        "context already current\0",
    ),
    (
        205,
        "CUDA_ERROR_MAP_FAILED\0",
        "mapping of buffer object failed\0",
    ),
    (
        206,
        "CUDA_ERROR_UNMAP_FAILED\0",
        "unmapping of buffer object failed\0",
    ),
    (
        208,
        "CUDA_ERROR_ALREADY_MAPPED\0",
        "resource already mapped\0",
    ),
    (211, "CUDA_ERROR_NOT_MAPPED\0", "resource not mapped\0"),
    (
        215,
        "CUDA_ERROR_UNSUPPORTED_LIMIT\0",
        "limit is not supported on this architecture\0",
    ),
    (
        216,
        "CUDA_ERROR_CONTEXT_ALREADY_IN_USE\0",
        "exclusive-thread device already in use by a different thread\0",
    ),
    (
        217,
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED\0",
        "peer access is not supported between these two devices\0",
    ),
    (
        300,
        "CUDA_ERROR_INVALID_SOURCE\0",
        "device kernel image is invalid\0",
    ),
    (301, "CUDA_ERROR_FILE_NOT_FOUND\0", "file not found\0"),
    (
        304,
        "CUDA_ERROR_OPERATING_SYSTEM\0",
        "OS call failed or operation not supported on this OS\0",
    ),
    (
        400,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE\0",
        "the operation cannot be performed in the present state\0",
    ),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS\0",
        "an illegal memory access was encountered\0",
    ),
    (
        701,
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0",
        "too many resources requested for launch\0",
    ),
    (
        702,
        "CUDA_ERROR_LAUNCH_TIMEOUT\0",
        "the launch timed out and was terminated\0",
    ),
    (
        704,
        "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED\0",
        "peer access is already enabled\0",
    ),
    (
        705,
        "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED\0",
        "peer access has not been enabled\0",
    ),
    (
        708,
        "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE\0",
        "cannot set while device is active in this process\0",
    ),
    (
        709,
        "CUDA_ERROR_CONTEXT_IS_DESTROYED\0",
        "context is destroyed\0",
    ),
    (710, "CUDA_ERROR_ASSERT\0", "device-side assert triggered\0"),
    (
        719,
        "CUDA_ERROR_LAUNCH_FAILED\0",
        "unspecified launch failure\0",
    ),
    (
        800,
        "CUDA_ERROR_NOT_PERMITTED\0",
        "operation not permitted\0",
    ),
    (
        801,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        802,
        "CUDA_ERROR_SYSTEM_NOT_READY\0",
        "system not yet initialized\0",
    ),
    (
        803,
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH\0",
        "system has unsupported display driver / cuda driver combination\0",
    ),
    (
        900,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
        "operation not permitted when stream is capturing\0",
    ),
    (909, "CUDA_ERROR_TIMEOUT\0", "wait operation timed out\0"),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];
