//! NVML's per-process listing, loaded at run time: `nvmlDeviceGetComputeRunningProcesses` (v3, v2, else v1), what
//! `nvidia-smi --query-compute-apps` reads, for the GPUs named by UUID.

/// One line of NVML's listing: a process holding memory on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProc {
    pub uuid: String,
    pub pid: u32,
    pub bytes: u64,
}

/// NVML, loaded at run time (the collector never links it): the calls the check needs.
pub struct Nvml {
    _lib: libloading::Library,
    devices: Vec<(String, usize)>,
    procs: ProcsFn,
    v1: bool,
}

type ProcsFn = unsafe extern "C" fn(usize, *mut u32, *mut u8) -> u32;

/// `nvmlProcessInfo_t` (v2/v3) is 24 bytes (pid, pad, bytes, two instance ids); v1 is 16 (pid, pad, bytes).
const INFO: usize = 24;
const INFO_V1: usize = 16;
/// `NVML_VALUE_NOT_AVAILABLE`: no figure for this process (a process NVML may not look into).
const NOT_AVAILABLE: u64 = u64::MAX;

impl Nvml {
    /// Loads `libnvidia-ml.so.1` and lists its devices by UUID.
    pub fn open() -> Result<Nvml, String> {
        type Init = unsafe extern "C" fn() -> u32;
        type Count = unsafe extern "C" fn(*mut u32) -> u32;
        type Handle = unsafe extern "C" fn(u32, *mut usize) -> u32;
        type Uuid = unsafe extern "C" fn(usize, *mut u8, u32) -> u32;
        // SAFETY: NVML's documented C API, called with the types nvml.h gives them; buffers are ours and sized
        // as passed.
        unsafe {
            let lib = libloading::Library::new("libnvidia-ml.so.1")
                .map_err(|e| format!("cannot load NVML: {e}"))?;
            let init: Init = *lib
                .get::<Init>(b"nvmlInit_v2\0")
                .map_err(|e| format!("NVML: {e}"))?;
            let count: Count = *lib
                .get::<Count>(b"nvmlDeviceGetCount_v2\0")
                .map_err(|e| format!("NVML: {e}"))?;
            let handle: Handle = *lib
                .get::<Handle>(b"nvmlDeviceGetHandleByIndex_v2\0")
                .map_err(|e| format!("NVML: {e}"))?;
            let uuid: Uuid = *lib
                .get::<Uuid>(b"nvmlDeviceGetUUID\0")
                .map_err(|e| format!("NVML: {e}"))?;
            let (procs, v1) = match lib
                .get::<ProcsFn>(b"nvmlDeviceGetComputeRunningProcesses_v3\0")
                .or_else(|_| lib.get::<ProcsFn>(b"nvmlDeviceGetComputeRunningProcesses_v2\0"))
            {
                Ok(f) => (*f, false),
                Err(_) => (
                    *lib.get::<ProcsFn>(b"nvmlDeviceGetComputeRunningProcesses\0")
                        .map_err(|e| format!("NVML: {e}"))?,
                    true,
                ),
            };
            let r = init();
            if r != 0 {
                return Err(format!("nvmlInit_v2 failed ({r})"));
            }
            let mut n = 0u32;
            if count(&mut n) != 0 {
                return Err("nvmlDeviceGetCount_v2 failed".into());
            }
            let mut devices = Vec::new();
            for i in 0..n.min(64) {
                let mut h = 0usize;
                let mut buf = [0u8; 96];
                if handle(i, &mut h) != 0 || uuid(h, buf.as_mut_ptr(), buf.len() as u32) != 0 {
                    continue;
                }
                let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
                devices.push((String::from_utf8_lossy(&buf[..end]).into_owned(), h));
            }
            Ok(Nvml {
                _lib: lib,
                devices,
                procs,
                v1,
            })
        }
    }

    /// Every process NVML lists on the GPUs named (by UUID), with its bytes, and apart those it gives no figure
    /// for (MIG instances, another user's process read without the right): (GPU UUID, pid). A GPU whose listing
    /// fails is passed over, not the others.
    pub fn read(&self, uuids: &[&str]) -> (Vec<GpuProc>, Vec<(String, u32)>) {
        let mut out = Vec::new();
        let mut unmeasured = Vec::new();
        for (uuid, h) in self
            .devices
            .iter()
            .filter(|(u, _)| uuids.contains(&u.as_str()))
        {
            if let Ok(v) = self.read_one(uuid, *h) {
                for p in v {
                    match p.bytes {
                        NOT_AVAILABLE => unmeasured.push((p.uuid, p.pid)),
                        _ => out.push(p),
                    }
                }
            }
        }
        (out, unmeasured)
    }

    fn read_one(&self, uuid: &str, h: usize) -> Result<Vec<GpuProc>, String> {
        let size = if self.v1 { INFO_V1 } else { INFO };
        let mut out = Vec::new();
        {
            let mut room = 64u32;
            let mut buf;
            loop {
                buf = vec![0u8; room as usize * size];
                let mut n = room;
                // SAFETY: `buf` holds `room` entries of the struct's size; NVML writes at most `n` of them.
                let r = unsafe { (self.procs)(h, &mut n, buf.as_mut_ptr()) };
                match r {
                    0 => {
                        buf.truncate(n.min(room) as usize * size);
                        break;
                    }
                    // NVML_ERROR_INSUFFICIENT_SIZE: more processes than room; `n` says how many.
                    7 if n > room && n <= 1 << 16 => room = n + 8,
                    r => return Err(format!("NVML's process listing failed ({r})")),
                }
            }
            for e in buf.chunks_exact(size) {
                let pid = u32::from_ne_bytes(e[0..4].try_into().expect("4 bytes"));
                let bytes = u64::from_ne_bytes(e[8..16].try_into().expect("8 bytes"));
                out.push(GpuProc {
                    uuid: uuid.to_string(),
                    pid,
                    bytes,
                });
            }
        }
        Ok(out)
    }
}
