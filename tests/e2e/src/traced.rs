//! Running programs under `vramtrace run` on the simulated driver, and reading back both sides: the trace
//! (what the shim recorded) and the driver's log (what the driver saw), so tests compare the two.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use vramtrace_format::{
    flags, Api, Bridge, EndKind, Event, Exit, FrameworkSample, Hello, Objects, Oom, Record, Stack,
    Stop, TraceHeader, TraceReader,
};

use crate::{artifact, wait_with_timeout, FakeCuda, LogLine, RunResult};

/// The `vramtrace` binary.
pub fn vramtrace() -> PathBuf {
    artifact("vramtrace")
}

/// `libvramtrace.so`.
pub fn shim() -> PathBuf {
    artifact("libvramtrace.so")
}

impl FakeCuda {
    /// `vramtrace run [vt_args] --out <dir>/<name>.vtrace -- program args`, on this fake. Returns the run's
    /// result and the trace path.
    pub fn traced<S: AsRef<OsStr>>(
        &self,
        name: &str,
        vt_args: &[&str],
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> (RunResult, PathBuf) {
        let trace = self.dir().join(format!("{name}.vtrace"));
        let mut c = self.command(vramtrace());
        c.arg("run")
            .args(vt_args)
            .arg("--out")
            .arg(&trace)
            .arg("--")
            .arg(program)
            .args(args);
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vramtrace run");
        (
            wait_with_timeout(child, std::time::Duration::from_secs(120), name),
            trace,
        )
    }
}

/// Everything a trace holds, by kind.
#[derive(Debug)]
pub struct Trace {
    pub header: TraceHeader,
    pub hellos: Vec<Hello>,
    /// Events per pid, in the order the shim sent them.
    pub events: BTreeMap<u32, Vec<Event>>,
    pub ooms: Vec<Oom>,
    pub ends: Vec<(u32, EndKind)>,
    /// Wait statuses the wrapper reaped.
    pub exits: Vec<Exit>,
    /// Children their own parents reaped, as the reapers' shims told: (reaper, child, status).
    pub reaped: Vec<(u32, u32, vramtrace_format::ExitStatus)>,
    /// Each process's GPUs by ordinal (`Record::Devices`): (pid, ordinal, UUID as nvidia-smi writes it).
    pub devices: Vec<(u32, u32, String)>,
    pub dropped: u64,
    /// Contexts torn down: (pid, device).
    pub contexts_gone: Vec<(u32, u32)>,
    /// Why records were lost: (pid, cause, count).
    pub lost: Vec<(u32, vramtrace_format::LossCause, u64)>,
    pub goodbyes: Vec<u32>,
    /// The collector's names of native frames (frame kind 20), in order.
    pub frame_names: Vec<vramtrace_format::FrameNames>,
    pub stop: Stop,
    /// Call sites, in the order they arrived.
    pub stacks: Vec<Stack>,
    /// Loaded-object lists, in the order they arrived.
    pub objects: Vec<Objects>,
    /// Notes: (pid, text).
    pub notes: Vec<(u32, String)>,
    /// The Python bridge's samples and other records, in the order they arrived, with the index of the record
    /// that carried them.
    pub samples: Vec<(usize, FrameworkSample)>,
    pub bridge: Vec<(usize, Bridge)>,
    /// Where things were in the file (the index of the record that carried them), parallel to `events` (per
    /// pid), `stacks` and `objects`: to check what came before what.
    pub event_records: BTreeMap<u32, Vec<usize>>,
    pub stack_records: Vec<usize>,
    pub objects_records: Vec<usize>,
}

/// A bridge record's body, read strictly: a test asks for a key of the type the schema gives it, so a bridge that
/// sent a count as text (which the collector's reader forgives) fails here.
pub trait BridgeBody {
    /// The body as JSON (`Null` when it is none).
    fn body(&self) -> serde_json::Value;
    /// `key`'s text, when it is a string.
    fn text(&self, key: &str) -> Option<String> {
        self.body()[key].as_str().map(str::to_string)
    }
    /// `key`'s count, when it is an integer >= 0.
    fn num(&self, key: &str) -> Option<u64> {
        self.body()[key].as_u64()
    }
}

impl BridgeBody for Bridge {
    fn body(&self) -> serde_json::Value {
        serde_json::from_str(&self.doc).unwrap_or(serde_json::Value::Null)
    }
}

impl Trace {
    pub fn all_events(&self) -> Vec<Event> {
        self.events.values().flatten().copied().collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.events.keys().copied().collect()
    }

    /// Process `pid`'s stack `id`.
    pub fn stack(&self, pid: u32, id: u32) -> Option<&Stack> {
        self.stacks.iter().find(|s| s.pid == pid && s.id == id)
    }

    /// The objects process `pid` had loaded when it sent stack `id` (the last list it sent before it).
    pub fn objects_for(&self, pid: u32, id: u32) -> Option<&Objects> {
        let i = self
            .stacks
            .iter()
            .position(|s| s.pid == pid && s.id == id)?;
        let at = self.stack_records[i];
        self.objects
            .iter()
            .zip(&self.objects_records)
            .rfind(|(o, r)| o.pid == pid && **r < at)
            .map(|(o, _)| o)
    }

    /// Asserts the stacks' rules: ids are nonzero and unique per process, each stack is sent once and before
    /// the first event that names it, every stack an event names exists, and the trace holds a list of the
    /// process's objects (the shim's courier sends it beside the ring, off the host's threads, so it may follow
    /// the first stack: the collector resolves a stack against objects that came after it).
    pub fn assert_stacks_precede_their_events(&self) {
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.stacks {
            assert_ne!(s.id, 0, "stack id 0 sent: {s:?}");
            assert!(
                seen.insert((s.pid, s.id)),
                "stack {} of {} sent twice",
                s.id,
                s.pid
            );
            assert!(
                self.objects
                    .iter()
                    .zip(&self.objects_records)
                    .any(|(o, _)| o.pid == s.pid),
                "stack {} of {} has no objects of its process in the trace",
                s.id,
                s.pid
            );
        }
        for (pid, events) in &self.events {
            for (e, at) in events.iter().zip(&self.event_records[pid]) {
                if e.stack == 0 {
                    continue;
                }
                let i = self
                    .stacks
                    .iter()
                    .position(|s| s.pid == *pid && s.id == e.stack)
                    .unwrap_or_else(|| {
                        panic!("{pid}: event names unknown stack {}: {e:?}", e.stack)
                    });
                assert!(
                    self.stack_records[i] < *at,
                    "{pid}: stack {} arrived after an event naming it",
                    e.stack
                );
            }
        }
    }
}

pub fn read_trace(path: &Path) -> Trace {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let (mut r, header) = TraceReader::open(std::io::BufReader::new(f)).expect("a trace");
    let mut t = Trace {
        header,
        hellos: vec![],
        events: BTreeMap::new(),
        ooms: vec![],
        ends: vec![],
        dropped: 0,
        lost: Vec::new(),
        contexts_gone: Vec::new(),
        goodbyes: vec![],
        frame_names: vec![],
        stop: Stop::Reading,
        stacks: vec![],
        objects: vec![],
        notes: vec![],
        samples: vec![],
        bridge: vec![],
        event_records: BTreeMap::new(),
        stack_records: vec![],
        objects_records: vec![],
        exits: vec![],
        reaped: vec![],
        devices: vec![],
    };
    let mut n = 0usize;
    while let Some(rec) = r.next_record() {
        n += 1;
        match rec {
            Record::Hello(h) => t.hellos.push(h),
            Record::Events { pid, events } => {
                t.event_records
                    .entry(pid)
                    .or_default()
                    .extend(std::iter::repeat_n(n, events.len()));
                t.events.entry(pid).or_default().extend(events)
            }
            Record::Dropped { count, .. } => t.dropped += count,
            Record::Goodbye { pid, .. } => t.goodbyes.push(pid),
            Record::Tick { .. } | Record::End { .. } => {}
            Record::ProcessEnd { pid, kind, .. } => t.ends.push((pid, kind)),
            Record::Oom(o) => t.ooms.push(o),
            Record::Stack(s) => {
                t.stacks.push(s);
                t.stack_records.push(n);
            }
            Record::Objects(o) => {
                t.objects.push(o);
                t.objects_records.push(n);
            }
            Record::Note { pid, text, .. } => t.notes.push((pid, text)),
            Record::FrameworkSample(f) => t.samples.push((n, f)),
            Record::Bridge(b) => t.bridge.push((n, b)),
            Record::Exit(x) => t.exits.push(x),
            Record::Reaped {
                pid, child, status, ..
            } => t.reaped.push((pid, child, status)),
            Record::Lost {
                pid, count, cause, ..
            } => t.lost.push((pid, cause, count)),
            Record::ContextGone { pid, device, .. } => t.contexts_gone.push((pid, device)),
            Record::FrameNames(f) => t.frame_names.push(f),
            Record::Devices { pid, uuids, .. } => t.devices.extend(
                uuids
                    .iter()
                    .map(|(o, u)| (pid, *o, vramtrace_format::gpu_uuid(u))),
            ),
        }
    }
    t.stop = r.stop().clone();
    t
}

/// The trace API and `_ptsz` flag for a driver-log function name, if the shim tracks it.
pub fn tracked(func: &str) -> Option<(Api, bool)> {
    let (base, ptsz) = match func.strip_suffix("_ptsz") {
        Some(b) => (b, true),
        None => (func, false),
    };
    Api::ALL
        .iter()
        .find(|a| a.name() == base)
        .map(|a| (*a, ptsz))
}

/// Asserts that the shim recorded exactly the tracked calls the driver saw, one for one and in order, with the
/// same results, addresses, sizes, streams and handles. Two differences are allowed and counted: the shim's
/// own `cuMemGetInfo_v2` at an out-of-memory moment (in the log, not recorded; at most `ooms` of them), and
/// requests the cap refused (recorded, never reaching the driver). Returns how many calls were compared.
pub fn assert_trace_matches_log(log: &[LogLine], events: &[Event], ooms: usize) -> usize {
    // Threads interleave differently in the driver and in the channel: compare each thread's own sequence.
    let tids: std::collections::BTreeSet<u32> = log
        .iter()
        .map(|l| l.tid)
        .chain(events.iter().map(|e| e.tid))
        .collect();
    if tids.len() > 1 {
        return tids
            .iter()
            .map(|t| {
                let l: Vec<LogLine> = log.iter().filter(|l| l.tid == *t).cloned().collect();
                let e: Vec<Event> = events.iter().filter(|e| e.tid == *t).copied().collect();
                assert_thread_matches_log(&l, &e, ooms)
            })
            .sum();
    }
    assert_thread_matches_log(log, events, ooms)
}

/// A call that gives something back: the shim publishes it before the driver answers (and a refusal after it).
pub fn is_release(api: Api) -> bool {
    use vramtrace_format::Effect;
    matches!(api.effect(), Effect::FreePtr | Effect::ReleaseHandle)
        || matches!(api, Api::MemUnmap | Api::MemAddressFree)
}

/// The driver calls of `log` the shim records: one event each, two for a release the driver refused.
pub fn events_for(log: &[LogLine]) -> usize {
    log.iter()
        .filter_map(|l| tracked(&l.func).map(|(a, _)| (a, l.rc)))
        .map(|(a, rc)| if is_release(a) && rc != 0 { 2 } else { 1 })
        .sum()
}

fn assert_thread_matches_log(log: &[LogLine], events: &[Event], ooms: usize) -> usize {
    let calls: Vec<(&LogLine, Api, bool)> = log
        .iter()
        .filter_map(|l| tracked(&l.func).map(|(a, p)| (l, a, p)))
        .collect();
    let events: Vec<&Event> = events
        .iter()
        .filter(|e| e.flags & flags::CAP_REFUSED == 0)
        .collect();
    let (mut i, mut j, mut skipped_info) = (0, 0, 0);
    while i < calls.len() {
        let (l, api, ptsz) = calls[i];
        let Some(e) = events.get(j) else {
            panic!(
                "the driver saw {l:?} but the trace ends ({} events compared)",
                j
            );
        };
        if api == Api::MemGetInfo && e.api != Api::MemGetInfo {
            skipped_info += 1;
            i += 1;
            continue;
        }
        let what = format!("call {i} {l:?} vs event {j} {e:?}");
        assert_eq!(e.api, api, "{what}");
        assert_eq!(e.flags & flags::PTSZ != 0, ptsz, "{what}");
        assert_eq!(e.flags & flags::UNDONE, 0, "{what}");
        if is_release(api) && l.rc != 0 {
            // Published before the driver refused it, then taken back by the thread's next event.
            assert_eq!(e.result, 0, "{what}");
            let u = events
                .get(j + 1)
                .unwrap_or_else(|| panic!("{what}: no UNDONE event after it"));
            assert!(u.flags & flags::UNDONE != 0, "{what}: then {u:?}");
            assert_eq!((u.api, u.addr, u.result), (api, l.addr, l.rc), "{what}");
            j += 1;
        } else {
            assert_eq!(e.result, l.rc, "{what}");
        }
        assert_eq!(e.addr, l.addr, "{what}");
        match api.effect() {
            vramtrace_format::Effect::AllocPtr => {
                assert_eq!(e.size, l.size, "{what}");
                if matches!(
                    api,
                    Api::MemAllocAsync | Api::MemAllocFromPoolAsync | Api::MemAllocPitch
                ) {
                    assert_eq!(e.aux, l.aux, "{what}");
                }
            }
            vramtrace_format::Effect::CreateHandle => {
                assert_eq!(e.size, l.size, "{what}");
                assert_eq!(e.device as u64, l.aux, "{what}: device");
            }
            vramtrace_format::Effect::AddressSpace | vramtrace_format::Effect::Info => {
                assert_eq!(e.size, l.size, "{what}");
                if api == Api::MemMap {
                    assert_eq!(e.aux, l.aux, "{what}: handle");
                }
            }
            vramtrace_format::Effect::FreePtr => {
                if api == Api::MemFreeAsync {
                    assert_eq!(e.aux, l.aux, "{what}: stream");
                }
            }
            vramtrace_format::Effect::ReleaseHandle => {}
        }
        i += 1;
        j += 1;
    }
    assert_eq!(
        j,
        events.len(),
        "the trace holds events the driver never saw: {:?}",
        &events[j..]
    );
    assert!(
        skipped_info <= ooms,
        "{skipped_info} cuMemGetInfo_v2 calls were not recorded"
    );
    j
}

/// The report of a trace against the reference replay (every event in time order): exact, nothing out of
/// order, no free taken for lost or unmatched.
pub fn assert_replays_exactly(path: &std::path::Path, events: u64, what: &str) {
    let a = vramtrace_collector::whatif::trace_file::analyze(path).unwrap();
    let reference =
        vramtrace_collector::model::analyze_reference(std::fs::File::open(path).unwrap()).unwrap();
    assert_eq!(a.dropped_events, 0, "{what}");
    assert_eq!(a.events, events, "{what}");
    assert_eq!(a.merge_inexact_events, 0, "{what}: entries out of order");
    assert_eq!((a.lost_frees, a.unmatched_frees), (0, 0), "{what}");
    assert_eq!(
        a.devices[0].peak_bytes, reference.devices[0].peak_bytes,
        "{what}"
    );
    assert_eq!(
        a.devices[0].timeline, reference.devices[0].timeline,
        "{what}"
    );
}
