//! What the environment says, read once per process.
//!
//! - `FAKECUDA_DEVICES`: number of devices (default 2, at most 16; 0 makes `cuInit` fail with
//!   `CUDA_ERROR_NO_DEVICE`).
//! - `FAKECUDA_DEVICE_BYTES`: size of each device (default 16 GiB). A plain byte count, or with a binary
//!   suffix (`K`, `M`, `G`, `T`, optionally followed by `iB`/`B`); a comma-separated list gives each device
//!   its own size (the last one repeats).
//! - `FAKECUDA_LARGEST_FREE`: the largest single physical allocation that can succeed (fragmentation).
//! - `FAKECUDA_STATE`: path of the device accounting shared between processes (see `state`).
//! - `FAKECUDA_LOG`: path of the driver's own call log (see `log`).
//! - `FAKECUDA_SHADOW_MAX`: allocations up to this size get a host-side copy of their contents on first
//!   write, so copies round-trip (default 64 MiB; 0 turns it off). Larger ones read back as zeros.
//! - `FAKECUDA_PITCH_ALIGN`: the row alignment `cuMemAllocPitch` pads to (default 512; real GPUs differ).
//! - `FAKECUDA_HOST_BYTES`: the pinned host memory `cuMemCreate` with a host location can take, per process
//!   (default 64 GiB); past it, `CUDA_ERROR_OUT_OF_MEMORY`.
//! - `FAKECUDA_LOG_QUERIES=1`: the log also has a line for each `cuCtxGetDevice`, `cuDeviceGetCount` and
//!   `cuDeviceGetUuid_v2` (addr 0, size 0, aux = the answer: the device, the count, the device asked about), so
//!   tests can count what the shim asks and see when it has read the devices.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Devices are numbered 0..MAX_DEVICES at most (the shared state file has room for this many).
pub const MAX_DEVICES: usize = 16;
/// `cuMemCreate` / `cuMemAddressReserve` granularity.
pub const GRANULARITY: u64 = 2 << 20;

pub struct Config {
    pub devices: usize,
    device_bytes: Vec<u64>,
    pub largest_free: Option<u64>,
    pub state_path: Option<PathBuf>,
    pub log_path: Option<PathBuf>,
    pub shadow_max: u64,
    pub host_bytes: u64,
    pub pitch_align: u64,
    pub log_queries: bool,
}

impl Config {
    /// Size of device `dev` in bytes.
    pub fn device_bytes(&self, dev: usize) -> u64 {
        let i = dev.min(self.device_bytes.len() - 1);
        self.device_bytes[i]
    }
}

pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(read)
}

fn read() -> Config {
    let devices = match var("FAKECUDA_DEVICES") {
        Some(s) => match s.trim().parse::<usize>() {
            Ok(n) => n.min(MAX_DEVICES),
            Err(_) => warn("FAKECUDA_DEVICES", &s, 2),
        },
        None => 2,
    };
    const DEFAULT_BYTES: u64 = 16 << 30;
    let device_bytes = match var("FAKECUDA_DEVICE_BYTES") {
        Some(s) => {
            let parsed: Option<Vec<u64>> = s.split(',').map(parse_bytes).collect();
            match parsed {
                Some(v) if !v.is_empty() => v,
                _ => vec![warn("FAKECUDA_DEVICE_BYTES", &s, DEFAULT_BYTES)],
            }
        }
        None => vec![DEFAULT_BYTES],
    };
    let largest_free = var("FAKECUDA_LARGEST_FREE").and_then(|s| {
        let v = parse_bytes(&s);
        if v.is_none() {
            warn("FAKECUDA_LARGEST_FREE", &s, 0);
        }
        v
    });
    let shadow_max = match var("FAKECUDA_SHADOW_MAX") {
        Some(s) => parse_bytes(&s).unwrap_or_else(|| warn("FAKECUDA_SHADOW_MAX", &s, 64 << 20)),
        None => 64 << 20,
    };
    Config {
        devices,
        device_bytes,
        largest_free,
        state_path: var("FAKECUDA_STATE").map(PathBuf::from),
        log_path: var("FAKECUDA_LOG").map(PathBuf::from),
        shadow_max,
        host_bytes: match var("FAKECUDA_HOST_BYTES") {
            Some(s) => parse_bytes(&s).unwrap_or_else(|| warn("FAKECUDA_HOST_BYTES", &s, 64 << 30)),
            None => 64 << 30,
        },
        pitch_align: var("FAKECUDA_PITCH_ALIGN")
            .and_then(|s| parse_bytes(&s))
            .filter(|a| a.is_power_of_two())
            .unwrap_or(512),
        log_queries: var("FAKECUDA_LOG_QUERIES").is_some_and(|s| s == "1"),
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

fn warn<T: std::fmt::Debug>(name: &str, value: &str, default: T) -> T {
    eprintln!("fakecuda: ignoring {name}={value:?} (not understood); using {default:?}");
    default
}

/// `123`, `64M`, `16GiB`, `1.5G` is not accepted (whole numbers only).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}
