//! All byte-level encoding lives here, so the encoder can be swapped without touching either side.
//!
//! Records other than events are bincode 2 (standard config: little endian, variable-length integers).
//! Event batches, the bulk of every trace, use a packed layout of their own to stay well under 24 bytes an event:
//! each field is an unsigned LEB128 varint, and the time, thread, address and aux fields are zigzag deltas
//! against the previous event of the batch (consecutive events share threads and streams, and a free usually
//! names the address its allocation returned).

use crate::Api;
use crate::{
    Bridge, EndKind, Event, Exit, ExitStatus, FrameworkSample, Hello, Objects, Oom, Record, Stack,
    TraceHeader, MAGIC, MAX_FRAME, NO_DEVICE, VERSION,
};

/// Who writes a frame kind: what a collector lets a process send, and what it writes itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// A process's shim, once, first on its connection (the hello).
    Hello,
    /// A process's shim: its events, through its ring or its socket.
    Events,
    /// A process's shim (or the Python bridge through it), after its hello, for itself only.
    Process,
    /// A process's shim for a child it reaped: in its ring, or alone on a connection of its own. The collector
    /// believes it only as far as the kernel confirms, and writes an `Exit` instead.
    Reaper,
    /// The collector alone (counts, promises, ends); refused from any process.
    Collector,
}

/// One frame kind as the format declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindInfo {
    pub kind: u8,
    /// Its constant's name in [`kind`].
    pub name: &'static str,
    pub writer: Writer,
    /// Its records carry a time their process stamped ([`crate::Record::process_time_mut`]).
    pub process_time: bool,
}

/// Declares every frame kind once: its number (a constant in [`kind`]), who writes it and whether its process
/// stamps its time. What the shim, the collector's intake and the readers ask of a kind comes from [`KINDS`].
macro_rules! frame_kinds {
    ($($(#[$doc:meta])* $name:ident = $n:literal, $writer:ident, $time:literal;)*) => {
        /// Frame kinds. Part of the format: never reuse a number. Readers skip kinds they do not know.
        pub mod kind {
            $($(#[$doc])* pub const $name: u8 = $n;)*
        }

        /// Every frame kind, in number order.
        pub const KINDS: &[KindInfo] = &[$(KindInfo {
            kind: $n,
            name: stringify!($name),
            writer: Writer::$writer,
            process_time: $time,
        },)*];
    };
}

frame_kinds! {
    HELLO = 1, Hello, false;
    EVENTS = 2, Events, false;
    DROPPED = 3, Collector, false;
    GOODBYE = 4, Process, false;
    TICK = 5, Collector, false;
    PROCESS_END = 6, Collector, false;
    OOM = 7, Process, true;
    /// Events with a stack id each (version 2); kind 2 is read as events without.
    EVENTS_STACKS = 8, Events, false;
    STACK = 9, Process, false;
    OBJECTS = 10, Process, false;
    NOTE = 11, Process, true;
    /// A framework allocator's figures, from the Python bridge (no version bump: older readers skip it).
    FRAMEWORK_SAMPLE = 12, Process, true;
    /// Any other bridge record.
    BRIDGE = 13, Process, true;
    /// How a process of the job ended, as the wrapper reaped it (no version bump: older readers skip it).
    EXIT = 14, Collector, false;
    /// Why records were lost (`Record::Lost`), written by the collector.
    LOST = 15, Collector, false;
    /// Every context of a process on a device was torn down (`Record::ContextGone`), from the shim.
    CONTEXT_GONE = 16, Process, true;
    /// The collector finished the trace (`Record::End`; no version bump: older readers skip it).
    END = 17, Collector, false;
    /// A process reaped a child of its own (`Record::Reaped`), from the reaper's shim: in its ring, or alone on
    /// a connection of its own (no version bump: older readers skip it).
    REAPED = 18, Reaper, true;
    /// The GPUs a process sees, by UUID (`Record::Devices`), from its shim (no version bump: older readers
    /// skip it).
    DEVICES = 19, Process, true;
}

/// What the format declares of frame kind `k`; `None` for a kind this build does not know.
pub fn kind_info(k: u8) -> Option<&'static KindInfo> {
    KINDS.iter().find(|i| i.kind == k)
}

/// Bytes before the first frame's payload: length (4) and kind (1).
pub const FRAME_OVERHEAD: usize = 5;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("frame payload ends early")]
    Short,
    #[error("bad varint")]
    BadVarint,
    #[error("unknown API number {0}")]
    BadApi(u8),
    #[error("frame length {0} is over the limit")]
    FrameTooLong(u32),
    #[error("empty frame")]
    EmptyFrame,
    #[error("undecodable record: {0}")]
    Bincode(String),
    #[error("not a vramtrace trace (bad magic)")]
    BadMagic,
    #[error("trace format version {found} is newer than this vramtrace reads (up to {supported})")]
    NewerVersion { found: u16, supported: u16 },
    #[error("{0} trailing bytes after the record")]
    Trailing(usize),
}

fn config() -> impl bincode::config::Config {
    // The limit keeps a corrupt length from asking for gigabytes.
    bincode::config::standard().with_limit::<{ MAX_FRAME as usize }>()
}

fn bincode_to(out: &mut Vec<u8>, value: &impl bincode::Encode) {
    // Writing to a Vec cannot fail.
    let _ = bincode::encode_into_std_write(value, out, config());
}

fn bincode_from<T: bincode::Decode<()>>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (v, used): (T, usize) = bincode::decode_from_slice(bytes, config())
        .map_err(|e| DecodeError::Bincode(e.to_string()))?;
    if used != bytes.len() {
        return Err(DecodeError::Trailing(bytes.len() - used));
    }
    Ok(v)
}

// ---- varints ---------------------------------------------------------------------------------------------

#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

#[inline]
fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A cursor over a payload; every read is bounds-checked.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// A varint of up to 8 bytes from the 8 bytes `word` starts with (little-endian): its value and length, or None
/// when it is longer. Why: nearly every field of an event is such a varint; its length comes from the first byte
/// without a continuation bit, and its 7-bit groups are joined by three shifts, with no loop.
#[inline(always)]
fn word_varint(word: u64) -> Option<(u64, usize)> {
    if word & 0x80 == 0 {
        return Some((word & 0x7f, 1));
    }
    let ends = !word & 0x8080_8080_8080_8080;
    if ends == 0 {
        return None;
    }
    // Every bit up to the end byte's top bit: the varint's bytes.
    let x = word & (ends ^ (ends - 1)) & 0x7f7f_7f7f_7f7f_7f7f;
    let x = ((x & 0x7f00_7f00_7f00_7f00) >> 1) | (x & 0x007f_007f_007f_007f);
    let x = ((x & 0x3fff_0000_3fff_0000) >> 2) | (x & 0x0000_3fff_0000_3fff);
    let x = ((x & 0x0fff_ffff_0000_0000) >> 4) | (x & 0x0000_0000_0fff_ffff);
    Some((x, (ends.trailing_zeros() / 8 + 1) as usize))
}

/// Bytes an event takes at most (nine varints of 10 bytes and two bytes), plus the 8 a word read looks at: from
/// an event's start with this many left, no read of it can pass the payload's end.
const EVENT_WINDOW: usize = 9 * 10 + 2 + 8;

impl<'a> Cursor<'a> {
    #[inline]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        if let Some(b) = self.bytes.get(self.pos..self.pos + 8) {
            if let Some((x, len)) = word_varint(u64::from_le_bytes(b.try_into().expect("8 bytes")))
            {
                self.pos += len;
                return Ok(x);
            }
        }
        self.varint_slow()
    }

    /// [`Cursor::varint`] without its bounds check, for a field of an event that started with at least
    /// [`EVENT_WINDOW`] bytes left.
    #[inline(always)]
    fn varint_in_window(&mut self) -> Result<u64, DecodeError> {
        debug_assert!(self.pos + 8 <= self.bytes.len());
        // SAFETY: the event began with EVENT_WINDOW bytes left and its fields before this one took at most
        // 8 * 10 + 2 bytes (a varint is at most 10 long: `varint_slow` fails past that), so 8 remain at `pos`.
        let word = u64::from_le(unsafe {
            self.bytes
                .as_ptr()
                .add(self.pos)
                .cast::<u64>()
                .read_unaligned()
        });
        match word_varint(word) {
            Some((x, len)) => {
                self.pos += len;
                Ok(x)
            }
            None => self.varint_slow(),
        }
    }

    /// [`Cursor::byte`] without its bounds check, as [`Cursor::varint_in_window`].
    #[inline(always)]
    fn byte_in_window(&mut self) -> u8 {
        debug_assert!(self.pos < self.bytes.len());
        // SAFETY: as in `varint_in_window`.
        let b = unsafe { *self.bytes.get_unchecked(self.pos) };
        self.pos += 1;
        b
    }

    /// The byte-at-a-time varint, for the rare long one and a payload's last bytes. The position goes in and
    /// comes back by value: were the cursor itself passed, its address would escape into this (cold) call, and
    /// the hot loop would keep the position in memory, a store and a load on every field.
    #[inline(always)]
    fn varint_slow(&mut self) -> Result<u64, DecodeError> {
        let (v, pos) = varint_slow_at(self.bytes, self.pos)?;
        self.pos = pos;
        Ok(v)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.bytes.get(self.pos).ok_or(DecodeError::Short)?;
        self.pos += 1;
        Ok(b)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
}

/// [`Cursor::varint_slow`]'s reading: the value and the position after it.
#[cold]
#[inline(never)]
fn varint_slow_at(bytes: &[u8], mut pos: usize) -> Result<(u64, usize), DecodeError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = *bytes.get(pos).ok_or(DecodeError::Short)?;
        pos += 1;
        if shift == 63 && b > 1 {
            return Err(DecodeError::BadVarint);
        }
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok((v, pos));
        }
        shift += 7;
        if shift > 63 {
            return Err(DecodeError::BadVarint);
        }
    }
}

// ---- frames ----------------------------------------------------------------------------------------------

/// Appends one frame: a length placeholder, the kind, whatever `body` writes, then the real length.
#[inline]
pub fn put_frame(out: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, kind]);
    body(out);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends an events frame (kind 8: with stack ids). The shim's hot path: no allocation beyond `out` growing.
pub fn put_events(out: &mut Vec<u8>, pid: u32, events: &[Event]) {
    put_frame(out, kind::EVENTS_STACKS, |out| {
        put_varint(out, pid as u64);
        put_varint(out, events.len() as u64);
        let (mut ts, mut tid, mut addr, mut aux) = (0u64, 0u32, 0u64, 0u64);
        for e in events {
            put_varint(out, zigzag(e.ts_ns.wrapping_sub(ts) as i64));
            put_varint(out, zigzag(e.tid.wrapping_sub(tid) as i32 as i64));
            out.push(e.api as u8);
            out.push(e.flags);
            // NO_DEVICE wraps to 0, so the common devices take one byte.
            put_varint(out, e.device.wrapping_add(1) as u64);
            put_varint(out, e.result as u64);
            put_varint(out, zigzag(e.addr.wrapping_sub(addr) as i64));
            put_varint(out, e.size);
            put_varint(out, zigzag(e.aux.wrapping_sub(aux) as i64));
            put_varint(out, e.stack as u64);
            ts = e.ts_ns;
            tid = e.tid;
            addr = e.addr;
            aux = e.aux;
        }
    });
}

/// Decodes an events payload of kind 8 (with stack ids), appending to `into`. Returns the pid.
pub fn decode_events(payload: &[u8], into: &mut Vec<Event>) -> Result<u32, DecodeError> {
    decode_events_of(kind::EVENTS_STACKS, payload, into)
}

/// Decodes an events payload of `kind` (2: without stack ids, version 1; 8: with), appending to `into`.
pub fn decode_events_of(
    kind: u8,
    payload: &[u8],
    into: &mut Vec<Event>,
) -> Result<u32, DecodeError> {
    decode_events_with(kind, payload, into, true)
}

/// [`decode_events_of`]; `window`: read the fields of events far from the end without bounds checks (false: the
/// checked reads throughout, the tests' reference).
#[inline(always)]
fn decode_events_with(
    kind: u8,
    payload: &[u8],
    into: &mut Vec<Event>,
    window: bool,
) -> Result<u32, DecodeError> {
    let stacks = kind == self::kind::EVENTS_STACKS;
    let mut c = Cursor {
        bytes: payload,
        pos: 0,
    };
    let pid = c.varint()? as u32;
    let n = c.varint()?;
    // Each event takes at least 9 bytes: a corrupt count cannot make us reserve much.
    if n > (c.remaining() / 9) as u64 {
        return Err(DecodeError::Short);
    }
    into.reserve(n as usize);
    let (mut ts, mut tid, mut addr, mut aux) = (0u64, 0u32, 0u64, 0u64);
    // One event's fields, read by `$v` (varints) and `$b` (bytes).
    macro_rules! fields {
        ($c:ident, $v:ident, $b:expr) => {{
            ts = ts.wrapping_add(unzigzag($c.$v()?) as u64);
            tid = tid.wrapping_add(unzigzag($c.$v()?) as u32);
            let api_byte = $b;
            let api = Api::from_u8(api_byte).ok_or(DecodeError::BadApi(api_byte))?;
            let flags = $b;
            let device = ($c.$v()? as u32).wrapping_sub(1);
            let result = $c.$v()? as u32;
            addr = addr.wrapping_add(unzigzag($c.$v()?) as u64);
            let size = $c.$v()?;
            aux = aux.wrapping_add(unzigzag($c.$v()?) as u64);
            let stack = if stacks { $c.$v()? as u32 } else { 0 };
            (api, flags, device, result, size, stack)
        }};
    }
    for _ in 0..n {
        // Far from the end (nearly every event): no bounds check per field.
        let (api, flags, device, result, size, stack) = if window && c.remaining() >= EVENT_WINDOW {
            fields!(c, varint_in_window, c.byte_in_window())
        } else {
            fields!(c, varint, c.byte()?)
        };
        into.push(Event {
            ts_ns: ts,
            tid,
            api,
            flags,
            device,
            result,
            addr,
            size,
            aux,
            stack,
        });
    }
    if c.remaining() != 0 {
        return Err(DecodeError::Trailing(c.remaining()));
    }
    Ok(pid)
}

#[derive(bincode::Encode, bincode::Decode)]
struct PidTs {
    pid: u32,
    ts_ns: u64,
}

#[derive(bincode::Encode, bincode::Decode)]
struct DroppedBody {
    pid: u32,
    ts_ns: u64,
    count: u64,
}

#[derive(bincode::Encode, bincode::Decode)]
struct EndBody {
    pid: u32,
    ts_ns: u64,
    kind: EndKind,
}

/// Appends any record as one frame.
pub fn put_record(out: &mut Vec<u8>, rec: &Record) {
    match rec {
        Record::Hello(h) => put_frame(out, kind::HELLO, |o| bincode_to(o, h)),
        Record::Events { pid, events } => put_events(out, *pid, events),
        Record::Dropped { pid, ts_ns, count } => put_frame(out, kind::DROPPED, |o| {
            bincode_to(
                o,
                &DroppedBody {
                    pid: *pid,
                    ts_ns: *ts_ns,
                    count: *count,
                },
            )
        }),
        Record::Goodbye { pid, ts_ns } => put_frame(out, kind::GOODBYE, |o| {
            bincode_to(
                o,
                &PidTs {
                    pid: *pid,
                    ts_ns: *ts_ns,
                },
            )
        }),
        Record::Tick { pid, ts_ns } => put_frame(out, kind::TICK, |o| {
            bincode_to(
                o,
                &PidTs {
                    pid: *pid,
                    ts_ns: *ts_ns,
                },
            )
        }),
        Record::Oom(o) => put_frame(out, kind::OOM, |out| bincode_to(out, o)),
        Record::Stack(st) => put_frame(out, kind::STACK, |out| bincode_to(out, st)),
        Record::Objects(ob) => put_frame(out, kind::OBJECTS, |out| bincode_to(out, ob)),
        Record::Note { pid, ts_ns, text } => put_frame(out, kind::NOTE, |out| {
            bincode_to(out, &(*pid, *ts_ns, text.as_str()))
        }),
        Record::FrameworkSample(f) => {
            put_frame(out, kind::FRAMEWORK_SAMPLE, |out| bincode_to(out, f))
        }
        Record::Bridge(b) => put_frame(out, kind::BRIDGE, |out| bincode_to(out, b)),
        Record::Exit(x) => put_frame(out, kind::EXIT, |out| bincode_to(out, x)),
        Record::End { ts_ns } => put_frame(out, kind::END, |out| bincode_to(out, ts_ns)),
        Record::Lost {
            pid,
            ts_ns,
            count,
            cause,
        } => put_frame(out, kind::LOST, |o| {
            bincode_to(o, &(*pid, *ts_ns, *count, *cause))
        }),
        Record::ContextGone {
            pid,
            ts_ns,
            device,
            how,
        } => put_frame(out, kind::CONTEXT_GONE, |o| {
            bincode_to(o, &(*pid, *ts_ns, *device, how.as_str()))
        }),
        Record::Reaped {
            pid,
            ts_ns,
            child,
            status,
        } => put_frame(out, kind::REAPED, |o| {
            bincode_to(o, &(*pid, *ts_ns, *child, *status))
        }),
        Record::Devices { pid, ts_ns, uuids } => put_frame(out, kind::DEVICES, |o| {
            bincode_to(o, &(*pid, *ts_ns, uuids))
        }),
        Record::ProcessEnd { pid, ts_ns, kind } => put_frame(out, kind::PROCESS_END, |o| {
            bincode_to(
                o,
                &EndBody {
                    pid: *pid,
                    ts_ns: *ts_ns,
                    kind: *kind,
                },
            )
        }),
    }
}

/// Room enough for any frame [`encode_reaped_into`] writes (it takes at most 31 bytes).
pub const REAPED_FRAME_MAX: usize = 48;

/// The frame of `Record::Reaped { pid, ts_ns, child, status }` (length, kind, payload), written into `buf`
/// without allocating, locking or panicking: the shim calls it from inside a program's `waitpid`, which may run
/// in a signal handler. The same bytes as [`put_record`]. The frame's length, or `None` if `buf` is too short
/// ([`REAPED_FRAME_MAX`] always suffices).
pub fn encode_reaped_into(
    buf: &mut [u8],
    pid: u32,
    ts_ns: u64,
    child: u32,
    status: ExitStatus,
) -> Option<usize> {
    let payload = buf.get_mut(FRAME_OVERHEAD..)?;
    let n = bincode::encode_into_slice((pid, ts_ns, child, status), payload, config()).ok()?;
    let len = u32::try_from(n + 1).ok()?;
    buf.get_mut(..4)?.copy_from_slice(&len.to_le_bytes());
    *buf.get_mut(4)? = kind::REAPED;
    Some(n + FRAME_OVERHEAD)
}

/// Decodes one frame's payload. `Ok(None)` for a kind this build does not know (a newer writer's addition).
pub fn decode_record(kind: u8, payload: &[u8]) -> Result<Option<Record>, DecodeError> {
    Ok(Some(match kind {
        kind::HELLO => Record::Hello(bincode_from::<Hello>(payload)?),
        kind::EVENTS | kind::EVENTS_STACKS => {
            let mut events = Vec::new();
            let pid = decode_events_of(kind, payload, &mut events)?;
            Record::Events { pid, events }
        }
        kind::STACK => Record::Stack(bincode_from::<Stack>(payload)?),
        kind::OBJECTS => Record::Objects(bincode_from::<Objects>(payload)?),
        kind::NOTE => {
            let (pid, ts_ns, text): (u32, u64, String) = bincode_from(payload)?;
            Record::Note { pid, ts_ns, text }
        }
        kind::DROPPED => {
            let b: DroppedBody = bincode_from(payload)?;
            Record::Dropped {
                pid: b.pid,
                ts_ns: b.ts_ns,
                count: b.count,
            }
        }
        kind::GOODBYE => {
            let b: PidTs = bincode_from(payload)?;
            Record::Goodbye {
                pid: b.pid,
                ts_ns: b.ts_ns,
            }
        }
        kind::TICK => {
            let b: PidTs = bincode_from(payload)?;
            Record::Tick {
                pid: b.pid,
                ts_ns: b.ts_ns,
            }
        }
        kind::OOM => Record::Oom(bincode_from::<Oom>(payload)?),
        kind::FRAMEWORK_SAMPLE => {
            Record::FrameworkSample(bincode_from::<FrameworkSample>(payload)?)
        }
        kind::BRIDGE => Record::Bridge(bincode_from::<Bridge>(payload)?),
        kind::EXIT => Record::Exit(bincode_from::<Exit>(payload)?),
        kind::END => Record::End {
            ts_ns: bincode_from::<u64>(payload)?,
        },
        kind::CONTEXT_GONE => {
            let (pid, ts_ns, device, how): (u32, u64, u32, String) = bincode_from(payload)?;
            Record::ContextGone {
                pid,
                ts_ns,
                device,
                how,
            }
        }
        kind::LOST => {
            let (pid, ts_ns, count, cause): (u32, u64, u64, crate::LossCause) =
                bincode_from(payload)?;
            Record::Lost {
                pid,
                ts_ns,
                count,
                cause,
            }
        }
        kind::REAPED => {
            let (pid, ts_ns, child, status): (u32, u64, u32, ExitStatus) = bincode_from(payload)?;
            Record::Reaped {
                pid,
                ts_ns,
                child,
                status,
            }
        }
        kind::DEVICES => {
            let (pid, ts_ns, uuids): (u32, u64, Vec<(u32, [u8; 16])>) = bincode_from(payload)?;
            Record::Devices { pid, ts_ns, uuids }
        }
        kind::PROCESS_END => {
            let b: EndBody = bincode_from(payload)?;
            Record::ProcessEnd {
                pid: b.pid,
                ts_ns: b.ts_ns,
                kind: b.kind,
            }
        }
        _ => return Ok(None),
    }))
}

// ---- header ----------------------------------------------------------------------------------------------

/// The bytes a trace file starts with.
pub fn encode_header(h: &TraceHeader) -> Vec<u8> {
    let mut body = Vec::new();
    bincode_to(&mut body, h);
    let mut out = Vec::with_capacity(14 + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Fixed part of the header: magic, version, header length.
pub const HEADER_PREFIX: usize = 14;

/// Checks the fixed prefix; returns (version, header body length).
pub fn decode_header_prefix(prefix: &[u8; HEADER_PREFIX]) -> Result<(u16, u32), DecodeError> {
    if prefix[..8] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = u16::from_le_bytes([prefix[8], prefix[9]]);
    if version > VERSION {
        return Err(DecodeError::NewerVersion {
            found: version,
            supported: VERSION,
        });
    }
    let len = u32::from_le_bytes([prefix[10], prefix[11], prefix[12], prefix[13]]);
    if len > MAX_FRAME {
        return Err(DecodeError::FrameTooLong(len));
    }
    Ok((version, len))
}

pub fn decode_header_body(body: &[u8]) -> Result<TraceHeader, DecodeError> {
    bincode_from(body)
}

// ---- splitting a byte stream into frames -----------------------------------------------------------------

/// Finds whole frames in bytes arriving from a socket. The collector appends exactly those bytes to the trace,
/// so the file never holds half a frame from a live process.
///
/// The buffer's bytes past the data stay initialised between reads: a receiver asks for room on every look,
/// usually to find nothing, and zeroing 256 KiB each time was the collector's largest cost while a job ran.
#[derive(Default)]
pub struct FrameSplitter {
    /// `buf[..len]` is data; the rest is room already initialised (its contents mean nothing).
    buf: Vec<u8>,
    len: usize,
}

impl FrameSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Space to read into: the caller fills some of it and reports how much with `filled`.
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        let end = self.len + want;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        &mut self.buf[self.len..end]
    }

    /// After reading `n` bytes into `spare(want)`: the first `n` are data.
    pub fn filled(&mut self, want: usize, n: usize) {
        debug_assert!(n <= want && self.len + want <= self.buf.len());
        self.len += n.min(want);
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        self.spare(n).copy_from_slice(bytes);
        self.len += n;
    }

    /// The prefix of buffered bytes made of whole frames, or an error if a frame header is impossible.
    pub fn whole(&self) -> Result<&[u8], DecodeError> {
        let data = &self.buf[..self.len];
        let mut pos = 0;
        while data.len() - pos >= 4 {
            let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap());
            if len == 0 {
                return Err(DecodeError::EmptyFrame);
            }
            if len > MAX_FRAME {
                return Err(DecodeError::FrameTooLong(len));
            }
            let end = pos + 4 + len as usize;
            if end > data.len() {
                break;
            }
            pos = end;
        }
        Ok(&data[..pos])
    }

    /// Forgets the first `n` bytes (the whole frames the caller has handled).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }

    /// Bytes of an incomplete frame still buffered.
    pub fn pending(&self) -> usize {
        self.len
    }

    /// The whole size (header included) the first buffered frame declares, once its header is in.
    pub fn first_frame_bytes(&self) -> Option<u64> {
        (self.len >= 4).then(|| u32::from_le_bytes(self.buf[..4].try_into().unwrap()) as u64 + 4)
    }

    /// The kind of the first buffered frame, once its first five bytes are in.
    pub fn first_kind(&self) -> Option<u8> {
        (self.len >= 5).then(|| self.buf[4])
    }

    /// Gives back room past `keep` bytes (or the data, if more) that a large frame left behind.
    pub fn trim(&mut self, keep: usize) {
        let keep = keep.max(self.len);
        if self.buf.len() > keep {
            self.buf.truncate(keep);
            self.buf.shrink_to_fit();
        }
    }

    /// The buffer's size, data and room together (what the splitter costs).
    pub fn footprint(&self) -> usize {
        self.buf.capacity()
    }
}

/// Iterates over the frames in a slice made of whole frames: yields (kind, payload).
pub fn frames(bytes: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        if bytes.len() - pos < FRAME_OVERHEAD {
            return None;
        }
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        if len == 0 || pos + 4 + len > bytes.len() {
            return None;
        }
        let kind = bytes[pos + 4];
        let payload = &bytes[pos + 5..pos + 4 + len];
        pos += 4 + len;
        Some((kind, payload))
    })
}

/// The device ordinal an event names, if any.
pub fn device_of(e: &Event) -> Option<u32> {
    (e.device != NO_DEVICE).then_some(e.device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags;

    fn sample(i: u64) -> Event {
        Event {
            ts_ns: 1_000_000_000 + i * 1500,
            tid: 4242 + (i % 3) as u32,
            api: Api::ALL[(i % 14) as usize],
            flags: if i.is_multiple_of(5) { flags::PTSZ } else { 0 },
            device: if i.is_multiple_of(4) {
                NO_DEVICE
            } else {
                (i % 2) as u32
            },
            result: if i.is_multiple_of(7) { 2 } else { 0 },
            addr: 0x7f00_0000_0000u64.wrapping_add(i.wrapping_mul(0x20_0000)),
            size: (i + 1) << 20,
            aux: if i.is_multiple_of(2) {
                0
            } else {
                0x5555_0000 + i
            },
            stack: (i % 5) as u32,
        }
    }

    #[test]
    fn events_round_trip_including_extremes() {
        let mut evs: Vec<Event> = (0..500).map(sample).collect();
        // Time going backwards across threads, max values, a zero address after a large one.
        evs.push(Event {
            ts_ns: 5,
            tid: u32::MAX,
            addr: u64::MAX,
            size: u64::MAX,
            aux: u64::MAX,
            result: u32::MAX,
            device: NO_DEVICE,
            ..evs[0]
        });
        evs.push(Event {
            ts_ns: u64::MAX,
            tid: 0,
            addr: 0,
            size: 0,
            aux: 0,
            ..evs[1]
        });
        // The extremes again far from the end, where fields are read without bounds checks.
        let ends = evs[500..].to_vec();
        evs.splice(0..0, ends.iter().copied());
        evs.splice(250..250, ends);
        let mut buf = Vec::new();
        put_events(&mut buf, 77, &evs);
        let (k, payload) = frames(&buf).next().unwrap();
        assert_eq!(k, kind::EVENTS_STACKS);
        let mut back = Vec::new();
        assert_eq!(decode_events(payload, &mut back).unwrap(), 77);
        assert_eq!(back, evs);
    }

    #[test]
    fn typical_events_are_compact() {
        // An alloc/free pair per step, same thread and stream: the 24-byte budget with room to spare.
        let mut evs = Vec::new();
        for i in 0..1000u64 {
            let addr = 0x7f12_3400_0000 + (i % 8) * 0x40_0000;
            let mut a = sample(0);
            a.ts_ns = 10_000_000 + i * 20_000;
            a.tid = 9000;
            a.api = Api::MemAllocAsync;
            a.flags = 0;
            a.device = 0;
            a.result = 0;
            a.addr = addr;
            a.size = 4 << 20;
            a.aux = 0x5600_1234_5000;
            let mut f = a;
            f.api = Api::MemFreeAsync;
            f.ts_ns += 9_000;
            f.size = 0;
            f.device = NO_DEVICE;
            evs.push(a);
            evs.push(f);
        }
        let mut buf = Vec::new();
        put_events(&mut buf, 1, &evs);
        let per_event = buf.len() as f64 / evs.len() as f64;
        assert!(per_event < 16.0, "{per_event} bytes/event");
    }

    #[test]
    fn records_round_trip() {
        let recs = vec![
            Record::Hello(Hello {
                pid: 1,
                ppid: 0,
                ts_ns: 3,
                cmdline: vec!["python".into(), "train.py".into()],
                hostname: "h".into(),
                rank: Some(3),
                local_rank: None,
                slurm_procid: Some(7),
                shim_version: "0.1.0".into(),
                extra: vec![("k".into(), "v".into())],
            }),
            Record::Events {
                pid: 9,
                events: (0..3).map(sample).collect(),
            },
            Record::Dropped {
                pid: 9,
                ts_ns: 10,
                count: 12345,
            },
            Record::Goodbye { pid: 9, ts_ns: 11 },
            Record::Tick { pid: 9, ts_ns: 12 },
            Record::ProcessEnd {
                pid: 9,
                ts_ns: 13,
                kind: EndKind::CutMidFrame { partial_bytes: 17 },
            },
            Record::ContextGone {
                pid: 9,
                ts_ns: 15,
                device: 1,
                how: "cuCtxDestroy".into(),
            },
            Record::Lost {
                pid: 9,
                ts_ns: 14,
                count: 77,
                cause: crate::LossCause::CollectorStalled,
            },
            Record::Exit(crate::Exit {
                pid: 9,
                ts_ns: 14,
                status: crate::ExitStatus::Signal {
                    signal: 9,
                    core: false,
                },
            }),
            Record::Exit(crate::Exit {
                pid: 10,
                ts_ns: 15,
                status: crate::ExitStatus::Code(7),
            }),
            Record::End { ts_ns: 16 },
            Record::Devices {
                pid: 9,
                ts_ns: 19,
                uuids: vec![(0, [0xab; 16]), (3, *b"fakecuda-gpu-03\0")],
            },
            Record::Reaped {
                pid: 4,
                ts_ns: 17,
                child: 9,
                status: crate::ExitStatus::Signal {
                    signal: 9,
                    core: false,
                },
            },
            Record::Stack(Stack {
                pid: 9,
                id: 3,
                native: vec![0x55_0000_1234, 0x7f00_0000_0042],
                python: vec![crate::PyFrame {
                    file: "train.py".into(),
                    function: "forward".into(),
                    line: 88,
                }],
            }),
            Record::Objects(Objects {
                pid: 9,
                ts_ns: 15,
                objects: vec![crate::Object {
                    path: "/usr/lib/libtorch.so".into(),
                    bias: 0x7f00_0000_0000,
                    text: vec![(0x7f00_0001_0000, 0x7f00_0100_0000)],
                    build_id: vec![1, 2, 3, 4],
                }],
            }),
            Record::Note {
                pid: 9,
                ts_ns: 16,
                text: "python 3.14 is not supported".into(),
            },
            Record::FrameworkSample(crate::FrameworkSample {
                pid: 9,
                ts_ns: 17,
                framework: crate::Framework::Torch,
                device: 1,
                allocated: 28_991_029_248,
                reserved: 59_055_800_320,
                active: 28_991_029_248,
                inactive_split: 30_064_771_072,
                requested: 28_991_029_000,
                alloc_retries: 1,
                ooms: 1,
            }),
            Record::Bridge(crate::Bridge {
                pid: 9,
                tid: 11,
                ts_ns: 18,
                what: "oom".into(),
                device: 1,
                ack: true,
                fields: vec![("requested".into(), "37580963840".into())],
            }),
            Record::Oom(Oom {
                pid: 9,
                tid: 10,
                ts_ns: 14,
                device: 1,
                api: Api::MemAllocAsync as u8,
                flags: crate::flags::CAP_REFUSED,
                requested_bytes: 1 << 30,
                result: 2,
                device_free_bytes: Some(5 << 30),
                device_total_bytes: Some(80 << 30),
                cap_bytes: Some(4 << 30),
                job_used_bytes: Some(3 << 30),
                process_used_bytes: None,
                extra: vec![],
            }),
        ];
        let mut buf = Vec::new();
        for r in &recs {
            put_record(&mut buf, r);
        }
        let back: Vec<Record> = frames(&buf)
            .map(|(k, p)| decode_record(k, p).unwrap().unwrap())
            .collect();
        assert_eq!(back, recs);
        // Every kind the format declares is written by `put_record` (kind 2 only by writers before version 2),
        // and what the table says of it is what the record is.
        let mut written: Vec<u8> = frames(&buf).map(|(k, _)| k).collect();
        for ((k, _), r) in frames(&buf).zip(&recs) {
            let info = kind_info(k).unwrap();
            assert_eq!(
                r.clone().process_time_mut().is_some(),
                info.process_time,
                "{}",
                info.name
            );
            assert_eq!(
                Record::has_process_time(k),
                info.process_time,
                "{}",
                info.name
            );
            if info.writer == Writer::Process {
                assert!(
                    r.clone().pid_mut().is_some(),
                    "{} speaks for a pid",
                    info.name
                );
            }
        }
        written.push(kind::EVENTS);
        written.sort_unstable();
        written.dedup();
        let declared: Vec<u8> = KINDS.iter().map(|i| i.kind).collect();
        assert_eq!(written, declared);
    }

    #[test]
    fn a_gpu_uuid_reads_as_nvidia_smi_writes_it() {
        let u: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            crate::gpu_uuid(&u),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
        assert_eq!(crate::gpu_uuid(&[0xff; 16]).len(), 40);
    }

    #[test]
    fn kinds_are_declared_once_with_numbers_never_shared() {
        let mut seen = std::collections::HashSet::new();
        for (i, k) in KINDS.iter().enumerate() {
            assert!(seen.insert(k.kind), "{} reuses {}", k.name, k.kind);
            assert_eq!(kind_info(k.kind), Some(k));
            if i > 0 {
                assert!(KINDS[i - 1].kind < k.kind, "in number order");
            }
        }
        assert_eq!(kind_info(kind::REAPED).unwrap().name, "REAPED");
        assert_eq!(kind_info(kind::HELLO).unwrap().writer, Writer::Hello);
        assert_eq!(kind_info(0), None);
    }

    #[test]
    fn version_1_events_without_stack_ids_still_read() {
        // A kind-2 frame as version 1 wrote it: the same fields, no stack id.
        let mut p = Vec::new();
        for v in [42u64, 1, zigzag(1000), zigzag(7)] {
            put_varint(&mut p, v); // pid, count, ts delta, tid delta
        }
        p.push(Api::MemAlloc as u8);
        p.push(0);
        for v in [1u64, 0, zigzag(0x7000), 4096, 0] {
            put_varint(&mut p, v); // device+1, result, addr delta, size, aux delta
        }
        match decode_record(kind::EVENTS, &p).unwrap().unwrap() {
            Record::Events { pid, events } => {
                assert_eq!(pid, 42);
                assert_eq!(events.len(), 1);
                let e = events[0];
                assert_eq!(
                    (e.ts_ns, e.tid, e.device, e.addr, e.size, e.stack),
                    (1000, 7, 0, 0x7000, 4096, 0)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_kind_is_skipped_not_an_error() {
        assert_eq!(decode_record(200, b"whatever").unwrap(), None);
        // The next kinds after the last one this build knows, as an older reader finds a newer writer's.
        for k in (0..=255).filter(|&k| kind_info(k).is_none()) {
            assert_eq!(decode_record(k, b"whatever").unwrap(), None, "kind {k}");
        }
    }

    #[test]
    fn reaped_frames_written_in_place_are_put_records_bytes() {
        use crate::ExitStatus;
        let statuses = [
            ExitStatus::Code(0),
            ExitStatus::Code(3),
            ExitStatus::Code(255),
            ExitStatus::Code(i32::MIN),
            ExitStatus::Signal {
                signal: 9,
                core: false,
            },
            ExitStatus::Signal {
                signal: 11,
                core: true,
            },
            ExitStatus::Signal {
                signal: i32::MAX,
                core: true,
            },
        ];
        for status in statuses {
            for (pid, ts_ns, child) in [
                (1, 0, 2),
                (u32::MAX, u64::MAX, u32::MAX),
                (4_194_304, 1 << 40, 7),
            ] {
                let rec = Record::Reaped {
                    pid,
                    ts_ns,
                    child,
                    status,
                };
                let mut want = Vec::new();
                put_record(&mut want, &rec);
                let mut buf = [0xAAu8; REAPED_FRAME_MAX];
                let n = encode_reaped_into(&mut buf, pid, ts_ns, child, status).unwrap();
                assert_eq!(&buf[..n], &want[..], "{rec:?}");
                assert!(n <= 31, "{n} bytes for {rec:?}");
                // Round trip through the frame reader and the decoder.
                let (k, p) = frames(&buf[..n]).next().unwrap();
                assert_eq!(k, kind::REAPED);
                assert_eq!(decode_record(k, p).unwrap(), Some(rec));
                // Too little room: nothing claimed, no panic.
                for short in 0..n {
                    assert_eq!(
                        encode_reaped_into(&mut buf[..short], pid, ts_ns, child, status),
                        None,
                        "{short} bytes"
                    );
                }
            }
        }
    }

    #[test]
    fn corrupt_payloads_error_without_panicking() {
        let mut buf = Vec::new();
        put_events(&mut buf, 5, &(0..50).map(sample).collect::<Vec<_>>());
        let payload = &buf[5..];
        // Every truncation and a spread of single-byte corruptions: errors or (rarely) other events, no panic.
        for cut in 0..payload.len() {
            let _ = decode_events(&payload[..cut], &mut Vec::new());
        }
        for i in 0..payload.len() {
            let mut p = payload.to_vec();
            p[i] ^= 0xff;
            let _ = decode_events(&p, &mut Vec::new());
            let _ = decode_record(kind::HELLO, &p);
        }
        // A huge claimed count is refused before reserving memory.
        let mut huge = Vec::new();
        put_varint(&mut huge, 1);
        put_varint(&mut huge, u64::MAX >> 1);
        assert_eq!(
            decode_events(&huge, &mut Vec::new()),
            Err(DecodeError::Short)
        );
    }

    /// A kind-2 payload (version 1: no stack ids) of `evs`.
    fn events_v1(pid: u32, evs: &[Event]) -> Vec<u8> {
        let mut p = Vec::new();
        put_varint(&mut p, pid as u64);
        put_varint(&mut p, evs.len() as u64);
        let (mut ts, mut tid, mut addr, mut aux) = (0u64, 0u32, 0u64, 0u64);
        for e in evs {
            put_varint(&mut p, zigzag(e.ts_ns.wrapping_sub(ts) as i64));
            put_varint(&mut p, zigzag(e.tid.wrapping_sub(tid) as i32 as i64));
            p.push(e.api as u8);
            p.push(e.flags);
            put_varint(&mut p, e.device.wrapping_add(1) as u64);
            put_varint(&mut p, e.result as u64);
            put_varint(&mut p, zigzag(e.addr.wrapping_sub(addr) as i64));
            put_varint(&mut p, e.size);
            put_varint(&mut p, zigzag(e.aux.wrapping_sub(aux) as i64));
            (ts, tid, addr, aux) = (e.ts_ns, e.tid, e.addr, e.aux);
        }
        p
    }

    #[test]
    fn unchecked_reads_decode_any_bytes_as_the_checked_ones_do() {
        // Long payloads of both kinds (most events inside the unchecked window), corrupted at random: bits
        // flipped, runs of continuation bytes (the longest varints), bytes cut. Values and errors both match the
        // checked reads. (With the window too small, the debug build's assertion fails this.)
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut evs: Vec<Event> = (0..200).map(sample).collect();
        for i in (0..200).step_by(17) {
            evs[i].addr = u64::MAX - i as u64;
            evs[i].size = u64::MAX >> (i % 7);
        }
        let mut buf = Vec::new();
        put_events(&mut buf, 9, &evs);
        let with_stacks = buf[5..].to_vec();
        let without = events_v1(9, &evs);
        for (k, good) in [(kind::EVENTS, without), (kind::EVENTS_STACKS, with_stacks)] {
            // Intact, both decode every event.
            let mut all = Vec::new();
            assert_eq!(decode_events_with(k, &good, &mut all, true), Ok(9));
            assert_eq!(all.len(), evs.len(), "kind {k}");
            for round in 0..3000 {
                let mut p = good.clone();
                match round % 3 {
                    0 => {
                        for _ in 0..1 + next() % 4 {
                            let i = (next() % p.len() as u64) as usize;
                            p[i] ^= 1 << (next() % 8);
                        }
                    }
                    1 => {
                        let i = (next() % p.len() as u64) as usize;
                        let run = (1 + next() % 12) as usize;
                        for b in p.iter_mut().skip(i).take(run) {
                            *b |= 0x80;
                        }
                    }
                    _ => p.truncate((next() % p.len() as u64) as usize),
                }
                let (mut fast, mut checked) = (Vec::new(), Vec::new());
                let a = decode_events_with(k, &p, &mut fast, true);
                let b = decode_events_with(k, &p, &mut checked, false);
                assert_eq!(a, b, "round {round}, kind {k}");
                assert_eq!(fast, checked, "round {round}, kind {k}");
            }
        }
    }

    #[test]
    fn varints_of_every_length_read_back_whether_or_not_bytes_follow() {
        let mut values = vec![0u64, 1, u64::MAX, u64::MAX - 1];
        for bits in 1..64 {
            values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
        }
        for v in values {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let len = b.len();
            // Alone (the careful path near a payload's end), and followed by other bytes (the quick paths, which
            // read a whole word: the bytes after must not leak into the value).
            for tail in [
                &[][..],
                &[0x80, 0x80, 0x80, 0x01, 0x05][..],
                &[0xff; 8][..],
                &[0x7f, 0x80, 0xff, 0x01, 0x00, 0x81, 0xfe, 0x7f][..],
            ] {
                let mut bytes = b.clone();
                bytes.extend_from_slice(tail);
                let mut c = Cursor {
                    bytes: &bytes,
                    pos: 0,
                };
                assert_eq!(c.varint(), Ok(v), "{v:#x} with {} bytes after", tail.len());
                assert_eq!(c.pos, len, "{v:#x}");
                if bytes.len() >= 8 {
                    // The unchecked path inside an event's window reads the same.
                    let mut c = Cursor {
                        bytes: &bytes,
                        pos: 0,
                    };
                    assert_eq!(c.varint_in_window(), Ok(v), "{v:#x} in a window");
                    assert_eq!(c.pos, len, "{v:#x} in a window");
                }
            }
            // Cut short: an error, never a value.
            for cut in 0..len {
                let mut c = Cursor {
                    bytes: &b[..cut],
                    pos: 0,
                };
                assert_eq!(c.varint(), Err(DecodeError::Short), "{v:#x} cut at {cut}");
            }
        }
        // Longer than a u64 can be, or a tenth byte above 1: refused.
        for bad in [
            &[0xffu8; 11][..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..],
        ] {
            let mut c = Cursor { bytes: bad, pos: 0 };
            assert_eq!(c.varint(), Err(DecodeError::BadVarint));
        }
    }

    #[test]
    fn splitter_yields_only_whole_frames() {
        let mut all = Vec::new();
        for i in 0..10 {
            put_record(
                &mut all,
                &Record::Tick {
                    pid: i,
                    ts_ns: i as u64,
                },
            );
        }
        let mut s = FrameSplitter::new();
        let mut got = 0;
        for chunk in all.chunks(3) {
            s.push(chunk);
            let whole = s.whole().unwrap().to_vec();
            got += frames(&whole).count();
            s.consume(whole.len());
        }
        assert_eq!(got, 10);
        assert_eq!(s.pending(), 0);
        let mut bad = FrameSplitter::new();
        bad.push(&(MAX_FRAME + 1).to_le_bytes());
        assert!(bad.whole().is_err());
    }

    #[test]
    fn splitter_reads_in_place_and_ignores_what_a_read_left_unwritten() {
        let mut all = Vec::new();
        for i in 0..50 {
            put_record(
                &mut all,
                &Record::Tick {
                    pid: i,
                    ts_ns: i as u64 * 7,
                },
            );
        }
        let mut s = FrameSplitter::new();
        let mut out = Vec::new();
        let mut at = 0;
        let mut step = 0;
        while at < all.len() || s.pending() > 0 {
            step += 1;
            // A read of 0 to 12 bytes into 16 bytes of room; the room past it holds whatever it held.
            let n = (step * 5 % 13).min(all.len() - at);
            let room = s.spare(16);
            room[..n].copy_from_slice(&all[at..at + n]);
            room[n..].fill(0xEE);
            s.filled(16, n);
            at += n;
            let whole = s.whole().unwrap().to_vec();
            out.extend_from_slice(&whole);
            s.consume(whole.len());
            assert!(step < 10_000);
        }
        assert_eq!(out, all);
        assert_eq!(frames(&out).count(), 50);
    }

    #[test]
    fn header_round_trip_and_version_check() {
        let h = TraceHeader {
            start_unix_ns: 1,
            start_mono_ns: 2,
            command: vec!["a".into()],
            hostname: "x".into(),
            vramtrace_version: "0.1.0".into(),
            extra: vec![],
        };
        let bytes = encode_header(&h);
        let prefix: [u8; HEADER_PREFIX] = bytes[..HEADER_PREFIX].try_into().unwrap();
        let (v, len) = decode_header_prefix(&prefix).unwrap();
        assert_eq!(v, VERSION);
        assert_eq!(
            decode_header_body(&bytes[HEADER_PREFIX..HEADER_PREFIX + len as usize]).unwrap(),
            h
        );
        let mut newer = prefix;
        newer[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
        assert!(matches!(
            decode_header_prefix(&newer),
            Err(DecodeError::NewerVersion { .. })
        ));
        let mut bad = prefix;
        bad[0] = b'X';
        assert_eq!(decode_header_prefix(&bad), Err(DecodeError::BadMagic));
    }
}
