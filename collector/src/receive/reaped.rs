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
use super::writer::TraceWriter;

/// One report, from the reporter the kernel named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub reporter: u32,
    pub ts_ns: u64,
    pub child: u32,
    pub status: ExitStatus,
    /// Whether the child's own parent (as the trace knows it) was still alive when this report came: then the
    /// kernel let only that parent reap it, and a report from anyone else is not believed.
    pub parent_alive: bool,
}

/// What the job's connections learnt of parents and reaps.
#[derive(Default)]
pub(crate) struct Reaps {
    /// Each process of the trace (kernel pid), each time a process by that number said hello: when, and its
    /// parent (/proc's at accept, else its hello's).
    parents: Mutex<Parents>,
    reports: Mutex<Reports>,
}

/// Pid -> (hello time, parent), oldest first: a pid the job reuses has one entry per process.
type Parents = HashMap<u32, Vec<(u64, u32)>>;

#[derive(Default)]
struct Reports {
    kept: Vec<Report>,
    /// Per reporter, how many it sent: a process cannot crowd out another's reports.
    per_reporter: HashMap<u32, usize>,
}

impl Reaps {
    /// Process `pid` said hello at `ts_ns`, a child of `parent`.
    pub(super) fn parent(&self, pid: u32, ts_ns: u64, parent: u32) {
        if let Ok(mut p) = self.parents.lock() {
            p.entry(pid).or_default().push((ts_ns, parent));
        }
    }
}

/// Takes a `Reaped` frame from `who`: kept for the end of the job, or refused.
pub(super) fn admit(payload: &[u8], who: Speaker, reaps: Option<&Reaps>) -> Result<(), Refusal> {
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
    if let Some(c) = reaps {
        if let Ok(mut r) = c.reports.lock() {
            // Bounded, per reporter and in all: a process reaps at most as many children as it had; a flood
            // past this is not believed, and crowds out no other process's reports.
            let n = r.per_reporter.entry(who.kernel).or_default();
            *n += 1;
            if *n <= MAX_PER_REPORTER && r.kept.len() < MAX_REPORTS {
                let parent_alive = c
                    .parents
                    .lock()
                    .ok()
                    .and_then(|p| parent_at(&p, child, ts_ns).map(|(_, pp)| pp))
                    .is_some_and(|pp| pp != who.kernel && alive(pp));
                r.kept.push(Report {
                    reporter: who.kernel,
                    ts_ns,
                    child,
                    status,
                    parent_alive,
                });
            }
        }
    }
    Ok(())
}

/// Whether `pid` names a live process now: one that has not exited. A zombie (exited, not yet reaped) has already
/// given its children to a subreaper, which may then report them. A pid reused since only makes a true report of
/// an ancestor refused, never a forged one believed.
fn alive(pid: u32) -> bool {
    if pid <= 1 {
        // init reaps orphans outside the job; the job's own subreaper is pid 1 only in a container of its own.
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the command's closing parenthesis.
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        // No /proc (or not readable): whether the pid exists at all.
        Err(_) => {
            // SAFETY: kill with signal 0 sends nothing; it only asks whether the pid exists.
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

/// More reports than any job makes processes for.
const MAX_REPORTS: usize = 1 << 22;
/// More children than one process reaps in any job.
const MAX_PER_REPORTER: usize = 1 << 16;

/// The parent of the process `pid` was at `ts_ns`: the one that said hello last at or before then (the
/// first, if all came later).
fn parent_at(parents: &Parents, pid: u32, ts_ns: u64) -> Option<(u64, u32)> {
    let v = parents.get(&pid)?;
    v.iter()
        .rev()
        .find(|(t, _)| *t <= ts_ns)
        .or(v.first())
        .copied()
}

/// The reports to keep (child's `Exit`s) and the refused count per reporter: a report is believed when the
/// reporter is the child's parent, or an ancestor of it once that parent was gone (a process reparented to a
/// subreaper of the job: tini, catatonit). The kernel lets only the parent of the moment reap a child, so an
/// ancestor's report made while the parent lived is refused, and the parent's own report is believed before
/// any ancestor's whatever came first. One about a process of the trace whose ancestors do not include the
/// reporter is refused; one about a process that never connected is passed over.
pub(super) fn judge(
    reports: &[Report],
    parents: &Parents,
    reaped_by_run: &HashSet<u32>,
) -> (Vec<Exit>, HashMap<u32, u64>) {
    let mut exits = Vec::new();
    let mut refused: HashMap<u32, u64> = HashMap::new();
    let mut done: HashSet<(u32, u64)> = HashSet::new();
    // The parents' own reports first: an ancestor's, sent sooner, cannot take a child's exit from its parent.
    let by_parent =
        |r: &Report| parent_at(parents, r.child, r.ts_ns).is_some_and(|(_, p)| p == r.reporter);
    let ordered = reports
        .iter()
        .filter(|r| by_parent(r))
        .chain(reports.iter().filter(|r| !by_parent(r)));
    for r in ordered {
        let Some((hello_ts, parent)) = parent_at(parents, r.child, r.ts_ns) else {
            continue;
        };
        if parent != r.reporter && r.parent_alive {
            *refused.entry(r.reporter).or_default() += 1;
            continue;
        }
        let mut ancestor = parent;
        let mut ours = false;
        for _ in 0..64 {
            if ancestor == r.reporter {
                ours = true;
                break;
            }
            match parent_at(parents, ancestor, r.ts_ns) {
                Some((_, up)) if up != ancestor => ancestor = up,
                _ => break,
            }
        }
        if !ours {
            *refused.entry(r.reporter).or_default() += 1;
            continue;
        }
        // Once per process, and not where run has the status from its own wait.
        if !reaped_by_run.contains(&r.child) && done.insert((r.child, hello_ts)) {
            exits.push(Exit {
                pid: r.child,
                ts_ns: r.ts_ns,
                status: r.status,
            });
        }
    }
    (exits, refused)
}

/// Writes the kept reports as `Exit` records, and the refused ones as losses of their reporters (`reaped`: the
/// job's processes vramtrace reaped itself). Called once, when every connection has ended.
pub(crate) fn write(
    reaps: &Reaps,
    reaped: &Mutex<std::collections::HashSet<u32>>,
    trace: &Mutex<TraceWriter>,
) {
    let reports = std::mem::take(&mut reaps.reports.lock().unwrap_or_else(|e| e.into_inner()).kept);
    if reports.is_empty() {
        return;
    }
    let parents = reaps
        .parents
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let reaped = reaped.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (exits, refused) = judge(&reports, &parents, &reaped);
    let mut buf = Vec::new();
    for x in exits {
        codec::put_record(&mut buf, &Record::Exit(x));
    }
    let now = crate::names::ticks::mono_ns();
    for (pid, count) in refused {
        // A reporter the trace names (it said hello) carries its refusals; one that only reported (a shell, an
        // agent with no connection of its own) is said under pid 0, so that no nameless process appears.
        if parents.contains_key(&pid) {
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
        } else {
            codec::put_record(
                &mut buf,
                &Record::Note {
                    pid: 0,
                    ts_ns: now,
                    text: format!(
                        "pid {pid} reported {count} exit(s) of processes that are not its children; refused"
                    ),
                },
            );
        }
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
            parent_alive: false,
        }
    }

    #[test]
    fn only_a_childs_own_parent_is_believed() {
        let parents: Parents = HashMap::from([
            (20, vec![(1, 10)]),
            (21, vec![(1, 10)]),
            (30, vec![(1, 99)]),
        ]);
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

    #[test]
    fn an_ancestor_is_believed_and_a_reused_pid_is_told_apart() {
        // 30 was orphaned to 10, its grandparent (a subreaper of the job); pid 20 served two processes, the
        // first a child of 11, the second (hello at 500) of 12.
        let parents: Parents = HashMap::from([
            (21, vec![(1, 10)]),
            (30, vec![(2, 21)]),
            (20, vec![(1, 11), (500, 12)]),
        ]);
        let reports = [
            Report {
                reporter: 10,
                ts_ns: 10,
                child: 30,
                status: ExitStatus::Code(1),
                parent_alive: false,
            },
            Report {
                reporter: 11,
                ts_ns: 100,
                child: 20,
                status: ExitStatus::Code(2),
                parent_alive: false,
            },
            Report {
                reporter: 12,
                ts_ns: 900,
                child: 20,
                status: ExitStatus::Code(3),
                parent_alive: false,
            },
            // The first process's parent cannot speak for the second.
            Report {
                reporter: 11,
                ts_ns: 901,
                child: 20,
                status: ExitStatus::Code(9),
                parent_alive: false,
            },
        ];
        let (exits, refused) = judge(&reports, &parents, &HashSet::new());
        let codes: Vec<(u32, ExitStatus)> = exits.iter().map(|x| (x.pid, x.status)).collect();
        assert_eq!(
            codes,
            [
                (20, ExitStatus::Code(2)),
                (20, ExitStatus::Code(3)),
                (30, ExitStatus::Code(1))
            ]
        );
        assert_eq!(refused, HashMap::from([(11, 1)]));
    }

    #[test]
    fn a_grandparent_cannot_speak_for_a_child_whose_parent_lives() {
        // 30 is 21's child, 21 is 10's. 10 reports 30 killed while 21 still lived (sooner than 21's own word),
        // and again later as if orphaned: neither outweighs 21's report. With 21 gone, 10's word is taken.
        let parents: Parents = HashMap::from([(21, vec![(1, 10)]), (30, vec![(2, 21)])]);
        let forged = Report {
            reporter: 10,
            ts_ns: 3,
            child: 30,
            status: ExitStatus::Signal {
                signal: 9,
                core: false,
            },
            parent_alive: true,
        };
        let true_one = Report {
            reporter: 21,
            ts_ns: 9,
            child: 30,
            status: ExitStatus::Code(0),
            parent_alive: false,
        };
        let late = Report {
            parent_alive: false,
            ..forged
        };
        let (exits, refused) = judge(&[forged, late, true_one], &parents, &HashSet::new());
        let codes: Vec<(u32, ExitStatus)> = exits.iter().map(|x| (x.pid, x.status)).collect();
        assert_eq!(codes, [(30, ExitStatus::Code(0))]);
        assert_eq!(refused, HashMap::from([(10, 1)]));
        let (exits, _) = judge(&[forged], &parents, &HashSet::new());
        assert!(exits.is_empty(), "{exits:?}");
        let (exits, _) = judge(&[late], &parents, &HashSet::new());
        assert_eq!(exits.len(), 1);
    }

    #[test]
    fn a_zombie_is_no_parent_any_more() {
        // A child that has exited and is not yet reaped: its children are already a subreaper's.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        let start = std::time::Instant::now();
        while alive(pid) {
            assert!(
                start.elapsed().as_secs() < 10,
                "the child never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        c.wait().unwrap();
        assert!(alive(std::process::id()));
    }

    #[test]
    fn one_reporter_cannot_crowd_out_another() {
        let c = Reaps::default();
        let frame = |pid: u32, child: u32| {
            let mut b = Vec::new();
            codec::put_record(
                &mut b,
                &Record::Reaped {
                    pid,
                    ts_ns: 1,
                    child,
                    status: ExitStatus::Code(0),
                },
            );
            b
        };
        let flood = Speaker { kernel: 5, said: 5 };
        for i in 0..(MAX_PER_REPORTER as u32 + 10) {
            let b = frame(5, i);
            let (_, p) = codec::frames(&b).next().unwrap();
            admit(p, flood, Some(&c)).unwrap();
        }
        let honest = Speaker { kernel: 6, said: 6 };
        let b = frame(6, 77);
        let (_, p) = codec::frames(&b).next().unwrap();
        admit(p, honest, Some(&c)).unwrap();
        let r = c.reports.lock().unwrap();
        assert_eq!(r.kept.len(), MAX_PER_REPORTER + 1);
        assert_eq!(r.kept.last().map(|k| (k.reporter, k.child)), Some((6, 77)));
    }

    #[test]
    fn a_refused_report_from_a_process_without_a_hello_is_said_under_pid_0() {
        let c = Reaps::default();
        c.parent(20, 1, 10);
        c.parent(11, 1, 1);
        if let Ok(mut r) = c.reports.lock() {
            // 11 said hello, 12 only reported: neither is 20's parent.
            for reporter in [11, 12] {
                r.kept.push(Report {
                    reporter,
                    ts_ns: 5,
                    child: 20,
                    status: ExitStatus::Code(1),
                    parent_alive: false,
                });
            }
        }
        let dir = std::env::temp_dir().join(format!("vramtrace-reaped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t");
        let trace = Mutex::new(TraceWriter::new(std::fs::File::create(&path).unwrap(), 0));
        write(&c, &Mutex::default(), &trace);
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let recs: Vec<Record> = codec::frames(&bytes)
            .filter_map(|(k, p)| codec::decode_record(k, p).ok().flatten())
            .collect();
        assert!(recs
            .iter()
            .any(|r| matches!(r, Record::Lost { pid: 11, .. })));
        assert!(!recs
            .iter()
            .any(|r| matches!(r, Record::Lost { pid: 12, .. })));
        assert!(recs.iter().any(
            |r| matches!(r, Record::Note { pid: 0, text, .. } if text.starts_with("pid 12 reported"))
        ));
        assert!(!recs.iter().any(|r| matches!(r, Record::Exit(_))));
    }
}
