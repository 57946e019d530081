//! `cuGetProcAddress` / `cuGetProcAddress_v2`: the caller names a function by its base name and the ABI
//! version it was built for; the answer is the newest variant introduced at or before that version (with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, the `_ptsz` variant where there is one). The pointers
//! are the exported functions themselves (with `-Bsymbolic`, the same addresses `dlsym` gives).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::context::*;
use crate::copy::*;
use crate::device::*;
use crate::memory::*;
use crate::pool::*;
use crate::stream::*;
use crate::types::*;
use crate::vmm::*;

struct Variant {
    version: c_int,
    ptsz: bool,
    addr: usize,
}

/// `base name, function, version [, ptsz]` rows; the `_ptsz` rows of a base share its name.
macro_rules! table {
    (@ptsz) => { false };
    (@ptsz ptsz) => { true };
    ($( $base:literal => $f:ident @ $v:expr $(, $ptsz:ident)? ; )*) => {{
        let mut t: HashMap<&'static str, Vec<Variant>> = HashMap::new();
        $(
            t.entry($base).or_default().push(Variant {
                version: $v,
                ptsz: table!(@ptsz $($ptsz)?),
                addr: $f as *const () as usize,
            });
        )*
        t
    }};
}

fn table() -> &'static HashMap<&'static str, Vec<Variant>> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<Variant>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        table! {
            // Memory: the legacy 32-bit functions below 3020, the _v2 ones from 3020 on.
            "cuMemAlloc" => cuMemAlloc @ 0;
            "cuMemAlloc" => cuMemAlloc_v2 @ 3020;
            "cuMemFree" => cuMemFree @ 0;
            "cuMemFree" => cuMemFree_v2 @ 3020;
            "cuMemGetInfo" => cuMemGetInfo @ 0;
            "cuMemGetInfo" => cuMemGetInfo_v2 @ 3020;
            "cuMemAllocPitch" => cuMemAllocPitch @ 0;
            "cuMemAllocPitch" => cuMemAllocPitch_v2 @ 3020;
            "cuMemAllocManaged" => cuMemAllocManaged @ 6000;
            "cuMemAllocAsync" => cuMemAllocAsync @ 11020;
            "cuMemAllocAsync" => cuMemAllocAsync_ptsz @ 11020, ptsz;
            "cuMemFreeAsync" => cuMemFreeAsync @ 11020;
            "cuMemFreeAsync" => cuMemFreeAsync_ptsz @ 11020, ptsz;
            "cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync @ 11020;
            "cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync_ptsz @ 11020, ptsz;
            "cuMemGetAddressRange" => cuMemGetAddressRange_v2 @ 3020;
            "cuPointerGetAttribute" => cuPointerGetAttribute @ 4000;
            "cuMemHostAlloc" => cuMemHostAlloc @ 2020;
            "cuMemAllocHost" => cuMemAllocHost_v2 @ 3020;
            "cuMemFreeHost" => cuMemFreeHost @ 2000;
            "cuMemPrefetchAsync" => cuMemPrefetchAsync @ 8000;
            "cuMemPrefetchAsync" => cuMemPrefetchAsync_ptsz @ 8000, ptsz;
            "cuMemPrefetchAsync" => cuMemPrefetchAsync_v2 @ 12020;
            "cuMemPrefetchAsync" => cuMemPrefetchAsync_v2_ptsz @ 12020, ptsz;
            "cuMemAdvise" => cuMemAdvise @ 8000;
            "cuMemAdvise" => cuMemAdvise_v2 @ 12020;
            // Pools.
            "cuDeviceGetDefaultMemPool" => cuDeviceGetDefaultMemPool @ 11020;
            "cuDeviceGetMemPool" => cuDeviceGetMemPool @ 11020;
            "cuDeviceSetMemPool" => cuDeviceSetMemPool @ 11020;
            "cuMemPoolCreate" => cuMemPoolCreate @ 11020;
            "cuMemPoolDestroy" => cuMemPoolDestroy @ 11020;
            "cuMemPoolTrimTo" => cuMemPoolTrimTo @ 11020;
            "cuMemPoolSetAttribute" => cuMemPoolSetAttribute @ 11020;
            "cuMemPoolGetAttribute" => cuMemPoolGetAttribute @ 11020;
            // Virtual memory management.
            "cuMemCreate" => cuMemCreate @ 10020;
            "cuMemRelease" => cuMemRelease @ 10020;
            "cuMemAddressReserve" => cuMemAddressReserve @ 10020;
            "cuMemAddressFree" => cuMemAddressFree @ 10020;
            "cuMemMap" => cuMemMap @ 10020;
            "cuMemUnmap" => cuMemUnmap @ 10020;
            "cuMemSetAccess" => cuMemSetAccess @ 10020;
            "cuMemRetainAllocationHandle" => cuMemRetainAllocationHandle @ 10020;
            "cuMemGetAllocationGranularity" => cuMemGetAllocationGranularity @ 10020;
            "cuMemGetAllocationPropertiesFromHandle" => cuMemGetAllocationPropertiesFromHandle @ 10020;
            // Copies and memsets.
            "cuMemcpyHtoD" => cuMemcpyHtoD_v2 @ 3020;
            "cuMemcpyDtoH" => cuMemcpyDtoH_v2 @ 3020;
            "cuMemcpyDtoD" => cuMemcpyDtoD_v2 @ 3020;
            "cuMemcpy" => cuMemcpy @ 4000;
            "cuMemcpyHtoDAsync" => cuMemcpyHtoDAsync_v2 @ 3020;
            "cuMemcpyHtoDAsync" => cuMemcpyHtoDAsync_v2_ptsz @ 7000, ptsz;
            "cuMemcpyDtoHAsync" => cuMemcpyDtoHAsync_v2 @ 3020;
            "cuMemcpyDtoHAsync" => cuMemcpyDtoHAsync_v2_ptsz @ 7000, ptsz;
            "cuMemcpyDtoDAsync" => cuMemcpyDtoDAsync_v2 @ 3020;
            "cuMemcpyDtoDAsync" => cuMemcpyDtoDAsync_v2_ptsz @ 7000, ptsz;
            "cuMemcpyAsync" => cuMemcpyAsync @ 4000;
            "cuMemcpyAsync" => cuMemcpyAsync_ptsz @ 7000, ptsz;
            "cuMemcpyPeerAsync" => cuMemcpyPeerAsync @ 4000;
            "cuMemcpyPeerAsync" => cuMemcpyPeerAsync_ptsz @ 7000, ptsz;
            "cuMemsetD8" => cuMemsetD8_v2 @ 3020;
            "cuMemsetD16" => cuMemsetD16_v2 @ 3020;
            "cuMemsetD32" => cuMemsetD32_v2 @ 3020;
            "cuMemsetD8Async" => cuMemsetD8Async @ 3020;
            "cuMemsetD8Async" => cuMemsetD8Async_ptsz @ 7000, ptsz;
            "cuMemsetD16Async" => cuMemsetD16Async @ 3020;
            "cuMemsetD16Async" => cuMemsetD16Async_ptsz @ 7000, ptsz;
            "cuMemsetD32Async" => cuMemsetD32Async @ 3020;
            "cuMemsetD32Async" => cuMemsetD32Async_ptsz @ 7000, ptsz;
            // Init, devices, errors.
            "cuInit" => cuInit @ 2000;
            "cuDriverGetVersion" => cuDriverGetVersion @ 2020;
            "cuDeviceGet" => cuDeviceGet @ 2000;
            "cuDeviceGetCount" => cuDeviceGetCount @ 2000;
            "cuDeviceGetName" => cuDeviceGetName @ 2000;
            "cuDeviceGetUuid" => cuDeviceGetUuid @ 9020;
            "cuDeviceGetUuid" => cuDeviceGetUuid_v2 @ 11040;
            "cuDeviceTotalMem" => cuDeviceTotalMem @ 2000;
            "cuDeviceTotalMem" => cuDeviceTotalMem_v2 @ 3020;
            "cuDeviceGetAttribute" => cuDeviceGetAttribute @ 2000;
            "cuDeviceComputeCapability" => cuDeviceComputeCapability @ 2000;
            "cuDeviceGetPCIBusId" => cuDeviceGetPCIBusId @ 4010;
            "cuDeviceCanAccessPeer" => cuDeviceCanAccessPeer @ 4000;
            "cuDeviceGetP2PAttribute" => cuDeviceGetP2PAttribute @ 8000;
            "cuGetErrorName" => cuGetErrorName @ 6000;
            "cuGetErrorString" => cuGetErrorString @ 6000;
            "cuGetExportTable" => cuGetExportTable @ 3000;
            "cuGetProcAddress" => cuGetProcAddress @ 11030;
            "cuGetProcAddress" => cuGetProcAddress_v2 @ 12000;
            // Contexts.
            "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain @ 7000;
            "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease @ 7000;
            "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease_v2 @ 11000;
            "cuDevicePrimaryCtxGetState" => cuDevicePrimaryCtxGetState @ 7000;
            "cuDevicePrimaryCtxSetFlags" => cuDevicePrimaryCtxSetFlags @ 7000;
            "cuDevicePrimaryCtxSetFlags" => cuDevicePrimaryCtxSetFlags_v2 @ 11000;
            "cuDevicePrimaryCtxReset" => cuDevicePrimaryCtxReset @ 7000;
            "cuDevicePrimaryCtxReset" => cuDevicePrimaryCtxReset_v2 @ 11000;
            "cuCtxCreate" => cuCtxCreate @ 2000;
            "cuCtxCreate" => cuCtxCreate_v2 @ 3020;
            "cuCtxCreate" => cuCtxCreate_v3 @ 11040;
            "cuCtxCreate" => cuCtxCreate_v4 @ 12050;
            "cuCtxDestroy" => cuCtxDestroy @ 2000;
            "cuCtxDestroy" => cuCtxDestroy_v2 @ 4000;
            "cuCtxPushCurrent" => cuCtxPushCurrent @ 2000;
            "cuCtxPushCurrent" => cuCtxPushCurrent_v2 @ 4000;
            "cuCtxPopCurrent" => cuCtxPopCurrent @ 2000;
            "cuCtxPopCurrent" => cuCtxPopCurrent_v2 @ 4000;
            "cuCtxSetCurrent" => cuCtxSetCurrent @ 4000;
            "cuCtxGetCurrent" => cuCtxGetCurrent @ 4000;
            "cuCtxGetDevice" => cuCtxGetDevice @ 2000;
            "cuCtxSynchronize" => cuCtxSynchronize @ 2000;
            "cuCtxGetFlags" => cuCtxGetFlags @ 7000;
            "cuCtxSetFlags" => cuCtxSetFlags @ 12010;
            "cuCtxGetApiVersion" => cuCtxGetApiVersion @ 3020;
            "cuCtxGetId" => cuCtxGetId @ 12000;
            "cuCtxGetStreamPriorityRange" => cuCtxGetStreamPriorityRange @ 5050;
            "cuCtxGetLimit" => cuCtxGetLimit @ 3010;
            "cuCtxSetLimit" => cuCtxSetLimit @ 3010;
            "cuCtxGetCacheConfig" => cuCtxGetCacheConfig @ 3020;
            "cuCtxSetCacheConfig" => cuCtxSetCacheConfig @ 3020;
            // Streams and events.
            "cuStreamCreate" => cuStreamCreate @ 2000;
            "cuStreamCreateWithPriority" => cuStreamCreateWithPriority @ 5050;
            "cuStreamDestroy" => cuStreamDestroy @ 2000;
            "cuStreamDestroy" => cuStreamDestroy_v2 @ 4000;
            "cuStreamSynchronize" => cuStreamSynchronize @ 2000;
            "cuStreamSynchronize" => cuStreamSynchronize_ptsz @ 7000, ptsz;
            "cuStreamQuery" => cuStreamQuery @ 2000;
            "cuStreamQuery" => cuStreamQuery_ptsz @ 7000, ptsz;
            "cuStreamWaitEvent" => cuStreamWaitEvent @ 3020;
            "cuStreamWaitEvent" => cuStreamWaitEvent_ptsz @ 7000, ptsz;
            "cuStreamGetFlags" => cuStreamGetFlags @ 5050;
            "cuStreamGetFlags" => cuStreamGetFlags_ptsz @ 7000, ptsz;
            "cuStreamGetPriority" => cuStreamGetPriority @ 5050;
            "cuStreamGetPriority" => cuStreamGetPriority_ptsz @ 7000, ptsz;
            "cuStreamGetCtx" => cuStreamGetCtx @ 9020;
            "cuStreamGetCtx" => cuStreamGetCtx_ptsz @ 9020, ptsz;
            "cuLaunchHostFunc" => cuLaunchHostFunc @ 10000;
            "cuLaunchHostFunc" => cuLaunchHostFunc_ptsz @ 10000, ptsz;
            "cuEventCreate" => cuEventCreate @ 2000;
            "cuEventRecord" => cuEventRecord @ 2000;
            "cuEventRecord" => cuEventRecord_ptsz @ 7000, ptsz;
            "cuEventRecordWithFlags" => cuEventRecordWithFlags @ 11010;
            "cuEventRecordWithFlags" => cuEventRecordWithFlags_ptsz @ 11010, ptsz;
            "cuEventSynchronize" => cuEventSynchronize @ 2000;
            "cuEventQuery" => cuEventQuery @ 2000;
            "cuEventDestroy" => cuEventDestroy @ 2000;
            "cuEventDestroy" => cuEventDestroy_v2 @ 4000;
            "cuEventElapsedTime" => cuEventElapsedTime @ 2000;
            "cuEventElapsedTime" => cuEventElapsedTime_v2 @ 12080;
        }
    })
}

/// The function for `symbol` at ABI `version`, or the query result saying why there is none.
fn lookup(symbol: &[u8], version: c_int, flags: u64) -> Result<usize, c_uint> {
    let name = std::str::from_utf8(symbol).map_err(|_| CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    let variants = table()
        .get(name)
        .ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    let want_ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let newest = |ptsz: bool| {
        variants
            .iter()
            .filter(|v| v.ptsz == ptsz && v.version <= version)
            .max_by_key(|v| v.version)
            .map(|v| v.addr)
    };
    let found = if want_ptsz {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    };
    found.ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_uint,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated name per the API.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let (p, st, code) = match lookup(name, version, flags) {
        Ok(addr) => (
            addr as *mut c_void,
            CU_GET_PROC_ADDRESS_SUCCESS,
            CUDA_SUCCESS,
        ),
        Err(st) => (std::ptr::null_mut(), st, CUDA_ERROR_NOT_FOUND),
    };
    let _ = crate::put(pfn, p);
    crate::put_opt(status, st);
    code
}

export! {
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut());
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_uint) => get_proc_address(symbol, pfn, version, flags, status);
}
