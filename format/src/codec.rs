//! All byte-level encoding lives here, so the encoder can be swapped without touching either side.
//!
//! Records other than events are bincode 2 (standard config: little endian, variable-length integers).
//! Event batches, the bulk of every trace, use a packed layout of their own to stay well under 24 bytes an event:
//! each field is an unsigned LEB128 varint, and the time, thread, address and aux fields are zigzag deltas
//! against the previous event of the batch (consecutive events share threads and streams, and a free usually
//! names the address its allocation returned).

use crate::Api;
use crate::{
    Bridge, EndKind, Event, Exit, ExitStatus, FrameNames, FrameworkSample, Hello, Objects, Oom,
    Stack, TraceHeader, MAGIC, MAX_FRAME, NO_DEVICE, VERSION,
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

pub(crate) fn bincode_to(out: &mut Vec<u8>, value: &impl bincode::Encode) {
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

pub(crate) fn bincode_from<T: bincode::Decode<()>>(bytes: &[u8]) -> Result<T, DecodeError> {
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

/// Declares every record once: its variant of [`Record`] (and its docs), its frame kind's number (a constant in
/// [`kind`]), who writes it, whether its process stamps its time, and its body on the wire (a struct variant's
/// fields in their order, bincode-encoded as a tuple; a newtype variant's value). The enum, [`KINDS`],
/// [`put_record`], [`decode_record`] and [`Record::kind`] are made from it: a record is added in one place, and
/// its encoder, decoder and kind cannot be forgotten. Event batches (kinds 2 and 8) have a packed layout of
/// their own ([`put_events`]). A `read_only` kind is an older layout of a record: read into its current variant
/// by its own decoder, never written.
macro_rules! records {
    (
        events { $($(#[$edoc:meta])* $ek:ident = $en:literal;)* }
        read_only { $($(#[$rdoc:meta])* $rv:ident = $rk:ident = $rn:literal, $rw:ident, $rtime:literal, $rdecode:path;)* }
        values { $($(#[$vdoc:meta])* $nv:ident($nt:ty) = $nk:ident = $nn:literal, $nw:ident, $ntime:literal;)* }
        fields {
            $($(#[$fdoc:meta])* $fv:ident {
                $($(#[$fmeta:meta])* $f:ident: $t:ty,)*
            } = $fk:ident = $fnn:literal, $fw:ident, $ftime:literal;)*
        }
    ) => {
        /// Frame kinds. Part of the format: never reuse a number. Readers skip kinds they do not know.
        pub mod kind {
            $($(#[$edoc])* pub const $ek: u8 = $en;)*
            $($(#[$rdoc])* pub const $rk: u8 = $rn;)*
            $(#[doc = concat!("`Record::", stringify!($nv), "`.")] pub const $nk: u8 = $nn;)*
            $(#[doc = concat!("`Record::", stringify!($fv), "`.")] pub const $fk: u8 = $fnn;)*
        }

        /// Every frame kind, in number order.
        pub const KINDS: &[KindInfo] = &in_number_order([
            $(KindInfo { kind: $en, name: stringify!($ek), writer: Writer::Events, process_time: false },)*
            $(KindInfo { kind: $rn, name: stringify!($rk), writer: Writer::$rw, process_time: $rtime },)*
            $(KindInfo { kind: $nn, name: stringify!($nk), writer: Writer::$nw, process_time: $ntime },)*
            $(KindInfo { kind: $fnn, name: stringify!($fk), writer: Writer::$fw, process_time: $ftime },)*
        ]);

        /// Everything that travels, on the socket and in the file.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Record {
            /// A batch of a process's events (frame kind 8, with a stack id each; kind 2 without, read as such).
            Events { pid: u32, events: Vec<Event> },
            $($(#[$vdoc])* $nv($nt),)*
            $($(#[$fdoc])* $fv { $($(#[$fmeta])* $f: $t,)* },)*
        }

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
                $(kind::$rk => Record::$rv($rdecode(payload)?),)*
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

/// `kinds` sorted by number (at compile time): the declaration groups them by their body's shape.
const fn in_number_order<const N: usize>(mut kinds: [KindInfo; N]) -> [KindInfo; N] {
    let mut i = 1;
    while i < N {
        let mut j = i;
        while j > 0 && kinds[j - 1].kind > kinds[j].kind {
            let t = kinds[j];
            kinds[j] = kinds[j - 1];
            kinds[j - 1] = t;
            j -= 1;
        }
        i += 1;
    }
    kinds
}

records! {
    events {
        /// Events without stack ids (version 1): read, no longer written.
        EVENTS = 2;
        /// Events with a stack id each (version 2).
        EVENTS_STACKS = 8;
    }
    read_only {
        /// The bridge's records with key/value text fields (before 2026-11-29): read into `Record::Bridge`.
        Bridge = BRIDGE_PAIRS = 13, Process, true, bridge_pairs::decode;
    }
    values {
        /// What a process says first on its connection: who it is, its settings.
        Hello(Hello) = HELLO = 1, Hello, false;
        /// A tracked allocation failed with out-of-memory (the device's or the cap's). Sent synchronously: the
        /// shim waits (at most a second) for the collector's acknowledgement before the program sees the error.
        Oom(Oom) = OOM = 7, Process, true;
        /// A call site, sent once per process before the first event that names it.
        Stack(Stack) = STACK = 9, Process, false;
        /// The process's loaded objects, sent before the first stack and again whenever the set changes.
        Objects(Objects) = OBJECTS = 10, Process, false;
        /// A framework allocator's own figures (allocated versus reserved), sampled by the Python bridge (no
        /// version bump: older readers skip it).
        FrameworkSample(FrameworkSample) = FRAMEWORK_SAMPLE = 12, Process, true;
        /// Something the Python bridge saw: it attached, an out-of-memory error inside the framework, a
        /// snapshot kept beside the trace, what it could not do; its body one JSON object (kind 13 before
        /// it, text pairs, is read into this; no version bump: older readers skip it).
        Bridge(Bridge) = BRIDGE = 21, Process, true;
        /// Written by the collector: how a process of the job ended, from the wait status it reaped (the command
        /// itself, and every descendant orphaned to it: `vramtrace run` is their child subreaper; no version
        /// bump: older readers skip it).
        Exit(Exit) = EXIT = 14, Collector, false;
        /// Written by the collector at the end of `run`, before its `End`: the names of the native frames the
        /// trace's stacks hold, resolved on the machine that recorded them, so a trace read elsewhere (the object
        /// files gone, or other builds of them) still names its frames. Several may follow one another; no
        /// version bump: older readers skip it.
        FrameNames(FrameNames) = FRAME_NAMES = 20, Collector, false;
    }
    fields {
        /// The shim's channel was full: `count` events since the last such record were not recorded.
        Dropped { pid: u32, ts_ns: u64, count: u64, } = DROPPED = 3, Collector, false;
        /// The shim flushed everything at exit.
        Goodbye { pid: u32, ts_ns: u64, } = GOODBYE = 4, Process, false;
        /// The shim's sender is alive and has nothing older than `ts_ns` left to send.
        Tick { pid: u32, ts_ns: u64, } = TICK = 5, Collector, false;
        /// Written by the collector when a process's connection closed.
        ProcessEnd { pid: u32, ts_ns: u64, kind: EndKind, } = PROCESS_END = 6, Collector, false;
        /// Something the shim wants the report to say once (a Python version it cannot walk, say).
        Note { pid: u32, ts_ns: u64, text: String, } = NOTE = 11, Process, true;
        /// Written by the collector beside a `Dropped` record: why those `count` records were lost (the totals
        /// stay in `Dropped`, which older readers count).
        Lost { pid: u32, ts_ns: u64, count: u64, cause: crate::LossCause, } = LOST = 15, Collector, false;
        /// Every context of the process on `device` was torn down (`how`: `cuCtxDestroy`,
        /// `cuDevicePrimaryCtxReset`, the last `cuDevicePrimaryCtxRelease`): the driver freed every pointer
        /// allocation it had made there (`cuMemCreate` handles stay).
        ContextGone { pid: u32, ts_ns: u64, device: u32, how: String, } = CONTEXT_GONE = 16, Process, true;
        /// Written by the collector last, once it finished the trace (headers with `end_record=1` promise one):
        /// a trace that has none was cut short (the collector was killed, or the disk filled) or is still being
        /// written (no version bump: older readers skip it).
        End { ts_ns: u64, } = END = 17, Collector, false;
        /// A process reaped one of its children (`wait4`, `waitpid`, `wait`, `waitid` in the reaper's shim): how
        /// a process ended that its own parent reaped, where `vramtrace run` writes no `Exit`. `pid` is the
        /// reaper as it believes itself to be (`getpid()`; a collector attributes a report connection to the
        /// kernel's word, `SO_PEERCRED`, not to this field). In its ring, or alone on a connection of its own.
        Reaped {
            pid: u32,
            /// CLOCK_MONOTONIC when the reaper's wait returned.
            ts_ns: u64,
            /// The reaped child, as the reaper's pid namespace numbers it.
            child: u32,
            status: ExitStatus,
        } = REAPED = 18, Reaper, true;
        /// The GPUs a process sees, by the driver's own word (`cuDeviceGetUuid_v2` for each ordinal): what its
        /// device ordinals are, so a metric's `uuid` label is the one `nvidia-smi -L` and dcgm-exporter show.
        /// Sent once a process's driver answers (no version bump: older readers skip it).
        Devices {
            pid: u32,
            ts_ns: u64,
            /// (ordinal, UUID's 16 bytes), for each ordinal the driver named.
            uuids: Vec<(u32, [u8; 16])>,
        } = DEVICES = 19, Process, true;
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

mod bridge_pairs;
pub use bridge_pairs::nest as nest_bridge_pairs;

#[cfg(test)]
mod tests;
