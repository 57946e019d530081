//! The allocator: admission of physical memory (`FAKECUDA_LARGEST_FREE`, the device accounting), addresses,
//! and frees. Callers hold the driver lock.

use crate::config;
use crate::driver::{Alloc, Driver, Kind, ALIGN};
use crate::state;
use crate::types::*;

/// Takes `bytes` of physical memory on `dev`, or says why not (`CUDA_ERROR_OUT_OF_MEMORY`).
pub fn admit(dev: usize, bytes: u64) -> Result<(), CUresult> {
    if let Some(largest) = config::get().largest_free {
        if bytes > largest {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    if state::reserve(dev, bytes) {
        Ok(())
    } else {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }
}

/// A new allocation of `bytes` (> 0) on `dev`; nothing is allocated on failure.
pub fn allocate(d: &mut Driver, dev: usize, bytes: u64, kind: Kind) -> Result<u64, CUresult> {
    // A pool's allocation takes device memory only when the pool must grow: its cache serves the rest.
    let counted = match kind {
        Kind::Pool(p) => d.pools.get(&p).map_or(bytes, |pool| pool.growth_for(bytes)),
        _ => bytes,
    };
    if let Some(largest) = config::get().largest_free {
        if bytes > largest {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    if counted > 0 {
        admit(dev, counted)?;
    }
    let placed = match kind {
        Kind::Legacy => d.legacy.take(bytes, ALIGN),
        Kind::Managed => map_host(bytes),
        Kind::Device | Kind::Pool(_) => d.regions[dev].take(bytes, ALIGN),
    };
    let Some((addr, slot)) = placed else {
        state::release(dev, counted);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    if let Kind::Pool(p) = kind {
        if let Some(pool) = d.pools.get_mut(&p) {
            pool.reserved += counted;
            pool.reserved_high = pool.reserved_high.max(pool.reserved);
            pool.used += bytes;
            pool.used_high = pool.used_high.max(pool.used);
        }
    }
    d.allocs.insert(
        addr,
        Alloc {
            size: bytes,
            slot,
            device: dev,
            kind,
            ctx: crate::driver::current().map_or(0, |c| c.0),
            shadow: None,
        },
    );
    Ok(addr)
}

/// Frees the allocation starting at `ptr`; returns the bytes it held. Unknown (or already freed):
/// `CUDA_ERROR_INVALID_VALUE`.
pub fn free(d: &mut Driver, ptr: u64) -> Result<u64, CUresult> {
    let a = d.allocs.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match a.kind {
        Kind::Legacy => d.legacy.give(ptr, a.slot),
        // SAFETY: our own anonymous mapping.
        Kind::Managed => unsafe {
            libc::munmap(ptr as *mut libc::c_void, a.slot as usize);
        },
        Kind::Device => d.regions[a.device].give(ptr, a.slot),
        Kind::Pool(p) => {
            d.regions[a.device].give(ptr, a.slot);
            // The pool keeps the freed bytes, up to its release threshold; the device gets back the rest.
            let back = match d.pools.get_mut(&p) {
                Some(pool) => {
                    pool.used = pool.used.saturating_sub(a.size);
                    let keep = pool.release_threshold;
                    pool.shrink_to(keep)
                }
                None => a.size,
            };
            state::release(a.device, back);
            return Ok(a.size);
        }
    }
    state::release(a.device, a.size);
    Ok(a.size)
}

/// A context is gone (destroyed, or a primary context reset or released for the last time): the driver frees
/// every allocation made in it, as the real one does. Returns the bytes freed.
pub fn teardown(d: &mut Driver, ctx: usize) -> u64 {
    let gone: Vec<u64> = d
        .allocs
        .iter()
        .filter(|(_, a)| a.ctx == ctx)
        .map(|(p, _)| *p)
        .collect();
    let mut bytes = 0;
    for p in gone {
        bytes += free(d, p).unwrap_or(0);
    }
    bytes
}

/// Managed memory is real host memory (reserved lazily), so the host can touch it like with CUDA.
fn map_host(bytes: u64) -> Option<(u64, u64)> {
    let len = bytes.checked_next_multiple_of(4096)?;
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some((p as u64, len))
}

/// The allocation containing `[ptr, ptr + len)`, as (base, allocation).
pub fn find(d: &Driver, ptr: u64, len: u64) -> Option<(u64, &Alloc)> {
    let (&base, a) = d.allocs.range(..=ptr).next_back()?;
    let end = ptr.checked_add(len)?;
    (end <= base + a.size.max(1)).then_some((base, a))
}

/// Whether `[ptr, ptr + len)` lies in `cuMemMap`ped memory (contiguous mappings).
pub fn mapped(d: &Driver, ptr: u64, len: u64) -> bool {
    let Some(end) = ptr.checked_add(len.max(1)) else {
        return false;
    };
    let mut at = ptr;
    while at < end {
        match d.mappings.range(..=at).next_back() {
            Some((&base, m)) if at < base + m.size => at = base + m.size,
            _ => return false,
        }
    }
    true
}
