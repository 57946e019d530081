//! NVML's memory figures under the cap: `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2` (what
//! `pynvml`, `nvidia-ml-py` and the framework helpers built on them read) report the same device as
//! `cuMemGetInfo_v2` does under the cap.
//!
//! The real function is called unchanged; a failing result is returned as it is. On success, if a cap applies to
//! that GPU, the figures are rewritten (docs/CAP.md):
//! - total' = min(cap, total), free' = min(free, cap - job's bytes in use), saturating, never above total'
//!   (`Cap::virtual_info`, the rule `cuMemGetInfo_v2` follows);
//! - v1: used' = total' - free' (NVML's v1 `used` includes the driver's reservation; so does this one);
//! - v2: total' = reserved' + used' + free' as NVML keeps it, with the job's own bytes counted as used first:
//!   reserved' = min(reserved, total' - free' - min(job, total' - free')), used' = total' - free' - reserved'.
//!   Where the cap is above what the device has, this leaves NVML's figures as they were.
//!
//! Which CUDA device is this NVML device? NVML numbers every GPU in PCI order; CUDA's ordinals follow
//! `CUDA_DEVICE_ORDER` and `CUDA_VISIBLE_DEVICES`. They are matched by UUID: NVML's `nvmlDeviceGetUUID`
//! ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") against the driver's `cuDeviceGetUuid_v2` for each ordinal,
//! read once per process after the driver is initialised. Before that (the driver not loaded or not
//! initialised), or for a GPU CUDA does not see (hidden by `CUDA_VISIBLE_DEVICES`, a MIG parent), the figures are
//! NVML's own.

use std::ffi::{c_char, c_uint, c_void};

use crate::cap;
use crate::driver::{self, Sym};

pub type NvmlReturn = c_uint;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
/// What the wrappers answer when no NVML is loaded behind them (only reachable through our own exports).
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;

/// `nvmlMemory_t` (nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t` (nvml.h): a 4-byte version, 4 bytes of padding, then four 64-bit figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

const _: () = assert!(std::mem::size_of::<NvmlMemory>() == 24);
const _: () = assert!(std::mem::size_of::<NvmlMemoryV2>() == 40);
const _: () = assert!(std::mem::offset_of!(NvmlMemoryV2, total) == 8);

/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)`: the struct's size, version 2 in the top byte.
pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;

type MemoryInfoFn = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
type MemoryInfoV2Fn = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn;

pub unsafe fn memory_info(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn {
    let f = driver::real_nvml(Sym::NvmlMemoryInfo);
    if f.is_null() {
        return NVML_ERROR_UNINITIALIZED;
    }
    let f: MemoryInfoFn = std::mem::transmute(f);
    let r = f(device, memory);
    if r == NVML_SUCCESS && !memory.is_null() {
        let m = &mut *memory;
        if let Some((c, dev)) = capped_device(device) {
            let (free, total) = c.virtual_info(dev, m.free, m.total);
            m.total = total;
            m.free = free;
            m.used = total.saturating_sub(free);
        }
    }
    r
}

pub unsafe fn memory_info_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn {
    let f = driver::real_nvml(Sym::NvmlMemoryInfoV2);
    if f.is_null() {
        return NVML_ERROR_UNINITIALIZED;
    }
    let f: MemoryInfoV2Fn = std::mem::transmute(f);
    let r = f(device, memory);
    // Only the layout this module knows (NVML refuses other versions; a later one may be laid out otherwise).
    if r == NVML_SUCCESS && !memory.is_null() && (*memory).version >> 24 == 2 {
        let m = &mut *memory;
        if let Some((c, dev)) = capped_device(device) {
            let (free, total) = c.virtual_info(dev, m.free, m.total);
            let (reserved, used) = split_v2(total, free, m.reserved, c.used(dev));
            m.total = total;
            m.free = free;
            m.reserved = reserved;
            m.used = used;
        }
    }
    r
}

/// v2's reserved and used under the cap, from the capped total and free, NVML's reserved, and the job's bytes in
/// use: what the capped device shows taken (total - free) is the job's bytes first, then the driver's
/// reservation as far as it fits, then anything else. Always total = reserved + used + free.
pub fn split_v2(total: u64, free: u64, reserved: u64, job: u64) -> (u64, u64) {
    let taken = total.saturating_sub(free);
    let reserved = reserved.min(taken - job.min(taken));
    (reserved, taken - reserved)
}

/// The cap and the CUDA ordinal of this NVML device, when a cap applies to it. Only a cap already built (by
/// the process's first tracked driver call): building it here would start recording in a process that only
/// reads NVML.
unsafe fn capped_device(device: NvmlDevice) -> Option<(&'static cap::Cap, u32)> {
    let c = cap::peek()?;
    let dev = cuda_ordinal(device)?;
    c.cap_of(dev)?;
    Some((c, dev))
}

/// The CUDA ordinal of an NVML device, by UUID.
unsafe fn cuda_ordinal(device: NvmlDevice) -> Option<u32> {
    let get_uuid = driver::real_nvml(Sym::NvmlDeviceGetUuid);
    if get_uuid.is_null() {
        return None;
    }
    let get_uuid: unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn =
        std::mem::transmute(get_uuid);
    let mut buf = [0u8; UUID_BUFFER];
    if get_uuid(device, buf.as_mut_ptr().cast(), UUID_BUFFER as c_uint) != NVML_SUCCESS {
        return None;
    }
    let len = buf.iter().position(|b| *b == 0)?;
    let uuid = parse_uuid(&buf[..len])?;
    crate::devices::uuids()?
        .iter()
        .position(|u| *u == Some(uuid))
        .map(|i| i as u32)
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as the driver's 16 bytes. Anything else (a "MIG-" instance) is
/// `None`.
pub fn parse_uuid(text: &[u8]) -> Option<[u8; 16]> {
    let hex = text.strip_prefix(b"GPU-")?;
    let mut out = [0u8; 16];
    let mut n = 0;
    for &c in hex {
        if c == b'-' {
            continue;
        }
        let v = (c as char).to_digit(16)? as u8;
        if n >= 32 {
            return None;
        }
        out[n / 2] |= if n % 2 == 0 { v << 4 } else { v };
        n += 1;
    }
    (n == 32).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn uuids_parse_as_the_driver_gives_them() {
        let text = b"GPU-66616b65-6375-6461-2d67-70752d303100";
        assert_eq!(parse_uuid(text), Some(*b"fakecuda-gpu-01\0"));
        assert_eq!(
            parse_uuid(b"GPU-00112233-4455-6677-8899-AABBCCDDEEFF").unwrap()[15],
            0xff
        );
        assert_eq!(
            parse_uuid(b"MIG-66616b65-6375-6461-2d67-70752d303100"),
            None
        );
        assert_eq!(parse_uuid(b"GPU-66616b65"), None);
        assert_eq!(
            parse_uuid(b"GPU-66616b65-6375-6461-2d67-70752d30310000"),
            None
        );
        assert_eq!(
            parse_uuid(b"GPU-66616b65-6375-6461-2d67-70752d30310g"),
            None
        );
    }

    #[test]
    fn v2_split_keeps_the_sum_and_counts_the_job_as_used() {
        // Capped at 10 MiB, 3 MiB of the job's: nothing of the driver's reservation fits beside it.
        assert_eq!(
            split_v2(10 * MIB, 7 * MIB, 512 * MIB, 3 * MIB),
            (0, 3 * MIB)
        );
        // Memory outside the job shrinks free: it is shown as reserved as far as the reservation goes.
        assert_eq!(
            split_v2(10 * MIB, 2 * MIB, 4 * MIB, 3 * MIB),
            (4 * MIB, 4 * MIB)
        );
        // A cap above the device: the real figures come back as they were.
        let (total, reserved, used) = (80 << 30, 600 * MIB, 5 << 30);
        let free = total - reserved - used;
        assert_eq!(split_v2(total, free, reserved, 3 << 30), (reserved, used));
        // Never an underflow, whatever the figures.
        assert_eq!(split_v2(MIB, 2 * MIB, MIB, 5 * MIB), (0, 0));
        assert_eq!(split_v2(10 * MIB, 0, 0, 20 * MIB), (0, 10 * MIB));
    }

    #[test]
    fn the_v2_struct_is_laid_out_like_nvml_h() {
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(std::mem::offset_of!(NvmlMemoryV2, reserved), 16);
        assert_eq!(std::mem::offset_of!(NvmlMemoryV2, free), 24);
        assert_eq!(std::mem::offset_of!(NvmlMemoryV2, used), 32);
    }
}
