//! What `report --json` and `oom --json` both carry (docs/JSON-SCHEMA.md): the trace's header, how a process
//! ended, timelines, and the call sites with their frames and the shim's notes.

use serde::Serialize;

use crate::callsites;
use crate::model::{self, Analysis, ExitStatus, ProcessStats};

/// `trace`: the header of the trace.
#[derive(Serialize)]
pub struct Trace<'a> {
    command: &'a [String],
    hostname: &'a str,
    start_unix_ns: u64,
    format_version: u16,
    vramtrace_version: &'a str,
}

impl<'a> Trace<'a> {
    pub fn of(a: &'a Analysis) -> Self {
        let h = &a.header;
        Trace {
            command: &h.command,
            hostname: &h.hostname,
            start_unix_ns: h.start_unix_ns,
            format_version: a.format_version,
            vramtrace_version: &h.vramtrace_version,
        }
    }
}

/// How a process ended, from its wait status: `{"code": 7}` or `{"signal": 9, "name": "SIGKILL",
/// "core_dumped": false}` (`null`, as `None`, when vramtrace did not reap it).
#[derive(Serialize)]
#[serde(untagged)]
pub enum Exit {
    Code {
        code: u64,
    },
    Signal {
        signal: u64,
        name: String,
        core_dumped: bool,
    },
}

impl Exit {
    pub fn of(e: Option<ExitStatus>) -> Option<Exit> {
        // As a u64: the schema's integers are unsigned (a code is 0-255, a signal positive).
        Some(match e? {
            ExitStatus::Code(c) => Exit::Code { code: c as u64 },
            ExitStatus::Signal { signal, core } => Exit::Signal {
                signal: signal as u64,
                name: vramtrace_format::signal_name(signal),
                core_dumped: core,
            },
        })
    }
}

/// `cut_bytes`: what was lost of a process's frame cut short, `null` for one that ended otherwise.
pub fn cut_bytes(p: &ProcessStats) -> Option<u64> {
    match p.ended {
        model::Ended::CutMidFrame { partial_bytes } => Some(partial_bytes as u64),
        _ => None,
    }
}

/// A timeline's bucket.
#[derive(Serialize)]
pub struct Bucket {
    t_ns: u64,
    max_bytes: u64,
    last_bytes: u64,
}

/// A timeline's buckets.
pub fn timeline(tl: &model::Timeline) -> Vec<Bucket> {
    tl.buckets
        .iter()
        .map(|b| Bucket {
            t_ns: b.t_ns,
            max_bytes: b.max_bytes,
            last_bytes: b.last_bytes,
        })
        .collect()
}

/// The label of call site `i` (an index into `call_sites`), `null` without one.
pub fn site_label(a: &Analysis, i: Option<usize>) -> Option<String> {
    i.and_then(|i| a.call_sites.sites.get(i)).map(|s| s.label())
}

/// The fields every output with call sites carries: `notes` (when the trace has any or has stacks), `stacks`,
/// `stacks_not_kept`, `call_sites` (when it has stacks). None of them for a trace without either.
#[derive(Serialize)]
pub struct CallSiteFields<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    notes: Option<Vec<Note<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stacks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stacks_not_kept: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_sites: Option<Vec<Site<'a>>>,
}

impl<'a> CallSiteFields<'a> {
    pub fn of(a: &'a Analysis) -> Self {
        let cs = &a.call_sites;
        let notes = (cs.present || !cs.notes.is_empty()).then(|| {
            cs.notes
                .iter()
                .map(|n| Note {
                    pid: n.pid,
                    time_ns: n.time_ns,
                    processes: n.processes,
                    text: &n.text,
                })
                .collect()
        });
        CallSiteFields {
            notes,
            stacks: cs.present.then_some(cs.stacks),
            stacks_not_kept: cs.present.then_some(cs.stacks_not_kept),
            call_sites: cs.present.then(|| {
                cs.sites
                    .iter()
                    .enumerate()
                    .map(|(i, s)| Site::of(i, s, a.caching_allocator(s.pid)))
                    .collect()
            }),
        }
    }
}

/// One of the shim's notes.
#[derive(Serialize)]
pub struct Note<'a> {
    pid: u32,
    time_ns: u64,
    processes: u64,
    text: &'a str,
}

/// A call site; `grew_cache`: its process ran a caching allocator (its allocations grew the cache).
#[derive(Serialize)]
pub struct Site<'a> {
    id: usize,
    pid: u32,
    stack: u32,
    label: String,
    grew_cache: bool,
    site_frame: Option<usize>,
    missing: bool,
    allocations: u64,
    allocated_bytes: u64,
    live_bytes_at_end: u64,
    per_device: Vec<SiteDevice>,
    frames: Vec<Frame<'a>>,
}

impl<'a> Site<'a> {
    fn of(id: usize, s: &'a callsites::Site, grew_cache: bool) -> Self {
        Site {
            id,
            pid: s.pid,
            stack: s.stack,
            label: s.label(),
            grew_cache,
            site_frame: s.site,
            missing: s.missing,
            allocations: s.allocations,
            allocated_bytes: s.allocated_bytes,
            live_bytes_at_end: s.live_bytes_at_end,
            per_device: s
                .per_device
                .iter()
                .map(|d| SiteDevice {
                    device: d.device,
                    allocations: d.allocations,
                    allocated_bytes: d.allocated_bytes,
                    peak_bytes: d.peak_bytes,
                    live_bytes_at_end: d.live_bytes_at_end,
                })
                .collect(),
            frames: s.frames.iter().map(Frame::of).collect(),
        }
    }
}

/// A call site's figures on one device.
#[derive(Serialize)]
pub struct SiteDevice {
    device: Option<u32>,
    allocations: u64,
    allocated_bytes: u64,
    peak_bytes: u64,
    live_bytes_at_end: u64,
}

/// One frame: `{kind, function, file, line, module, offset, address, inlined, note}`.
#[derive(Serialize)]
pub struct Frame<'a> {
    kind: &'static str,
    function: Option<&'a str>,
    file: Option<&'a str>,
    line: Option<u32>,
    module: Option<&'a str>,
    offset: Option<u64>,
    address: Option<u64>,
    inlined: bool,
    note: Option<&'a str>,
}

impl<'a> Frame<'a> {
    pub fn of(f: &'a callsites::Frame) -> Self {
        Frame {
            kind: f.kind.key(),
            function: f.function.as_deref(),
            file: f.file.as_deref(),
            line: f.line,
            module: f.module.as_deref(),
            offset: f.offset,
            address: f.address,
            inlined: f.inlined,
            note: f.note.as_deref(),
        }
    }
}
