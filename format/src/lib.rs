//! The vocabulary both sides of vramtrace share: the events the shim records, the records it sends, and the
//! trace file the collector writes. The shim links this crate, so it stays small: bincode and thiserror only.
//!
//! Layout of a trace file (docs/TRACE-FORMAT.md has the full description):
//!
//! ```text
//! "VRAMTRC\0" | version: u16 LE | header length: u32 LE | header (bincode)
//! then frames: length: u32 LE | kind: u8 | payload       (length counts kind + payload)
//! ```
//!
//! The shim sends exactly these frames over its socket; the collector appends whole frames to the file as they
//! arrive, so a trace cut short by any kill is readable up to its last whole frame.

// Every unsafe block says why it is sound here (issue 26; the lint is the workspace's, Cargo.toml).

pub mod cap;
pub mod codec;
pub mod env;
pub mod keys;
pub mod reader;
pub mod ring;
pub mod settings;
pub mod ticks;

pub use codec::{DecodeError, FrameSplitter, Record};
pub use reader::{OpenError, Stop, TraceReader};

/// First bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"VRAMTRC\0";
/// Version of the trace format this build writes. Readers refuse newer versions with a clear message.
/// 1: events without call sites. 2: events carry a stack id (frame kind 8), with stacks (9), loaded objects (10)
/// and notes (11); a version-2 reader reads version-1 traces unchanged. 3: a release is recorded before the
/// driver answers it (result 0), and a refusal follows it (`flags::UNDONE`); a version-3 reader reads older
/// traces unchanged (there a refused release has its code and no `UNDONE`), an older one would take a refused
/// release for a done one.
pub const VERSION: u16 = 3;
/// The largest frame either side accepts; anything longer is corruption, not data.
pub const MAX_FRAME: u32 = 64 << 20;
/// `Event::device` when the device is unknown (frees: the collector knows it from the allocation).
pub const NO_DEVICE: u32 = u32::MAX;

/// The byte the collector sends back on a connection once an `Oom` frame (or a `Bridge` frame with `ack`) is
/// safely in the trace. Every such frame gets exactly one answer, in order: this, or [`OOM_NAK`].
pub const OOM_ACK: u8 = 0x06;
/// The answer for such a frame the collector could not write (a full disk): it is not in the trace.
pub const OOM_NAK: u8 = 0x15;

/// Flag bits of `Event::flags`.
pub mod flags {
    /// The `_ptsz` (per-thread default stream) variant of the entry point was called.
    pub const PTSZ: u8 = 1;
    /// vramtrace's cap refused the request; the driver was never called. `result` is then out-of-memory.
    pub const CAP_REFUSED: u8 = 2;
    /// Over the cap, but the cap is in warn mode: the request went to the driver anyway.
    pub const CAP_EXCEEDED: u8 = 4;
    /// A release the driver refused (`result` its code), published after the release itself: the shim
    /// publishes a release before calling the driver, so that its time comes before any reuse of what it frees.
    /// What it released is the process's again.
    pub const UNDONE: u8 = 8;
}

/// The driver entry points vramtrace records. The numbers are part of the trace format: never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Api {
    MemAlloc = 1,
    MemAllocPitch = 2,
    MemAllocManaged = 3,
    MemFree = 4,
    MemAllocAsync = 5,
    MemAllocFromPoolAsync = 6,
    MemFreeAsync = 7,
    MemCreate = 8,
    MemRelease = 9,
    MemMap = 10,
    MemUnmap = 11,
    MemAddressReserve = 12,
    MemAddressFree = 13,
    MemGetInfo = 14,
}

/// What an event does to the memory a process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Takes physical memory, keyed by the returned device pointer.
    AllocPtr,
    /// Gives back memory taken by `AllocPtr`.
    FreePtr,
    /// Takes physical memory, keyed by a `cuMemCreate` handle.
    CreateHandle,
    /// Gives back a `cuMemCreate` handle.
    ReleaseHandle,
    /// Address-space bookkeeping only (reserve, map, unmap, address free): no physical memory moves.
    AddressSpace,
    /// A memory-info query: `addr` = total, `size` = free, as the real driver reported them.
    Info,
}

impl Api {
    pub const ALL: [Api; 14] = [
        Api::MemAlloc,
        Api::MemAllocPitch,
        Api::MemAllocManaged,
        Api::MemFree,
        Api::MemAllocAsync,
        Api::MemAllocFromPoolAsync,
        Api::MemFreeAsync,
        Api::MemCreate,
        Api::MemRelease,
        Api::MemMap,
        Api::MemUnmap,
        Api::MemAddressReserve,
        Api::MemAddressFree,
        Api::MemGetInfo,
    ];

    pub fn from_u8(v: u8) -> Option<Api> {
        Api::ALL.get((v as usize).wrapping_sub(1)).copied()
    }

    /// The driver's name for the entry point (the versioned one, without `_ptsz`).
    pub fn name(self) -> &'static str {
        match self {
            Api::MemAlloc => "cuMemAlloc_v2",
            Api::MemAllocPitch => "cuMemAllocPitch_v2",
            Api::MemAllocManaged => "cuMemAllocManaged",
            Api::MemFree => "cuMemFree_v2",
            Api::MemAllocAsync => "cuMemAllocAsync",
            Api::MemAllocFromPoolAsync => "cuMemAllocFromPoolAsync",
            Api::MemFreeAsync => "cuMemFreeAsync",
            Api::MemCreate => "cuMemCreate",
            Api::MemRelease => "cuMemRelease",
            Api::MemMap => "cuMemMap",
            Api::MemUnmap => "cuMemUnmap",
            Api::MemAddressReserve => "cuMemAddressReserve",
            Api::MemAddressFree => "cuMemAddressFree",
            Api::MemGetInfo => "cuMemGetInfo_v2",
        }
    }

    pub fn effect(self) -> Effect {
        match self {
            Api::MemAlloc
            | Api::MemAllocPitch
            | Api::MemAllocManaged
            | Api::MemAllocAsync
            | Api::MemAllocFromPoolAsync => Effect::AllocPtr,
            Api::MemFree | Api::MemFreeAsync => Effect::FreePtr,
            Api::MemCreate => Effect::CreateHandle,
            Api::MemRelease => Effect::ReleaseHandle,
            Api::MemMap | Api::MemUnmap | Api::MemAddressReserve | Api::MemAddressFree => {
                Effect::AddressSpace
            }
            Api::MemGetInfo => Effect::Info,
        }
    }
}

/// One call into the driver, as the shim saw it. Fixed size and `Copy`: it travels through a channel from the
/// calling thread to the shim's sender thread without allocating.
///
/// Field use by API: allocations put the returned pointer in `addr` (0 when the call failed), the bytes in `size`
/// (pitch x height for `cuMemAllocPitch`), and the stream (async), pitch (pitch) or flags (managed) in `aux`.
/// Frees put the pointer in `addr` and the stream in `aux`; `size` is 0 (the collector knows it).
/// `cuMemCreate`/`cuMemRelease`: the handle in `addr`. `cuMemMap`: the address in `addr`, the handle in `aux`.
/// `cuMemGetInfo`: `addr` = total, `size` = free, as the real driver answered.
///
/// Timestamps: allocations are stamped when the driver returns, frees when they are called, so that sorting by
/// time puts a free before any reuse of its address by another thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC, nanoseconds.
    pub ts_ns: u64,
    pub tid: u32,
    pub api: Api,
    pub flags: u8,
    /// Device ordinal, or `NO_DEVICE`.
    pub device: u32,
    /// The `CUresult` the caller got back.
    pub result: u32,
    pub addr: u64,
    pub size: u64,
    pub aux: u64,
    /// The call site: a `Record::Stack` id of the same process, or 0 when none was captured.
    pub stack: u32,
}

impl Event {
    pub fn ok(&self) -> bool {
        self.result == 0
    }
}

/// A process announcing itself, first thing on its connection.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Hello {
    pub pid: u32,
    pub ppid: u32,
    pub ts_ns: u64,
    pub cmdline: Vec<String>,
    pub hostname: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub slurm_procid: Option<u32>,
    pub shim_version: String,
    /// Room for later additions without a format version bump.
    pub extra: Vec<(String, String)>,
}

/// How a process's connection ended, as the collector saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum EndKind {
    /// The shim flushed and said goodbye (normal exit through `exit()`).
    Goodbye,
    /// The connection closed without a goodbye: killed, `_exit`, or crashed.
    Vanished,
    /// The connection closed in the middle of a frame; `partial_bytes` of it were lost.
    CutMidFrame { partial_bytes: u32 },
}

impl Record {
    /// Whether records of frame kind `k` carry a time their process stamped ([`Record::process_time_mut`]):
    /// a reader can tell without decoding the frame.
    pub fn has_process_time(k: u8) -> bool {
        codec::kind_info(k).is_some_and(|i| i.process_time)
    }

    /// The time of a record a process stamps itself and sends whole (an out-of-memory record, a note, the
    /// bridge's records, a context torn down, a child reaped); `None` for the others (events carry their own, the
    /// collector
    /// writes the rest).
    pub fn process_time_mut(&mut self) -> Option<&mut u64> {
        match self {
            Record::Oom(o) => Some(&mut o.ts_ns),
            Record::Note { ts_ns, .. }
            | Record::ContextGone { ts_ns, .. }
            | Record::Reaped { ts_ns, .. }
            | Record::Devices { ts_ns, .. } => Some(ts_ns),
            Record::FrameworkSample(f) => Some(&mut f.ts_ns),
            Record::Bridge(b) => Some(&mut b.ts_ns),
            _ => None,
        }
    }

    /// The process a record speaks for; `None` for the collector's own records (`End`). The collector checks
    /// it against the process that sent the record (and rewrites it to the kernel's pid) before writing.
    pub fn pid_mut(&mut self) -> Option<&mut u32> {
        match self {
            Record::Hello(h) => Some(&mut h.pid),
            Record::Events { pid, .. }
            | Record::Dropped { pid, .. }
            | Record::Goodbye { pid, .. }
            | Record::Tick { pid, .. }
            | Record::ProcessEnd { pid, .. }
            | Record::Note { pid, .. }
            | Record::Lost { pid, .. }
            | Record::ContextGone { pid, .. } => Some(pid),
            Record::Oom(o) => Some(&mut o.pid),
            Record::Stack(s) => Some(&mut s.pid),
            Record::Objects(o) => Some(&mut o.pid),
            Record::FrameworkSample(f) => Some(&mut f.pid),
            Record::Bridge(b) => Some(&mut b.pid),
            Record::Exit(x) => Some(&mut x.pid),
            Record::Reaped { pid, .. } | Record::Devices { pid, .. } => Some(pid),
            Record::End { .. } | Record::FrameNames(_) => None,
        }
    }
}

/// Why records of a process were lost.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, bincode::Encode, bincode::Decode,
)]
pub enum LossCause {
    /// The process recorded faster than the collector drained its ring.
    RingFull,
    /// The collector did not drain for a while (stopped, or starved of CPU) and the ring filled.
    CollectorStalled,
    /// The process ended in the middle of writing them.
    DiedMidRecord,
    /// The process sent records it may not send (another process's, the collector's own, undecodable, or larger
    /// than the collector's room for unfinished records): refused at ingest, never written.
    Refused,
    /// The process ended while writing them, and they were no events: records of the shim's own (a call site, the
    /// loaded objects, the GPUs' names, a note) or of the Python bridge. Like `Refused`, no `Dropped` beside it.
    DiedMidNonEvent,
}

impl LossCause {
    pub fn describe(self) -> &'static str {
        match self {
            LossCause::RingFull => {
                "the program recorded faster than the collector drained its ring (--lossless waits instead; \
                 --ring-size makes the ring larger)"
            }
            LossCause::CollectorStalled => {
                "the collector was stalled (stopped, or starved of CPU) while the process ran, and its ring filled"
            }
            LossCause::DiedMidRecord => "the process ended while writing them",
            LossCause::DiedMidNonEvent => {
                "the process ended while writing them; they were records of the shim's own or of the Python bridge \
                 (a call site, the loaded objects, the GPUs' names, a note, a sample), not allocations or frees"
            }
            LossCause::Refused => {
                "the process sent records it may not send (for another process, the collector's own kinds, \
                 undecodable, or too large for the collector's room); they were refused"
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LossCause::RingFull => "ring_full",
            LossCause::CollectorStalled => "collector_stalled",
            LossCause::DiedMidRecord => "died_mid_record",
            LossCause::Refused => "refused",
            LossCause::DiedMidNonEvent => "died_mid_non_event",
        }
    }
}

/// How a process ended, from its wait status (frame kind 14).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Exit {
    pub pid: u32,
    /// CLOCK_MONOTONIC when the collector reaped it.
    pub ts_ns: u64,
    pub status: ExitStatus,
}

/// A wait status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum ExitStatus {
    /// `exit(code)` or `_exit(code)`, or a return from `main`.
    Code(i32),
    /// Ended by signal `signal`; `core` when it dumped core.
    Signal { signal: i32, core: bool },
}

impl ExitStatus {
    /// From a raw `waitpid` status; `None` for a stopped or continued one.
    pub fn from_wait(status: i32) -> Option<ExitStatus> {
        if libc_like::exited(status) {
            Some(ExitStatus::Code(libc_like::exit_code(status)))
        } else if libc_like::signaled(status) {
            Some(ExitStatus::Signal {
                signal: libc_like::term_sig(status),
                core: status & 0x80 != 0,
            })
        } else {
            None
        }
    }

    /// From what `waitid` says of a child (`siginfo_t`'s `si_code` and `si_status`): `CLD_EXITED` (1) with the
    /// exit code, `CLD_KILLED` (2) or `CLD_DUMPED` (3) with the signal; `None` for the others (stopped, trapped,
    /// continued).
    pub fn from_child_info(si_code: i32, si_status: i32) -> Option<ExitStatus> {
        match si_code {
            libc_like::CLD_EXITED => Some(ExitStatus::Code(si_status & 0xff)),
            libc_like::CLD_KILLED | libc_like::CLD_DUMPED => Some(ExitStatus::Signal {
                signal: si_status,
                core: si_code == libc_like::CLD_DUMPED,
            }),
            _ => None,
        }
    }

    /// The code a shell reports: the exit code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal { signal, .. } => 128 + signal,
        }
    }

    /// "exited with code 7", "killed by SIGKILL (signal 9)".
    pub fn describe(self) -> String {
        match self {
            ExitStatus::Code(c) => format!("exited with code {c}"),
            ExitStatus::Signal { signal, core } => format!(
                "killed by {} (signal {signal}){}",
                signal_name(signal),
                if core { ", core dumped" } else { "" }
            ),
        }
    }
}

/// The usual name of a Linux signal (`SIGKILL`), or `SIG<n>`.
pub fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match NAMES.get(signal as usize) {
        Some(n) if signal > 0 && !n.is_empty() => (*n).to_string(),
        _ => format!("SIG{signal}"),
    }
}

/// The `W*` macros of `<sys/wait.h>` (Linux), without a libc dependency in this crate.
mod libc_like {
    pub const CLD_EXITED: i32 = 1;
    pub const CLD_KILLED: i32 = 2;
    pub const CLD_DUMPED: i32 = 3;
    pub fn exited(s: i32) -> bool {
        s & 0x7f == 0
    }
    pub fn exit_code(s: i32) -> i32 {
        (s >> 8) & 0xff
    }
    pub fn signaled(s: i32) -> bool {
        ((s & 0x7f) + 1) as i8 >> 1 > 0
    }
    pub fn term_sig(s: i32) -> i32 {
        s & 0x7f
    }
}

/// Which framework's allocator a bridge record describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum Framework {
    /// PyTorch's CUDA caching allocator (or its `cudaMallocAsync` backend).
    Torch,
    /// XLA's allocator under JAX (`jax.Device.memory_stats()`).
    Jax,
}

impl Framework {
    pub fn name(self) -> &'static str {
        match self {
            Framework::Torch => "pytorch",
            Framework::Jax => "jax",
        }
    }
}

/// One sample of a framework allocator's figures for one device of one process (frame kind 12). Sent only when
/// a figure changed since the process's last sample of that device.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct FrameworkSample {
    pub pid: u32,
    /// CLOCK_MONOTONIC when the figures were read.
    pub ts_ns: u64,
    pub framework: Framework,
    pub device: u32,
    /// Bytes in tensors (PyTorch `allocated_bytes.all.current`; JAX `bytes_in_use`).
    pub allocated: u64,
    /// Bytes the allocator holds from the driver (PyTorch `reserved_bytes.all.current`; JAX `bytes_reserved`,
    /// else `pool_bytes`, else `bytes_limit`).
    pub reserved: u64,
    /// PyTorch `active_bytes.all.current` (allocated plus blocks awaiting a stream's free); 0 otherwise.
    pub active: u64,
    /// PyTorch `inactive_split_bytes.all.current`: free bytes inside segments that cannot be released.
    pub inactive_split: u64,
    /// PyTorch `requested_bytes.all.current` (what callers asked for, before rounding).
    pub requested: u64,
    /// PyTorch `num_alloc_retries`: the cache was flushed and a driver allocation retried.
    pub alloc_retries: u64,
    /// PyTorch `num_ooms`.
    pub ooms: u64,
}

/// A bridge record other than a sample (frame kind 21): `what` says which, `doc` carries its figures as one
/// JSON object, nested where the data is (a walk's holders, the problems at attach), its keys and their types
/// per kind as bridge/schema.json declares them (the collector's `model::analysis::bridge::doc` reads it).
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Bridge {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// `attach`, `oom`, `snapshot`, `note`, `exit`, ... ([`keys::bridge::Kind`]).
    pub what: String,
    /// Device ordinal, or `NO_DEVICE`.
    pub device: u32,
    /// The bridge waits for the collector to hold this record (acknowledgement byte) before going on.
    pub ack: bool,
    /// One JSON object (UTF-8). Not checked by the shim: the process wrote it, and its reader treats it as
    /// untrusted.
    pub doc: String,
}

impl Bridge {
    /// Its kind; `None` for a kind this build does not know (a newer bridge's: skipped by every reader).
    pub fn kind(&self) -> Option<keys::bridge::Kind> {
        keys::bridge::Kind::of(&self.what)
    }
}

/// A call site: where an allocation came from.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Stack {
    pub pid: u32,
    /// Unique within the process, never 0.
    pub id: u32,
    /// Return addresses, innermost first (the caller of the driver entry point first), at most 64. Absolute
    /// addresses in the process; `Objects` maps them to files and offsets.
    pub native: Vec<u64>,
    /// The allocating thread's Python frames, innermost first; empty when it was running no Python.
    pub python: Vec<PyFrame>,
}

#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct PyFrame {
    pub file: String,
    pub function: String,
    /// 0 when unknown.
    pub line: u32,
}

/// Names of native frames, resolved by the collector at the end of `run` from the objects the job loaded (frame
/// kind 20). A frame is an object (its path and build id, as the `Objects` records name it) and an offset in it
/// (a return address less the object's load bias); its names are the functions there, innermost first (all but
/// the last inlined into the next), with file and line where debug information had them. Strings are held once,
/// in `strings`, and named by index. Only frames that resolved to something are listed: a frame not listed is
/// resolved from the reader's own files, as in traces without this record.
#[derive(Clone, Debug, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct FrameNames {
    pub strings: Vec<String>,
    pub objects: Vec<NamedObject>,
}

/// One object's named frames ([`FrameNames`]).
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct NamedObject {
    /// As the `Objects` records name it (empty: the main program).
    pub path: String,
    /// As the `Objects` records give it (empty when it has none).
    pub build_id: Vec<u8>,
    pub frames: Vec<NamedFrame>,
}

/// The functions at one offset of an object ([`FrameNames`]).
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct NamedFrame {
    /// The return address less the object's load bias (what a report shows as `module+0xoffset`).
    pub offset: u64,
    /// Innermost first; every one but the last was inlined into the next.
    pub functions: Vec<NamedFunction>,
}

/// One function at a frame ([`NamedFrame`]): indices into [`FrameNames::strings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct NamedFunction {
    /// Demangled.
    pub function: Option<u32>,
    pub file: Option<u32>,
    /// 0 when unknown.
    pub line: u32,
}

/// The objects (executable and shared libraries) loaded in a process.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Objects {
    pub pid: u32,
    pub ts_ns: u64,
    pub objects: Vec<Object>,
}

#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Object {
    /// As the loader names it (empty for the main program: `/proc/self/exe` is resolved into it).
    pub path: String,
    /// The load bias: file virtual address + bias = address in the process.
    pub bias: u64,
    /// Executable segments, as absolute [start, end) ranges in the process.
    pub text: Vec<(u64, u64)>,
    /// The GNU build id (NT_GNU_BUILD_ID), empty when the object has none.
    pub build_id: Vec<u8>,
}

/// What the shim knew at the moment an allocation failed for lack of memory.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Oom {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// Device ordinal, or `NO_DEVICE`.
    pub device: u32,
    /// `Api` number of the call that failed.
    pub api: u8,
    /// `flags` bits of the call (`CAP_REFUSED` when the cap, not the device, said no).
    pub flags: u8,
    pub requested_bytes: u64,
    /// The `CUresult` the program got.
    pub result: u32,
    /// The real driver's free and total memory for the device at that moment (`cuMemGetInfo_v2`, not the
    /// cap's virtual figures); `None` if the driver could not say (no current context).
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    /// The cap on the device, if one applied.
    pub cap_bytes: Option<u64>,
    /// The job's bytes in use on the device by the cap's ledger (all processes), when capped.
    pub job_used_bytes: Option<u64>,
    /// This process's bytes in use on the device by the cap's ledger, when capped.
    pub process_used_bytes: Option<u64>,
    /// Room for later additions without a format version bump.
    pub extra: Vec<(String, String)>,
}

/// The header at the top of every trace file.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct TraceHeader {
    /// Wall clock at the start, ns since the Unix epoch (for people).
    pub start_unix_ns: u64,
    /// CLOCK_MONOTONIC at the start (event timestamps are on this clock).
    pub start_mono_ns: u64,
    pub command: Vec<String>,
    pub hostname: String,
    pub vramtrace_version: String,
    /// Room for later additions without a format version bump.
    pub extra: Vec<(String, String)>,
}

impl TraceHeader {
    /// The value the collector wrote under `key` in `extra` (`keys::header`), if any.
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.extra
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A GPU's UUID as NVIDIA's tools write it (`nvidia-smi -L`, NVML, dcgm-exporter):
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn gpu_uuid(u: &[u8; 16]) -> String {
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests;
