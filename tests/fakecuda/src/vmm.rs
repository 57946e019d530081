//! Virtual memory management: `cuMemCreate` (physical memory on the device of `prop->location`, or pinned host
//! memory for a host location, in multiples of the 2 MiB granularity), address reservations (no physical memory), mappings, access, and
//! handle reference counts. The memory of a handle is given back when it has been released and is no
//! longer mapped.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::alloc;
use crate::config::GRANULARITY;
use crate::driver::{check_device, check_init, lock, Handle, HandleKind, Mapping};
use crate::types::*;
use crate::{get, log, put, rc, state};

/// A handle's "device" when its memory is pinned host memory (a host location), as the real driver gives
/// since CUDA 12.2: NCCL makes its host buffers so.
pub const HOST: usize = usize::MAX;
/// Pinned host memory held by this process's host handles (see `FAKECUDA_HOST_BYTES`).
static HOST_USED: AtomicU64 = AtomicU64::new(0);

/// The device a `CUmemAllocationProp` places memory on, or [`HOST`].
fn prop_device(prop: *const CUmemAllocationProp) -> Result<usize, CUresult> {
    let p = get(prop)?;
    if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match p.location.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE => check_device(p.location.id),
        CU_MEM_LOCATION_TYPE_HOST | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(HOST),
        CU_MEM_LOCATION_TYPE_HOST_NUMA if p.location.id >= 0 => Ok(HOST),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Takes `size` bytes of pinned host memory, or says there is none.
fn host_admit(size: u64) -> Result<(), CUresult> {
    let limit = crate::config::get().host_bytes;
    HOST_USED
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            u.checked_add(size).filter(|&n| n <= limit)
        })
        .map(|_| ())
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
}

fn create(
    handle: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> Result<(u64, usize), CUresult> {
    check_init()?;
    if handle.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = prop_device(prop)?;
    let size = size as u64;
    if size == 0 || size % GRANULARITY != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = lock();
    if dev == HOST {
        host_admit(size)?;
    } else {
        alloc::admit(dev, size)?;
    }
    let h = g.new_handle(HandleKind::MemHandle) as u64;
    g.handles.insert(
        h,
        Handle {
            size,
            device: dev,
            refs: 1,
            maps: 0,
        },
    );
    drop(g);
    put(handle, h)?;
    Ok((h, dev))
}

/// Drops the handle (and its memory) once released and unmapped.
fn settle(g: &mut crate::driver::Driver, h: u64) {
    if let Some(x) = g.handles.get(&h) {
        if x.refs == 0 && x.maps == 0 {
            let (dev, size) = (x.device, x.size);
            g.handles.remove(&h);
            if dev == HOST {
                HOST_USED.fetch_sub(size, Ordering::AcqRel);
            } else {
                state::release(dev, size);
            }
        }
    }
}

fn release(h: u64) -> Result<u64, CUresult> {
    check_init()?;
    let mut g = lock();
    let x = g
        .handles
        .get_mut(&h)
        .filter(|x| x.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    x.refs -= 1;
    let size = x.size;
    settle(&mut g, h);
    Ok(size)
}

fn reserve(ptr: *mut CUdeviceptr, size: usize, align: usize, flags: u64) -> Result<u64, CUresult> {
    check_init()?;
    let (size, align) = (size as u64, align as u64);
    if ptr.is_null() || flags != 0 || size == 0 || size % GRANULARITY != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if align != 0 && !align.is_power_of_two() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = lock();
    let (addr, slot) = g
        .vas
        .take(size, align.max(GRANULARITY))
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    g.reservations.insert(addr, (size, slot));
    drop(g);
    put(ptr, addr)?;
    Ok(addr)
}

fn address_free(ptr: u64, size: usize) -> Result<(), CUresult> {
    check_init()?;
    let mut g = lock();
    let &(rsize, slot) = g
        .reservations
        .get(&ptr)
        .filter(|r| r.0 == size as u64)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if g.mappings.range(ptr..ptr + rsize).next().is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    g.reservations.remove(&ptr);
    g.vas.give(ptr, slot);
    Ok(())
}

fn map(ptr: u64, size: usize, offset: usize, h: u64, flags: u64) -> Result<(), CUresult> {
    check_init()?;
    let (size, offset) = (size as u64, offset as u64);
    if flags != 0
        || size == 0
        || ptr % GRANULARITY != 0
        || size % GRANULARITY != 0
        || offset % GRANULARITY != 0
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut g = lock();
    // Inside one reservation.
    match g.reservations.range(..=ptr).next_back() {
        Some((&base, &(rsize, _))) if end <= base + rsize => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    // Not over an existing mapping.
    let overlaps = g
        .mappings
        .range(..end)
        .next_back()
        .is_some_and(|(&b, m)| b + m.size > ptr);
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let x = g
        .handles
        .get_mut(&h)
        .filter(|x| x.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if offset.checked_add(size).is_none_or(|e| e > x.size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    x.maps += 1;
    g.mappings.insert(ptr, Mapping { size, handle: h });
    Ok(())
}

/// Unmaps the whole mappings in `[ptr, ptr + size)`; a mapping cut in two, or nothing mapped, is an error.
fn unmap(ptr: u64, size: usize) -> Result<(), CUresult> {
    check_init()?;
    let end = ptr
        .checked_add(size as u64)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut g = lock();
    let inside: Vec<u64> = g.mappings.range(ptr..end).map(|(&b, _)| b).collect();
    let cut_before = g
        .mappings
        .range(..ptr)
        .next_back()
        .is_some_and(|(&b, m)| b + m.size > ptr);
    let cut_after = inside.last().is_some_and(|b| b + g.mappings[b].size > end);
    if inside.is_empty() || cut_before || cut_after {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in inside {
        if let Some(m) = g.mappings.remove(&b) {
            if let Some(x) = g.handles.get_mut(&m.handle) {
                x.maps -= 1;
            }
            settle(&mut g, m.handle);
        }
    }
    Ok(())
}

fn set_access(
    ptr: u64,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> Result<(), CUresult> {
    check_init()?;
    if desc.is_null() || count == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..count {
        // SAFETY: the caller passes `count` descriptors.
        let d = get(unsafe { desc.add(i) })?;
        if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
            || !matches!(
                d.flags,
                CU_MEM_ACCESS_FLAGS_PROT_NONE
                    | CU_MEM_ACCESS_FLAGS_PROT_READ
                    | CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            )
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_device(d.location.id)?;
    }
    if alloc::mapped(&lock(), ptr, size as u64) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The handle mapped at `addr` (any address inside a mapping), with a new reference.
fn retain(handle: *mut u64, addr: u64) -> Result<(u64, u64), CUresult> {
    check_init()?;
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = lock();
    let h = match g.mappings.range(..=addr).next_back() {
        Some((&b, m)) if addr < b + m.size => m.handle,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let x = g.handles.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    x.refs += 1;
    let size = x.size;
    drop(g);
    put(handle, h)?;
    Ok((h, size))
}

fn granularity(
    g: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> Result<(), CUresult> {
    check_init()?;
    prop_device(prop)?;
    if option > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(g, GRANULARITY as usize)
}

fn properties(prop: *mut CUmemAllocationProp, h: u64) -> Result<(), CUresult> {
    check_init()?;
    let dev = lock()
        .handles
        .get(&h)
        .map(|x| x.device)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    put(
        prop,
        CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: 0,
            location: if dev == HOST {
                CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_HOST,
                    id: 0,
                }
            } else {
                CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: dev as i32,
                }
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: [0; 8],
        },
    )
}

fn logged<T>(name: &str, r: Result<T, CUresult>, addr: u64, size: u64, aux: u64) -> CUresult {
    let code = rc(r);
    log::call(name, code, addr, size, aux);
    code
}

export! {
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) => {
        let r = create(handle, size, prop, flags);
        let h = r.as_ref().map_or(0, |x| x.0);
        // The device the properties name, failed or not; host memory as the shim records it: none (u32::MAX).
        let dev = match r.as_ref().map(|x| x.1).or_else(|_| prop_device(prop)) {
            Ok(HOST) => u32::MAX as u64,
            Ok(d) => d as u64,
            Err(_) => 0,
        };
        logged("cuMemCreate", r, h, size as u64, dev)
    };
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) => {
        let r = release(handle);
        let size = *r.as_ref().unwrap_or(&0);
        logged("cuMemRelease", r, handle, size, 0)
    };
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, _addr: CUdeviceptr, flags: u64) => {
        let r = reserve(ptr, size, alignment, flags);
        let a = *r.as_ref().unwrap_or(&0);
        logged("cuMemAddressReserve", r, a, size as u64, alignment as u64)
    };
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) => logged("cuMemAddressFree", address_free(ptr, size), ptr, size as u64, 0);
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) => logged("cuMemMap", map(ptr, size, offset, handle, flags), ptr, size as u64, handle);
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => logged("cuMemUnmap", unmap(ptr, size), ptr, size as u64, 0);
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) => logged("cuMemSetAccess", set_access(ptr, size, desc, count), ptr, size as u64, count as u64);
    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) => {
        let r = retain(handle, addr as u64);
        let (h, size) = *r.as_ref().unwrap_or(&(0, 0));
        logged("cuMemRetainAllocationHandle", r, addr as u64, size, h)
    };
    fn cuMemGetAllocationGranularity(g: *mut usize, prop: *const CUmemAllocationProp, option: u32) => rc(granularity(g, prop, option));
    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) => rc(properties(prop, handle));
}
