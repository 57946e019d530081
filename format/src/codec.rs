//! All byte-level encoding lives here, so the encoder can be swapped without touching either side.
//!
//! Records other than events are bincode 2 (standard config: little endian, variable-length integers).
//! Event batches, the bulk of every trace, use a packed layout of their own to stay well under 24 bytes an event:
//! each field is an unsigned LEB128 varint, and the time, thread, address and aux fields are zigzag deltas
//! against the previous event of the batch (consecutive events share threads and streams, and a free usually
//! names the address its allocation returned).

use crate::Api;
use crate::{
    EndKind, Event, ExitStatus, Record, TraceHeader, MAGIC, MAX_FRAME, NO_DEVICE, VERSION,
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
    /// The names of the trace's native frames, resolved where it was recorded (`Record::FrameNames`), written
    /// by the collector before its `End` (no version bump: older readers skip it).
    FRAME_NAMES = 20, Collector, false;
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

/// bincode's error in words: its own `Display` is its `Debug` form (`Utf8 { inner: Utf8Error { .. } }`), which a
/// damaged trace's warning would otherwise print to the user.
fn plain(e: &bincode::error::DecodeError) -> String {
    use bincode::error::DecodeError as E;
    match e {
        E::UnexpectedEnd { .. } => "it ends early".into(),
        E::LimitExceeded => "a length past the frame's limit".into(),
        E::InvalidIntegerType { .. } | E::OutsideUsizeRange(_) => "an integer out of range".into(),
        E::NonZeroTypeIsZero { .. } => "a zero where none may be".into(),
        E::UnexpectedVariant { found, .. } => format!("an unknown variant {found}"),
        E::Utf8 { .. } => "text that is not UTF-8".into(),
        E::InvalidCharEncoding(_) => "a character that is not UTF-8".into(),
        E::InvalidBooleanValue(b) => format!("a flag byte {b} that is neither 0 nor 1"),
        E::ArrayLengthMismatch { required, found } => {
            format!("an array of {found} items where {required} belong")
        }
        _ => "bytes that do not decode".into(),
    }
}

fn bincode_from<T: bincode::Decode<()>>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (v, used): (T, usize) =
        bincode::decode_from_slice(bytes, config()).map_err(|e| DecodeError::Bincode(plain(&e)))?;
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

/// Declares how each [`Record`] goes on the wire, once: its frame kind, and its body (a struct variant's
/// fields in their order, bincode-encoded as a tuple; a newtype variant's value). [`put_record`],
/// [`decode_record`] and [`Record::kind`] are made from it, so a variant not declared here does not compile
/// (the encoder's match is exhaustive) and its decoder cannot be forgotten.
macro_rules! record_wire {
    (
        values { $($nv:ident = $nk:ident,)* }
        fields { $($fv:ident { $($f:ident: $t:ty),* } = $fk:ident,)* }
    ) => {
        /// Appends any record as one frame.
        pub fn put_record(out: &mut Vec<u8>, rec: &Record) {
            match rec {
                Record::Events { pid, events } => put_events(out, *pid, events),
                $(Record::$nv(v) => put_frame(out, kind::$nk, |o| bincode_to(o, v)),)*
                $(Record::$fv { $($f),* } => put_frame(out, kind::$fk, |o| bincode_to(o, &($($f,)*))),)*
            }
        }

        /// Decodes one frame's payload. `Ok(None)` for a kind this build does not know (a newer writer's
        /// addition).
        pub fn decode_record(k: u8, payload: &[u8]) -> Result<Option<Record>, DecodeError> {
            Ok(Some(match k {
                kind::EVENTS | kind::EVENTS_STACKS => {
                    let mut events = Vec::new();
                    let pid = decode_events_of(k, payload, &mut events)?;
                    Record::Events { pid, events }
                }
                $(kind::$nk => Record::$nv(bincode_from(payload)?),)*
                $(kind::$fk => {
                    let ($($f,)*): ($($t,)*) = bincode_from(payload)?;
                    Record::$fv { $($f),* }
                })*
                _ => return Ok(None),
            }))
        }

        impl Record {
            /// Its frame kind (events: [`kind::EVENTS_STACKS`], as [`put_events`] writes them).
            pub fn kind(&self) -> u8 {
                match self {
                    Record::Events { .. } => kind::EVENTS_STACKS,
                    $(Record::$nv(_) => kind::$nk,)*
                    $(Record::$fv { .. } => kind::$fk,)*
                }
            }
        }
    };
}

record_wire! {
    values {
        Hello = HELLO,
        Oom = OOM,
        Stack = STACK,
        Objects = OBJECTS,
        FrameworkSample = FRAMEWORK_SAMPLE,
        Bridge = BRIDGE,
        Exit = EXIT,
        FrameNames = FRAME_NAMES,
    }
    fields {
        Dropped { pid: u32, ts_ns: u64, count: u64 } = DROPPED,
        Goodbye { pid: u32, ts_ns: u64 } = GOODBYE,
        Tick { pid: u32, ts_ns: u64 } = TICK,
        Note { pid: u32, ts_ns: u64, text: String } = NOTE,
        End { ts_ns: u64 } = END,
        Lost { pid: u32, ts_ns: u64, count: u64, cause: crate::LossCause } = LOST,
        ContextGone { pid: u32, ts_ns: u64, device: u32, how: String } = CONTEXT_GONE,
        Reaped { pid: u32, ts_ns: u64, child: u32, status: ExitStatus } = REAPED,
        Devices { pid: u32, ts_ns: u64, uuids: Vec<(u32, [u8; 16])> } = DEVICES,
        ProcessEnd { pid: u32, ts_ns: u64, kind: EndKind } = PROCESS_END,
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
mod tests;
