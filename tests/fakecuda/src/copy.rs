//! Copies and memsets. Device memory has no backing store: an allocation of at most `FAKECUDA_SHADOW_MAX`
//! bytes gets a host-side copy of its contents on its first write, so data round-trips; other device
//! memory (larger allocations, `cuMemMap`ped ranges) reads back as zeros. Managed memory is host memory
//! and is copied for real. A device range outside any allocation or mapping is `CUDA_ERROR_INVALID_VALUE`.
//! Work completes before the call returns, the async variants included.

use std::ffi::{c_uint, c_ushort, c_void};

use crate::alloc;
use crate::config;
use crate::driver::{check_init, lock, Driver, Kind};
use crate::rc;
use crate::stream::check_stream;
use crate::types::*;

/// What holds the bytes of a device range.
enum Target {
    /// Host memory at this address (managed memory).
    Host(*mut u8),
    /// Allocation at `base`, offset `off`; contents in its shadow (created on demand if allowed).
    Alloc {
        base: u64,
        off: usize,
        shadowable: bool,
    },
    /// Mapped, or too large to shadow: contents are not kept.
    Nowhere,
}

fn target(g: &Driver, ptr: u64, len: u64) -> Result<Target, CUresult> {
    if let Some((base, a)) = alloc::find(g, ptr, len) {
        return Ok(match a.kind {
            Kind::Managed => Target::Host(ptr as *mut u8),
            _ => Target::Alloc {
                base,
                off: (ptr - base) as usize,
                shadowable: a.shadow.is_some() || a.size <= config::get().shadow_max,
            },
        });
    }
    if alloc::mapped(g, ptr, len) {
        return Ok(Target::Nowhere);
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// The shadow of the allocation at `base`, created (zeroed) if missing.
fn shadow(g: &mut Driver, base: u64) -> Option<&mut [u8]> {
    let a = g.allocs.get_mut(&base)?;
    if a.shadow.is_none() {
        a.shadow = Some(vec![0u8; a.size as usize].into_boxed_slice());
    }
    a.shadow.as_deref_mut()
}

/// Writes `src` to device memory at `ptr`.
fn write_dev(g: &mut Driver, ptr: u64, src: &[u8]) -> Result<(), CUresult> {
    match target(g, ptr, src.len() as u64)? {
        // SAFETY: managed memory is our own mapping, and the range was checked.
        Target::Host(p) => unsafe { std::ptr::copy(src.as_ptr(), p, src.len()) },
        Target::Alloc {
            base,
            off,
            shadowable: true,
        } => {
            if let Some(s) = shadow(g, base) {
                s[off..off + src.len()].copy_from_slice(src);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Reads device memory at `ptr` into `dst`.
fn read_dev(g: &Driver, ptr: u64, dst: &mut [u8]) -> Result<(), CUresult> {
    match target(g, ptr, dst.len() as u64)? {
        // SAFETY: as in write_dev.
        Target::Host(p) => unsafe { std::ptr::copy(p, dst.as_mut_ptr(), dst.len()) },
        Target::Alloc { base, off, .. } => {
            match g.allocs.get(&base).and_then(|a| a.shadow.as_deref()) {
                Some(s) => dst.copy_from_slice(&s[off..off + dst.len()]),
                None => dst.fill(0),
            }
        }
        Target::Nowhere => dst.fill(0),
    }
    Ok(())
}

/// Fills `n` elements at `ptr` with `elem`.
fn fill_dev(g: &mut Driver, ptr: u64, elem: &[u8], n: usize) -> Result<(), CUresult> {
    let len = elem.len().checked_mul(n).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if len == 0 {
        return Ok(());
    }
    let zero = elem.iter().all(|&b| b == 0);
    let fill = |buf: &mut [u8]| {
        buf.chunks_exact_mut(elem.len())
            .for_each(|c| c.copy_from_slice(elem))
    };
    match target(g, ptr, len as u64)? {
        // SAFETY: as in write_dev.
        Target::Host(p) => fill(unsafe { std::slice::from_raw_parts_mut(p, len) }),
        Target::Alloc {
            base,
            off,
            shadowable: true,
        } => {
            let has = g.allocs.get(&base).is_some_and(|a| a.shadow.is_some());
            if has || !zero {
                if let Some(s) = shadow(g, base) {
                    fill(&mut s[off..off + len]);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn host_slice<'a>(p: *const c_void, n: usize) -> Result<&'a [u8], CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's host buffer of `n` bytes, as the API contract says.
    Ok(unsafe { std::slice::from_raw_parts(p.cast(), n) })
}

fn host_slice_mut<'a>(p: *mut c_void, n: usize) -> Result<&'a mut [u8], CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: as host_slice.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast(), n) })
}

fn htod(dst: u64, src: *const c_void, n: usize) -> Result<(), CUresult> {
    check_init()?;
    if n == 0 {
        return Ok(());
    }
    let src = host_slice(src, n)?;
    write_dev(&mut lock(), dst, src)
}

fn dtoh(dst: *mut c_void, src: u64, n: usize) -> Result<(), CUresult> {
    check_init()?;
    if n == 0 {
        return Ok(());
    }
    let dst = host_slice_mut(dst, n)?;
    read_dev(&lock(), src, dst)
}

fn dtod(dst: u64, src: u64, n: usize) -> Result<(), CUresult> {
    check_init()?;
    if n == 0 {
        return Ok(());
    }
    let mut g = lock();
    // Only copy bytes that are kept somewhere; otherwise the destination reads as zeros.
    let kept = match target(&g, src, n as u64)? {
        Target::Host(_) => true,
        Target::Alloc { base, .. } => g.allocs.get(&base).is_some_and(|a| a.shadow.is_some()),
        Target::Nowhere => false,
    };
    if kept {
        let mut buf = vec![0u8; n];
        read_dev(&g, src, &mut buf)?;
        write_dev(&mut g, dst, &buf)
    } else {
        target(&g, dst, n as u64)?;
        fill_dev(&mut g, dst, &[0], n)
    }
}

/// `cuMemcpy` / `cuMemcpyAsync`: unified addressing decides which side is the device.
fn unified(dst: u64, src: u64, n: usize) -> Result<(), CUresult> {
    check_init()?;
    if n == 0 {
        return Ok(());
    }
    let (dst_dev, src_dev) = {
        let g = lock();
        (
            target(&g, dst, n as u64).is_ok(),
            target(&g, src, n as u64).is_ok(),
        )
    };
    match (dst_dev, src_dev) {
        (true, true) => dtod(dst, src, n),
        (true, false) => htod(dst, src as *const c_void, n),
        (false, true) => dtoh(dst as *mut c_void, src, n),
        (false, false) => {
            let s = host_slice(src as *const c_void, n)?.to_vec();
            host_slice_mut(dst as *mut c_void, n)?.copy_from_slice(&s);
            Ok(())
        }
    }
}

fn memset(ptr: u64, elem: &[u8], n: usize) -> Result<(), CUresult> {
    check_init()?;
    fill_dev(&mut lock(), ptr, elem, n)
}

fn on_stream(s: CUstream, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    rc(check_stream(s).and_then(|_| f()))
}

export! {
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) => rc(htod(dst, src, n));
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) => rc(dtoh(dst, src, n));
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => rc(dtod(dst, src, n));
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => rc(unified(dst, src, n));
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => on_stream(s, || htod(dst, src, n));
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => on_stream(s, || htod(dst, src, n));
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => on_stream(s, || dtoh(dst, src, n));
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => on_stream(s, || dtoh(dst, src, n));
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => on_stream(s, || dtod(dst, src, n));
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => on_stream(s, || dtod(dst, src, n));
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => on_stream(s, || unified(dst, src, n));
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => on_stream(s, || unified(dst, src, n));
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, _dctx: CUcontext, src: CUdeviceptr, _sctx: CUcontext, n: usize, s: CUstream) => on_stream(s, || dtod(dst, src, n));
    fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, _dctx: CUcontext, src: CUdeviceptr, _sctx: CUcontext, n: usize, s: CUstream) => on_stream(s, || dtod(dst, src, n));
    fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) => rc(memset(dst, &[v], n));
    fn cuMemsetD16_v2(dst: CUdeviceptr, v: c_ushort, n: usize) => rc(memset(dst, &v.to_ne_bytes(), n));
    fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) => rc(memset(dst, &v.to_ne_bytes(), n));
    fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) => on_stream(s, || memset(dst, &[v], n));
    fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) => on_stream(s, || memset(dst, &[v], n));
    fn cuMemsetD16Async(dst: CUdeviceptr, v: c_ushort, n: usize, s: CUstream) => on_stream(s, || memset(dst, &v.to_ne_bytes(), n));
    fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, v: c_ushort, n: usize, s: CUstream) => on_stream(s, || memset(dst, &v.to_ne_bytes(), n));
    fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => on_stream(s, || memset(dst, &v.to_ne_bytes(), n));
    fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => on_stream(s, || memset(dst, &v.to_ne_bytes(), n));
}
