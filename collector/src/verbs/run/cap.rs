//! The cap before the job starts (its spec checked against the devices) and while it runs (the GPU's own count
//! through `cap_check`, writing into the trace).

use std::sync::{Arc, Mutex};

use anyhow::bail;
use vramtrace_format::cap::CapSpec;
use vramtrace_format::{codec, env, keys, Record};

use super::args::{CapMode, RunArgs};
use crate::cap_check::CapOn;
use crate::names::ticks::mono_ns;
use crate::names::units;
use crate::process::probe;
use crate::receive::TraceWriter;

/// Keys and values for the trace header's `extra`.
pub(super) type HeaderKeys = Vec<(String, String)>;

/// What the cap's check reads (the trace's count, as the metrics read it) and writes (its notes).
pub(super) struct CheckSink {
    pub(super) live: Arc<crate::live::Live>,
    pub(super) trace: Arc<Mutex<TraceWriter>>,
}

impl crate::cap_check::Sink for CheckSink {
    fn counted(&self) -> Vec<crate::live::Counted> {
        self.live.counted()
    }

    fn note(&self, pid: u32, text: &str) {
        let mut buf = Vec::new();
        codec::put_record(
            &mut buf,
            &Record::Note {
                pid,
                ts_ns: mono_ns(),
                text: text.to_string(),
            },
        );
        if let Ok(mut w) = self.trace.lock() {
            w.write(pid, &buf);
        }
    }
}

/// `--cap-mode`, else `VRAMTRACE_CAP_MODE` (as the shim reads it), else enforce; anything else is bad usage.
pub(super) fn cap_mode(args: &RunArgs) -> anyhow::Result<CapMode> {
    if let Some(m) = args.cap_mode {
        return Ok(m);
    }
    env::cap_mode(std::env::var(env::CAP_MODE).ok().as_deref())
        .map(CapMode::from)
        .map_err(|e| anyhow::anyhow!(e))
}

/// Checks a cap before anything starts: its syntax, and the devices it names against the machine's. Returns the
/// trace header's record of it: the spec, the mode, and per device the cap and the device's size.
pub(super) fn check_cap(spec: &str, mode: CapMode) -> anyhow::Result<(HeaderKeys, Vec<CapOn>)> {
    let parsed = CapSpec::parse(spec).map_err(|e| anyhow::anyhow!("--cap {spec}: {e}"))?;
    let mut extra = vec![
        (keys::header::CAP.to_string(), spec.to_string()),
        (keys::header::CAP_MODE.to_string(), mode.name().to_string()),
    ];
    let Some(devices) = probe::devices() else {
        crate::note!("vramtrace: no CUDA driver answered; the cap is applied to whatever devices the job finds");
        return Ok((extra, Vec::new()));
    };
    if let Some(d) = parsed.max_device() {
        if d as usize >= devices.len() {
            bail!(
                "--cap {spec}: there is no device {d} (this machine has {} device{})",
                devices.len(),
                if devices.len() == 1 { "" } else { "s" }
            );
        }
    }
    let mut on = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let total = &dev.total;
        extra.push((
            keys::header::per_device(keys::header::DEVICE_TOTAL, i as u32),
            total.to_string(),
        ));
        if let Some(a) = parsed.amount(i as u32) {
            let bytes = a.bytes(*total);
            if bytes > *total {
                crate::note!(
                    "vramtrace: the cap on device {i} ({}) is above its memory ({}): the device's own size is the limit",
                    units::bytes(bytes),
                    units::bytes(*total)
                );
            }
            extra.push((
                keys::header::per_device(keys::header::CAP_BYTES, i as u32),
                bytes.to_string(),
            ));
            // Checked against NVML's per-process count, which names GPUs by UUID.
            if let Some(uuid) = &dev.uuid {
                on.push(CapOn {
                    uuid: uuid.clone(),
                    ordinal: i as u32,
                    bytes: bytes.min(*total),
                });
            }
        }
    }
    Ok((extra, on))
}
