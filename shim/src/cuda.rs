//! The slice of the CUDA driver API the shim touches: types, result codes, and one struct layout.

use std::ffi::{c_int, c_void};

pub type CUresult = u32;
pub type CUdeviceptr = u64;
pub type CUdevice = c_int;
pub type CUcontext = *mut std::ffi::c_void;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;

pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// `CUmemLocation` (cuda.h): where a `cuMemCreate` allocation lives.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemLocation {
    pub type_: u32,
    pub id: c_int,
}

/// `CUmemAllocationProp` (cuda.h, CUDA 10.2 on; the layout has not changed since). Only `location` is read.
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}
