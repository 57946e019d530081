//! Memory pools for the stream-ordered allocator: each device's default pool, created pools, attributes.
//! A pool keeps freed memory reserved up to its release threshold (0 by default: given back at once), and
//! `cuMemPoolTrimTo` gives back what is above the bytes asked to keep: the device counts what pools reserve.

use std::ffi::{c_int, c_void};

use crate::driver::{check_device, check_init, default_pool, lock, HandleKind, Pool};
use crate::types::*;
use crate::{get, log, put, rc};

fn get_default(pool: *mut CUmemoryPool, dev: CUdevice) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    put(pool, default_pool(d) as CUmemoryPool)
}

fn get_current(pool: *mut CUmemoryPool, dev: CUdevice) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    let p = lock().current_pool[d];
    put(pool, p as CUmemoryPool)
}

fn set_current(dev: CUdevice, pool: CUmemoryPool) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    let mut g = lock();
    match g.pools.get(&(pool as usize)) {
        Some(p) if p.device == d => {
            g.current_pool[d] = pool as usize;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn create(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> Result<usize, CUresult> {
    check_init()?;
    let props = get(props)?;
    if pool.is_null()
        || props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
        || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = check_device(props.location.id)?;
    let mut g = lock();
    let h = g.new_handle(HandleKind::Pool);
    g.pools.insert(
        h,
        Pool {
            device: d,
            ..Pool::default()
        },
    );
    put(pool, h as CUmemoryPool)?;
    Ok(d)
}

fn logged_create(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult {
    let r = create(pool, props);
    let h = match r {
        // SAFETY: written by `create` just now.
        Ok(_) => unsafe { pool.read_unaligned() as u64 },
        Err(_) => 0,
    };
    log::call(
        "cuMemPoolCreate",
        rc(r),
        h,
        0,
        *r.as_ref().unwrap_or(&0) as u64,
    );
    rc(r)
}

fn destroy(pool: CUmemoryPool) -> Result<(), CUresult> {
    check_init()?;
    let p = pool as usize;
    let mut g = lock();
    let is_default = g.pools.get(&p).map(|x| default_pool(x.device) == p);
    match is_default {
        Some(false) => {
            let (d, held) = g
                .pools
                .remove(&p)
                .map_or((0, 0), |x| (x.device, x.reserved));
            crate::state::release(d, held);
            if g.current_pool[d] == p {
                g.current_pool[d] = default_pool(d);
            }
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn trim(pool: CUmemoryPool, keep: u64) -> Result<(), CUresult> {
    check_init()?;
    let mut g = lock();
    let p = g
        .pools
        .get_mut(&(pool as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let dev = p.device;
    let freed = p.shrink_to(keep);
    crate::state::release(dev, freed);
    Ok(())
}

fn set_attribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> Result<(), CUresult> {
    check_init()?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = lock();
    let p = g
        .pools
        .get_mut(&(pool as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attr {
        1..=3 => Ok(()), // reuse policies (int)
        4 => {
            // SAFETY: a cuuint64_t per the API (the caller's pointer to the value).
            p.release_threshold = unsafe { value.cast::<u64>().read_unaligned() };
            Ok(())
        }
        // RESERVED_MEM_HIGH / USED_MEM_HIGH: reset to the current value.
        6 => {
            p.reserved_high = p.reserved;
            Ok(())
        }
        8 => {
            p.used_high = p.used;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn get_attribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> Result<(), CUresult> {
    check_init()?;
    let g = lock();
    let p = g
        .pools
        .get(&(pool as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attr {
        1..=3 => put(value.cast::<c_int>(), 1),
        4 => put(value.cast::<u64>(), p.release_threshold),
        5 => put(value.cast::<u64>(), p.reserved),
        6 => put(value.cast::<u64>(), p.reserved_high),
        7 => put(value.cast::<u64>(), p.used),
        8 => put(value.cast::<u64>(), p.used_high),
        9 => put(
            value.cast::<c_int>(),
            CU_MEM_ALLOCATION_TYPE_PINNED as c_int,
        ),
        10 => put(value.cast::<c_int>(), 0),
        11 => put(value.cast::<c_int>(), p.device as c_int),
        12 => put(value.cast::<c_int>(), CU_MEM_LOCATION_TYPE_DEVICE as c_int),
        13 => put(value.cast::<u64>(), 0),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

export! {
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) => rc(get_default(pool, dev));
    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) => rc(get_current(pool, dev));
    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) => rc(set_current(dev, pool));
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) => logged_create(pool, props);
    fn cuMemPoolDestroy(pool: CUmemoryPool) => {
        let r = rc(destroy(pool));
        log::call("cuMemPoolDestroy", r, pool as u64, 0, 0);
        r
    };
    fn cuMemPoolTrimTo(pool: CUmemoryPool, min_keep: usize) => {
        let r = rc(trim(pool, min_keep as u64));
        log::call("cuMemPoolTrimTo", r, pool as u64, min_keep as u64, 0);
        r
    };
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) => rc(set_attribute(pool, attr, value));
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) => rc(get_attribute(pool, attr, value));
}
