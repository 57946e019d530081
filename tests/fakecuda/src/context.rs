//! Contexts: one primary context per device (reference counted), created contexts, and each thread's
//! context stack (the top is the current context).
//!
//! Tearing a context down (`cuCtxDestroy`, `cuDevicePrimaryCtxReset`, the last `cuDevicePrimaryCtxRelease`)
//! frees every allocation made in it, as the real driver does (`cuMemCreate` handles are the device's and stay).

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{
    self, check_device, check_init, current, lock, primary_ctx, with_stack, HandleKind,
};
use crate::types::*;
use crate::{put, put_opt, rc};

fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    lock().primary[d].refs += 1;
    put(pctx, primary_ctx(d) as CUcontext)
}

fn primary_release(dev: CUdevice) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    let mut g = lock();
    let p = &mut g.primary[d];
    if p.refs == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refs -= 1;
    if p.refs == 0 {
        crate::alloc::teardown(&mut g, primary_ctx(d));
    }
    Ok(())
}

fn primary_state(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    if flags.is_null() || active.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = lock().primary[d];
    put(flags, p.flags)?;
    put(active, (p.refs > 0) as c_int)
}

fn primary_set_flags(dev: CUdevice, flags: c_uint, v2: bool) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    let mut g = lock();
    let p = &mut g.primary[d];
    if !v2 && p.refs > 0 {
        return Err(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
    }
    p.flags = flags;
    Ok(())
}

fn primary_reset(dev: CUdevice) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    let mut g = lock();
    g.primary[d] = Default::default();
    crate::alloc::teardown(&mut g, primary_ctx(d));
    Ok(())
}

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Result<(), CUresult> {
    let d = check_device(dev)?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = {
        let mut g = lock();
        let h = g.new_handle(HandleKind::Ctx);
        g.contexts.insert(h, (d, flags));
        h
    };
    with_stack(|s| s.push((h, d)));
    put(pctx, h as CUcontext)
}

fn destroy(ctx: CUcontext) -> Result<(), CUresult> {
    check_init()?;
    let h = ctx as usize;
    let mut g = lock();
    if g.contexts.remove(&h).is_none() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    crate::alloc::teardown(&mut g, h);
    drop(g);
    with_stack(|s| s.retain(|c| c.0 != h));
    Ok(())
}

/// A valid context handle's device.
fn ctx_device(ctx: CUcontext) -> Result<usize, CUresult> {
    lock()
        .ctx_device(ctx as usize)
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

fn set_current(ctx: CUcontext) -> Result<(), CUresult> {
    check_init()?;
    if ctx.is_null() {
        with_stack(|s| s.pop());
        return Ok(());
    }
    let d = ctx_device(ctx)?;
    with_stack(|s| {
        s.pop();
        s.push((ctx as usize, d));
    });
    Ok(())
}

fn push_current(ctx: CUcontext) -> Result<(), CUresult> {
    check_init()?;
    let d = ctx_device(ctx)?;
    with_stack(|s| s.push((ctx as usize, d)));
    Ok(())
}

fn pop_current(pctx: *mut CUcontext) -> Result<(), CUresult> {
    check_init()?;
    let top = with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    put_opt(pctx, top.0 as CUcontext);
    Ok(())
}

fn get_current(pctx: *mut CUcontext) -> Result<(), CUresult> {
    check_init()?;
    put(
        pctx,
        current().map_or(std::ptr::null_mut(), |c| c.0 as CUcontext),
    )
}

fn get_device(dev: *mut CUdevice) -> Result<(), CUresult> {
    let d = driver::current_device();
    if crate::config::get().log_queries {
        let (rc, aux) = match d {
            Ok(d) => (0, d as u64),
            Err(e) => (e, u32::MAX as u64),
        };
        crate::log::call("cuCtxGetDevice", rc, 0, 0, aux);
    }
    put(dev, d? as CUdevice)
}

/// Flags of the current context.
fn get_flags(flags: *mut c_uint) -> Result<(), CUresult> {
    let (ctx, d) = current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    check_init()?;
    let g = lock();
    let f = g.contexts.get(&ctx).map_or(g.primary[d].flags, |c| c.1);
    put(flags, f)
}

fn set_flags(flags: c_uint) -> Result<(), CUresult> {
    let (ctx, d) = current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    check_init()?;
    let mut g = lock();
    match g.contexts.get_mut(&ctx) {
        Some(c) => c.1 = flags,
        None => g.primary[d].flags = flags,
    }
    Ok(())
}

fn with_current(f: impl FnOnce() -> Result<(), CUresult>) -> Result<(), CUresult> {
    driver::current_device()?;
    f()
}

fn limit(pvalue: *mut usize, limit: c_int) -> Result<(), CUresult> {
    let v = match limit {
        0 => 1024,    // STACK_SIZE
        1 => 1 << 20, // PRINTF_FIFO_SIZE
        2 => 8 << 20, // MALLOC_HEAP_SIZE
        3 => 2,       // DEV_RUNTIME_SYNC_DEPTH
        4 => 2048,    // DEV_RUNTIME_PENDING_LAUNCH_COUNT
        5 => 64,      // MAX_L2_FETCH_GRANULARITY
        6 => 0,       // PERSISTING_L2_CACHE_SIZE
        7 | 8 => 0,   // SHMEM_SIZE, CIG_ENABLED
        9 => 1,       // CIG_SHMEM_FALLBACK_ENABLED
        _ => return Err(CUDA_ERROR_UNSUPPORTED_LIMIT),
    };
    put(pvalue, v)
}

const CUDA_ERROR_UNSUPPORTED_LIMIT: CUresult = 215;

export! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) => rc(primary_retain(pctx, dev));
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) => rc(primary_release(dev));
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => rc(primary_release(dev));
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) => rc(primary_state(dev, flags, active));
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) => rc(primary_set_flags(dev, flags, false));
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) => rc(primary_set_flags(dev, flags, true));
    fn cuDevicePrimaryCtxReset(dev: CUdevice) => rc(primary_reset(dev));
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => rc(primary_reset(dev));
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => rc(create(pctx, flags, dev));
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => rc(create(pctx, flags, dev));
    fn cuCtxCreate_v3(pctx: *mut CUcontext, _params: *mut c_void, _n: c_int, flags: c_uint, dev: CUdevice) => rc(create(pctx, flags, dev));
    fn cuCtxCreate_v4(pctx: *mut CUcontext, _params: *mut c_void, flags: c_uint, dev: CUdevice) => rc(create(pctx, flags, dev));
    fn cuCtxDestroy(ctx: CUcontext) => rc(destroy(ctx));
    fn cuCtxDestroy_v2(ctx: CUcontext) => rc(destroy(ctx));
    fn cuCtxSetCurrent(ctx: CUcontext) => rc(set_current(ctx));
    fn cuCtxGetCurrent(pctx: *mut CUcontext) => rc(get_current(pctx));
    fn cuCtxPushCurrent(ctx: CUcontext) => rc(push_current(ctx));
    fn cuCtxPushCurrent_v2(ctx: CUcontext) => rc(push_current(ctx));
    fn cuCtxPopCurrent(pctx: *mut CUcontext) => rc(pop_current(pctx));
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) => rc(pop_current(pctx));
    fn cuCtxGetDevice(dev: *mut CUdevice) => rc(get_device(dev));
    fn cuCtxSynchronize() => rc(with_current(|| Ok(())));
    fn cuCtxGetFlags(flags: *mut c_uint) => rc(get_flags(flags));
    fn cuCtxSetFlags(flags: c_uint) => rc(set_flags(flags));
    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) => rc(check_init().and_then(|_| {
        if !ctx.is_null() { ctx_device(ctx)?; } else { driver::current_device()?; }
        put(version, 3020)
    }));
    fn cuCtxGetId(ctx: CUcontext, id: *mut u64) => rc(check_init().and_then(|_| {
        let h = if ctx.is_null() { current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?.0 } else { ctx_device(ctx).map(|_| ctx as usize)? };
        put(id, (h >> 6) as u64 & 0xffff_ffff)
    }));
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) => rc(with_current(|| { put_opt(least, 0); put_opt(greatest, -5); Ok(()) }));
    fn cuCtxGetLimit(pvalue: *mut usize, lim: c_int) => rc(with_current(|| limit(pvalue, lim)));
    fn cuCtxSetLimit(lim: c_int, _value: usize) => rc(with_current(|| limit(&mut 0, lim)));
    fn cuCtxGetCacheConfig(config: *mut c_int) => rc(with_current(|| put(config, 0)));
    fn cuCtxSetCacheConfig(_config: c_int) => rc(with_current(|| Ok(())));
}
