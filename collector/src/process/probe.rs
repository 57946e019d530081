//! What devices the machine has, asked of the driver in a process of its own (`vramtrace __probe`), so the
//! collector itself never loads libcuda, and a driver that hangs or crashes cannot take the collector with it.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::exit::Code;

/// A device as the driver gives it to the job: its total memory and UUID (`GPU-...`, as NVML names it; `None`
/// where the driver does not say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub total: u64,
    pub uuid: Option<String>,
}

/// The devices, by ordinal. `None` when there is no usable driver.
pub fn devices() -> Option<Vec<Device>> {
    let exe = std::env::current_exe().ok()?;
    let mut child = Command::new(exe)
        .arg("__probe")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // A driver can take seconds to initialise; it must not take forever.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    text.lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            let total = w.next()?.parse().ok()?;
            Some(Device {
                total,
                uuid: w.next().map(str::to_string),
            })
        })
        .collect()
}

/// `vramtrace __probe`: prints each device's total memory and UUID, one line each. Exit 3 when there is no
/// driver.
pub fn main() -> Code {
    type Init = unsafe extern "C" fn(u32) -> u32;
    type Count = unsafe extern "C" fn(*mut i32) -> u32;
    type Get = unsafe extern "C" fn(*mut i32, i32) -> u32;
    type Total = unsafe extern "C" fn(*mut usize, i32) -> u32;
    type Uuid = unsafe extern "C" fn(*mut [u8; 16], i32) -> u32;
    // SAFETY: in `vramtrace __probe`, a process of its own: the driver's functions are called with the types cuda.h
    // gives them, on locals of the sizes they write; a driver that crashes takes only this process.
    unsafe {
        let Ok(lib) = libloading::Library::new("libcuda.so.1") else {
            return 3;
        };
        let (Ok(init), Ok(count), Ok(get), Ok(total)) = (
            lib.get::<Init>(b"cuInit\0"),
            lib.get::<Count>(b"cuDeviceGetCount\0"),
            lib.get::<Get>(b"cuDeviceGet\0"),
            lib.get::<Total>(b"cuDeviceTotalMem_v2\0"),
        ) else {
            return 3;
        };
        let mut n = 0;
        if init(0) != 0 || count(&mut n) != 0 {
            return 3;
        }
        for i in 0..n {
            let (mut d, mut bytes) = (0, 0usize);
            if get(&mut d, i) != 0 || total(&mut bytes, d) != 0 {
                return 3;
            }
            let mut u = [0u8; 16];
            let uuid = lib
                .get::<Uuid>(b"cuDeviceGetUuid_v2\0")
                .or_else(|_| lib.get::<Uuid>(b"cuDeviceGetUuid\0"))
                .ok()
                .filter(|f| f(&mut u, d) == 0)
                .map(|_| vramtrace_format::gpu_uuid(&u));
            crate::say!("{bytes} {}", uuid.unwrap_or_default());
        }
    }
    0
}
