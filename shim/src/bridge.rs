//! The door the Python bridge (bridge/vramtrace_bridge) uses to put what it sees inside a framework's
//! allocator into this process's stream of events: the records travel through the same channel and sender as
//! the driver's events, so they are ordered with them and survive exactly as they do. Called through ctypes,
//! never on a driver call's path; each call builds one record (allocation is fine here).

use std::ffi::{c_char, c_int, CStr};

use vramtrace_format::{Bridge, Framework, FrameworkSample, Record, NO_DEVICE};

use crate::record::{self, Offered};

/// The version of this C interface; the bridge refuses to talk to a shim whose version it does not know. 2: a
/// record's body is one JSON object (1: `key=value` lines).
pub const VERSION: c_int = 2;

/// Results the C functions return.
pub const QUEUED: c_int = 0;
pub const NOT_RECORDING: c_int = 1;
pub const DROPPED: c_int = 2;
pub const NOT_ACKNOWLEDGED: c_int = 3;
/// Past [`MAX_RECORD_BYTES`]: refused before anything is sent, said once in the trace.
pub const TOO_LARGE: c_int = 4;
pub const BAD_ARGUMENTS: c_int = -1;

/// The most a bridge record may carry (its name and fields). The bridge's largest (a holders walk's sixteen
/// holders) are a few KiB. A larger one would not fit the ring, whose drop count it would raise for a record
/// that is no event (the collector takes a count that rises in a ring never full for one the process wrote
/// itself), or over the socket, where the collector refuses a frame that large.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// The note said once, the first time a record is too large.
static TOO_LARGE_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The figures of one sample, in the order the C interface takes them.
pub const SAMPLE_VALUES: usize = 7;

/// A framework allocator's figures for one device. `values`: allocated, reserved, active, inactive split,
/// requested, allocation retries, out-of-memory count (`n` of them; missing ones are 0, extra ones ignored).
/// `ts_ns`: CLOCK_MONOTONIC when they were read, or 0 for now. A time ahead of now is not that clock's (a caller's
/// wall time, say): now instead, so that it cannot place the sample, or hold anything after it, in the future.
pub unsafe fn sample(framework: u32, device: u32, values: *const u64, n: u32, ts_ns: u64) -> c_int {
    let framework = match framework {
        1 => Framework::Torch,
        2 => Framework::Jax,
        _ => return BAD_ARGUMENTS,
    };
    if values.is_null() && n > 0 {
        return BAD_ARGUMENTS;
    }
    let mut v = [0u64; SAMPLE_VALUES];
    let n = (n as usize).min(SAMPLE_VALUES);
    if n > 0 {
        v[..n].copy_from_slice(std::slice::from_raw_parts(values, n));
    }
    let rec = Record::FrameworkSample(FrameworkSample {
        pid: std::process::id(),
        ts_ns: {
            let now = record::now();
            if ts_ns == 0 || ts_ns > now {
                now
            } else {
                ts_ns
            }
        },
        framework,
        device,
        allocated: v[0],
        reserved: v[1],
        active: v[2],
        inactive_split: v[3],
        requested: v[4],
        alloc_retries: v[5],
        ooms: v[6],
    });
    offered(record::offer(rec))
}

/// Any other bridge record: `what` names it, `doc` is one JSON object (UTF-8, `len` bytes, not necessarily
/// NUL-terminated), carried as it is: the collector reads it, as it reads everything a process sends, as
/// untrusted. With `ack`, waits (at most a second) until the collector holds it.
pub unsafe fn record(
    what: *const c_char,
    device: u32,
    doc: *const c_char,
    len: usize,
    ack: c_int,
) -> c_int {
    if what.is_null() || (doc.is_null() && len > 0) {
        return BAD_ARGUMENTS;
    }
    let what = CStr::from_ptr(what).to_string_lossy().into_owned();
    if what.len().saturating_add(len) > MAX_RECORD_BYTES {
        if let Some(r) = record::live() {
            if !TOO_LARGE_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                r.note(format!(
                    "the Python bridge's records past {} KiB were not recorded (the first: `{}`, {} bytes)",
                    MAX_RECORD_BYTES >> 10,
                    what.chars().take(64).collect::<String>(),
                    what.len().saturating_add(len)
                ));
            }
        }
        return TOO_LARGE;
    }
    let doc = if len == 0 {
        String::new()
    } else {
        String::from_utf8_lossy(std::slice::from_raw_parts(doc.cast::<u8>(), len)).into_owned()
    };
    let rec = Bridge {
        pid: std::process::id(),
        tid: record::tid(),
        ts_ns: record::now(),
        what,
        device: if device == u32::MAX {
            NO_DEVICE
        } else {
            device
        },
        ack: ack != 0,
        doc,
    };
    if rec.ack {
        if record::send_sync(Record::Bridge(rec)) {
            QUEUED
        } else if record::live().is_none() {
            NOT_RECORDING
        } else {
            NOT_ACKNOWLEDGED
        }
    } else {
        offered(record::offer(Record::Bridge(rec)))
    }
}

fn offered(o: Offered) -> c_int {
    match o {
        Offered::Queued => QUEUED,
        Offered::NotRecording => NOT_RECORDING,
        Offered::Dropped => DROPPED,
    }
}
