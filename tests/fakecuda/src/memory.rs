//! The classic and stream-ordered allocation entry points, `cuMemGetInfo`, pointer queries, pinned host
//! memory. Every allocation / free / info call is logged (see `log`).
//!
//! Stream-ordered frees give the memory back at once (the pools keep nothing cached).

use std::ffi::{c_int, c_uint, c_void};

use crate::alloc;
use crate::driver::{check_init, current_device, lock, primary_ctx, Kind};
use crate::log;
use crate::types::*;
use crate::{config, put, rc};

/// Logs an allocation call and returns its code.
fn logged_alloc(name: &str, r: Result<u64, CUresult>, size: u64, aux: u64) -> CUresult {
    let (code, addr) = match r {
        Ok(a) => (CUDA_SUCCESS, a),
        Err(e) => (e, 0),
    };
    log::call(name, code, addr, size, aux);
    code
}

/// Logs a free call and returns its code.
fn logged_free(name: &str, ptr: u64, r: Result<u64, CUresult>, aux: u64) -> CUresult {
    let (code, size) = match r {
        Ok(s) => (CUDA_SUCCESS, s),
        Err(e) => (e, 0),
    };
    log::call(name, code, ptr, size, aux);
    code
}

fn mem_alloc(bytes: u64, kind: Kind) -> Result<u64, CUresult> {
    check_init()?;
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = current_device()?;
    alloc::allocate(&mut lock(), dev, bytes, kind)
}

fn alloc_v2(name: &str, dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    let r = if dptr.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        mem_alloc(bytes as u64, Kind::Device).and_then(|a| put(dptr, a).map(|_| a))
    };
    logged_alloc(name, r, bytes as u64, 0)
}

fn alloc_v1(dptr: *mut CUdeviceptr_v1, bytes: c_uint) -> CUresult {
    let r = if dptr.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        mem_alloc(bytes as u64, Kind::Legacy).and_then(|a| put(dptr, a as c_uint).map(|_| a))
    };
    logged_alloc("cuMemAlloc", r, bytes as u64, 0)
}

/// Pitch = width rounded up to the row alignment (`FAKECUDA_PITCH_ALIGN`, 512 by default); bytes = pitch x
/// height. Element size 4, 8 or 16.
fn pitch_of(width: u64, height: u64, elem: c_uint) -> Result<(u64, u64), CUresult> {
    if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = width
        .checked_next_multiple_of(crate::config::get().pitch_align)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let bytes = pitch.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok((pitch, bytes))
}

fn alloc_pitch_v2(
    dptr: *mut CUdeviceptr,
    ppitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let shape = pitch_of(width as u64, height as u64, elem);
    let (pitch, bytes) = shape.unwrap_or((0, 0));
    let r = (|| {
        if dptr.is_null() || ppitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_init()?;
        shape?;
        let a = mem_alloc(bytes, Kind::Device)?;
        put(dptr, a)?;
        put(ppitch, pitch as usize)?;
        Ok(a)
    })();
    logged_alloc("cuMemAllocPitch_v2", r, bytes, pitch)
}

fn alloc_pitch_v1(
    dptr: *mut CUdeviceptr_v1,
    ppitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    let shape = pitch_of(width as u64, height as u64, elem);
    let (pitch, bytes) = shape.unwrap_or((0, 0));
    let r = (|| {
        if dptr.is_null() || ppitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_init()?;
        shape?;
        if bytes > c_uint::MAX as u64 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let a = mem_alloc(bytes, Kind::Legacy)?;
        put(dptr, a as c_uint)?;
        put(ppitch, pitch as c_uint)?;
        Ok(a)
    })();
    logged_alloc("cuMemAllocPitch", r, bytes, pitch)
}

fn alloc_managed(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult {
    let r = if dptr.is_null() || !matches!(flags, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST) {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        mem_alloc(bytes as u64, Kind::Managed).and_then(|a| put(dptr, a).map(|_| a))
    };
    logged_alloc("cuMemAllocManaged", r, bytes as u64, flags as u64)
}

fn free(name: &str, ptr: u64) -> CUresult {
    let r = check_init().and_then(|_| {
        if ptr == 0 {
            Ok(0)
        } else {
            alloc::free(&mut lock(), ptr)
        }
    });
    logged_free(name, ptr, r, 0)
}

/// `cuMemAllocAsync` (from the device's current pool) and `cuMemAllocFromPoolAsync`. The device is the
/// pool's, else the stream's, else the current context's. Zero bytes: success and a null pointer.
fn alloc_async(
    name: &str,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
) -> CUresult {
    let r = (|| {
        check_init()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let cur = current_device()?;
        let mut g = lock();
        let sdev = g.stream_device(stream as usize)?;
        let (dev, pool) = match pool {
            Some(p) => {
                let p = p as usize;
                (g.pools.get(&p).ok_or(CUDA_ERROR_INVALID_VALUE)?.device, p)
            }
            None => {
                let dev = sdev.unwrap_or(cur);
                (dev, g.current_pool[dev])
            }
        };
        let a = if bytes == 0 {
            0
        } else {
            alloc::allocate(&mut g, dev, bytes as u64, Kind::Pool(pool))?
        };
        drop(g);
        put(dptr, a)?;
        Ok(a)
    })();
    logged_alloc(name, r, bytes as u64, stream as u64)
}

fn free_async(name: &str, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let r = (|| {
        check_init()?;
        let mut g = lock();
        g.stream_device(stream as usize)?;
        if ptr == 0 {
            return Ok(0);
        }
        alloc::free(&mut g, ptr)
    })();
    logged_free(name, ptr, r, stream as u64)
}

/// (free, total, device) of the current context's device: free = size - used, saturating.
fn info() -> Result<(u64, u64, usize), CUresult> {
    let dev = current_device()?;
    let total = config::get().device_bytes(dev);
    Ok((total.saturating_sub(crate::state::used(dev)), total, dev))
}

fn logged_info(name: &str, r: Result<(u64, u64, usize), CUresult>) -> CUresult {
    let (code, (free, total, dev)) = match r {
        Ok(v) => (CUDA_SUCCESS, v),
        Err(e) => (e, (0, 0, 0)),
    };
    log::call(name, code, total, free, dev as u64);
    code
}

fn get_info_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let r = info().and_then(|v| {
        put(free, v.0 as usize)?;
        put(total, v.1 as usize)?;
        Ok(v)
    });
    logged_info("cuMemGetInfo_v2", r)
}

/// Legacy: `unsigned int` sizes, saturated.
fn get_info_v1(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let sat = |v: u64| v.min(c_uint::MAX as u64) as c_uint;
    let r = info().and_then(|v| {
        put(free, sat(v.0))?;
        put(total, sat(v.1))?;
        Ok(v)
    });
    logged_info("cuMemGetInfo", r)
}

/// Base and size of the allocation (or mapping) containing `ptr`.
fn address_range(ptr: u64) -> Result<(u64, u64), CUresult> {
    check_init()?;
    let g = lock();
    if let Some((base, a)) = alloc::find(&g, ptr, 1) {
        return Ok((base, a.size));
    }
    match g.mappings.range(..=ptr).next_back() {
        Some((&base, m)) if ptr < base + m.size => Ok((base, m.size)),
        _ => Err(CUDA_ERROR_NOT_FOUND),
    }
}

fn get_address_range(pbase: *mut CUdeviceptr, psize: *mut usize, ptr: u64) -> Result<(), CUresult> {
    let (base, size) = address_range(ptr)?;
    crate::put_opt(pbase, base);
    crate::put_opt(psize, size as usize);
    Ok(())
}

/// `cuPointerGetAttribute` for device, managed and mapped memory and pinned host blocks.
fn pointer_attribute(data: *mut c_void, attr: c_int, ptr: u64) -> Result<(), CUresult> {
    check_init()?;
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let g = lock();
    // (device, managed, base, size); device u32::MAX = host memory.
    let info = if let Some((base, a)) = alloc::find(&g, ptr, 1) {
        (a.device, a.kind == Kind::Managed, base, a.size)
    } else if let Some((&base, m)) = g
        .mappings
        .range(..=ptr)
        .next_back()
        .filter(|(&b, m)| ptr < b + m.size)
    {
        // Host memory mapped: the fake keeps no memory types, and answers as for device 0.
        let dev = g.handles.get(&m.handle).map_or(0, |h| {
            if h.device == crate::vmm::HOST {
                0
            } else {
                h.device
            }
        });
        (dev, false, base, m.size)
    } else if let Some((&base, &size)) = g
        .host
        .iter()
        .find(|(&b, &s)| (b as u64..b as u64 + s as u64).contains(&ptr))
    {
        (usize::MAX, false, base as u64, size as u64)
    } else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    drop(g);
    let (dev, managed, base, size) = info;
    let host = dev == usize::MAX;
    match attr {
        1 => put(
            data.cast::<usize>(),
            if host { 0 } else { primary_ctx(dev) },
        ), // CONTEXT
        2 => put(data.cast::<c_uint>(), if host { 1 } else { 2 }), // MEMORY_TYPE: HOST / DEVICE
        3 => put(data.cast::<u64>(), ptr),                         // DEVICE_POINTER
        4 => put(data.cast::<u64>(), if host || managed { ptr } else { 0 }), // HOST_POINTER
        6 => put(data.cast::<c_uint>(), 0),                        // SYNC_MEMOPS
        7 => put(data.cast::<u64>(), base),                        // BUFFER_ID
        8 => put(data.cast::<u8>(), managed as u8),                // IS_MANAGED (bool)
        9 => put(data.cast::<c_int>(), if host { -1 } else { dev as c_int }), // DEVICE_ORDINAL
        11 => put(data.cast::<u64>(), base),                       // RANGE_START_ADDR
        12 => put(data.cast::<usize>(), size as usize),            // RANGE_SIZE
        13 => put(data.cast::<u8>(), 1),                           // MAPPED (bool)
        16 => put(data.cast::<c_uint>(), CU_MEM_ACCESS_FLAGS_PROT_READWRITE), // ACCESS_FLAGS
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn host_alloc(pp: *mut *mut c_void, bytes: usize) -> Result<(), CUresult> {
    check_init()?;
    if pp.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut p = std::ptr::null_mut();
    // SAFETY: posix_memalign into a local.
    if unsafe { libc::posix_memalign(&mut p, 4096, bytes) } != 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    lock().host.insert(p as usize, bytes);
    put(pp, p)
}

fn host_free(p: *mut c_void) -> Result<(), CUresult> {
    check_init()?;
    lock()
        .host
        .remove(&(p as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: allocated by posix_memalign in host_alloc.
    unsafe { libc::free(p) };
    Ok(())
}

/// Prefetch / advise: the range must be managed memory; nothing else happens.
fn managed_range(ptr: u64, count: usize) -> Result<(), CUresult> {
    check_init()?;
    match alloc::find(&lock(), ptr, count as u64) {
        Some((_, a)) if a.kind == Kind::Managed => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

export! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => alloc_v2("cuMemAlloc_v2", dptr, bytesize);
    /// Legacy (pre-3.2): a 32-bit pointer, from a low address range.
    fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) => alloc_v1(dptr, bytesize);
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, ppitch: *mut usize, width: usize, height: usize, elem: c_uint) => alloc_pitch_v2(dptr, ppitch, width, height, elem);
    fn cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, ppitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) => alloc_pitch_v1(dptr, ppitch, width, height, elem);
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) => alloc_managed(dptr, bytesize, flags);
    fn cuMemFree_v2(dptr: CUdeviceptr) => free("cuMemFree_v2", dptr);
    fn cuMemFree(dptr: CUdeviceptr_v1) => free("cuMemFree", dptr as u64);
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => alloc_async("cuMemAllocAsync", dptr, bytesize, None, stream);
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => alloc_async("cuMemAllocAsync_ptsz", dptr, bytesize, None, stream);
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => alloc_async("cuMemAllocFromPoolAsync", dptr, bytesize, Some(pool), stream);
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => alloc_async("cuMemAllocFromPoolAsync_ptsz", dptr, bytesize, Some(pool), stream);
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => free_async("cuMemFreeAsync", dptr, stream);
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => free_async("cuMemFreeAsync_ptsz", dptr, stream);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => get_info_v2(free, total);
    /// Legacy (pre-3.2): `unsigned int` sizes, saturated.
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) => get_info_v1(free, total);
    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) => rc(get_address_range(pbase, psize, dptr));
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) => rc(pointer_attribute(data, attribute, ptr));
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, _flags: c_uint) => rc(host_alloc(pp, bytesize));
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) => rc(host_alloc(pp, bytesize));
    fn cuMemFreeHost(p: *mut c_void) => rc(host_free(p));
    fn cuMemPrefetchAsync(ptr: CUdeviceptr, count: usize, _dev: CUdevice, _stream: CUstream) => rc(managed_range(ptr, count));
    fn cuMemPrefetchAsync_ptsz(ptr: CUdeviceptr, count: usize, _dev: CUdevice, _stream: CUstream) => rc(managed_range(ptr, count));
    fn cuMemPrefetchAsync_v2(ptr: CUdeviceptr, count: usize, _loc: CUmemLocation, _flags: c_uint, _stream: CUstream) => rc(managed_range(ptr, count));
    fn cuMemPrefetchAsync_v2_ptsz(ptr: CUdeviceptr, count: usize, _loc: CUmemLocation, _flags: c_uint, _stream: CUstream) => rc(managed_range(ptr, count));
    fn cuMemAdvise(ptr: CUdeviceptr, count: usize, _advice: c_int, _dev: CUdevice) => rc(managed_range(ptr, count));
    fn cuMemAdvise_v2(ptr: CUdeviceptr, count: usize, _advice: c_int, _loc: CUmemLocation) => rc(managed_range(ptr, count));
}
