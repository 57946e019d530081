//! Exits that parents reaped themselves. `vramtrace run` reaps the command and every process orphaned to it;
//! a process reaped by its own parent (torchrun's workers, a shell's children) is seen only by that parent's
//! shim, which reports it (`Record::Reaped`: on its ring, or, from a process with no connection, on a
//! connection of one frame). A report is a parent's word about another process, so it is kept only where the
//! kernel agrees: the child is a process of the trace whose parent, by /proc when it connected (by its own
//! hello when /proc had forgotten it), is the reporter, by the kernel's pid. A report about a process of the
//! trace with another parent is refused and counted against the reporter; one about a process that never
//! connected (a shell's `ls`) has nothing to attach to and is passed over. Kept reports become `Exit` records
//! when the job is over, unless `run` reaped that pid itself.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use vramtrace_format::codec::{self, kind};
use vramtrace_format::{Exit, ExitStatus, LossCause, Record};

use super::ingest::{Refusal, Speaker};
use super::{Connections, TraceWriter};

/// One report, from the reporter the kernel named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub reporter: u32,
    pub ts_ns: u64,
    pub child: u32,
    pub status: ExitStatus,
}

/// What the job's connections learnt of parents and reaps.
#[derive(Default)]
pub(crate) struct Reaps {
    /// Each process of the trace (kernel pid) and its parent: /proc's at accept, else its hello's.
    pub(super) parents: Mutex<HashMap<u32, u32>>,
    pub(super) reports: Mutex<Vec<Report>>,
}

/// Takes a `Reaped` frame from `who`: kept for the end of the job, or refused.
pub(super) fn admit(
    payload: &[u8],
    who: Speaker,
    conns: Option<&Connections>,
) -> Result<(), Refusal> {
    let Ok(Some(Record::Reaped {
        pid,
        ts_ns,
        child,
        status,
    })) = codec::decode_record(kind::REAPED, payload)
    else {
        return Err(Refusal::Undecodable(kind::REAPED));
    };
    if pid != who.said {
        return Err(Refusal::OtherPid {
            kind: kind::REAPED,
            pid,
        });
    }
    // A reporter in a pid namespace of its own numbers its children there: they cannot be matched here.
    if who.said != who.kernel {
        return Ok(());
    }
    if let Some(c) = conns {
        if let Ok(mut r) = c.reaps.reports.lock() {
            // Bounded: a process reaps at most as many children as it had; a flood past this is not believed.
            if r.len() < MAX_REPORTS {
                r.push(Report {
                    reporter: who.kernel,
                    ts_ns,
                    child,
                    status,
                });
            }
        }
    }
    Ok(())
}

/// More reports than any job makes processes for.
const MAX_REPORTS: usize = 1 << 20;

/// The reports to keep (child's `Exit`s) and the refused count per reporter, by the rule above.
pub(super) fn judge(
    reports: &[Report],
    parents: &HashMap<u32, u32>,
    reaped_by_run: &HashSet<u32>,
) -> (Vec<Exit>, HashMap<u32, u64>) {
    let mut exits = Vec::new();
    let mut refused: HashMap<u32, u64> = HashMap::new();
    let mut done: HashSet<u32> = HashSet::new();
    for r in reports {
        // A process that never connected: nothing to attach it to.
        let Some(parent) = parents.get(&r.child) else {
            continue;
        };
        if *parent != r.reporter {
            *refused.entry(r.reporter).or_default() += 1;
            continue;
        }
        // Once, and not where run has the status from its own wait.
        if !reaped_by_run.contains(&r.child) && done.insert(r.child) {
            exits.push(Exit {
                pid: r.child,
                ts_ns: r.ts_ns,
                status: r.status,
            });
        }
    }
    (exits, refused)
}

/// Writes the kept reports as `Exit` records, and the refused ones as losses of their reporters. Called once,
/// when every connection has ended.
pub(crate) fn write(conns: &Connections, trace: &Mutex<TraceWriter>) {
    let reports = std::mem::take(
        &mut *conns
            .reaps
            .reports
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    if reports.is_empty() {
        return;
    }
    let parents = conns
        .reaps
        .parents
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let reaped = conns
        .reaped
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (exits, refused) = judge(&reports, &parents, &reaped);
    let mut buf = Vec::new();
    for x in exits {
        codec::put_record(&mut buf, &Record::Exit(x));
    }
    let now = crate::ticks::mono_ns();
    for (pid, count) in refused {
        codec::put_record(
            &mut buf,
            &Record::Note {
                pid,
                ts_ns: now,
                text: format!(
                    "this process reported {count} exit(s) of processes that are not its children; refused"
                ),
            },
        );
        codec::put_record(
            &mut buf,
            &Record::Lost {
                pid,
                ts_ns: now,
                count,
                cause: LossCause::Refused,
            },
        );
    }
    if let Ok(mut w) = trace.lock() {
        w.write(0, &buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(reporter: u32, child: u32, code: i32) -> Report {
        Report {
            reporter,
            ts_ns: 5,
            child,
            status: ExitStatus::Code(code),
        }
    }

    #[test]
    fn only_a_childs_own_parent_is_believed() {
        let parents = HashMap::from([(20, 10), (21, 10), (30, 99)]);
        let reports = [
            report(10, 20, 3),
            // Its sibling's exit, from a process that is not its parent.
            report(11, 21, 137),
            // A child that never connected: nothing to attach it to.
            report(10, 4242, 1),
            // Said twice: the first kept.
            report(10, 20, 9),
            // run reaped it itself.
            report(99, 30, 0),
        ];
        let (exits, refused) = judge(&reports, &parents, &HashSet::from([30]));
        assert_eq!(
            exits,
            [Exit {
                pid: 20,
                ts_ns: 5,
                status: ExitStatus::Code(3)
            }]
        );
        assert_eq!(refused, HashMap::from([(11, 1)]));
    }

    #[test]
    fn a_report_for_another_reporter_or_undecodable_is_refused() {
        let mut b = Vec::new();
        codec::put_record(
            &mut b,
            &Record::Reaped {
                pid: 10,
                ts_ns: 1,
                child: 20,
                status: ExitStatus::Code(0),
            },
        );
        let (_, p) = codec::frames(&b).next().unwrap();
        let me = Speaker {
            kernel: 11,
            said: 11,
        };
        assert!(matches!(
            admit(p, me, None),
            Err(Refusal::OtherPid { pid: 10, .. })
        ));
        assert!(admit(&[0xff], me, None).is_err());
        let ten = Speaker {
            kernel: 10,
            said: 10,
        };
        assert!(admit(p, ten, None).is_ok());
    }
}
