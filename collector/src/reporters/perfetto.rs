//! `--format perfetto`: Perfetto's protobuf trace (a `Trace` of `TracePacket`s) for ui.perfetto.dev and
//! `trace_processor`, written as the replay goes (docs/EXPORTS.md).
//!
//! Tracks: one counter of bytes in use per device for the job (under a track named by the job's command), and
//! per process a process track (pid, command line, named by rank and command) with a counter per device. The
//! counters step at every allocation, free and end-of-process release, with the replay's own figures, so their
//! peaks are the report's. Instants on the process tracks: each out-of-memory error (`cap refused` when the
//! cap said no), each allocation let past the cap in warn mode, and each allocation with a call site (the
//! call-site threshold, `--stack-min-bytes`), annotated with the call site; those are kept until the end (their
//! frames are symbolised then), at most [`MAX_INSTANTS`], the rest counted.
//!
//! The messages are hand-written with prost, only the fields used, numbered as in Perfetto's
//! protos/perfetto/trace/ (trace.proto, trace_packet.proto, track_event/track_descriptor.proto,
//! track_event/counter_descriptor.proto, track_event/process_descriptor.proto, track_event/track_event.proto,
//! track_event/debug_annotation.proto).

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message;
use vramtrace_format::{flags, TraceHeader};

use super::{process_name, site_label};
use crate::model::observe::tap::{Change, Frames, OomStep, Step, Tap};
use crate::model::ProcessStats;
use crate::names::fasthash::FastMap;
use crate::names::units::bytes;
use crate::reporters::text::{device_name, short_command};

/// The most instants kept for the end of the export.
pub const MAX_INSTANTS: usize = 100_000;

// ---- Perfetto's messages (the fields used) ----

/// `perfetto.protos.Trace`.
#[derive(Clone, PartialEq, Message)]
pub struct Trace {
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

/// `perfetto.protos.TracePacket`.
#[derive(Clone, PartialEq, Message)]
pub struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
}

/// `perfetto.protos.TrackDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
    #[prost(string, optional, tag = "14")]
    pub description: Option<String>,
}

/// `perfetto.protos.ProcessDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(string, repeated, tag = "2")]
    pub cmdline: Vec<String>,
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

/// `perfetto.protos.CounterDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct CounterDescriptor {
    /// `Unit`: `UNIT_SIZE_BYTES` = 3.
    #[prost(int32, optional, tag = "3")]
    pub unit: Option<i32>,
}

/// `perfetto.protos.TrackEvent`.
#[derive(Clone, PartialEq, Message)]
pub struct TrackEvent {
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// `Type`: `TYPE_INSTANT` = 3, `TYPE_COUNTER` = 4.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
}

/// `perfetto.protos.DebugAnnotation`.
#[derive(Clone, PartialEq, Message)]
pub struct DebugAnnotation {
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
}

pub const UNIT_SIZE_BYTES: i32 = 3;
pub const TYPE_INSTANT: i32 = 3;
pub const TYPE_COUNTER: i32 = 4;
/// `TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED`.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
/// All packets are on one sequence.
pub const SEQUENCE: u32 = 1;

// ---- Track ids ----

/// The job's track (the devices' counters are its children).
pub const JOB_TRACK: u64 = 1;
/// The job's bytes in use on a device.
pub fn device_track(device: Option<u32>) -> u64 {
    0x1_0000_0000 + device.map_or(0xffff_ffff, u64::from)
}
/// A process (its slot in the replay: a pid reused or exec'd is another).
pub fn process_track(slot: usize) -> u64 {
    0x2_0000_0000 + slot as u64
}
/// A process's bytes in use on a device.
pub fn process_device_track(slot: usize, device: Option<u32>) -> u64 {
    0x10_0000_0000 + ((slot as u64) << 16) + device.map_or(0xffff, |d| u64::from(d.min(0xfffe)))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum InstantKind {
    Oom {
        cap_refused: bool,
        free: Option<u64>,
        /// Pinned host memory (`cuMemCreate` with a host location), not a GPU's.
        on_host: bool,
    },
    CapExceeded,
    Alloc,
}

struct Instant {
    kind: InstantKind,
    t_ns: u64,
    slot: usize,
    device: Option<u32>,
    size: u64,
    stack: u32,
}

/// The tap that writes the trace as the replay goes.
pub struct Perfetto<W: Write> {
    w: W,
    /// With several traces of one job: the host of the trace being replayed (its index, its name), and the
    /// first replay slot of its processes, so tracks of different hosts never share an id.
    host: Option<(u64, String)>,
    slot_base: usize,
    buf: Vec<u8>,
    err: Option<io::Error>,
    start_mono: u64,
    command: Vec<String>,
    tracks: FastMap<u64, ()>,
    first: bool,
    instants: Vec<Instant>,
    instants_left_out: u64,
    labels: HashMap<(usize, u32), (String, String)>,
    written_packets: u64,
    last_tracks: (u64, u64),
}

impl<W: Write> Perfetto<W> {
    pub fn new(w: W) -> Self {
        Perfetto {
            w,
            host: None,
            slot_base: 0,
            buf: Vec::with_capacity(256),
            err: None,
            start_mono: 0,
            command: Vec::new(),
            tracks: FastMap::default(),
            first: true,
            instants: Vec::new(),
            instants_left_out: 0,
            labels: HashMap::new(),
            written_packets: 0,
            last_tracks: (0, 0),
        }
    }

    /// Flushes and hands the writer back, or the first write error.
    /// Several traces of one job go into one file: the next trace replayed is host `index` (named `name`), its
    /// processes' slots counted from `slot_base`. Its header's start (given to `start`) says where its clock is.
    pub fn next_host(&mut self, index: u64, name: String, slot_base: usize) {
        self.host = Some((index, name));
        self.slot_base = slot_base;
        self.last_tracks = (0, 0);
    }

    fn dev_track(&self, device: Option<u32>) -> u64 {
        device_track(device) + self.host.as_ref().map_or(0, |h| h.0 << 36)
    }

    fn dev_name(&self, device: Option<u32>) -> String {
        match &self.host {
            Some((_, h)) => format!("{h}: {}", device_name(device)),
            None => device_name(device),
        }
    }

    pub fn end(mut self) -> io::Result<W> {
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        self.w.flush()?;
        Ok(self.w)
    }

    pub fn notes(&self) -> Vec<String> {
        let mut n = Vec::new();
        if self.instants_left_out > 0 {
            n.push(format!(
                "{} instants (allocations with a call site past the first {MAX_INSTANTS}) left out",
                self.instants_left_out
            ));
        }
        n
    }

    pub fn packets(&self) -> u64 {
        self.written_packets
    }

    /// One packet, as one `Trace.packet` field (tag 1, length-delimited): a file of them is a `Trace`.
    fn packet(&mut self, mut p: TracePacket) {
        if self.err.is_some() {
            return;
        }
        p.trusted_packet_sequence_id = Some(SEQUENCE);
        if self.first {
            p.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
            self.first = false;
        }
        self.buf.clear();
        self.buf.push(0x0a);
        prost::encoding::encode_varint(p.encoded_len() as u64, &mut self.buf);
        if let Err(e) = p.encode(&mut self.buf) {
            self.err = Some(io::Error::other(e));
            return;
        }
        self.written_packets += 1;
        if let Err(e) = self.w.write_all(&self.buf) {
            self.err = Some(e);
        }
    }

    fn descriptor(&mut self, d: TrackDescriptor) {
        self.packet(TracePacket {
            track_descriptor: Some(d),
            ..TracePacket::default()
        });
    }

    fn job_track(&mut self) {
        if self.tracks.insert(JOB_TRACK, ()).is_none() {
            let name = format!("job: {}", short_command(&self.command));
            self.descriptor(TrackDescriptor {
                uuid: Some(JOB_TRACK),
                name: Some(name),
                ..TrackDescriptor::default()
            });
        }
    }

    fn counter_track(&mut self, uuid: u64, parent: u64, name: String) {
        if self.tracks.insert(uuid, ()).is_none() {
            self.descriptor(TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(parent),
                name: Some(name),
                counter: Some(CounterDescriptor {
                    unit: Some(UNIT_SIZE_BYTES),
                }),
                ..TrackDescriptor::default()
            });
        }
    }

    fn process_track(&mut self, slot: usize, p: &ProcessStats) {
        let uuid = process_track(slot);
        if self.tracks.insert(uuid, ()).is_none() {
            self.descriptor(TrackDescriptor {
                uuid: Some(uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(p.pid as i32),
                    cmdline: p.cmdline.clone(),
                    process_name: Some(process_name(p)),
                }),
                ..TrackDescriptor::default()
            });
        }
    }

    /// A counter value: the hot path (two per allocation or free), encoded by hand into exactly the bytes prost
    /// writes for the same [`TracePacket`] (tested), without building one.
    fn counter(&mut self, t_ns: u64, track: u64, value: u64) {
        let ts = self.start_mono.saturating_add(t_ns);
        let value = value.min(i64::MAX as u64);
        if self.first || self.err.is_some() {
            self.packet(counter_packet(ts, track, value));
            return;
        }
        use prost::encoding::encoded_len_varint;
        // TrackEvent: type (9) = TYPE_COUNTER, track_uuid (11), counter_value (30).
        let event_len = 2 + 1 + encoded_len_varint(track) + 2 + encoded_len_varint(value);
        // TracePacket: timestamp (8), trusted_packet_sequence_id (10), track_event (11).
        let packet_len =
            1 + encoded_len_varint(ts) + 2 + 1 + encoded_len_varint(event_len as u64) + event_len;
        // At most 1 + 1 + (1 + 10) + 2 + 1 + 1 + (3 + 10) + (2 + 10) bytes.
        let mut b = [0u8; 48];
        b[0] = 0x0a;
        let mut n = 1;
        n += varint(packet_len as u64, &mut b[n..]);
        b[n] = 0x40;
        n += 1;
        n += varint(ts, &mut b[n..]);
        b[n..n + 3].copy_from_slice(&[0x50, SEQUENCE as u8, 0x5a]);
        n += 3;
        n += varint(event_len as u64, &mut b[n..]);
        b[n..n + 3].copy_from_slice(&[0x48, TYPE_COUNTER as u8, 0x58]);
        n += 3;
        n += varint(track, &mut b[n..]);
        b[n..n + 2].copy_from_slice(&[0xf0, 0x01]);
        n += 2;
        n += varint(value, &mut b[n..]);
        self.written_packets += 1;
        if let Err(e) = self.w.write_all(&b[..n]) {
            self.err = Some(e);
        }
    }

    fn instant(&mut self, i: Instant) {
        if self.instants.len() >= MAX_INSTANTS && i.kind == InstantKind::Alloc {
            self.instants_left_out += 1;
            return;
        }
        self.instants.push(i);
    }
}

/// `v` as a protobuf varint at the start of `out`; its length.
#[inline]
fn varint(mut v: u64, out: &mut [u8]) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = v as u8 | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}

/// The packet of a counter value.
fn counter_packet(ts: u64, track: u64, value: u64) -> TracePacket {
    TracePacket {
        timestamp: Some(ts),
        trusted_packet_sequence_id: Some(SEQUENCE),
        track_event: Some(TrackEvent {
            r#type: Some(TYPE_COUNTER),
            track_uuid: Some(track),
            counter_value: Some(value as i64),
            ..TrackEvent::default()
        }),
        ..TracePacket::default()
    }
}

impl<W: Write + Send> Tap for Perfetto<W> {
    fn start(&mut self, header: &TraceHeader) {
        self.start_mono = header.start_mono_ns;
        self.command = header.command.clone();
        self.job_track();
    }

    fn step(&mut self, s: &Step) {
        // GPU memory only: pinned host memory would share the unknown GPU's tracks (the report lists it).
        if s.on_host || !matches!(s.change, Change::Alloc | Change::Free | Change::Released) {
            return;
        }
        let slot = s.slot + self.slot_base;
        let dev = self.dev_track(s.device);
        let proc_dev = process_device_track(slot, s.device);
        // The tracks of the last change are described already (the replay hands out runs of one process).
        if self.last_tracks != (dev, proc_dev) {
            if !self.tracks.contains_key(&dev) {
                let name = format!("{} bytes in use (job)", self.dev_name(s.device));
                self.counter_track(dev, JOB_TRACK, name);
            }
            if !self.tracks.contains_key(&proc_dev) {
                self.process_track(slot, s.process);
                let name = format!("{} bytes in use", device_name(s.device));
                self.counter_track(proc_dev, process_track(slot), name);
            }
            self.last_tracks = (dev, proc_dev);
        }
        self.counter(s.t_ns, dev, s.device_bytes);
        self.counter(s.t_ns, proc_dev, s.process_device_bytes);
        if s.change == Change::Alloc {
            if s.flags & flags::CAP_EXCEEDED != 0 {
                self.instant(Instant {
                    kind: InstantKind::CapExceeded,
                    t_ns: s.t_ns,
                    slot,
                    device: s.device,
                    size: s.size,
                    stack: s.stack,
                });
            }
            if s.stack != 0 {
                self.instant(Instant {
                    kind: InstantKind::Alloc,
                    t_ns: s.t_ns,
                    slot,
                    device: s.device,
                    size: s.size,
                    stack: s.stack,
                });
            }
        }
    }

    fn oom(&mut self, o: &OomStep) {
        let slot = o.slot + self.slot_base;
        self.process_track(slot, o.process);
        let device = (o.oom.device != vramtrace_format::NO_DEVICE).then_some(o.oom.device);
        self.instant(Instant {
            kind: InstantKind::Oom {
                cap_refused: o.oom.flags & flags::CAP_REFUSED != 0,
                // A host request's record may carry a GPU's figures (older shims): not the host's.
                free: o.oom.device_free_bytes.filter(|_| !o.on_host),
                on_host: o.on_host,
            },
            t_ns: o.t_ns,
            slot,
            device,
            size: o.oom.requested_bytes,
            stack: o.stack,
        });
    }

    fn finish(&mut self, frames: &mut Frames) {
        let instants = std::mem::take(&mut self.instants);
        for i in &instants {
            if i.stack == 0 || self.labels.contains_key(&(i.slot, i.stack)) {
                continue;
            }
            // The replay's own slot (this writer counts slots across several traces).
            let fr = frames(i.slot - self.slot_base, i.stack);
            let stack = fr.as_ref().map_or(String::new(), |fr| {
                let lines: Vec<String> = fr.iter().take(16).map(|f| f.label()).collect();
                lines.join("\n")
            });
            let label = (site_label(i.stack, fr), stack);
            self.labels.insert((i.slot, i.stack), label);
        }
        for i in instants {
            let name = match i.kind {
                InstantKind::Oom {
                    cap_refused: true, ..
                } => format!("cap refused {}", bytes(i.size)),
                InstantKind::Oom { .. } => format!("out of memory: {} requested", bytes(i.size)),
                InstantKind::CapExceeded => format!("over the cap (warn): {}", bytes(i.size)),
                InstantKind::Alloc => format!("alloc {}", bytes(i.size)),
            };
            let ann = |name: &str, u: Option<u64>, s: Option<String>| DebugAnnotation {
                name: Some(name.to_string()),
                uint_value: u,
                string_value: s,
            };
            let place = match i.kind {
                InstantKind::Oom { on_host: true, .. } => "host memory".to_string(),
                _ => device_name(i.device),
            };
            let mut a = vec![
                ann("device", None, Some(place)),
                ann("bytes", Some(i.size), None),
            ];
            if let InstantKind::Oom { free: Some(f), .. } = i.kind {
                a.push(ann("device_free_bytes", Some(f), None));
            }
            if let Some((site, stack)) = self.labels.get(&(i.slot, i.stack)) {
                a.push(ann("call_site", None, Some(site.clone())));
                if !stack.is_empty() {
                    a.push(ann("stack", None, Some(stack.clone())));
                }
            }
            let category = match i.kind {
                InstantKind::Alloc => "alloc",
                _ => "oom",
            };
            let ts = self.start_mono.saturating_add(i.t_ns);
            self.packet(TracePacket {
                timestamp: Some(ts),
                track_event: Some(TrackEvent {
                    r#type: Some(TYPE_INSTANT),
                    track_uuid: Some(process_track(i.slot)),
                    name: Some(name),
                    categories: vec![category.to_string()],
                    debug_annotations: a,
                    ..TrackEvent::default()
                }),
                ..TracePacket::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_by_hand_is_the_packet_prost_writes() {
        for (ts, track, value) in [
            (0, JOB_TRACK, 0),
            (5_000_000_000, device_track(Some(3)), 1 << 40),
            (
                u64::MAX,
                process_device_track(70_000, None),
                i64::MAX as u64,
            ),
            (123, process_device_track(2, Some(1)), 4096),
        ] {
            let mut p = Perfetto::new(Vec::new());
            p.first = false;
            p.counter(ts, track, value);
            let mut want = vec![0x0a];
            let packet = counter_packet(ts, track, value);
            prost::encoding::encode_varint(packet.encoded_len() as u64, &mut want);
            packet.encode(&mut want).unwrap();
            assert_eq!(p.end().unwrap(), want);
            let got = Trace::decode(&want[..]).unwrap();
            assert_eq!(got.packet, vec![packet]);
        }
    }
}
