//! The Python bridge's records (`Record::Bridge`), read once into typed facts. The wire carries each record as
//! its kind and one JSON object ([`doc`]: the schema's types, held equal to bridge/schema.json); this is the one
//! place that reads them. Every reader (the replay's framework observer, `fit`'s progress) matches on
//! [`BridgeRecord`], so a kind added to the schema is a compile error here until it is read, and then in each
//! reader until it is handled.

pub mod doc;
mod holders;
mod oom;

use vramtrace_format::keys::bridge::{values, what, Kind};
use vramtrace_format::{Bridge, Framework, NO_DEVICE};

use crate::model::analysis::framework::{BridgeProcess, FrameworkOom, HistoryChange};
use crate::model::analysis::growth::StepSource;
use crate::model::analysis::holders::Holders;

/// Boundary readings name devices below this ordinal only: a forged record cannot make millions of devices.
pub const MAX_READING_DEVICE: u64 = 256;

/// One bridge record, typed.
pub enum BridgeRecord {
    /// The bridge loaded in a process (PyTorch's side only says `attach`).
    Attach(BridgeProcess),
    /// It armed or disarmed PyTorch's allocation history.
    History(HistoryChange),
    /// A framework's out-of-memory error, with the allocator's figures and settings then.
    Oom(Box<FrameworkOom>, Peaks),
    /// The process's last figures at its exit.
    Exit(Peaks),
    /// A snapshot of PyTorch's history written at the process's exit (`path`).
    ExitSnapshot(String),
    /// The program's iteration count, and the allocator's reading at that boundary.
    Steps(StepReading),
    /// The allocator's peak counters rose.
    Peak(Peaks),
    /// What held the tensors (the bridge's walk).
    Holders(Holders),
    /// Something the bridge wants said once.
    Note(String),
    /// The bridge stopped the program after its steps (`run --stop-after-steps`).
    Stopped { steps: u64 },
}

/// The allocator's own peak counters a record carries, and the device they are of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peaks {
    pub device: Option<u32>,
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
}

impl Peaks {
    /// Some figure, of a device.
    pub fn any(self) -> Option<(u32, Option<u64>, Option<u64>)> {
        let d = self.device?;
        (self.allocated.is_some() || self.reserved.is_some()).then_some((
            d,
            self.allocated,
            self.reserved,
        ))
    }
}

/// A `steps` record: the counters the bridge keeps, and its reading at the boundary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReading {
    pub optimizer: u64,
    pub batches: u64,
    pub scopes: u64,
    /// The device read (below [`MAX_READING_DEVICE`]).
    pub device: Option<u32>,
    /// Allocated bytes at the boundary.
    pub allocated: Option<u64>,
    pub peaks: Peaks,
}

impl StepReading {
    /// What counts the program's iterations: optimizer steps when it has any, else DataLoader batches, else
    /// its outermost no_grad scopes (the bridge reads its boundaries only then too); with the count.
    pub fn counter(&self) -> (StepSource, u64) {
        if self.optimizer > 0 {
            (StepSource::Optimizer, self.optimizer)
        } else if self.batches > 0 {
            (StepSource::Batches, self.batches)
        } else {
            (StepSource::Scopes, self.scopes)
        }
    }
}

impl BridgeRecord {
    /// Reads record `b`, at relative time `t`. `None` for a kind this build does not know (a newer bridge's), and
    /// for a record that says nothing usable (a walk at no known moment, a snapshot not at exit).
    pub fn read(b: &Bridge, t: u64) -> Option<BridgeRecord> {
        let device = (b.device != NO_DEVICE).then_some(b.device);
        Some(match b.kind()? {
            Kind::Attach => {
                let a: doc::Attach = doc::read(&b.doc);
                BridgeRecord::Attach(BridgeProcess {
                    pid: b.pid,
                    framework: Framework::Torch,
                    framework_version: a.torch.some(),
                    python: a.python.some(),
                    backend: a.backend.some(),
                    alloc_conf: a.alloc_conf.some(),
                    sample_ms: a.sample_ms.get(),
                    history_entries: a.history_entries.or0(),
                    problems: a.problems.0,
                })
            }
            Kind::History => {
                let h: doc::History = doc::read(&b.doc);
                BridgeRecord::History(HistoryChange {
                    pid: b.pid,
                    device,
                    time_ns: t,
                    armed: h.state.as_str() == values::ARMED,
                    reason: h.reason.as_str().to_string(),
                    entries: h.entries.or0(),
                    allocated: h.allocated.get(),
                    limit: h.limit.get(),
                })
            }
            Kind::Oom => {
                let o: doc::Oom = doc::read(&b.doc);
                let peaks = Peaks {
                    device,
                    allocated: o.allocated_peak.get().or(o.peak_bytes_in_use.get()),
                    reserved: o.reserved_peak.get(),
                };
                BridgeRecord::Oom(Box::new(FrameworkOom::from_bridge(b, &o, t)), peaks)
            }
            Kind::Exit => {
                let x: doc::Exit = doc::read(&b.doc);
                BridgeRecord::Exit(Peaks {
                    device,
                    allocated: x.allocated_peak.get().or(x.peak_bytes_in_use.get()),
                    reserved: x.reserved_peak.get(),
                })
            }
            Kind::Snapshot => {
                let s: doc::Snapshot = doc::read(&b.doc);
                if s.at.as_str() != what::EXIT {
                    return None;
                }
                BridgeRecord::ExitSnapshot(s.path.0?)
            }
            Kind::Steps => {
                let s: doc::Steps = doc::read(&b.doc);
                // A boundary reading names its device among its fields.
                let device = s
                    .device
                    .get()
                    .filter(|&d| d < MAX_READING_DEVICE)
                    .map(|d| d as u32);
                BridgeRecord::Steps(StepReading {
                    optimizer: s.optimizer.or0(),
                    batches: s.batches.or0(),
                    scopes: s.scopes.or0(),
                    device,
                    allocated: s.allocated.get(),
                    peaks: Peaks {
                        device,
                        allocated: s.allocated_peak.get(),
                        reserved: s.reserved_peak.get(),
                    },
                })
            }
            Kind::Peak => {
                let p: doc::Peak = doc::read(&b.doc);
                BridgeRecord::Peak(Peaks {
                    device,
                    allocated: p.allocated_peak.get(),
                    reserved: p.reserved_peak.get(),
                })
            }
            Kind::Holders => BridgeRecord::Holders(Holders::from_bridge(b, t)?),
            Kind::Note => {
                BridgeRecord::Note(doc::read::<doc::Note>(&b.doc).text.as_str().to_string())
            }
            Kind::Stopped => BridgeRecord::Stopped {
                steps: doc::read::<doc::Stopped>(&b.doc).steps.or0(),
            },
        })
    }

    /// The allocator's peak counters it carries (`peak`, `steps`, `oom`, `exit`), of a device.
    pub fn peaks(&self) -> Option<(u32, Option<u64>, Option<u64>)> {
        match self {
            BridgeRecord::Peak(p) | BridgeRecord::Exit(p) | BridgeRecord::Oom(_, p) => p.any(),
            BridgeRecord::Steps(s) => s.peaks.any(),
            BridgeRecord::Attach(_)
            | BridgeRecord::History(_)
            | BridgeRecord::ExitSnapshot(_)
            | BridgeRecord::Holders(_)
            | BridgeRecord::Note(_)
            | BridgeRecord::Stopped { .. } => None,
        }
    }
}

/// A bridge record as the wire brings it, for tests: `fields` as the old flattened pairs (`h.0.kind`), nested as
/// a kind-13 frame's are read (format's `codec::nest_bridge_pairs`), each value as its text (which the readers
/// take as a count or a flag where the schema says one).
#[cfg(test)]
pub(crate) fn record<V: ToString>(
    pid: u32,
    what: &str,
    device: u32,
    fields: &[(&str, V)],
) -> Bridge {
    let pairs: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Bridge {
        pid,
        tid: pid,
        ts_ns: 0,
        what: what.into(),
        device,
        ack: false,
        doc: serde_json::Value::Object(vramtrace_format::codec::nest_bridge_pairs(&pairs))
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(what: &str, device: u32, fields: &[(&str, &str)]) -> Bridge {
        record(7, what, device, fields)
    }

    #[test]
    fn each_kind_reads_into_its_variant_and_an_unknown_one_into_none() {
        let steps = rec(
            "steps",
            NO_DEVICE,
            &[
                ("scopes", "9"),
                ("device", "1"),
                ("allocated", "5"),
                ("allocated_peak", "8"),
            ],
        );
        let Some(BridgeRecord::Steps(s)) = BridgeRecord::read(&steps, 0) else {
            panic!("steps")
        };
        assert_eq!(s.counter(), (StepSource::Scopes, 9));
        assert_eq!((s.device, s.allocated), (Some(1), Some(5)));
        assert_eq!(
            BridgeRecord::read(&steps, 0).unwrap().peaks(),
            Some((1, Some(8), None))
        );
        // The optimizer's count wins over the batches', and those over the scopes'.
        let both = rec(
            "steps",
            NO_DEVICE,
            &[("optimizer", "3"), ("batches", "6"), ("scopes", "9")],
        );
        let Some(BridgeRecord::Steps(s)) = BridgeRecord::read(&both, 0) else {
            panic!("steps")
        };
        assert_eq!(s.counter(), (StepSource::Optimizer, 3));
        // A forged device ordinal is no device.
        let forged = rec(
            "steps",
            NO_DEVICE,
            &[("device", "999999"), ("allocated_peak", "8")],
        );
        assert_eq!(BridgeRecord::read(&forged, 0).unwrap().peaks(), None);

        let attach = rec(
            "attach",
            NO_DEVICE,
            &[
                ("torch", "2.11"),
                ("problem.2", "b"),
                ("problem.1", "a"),
                ("sample_ms", "50"),
            ],
        );
        let Some(BridgeRecord::Attach(a)) = BridgeRecord::read(&attach, 0) else {
            panic!("attach")
        };
        assert_eq!(a.problems, ["a", "b"]);
        assert_eq!(
            (a.framework_version.as_deref(), a.sample_ms),
            (Some("2.11"), Some(50))
        );

        let history = rec(
            "history",
            0,
            &[("state", "armed"), ("reason", "retry"), ("entries", "10")],
        );
        let Some(BridgeRecord::History(h)) = BridgeRecord::read(&history, 42) else {
            panic!("history")
        };
        assert!(h.armed);
        assert_eq!((h.device, h.time_ns, h.entries), (Some(0), 42, 10));

        let exit = rec(
            "exit",
            2,
            &[("peak_bytes_in_use", "11"), ("reserved_peak", "12")],
        );
        assert_eq!(
            BridgeRecord::read(&exit, 0).unwrap().peaks(),
            Some((2, Some(11), Some(12)))
        );
        // No device: nothing to place a peak on.
        let exit = rec("exit", NO_DEVICE, &[("allocated_peak", "11")]);
        assert_eq!(BridgeRecord::read(&exit, 0).unwrap().peaks(), None);

        let snap = rec(
            "snapshot",
            NO_DEVICE,
            &[("at", "exit"), ("path", "/t/s.pickle")],
        );
        assert!(
            matches!(BridgeRecord::read(&snap, 0), Some(BridgeRecord::ExitSnapshot(p)) if p == "/t/s.pickle")
        );
        let snap = rec(
            "snapshot",
            NO_DEVICE,
            &[("at", "later"), ("path", "/t/s.pickle")],
        );
        assert!(BridgeRecord::read(&snap, 0).is_none());
        let stopped = rec("stopped", NO_DEVICE, &[("steps", "5")]);
        assert!(matches!(
            BridgeRecord::read(&stopped, 0),
            Some(BridgeRecord::Stopped { steps: 5 })
        ));
        assert!(BridgeRecord::read(&rec("later", NO_DEVICE, &[]), 0).is_none());
    }
}
