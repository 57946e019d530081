//! The trace's records, as the replay takes them in file order: events and timed records go into the merge,
//! at their times; metadata (call sites, loaded objects, notes, losses) is kept at once; each record moves its
//! process's promise (docs/ARCHITECTURE.md, "How the merge keeps it").

use vramtrace_format::keys;
use vramtrace_format::{Bridge, EndKind, Event, FrameworkSample, Hello, Record};

use crate::model::analysis::bridge::BridgeRecord;
use crate::model::analysis::holders::{Holders, WalkAt};
use crate::model::analysis::Ended;
use crate::model::input::entry::Entry;
use crate::model::observe::framework::Told;
use crate::model::replay::name_gpu;
use crate::model::replay::Replay;

impl Replay<'_> {
    pub(in crate::model) fn on_events(&mut self, pid: u32, batch: Vec<Event>) {
        if batch.is_empty() {
            return;
        }
        self.events += batch.len() as u64;
        let (mut lo, mut hi) = (u64::MAX, 0);
        for e in &batch {
            lo = lo.min(e.ts_ns);
            hi = hi.max(e.ts_ns);
        }
        self.observe(lo);
        self.observe(hi);
        let s = self.route(pid, lo);
        self.advance(s, hi);
        self.procs[s].newest = self.procs[s].newest.max(hi);
        let limit = self.limit();
        self.merge.events(s, pid, batch, limit);
        self.pump();
    }

    pub(in crate::model) fn on_record(&mut self, rec: Record) {
        match rec {
            Record::Hello(h) => self.on_hello(h),
            Record::Events { pid, events } => self.on_events(pid, events),
            Record::End { .. } => self.end_record = true,
            Record::Dropped { pid, ts_ns, count } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                self.merge
                    .record(pid, 0, ts_ns, Entry::Dropped { slot: s, count });
                self.pump();
            }
            // The collector's promise for processes still to come: none has anything older.
            Record::Tick { pid: 0, ts_ns } => {
                if let Some(n) = &mut self.newcomers {
                    *n = (*n).max(ts_ns);
                }
                self.pump();
            }
            Record::Tick { pid, ts_ns } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                self.promise_now(s, ts_ns);
                self.pump();
            }
            Record::Goodbye { pid, ts_ns } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                self.promise_now(s, ts_ns);
                let p = &mut self.procs[s];
                p.goodbye = true;
                // The process's last word, after its last record: CUDA releases what it left when it exits, right
                // after. Released then, not when the collector noticed the connection close, which may be after a
                // next process started. Never before anything it recorded (after it, by a nanosecond: records
                // such as a context's teardown sort after ends at the same time) or promised.
                if self.goodbye_last && !p.end_queued {
                    let at = ts_ns.max(p.wm).max(p.newest.saturating_add(1));
                    p.end_queued = true;
                    p.s.ended = Ended::Goodbye;
                    p.s.end_ns = Some(at.saturating_sub(self.start));
                    self.merge.record(pid, 0, at, Entry::End { slot: s });
                }
                self.close(s);
                self.pump();
            }
            Record::ProcessEnd { pid, ts_ns, kind } => {
                self.observe(ts_ns);
                // One per connection, and connections of one pid end in order: the oldest image without one.
                let mut s = self.route(pid, ts_ns);
                while let Some(pv) = self.procs[s].prev {
                    if self.procs[pv].end_seen {
                        break;
                    }
                    s = pv;
                }
                let p = &mut self.procs[s];
                if !p.end_seen {
                    p.end_seen = true;
                    // Its kind is said even when a goodbye already ended it (and released its memory).
                    p.s.ended = match kind {
                        EndKind::Goodbye => Ended::Goodbye,
                        EndKind::Vanished => Ended::Vanished,
                        EndKind::CutMidFrame { partial_bytes } => {
                            Ended::CutMidFrame { partial_bytes }
                        }
                    };
                    if !p.end_queued {
                        p.end_queued = true;
                        p.s.end_ns = Some(ts_ns.saturating_sub(self.start));
                        self.close(s);
                        self.merge.record(pid, 0, ts_ns, Entry::End { slot: s });
                    }
                }
                self.pump();
            }
            Record::Oom(o) => {
                let ts = o.ts_ns;
                self.observe(ts);
                // Follows the batch holding its failure: it moves no promise (nor do the bridge's records).
                let s = self.route(o.pid, ts);
                self.procs[s].newest = self.procs[s].newest.max(ts);
                let (pid, tid) = (o.pid, o.tid);
                let entry = Entry::Oom {
                    slot: s,
                    oom: Box::new(o),
                };
                self.merge.record(pid, tid, ts, entry);
                self.pump();
            }
            // Metadata: their times move no watermark and are no event's.
            Record::Stack(st) => {
                let s = self.route(st.pid, self.last_ts);
                self.cs.on_stack(&mut self.procs[s].cs, st);
            }
            Record::Objects(o) => {
                let s = self.route(o.pid, o.ts_ns);
                self.cs.on_objects(&mut self.procs[s].cs, o.objects);
            }
            // The collector's names for the native frames, from where the trace was recorded.
            Record::FrameNames(n) => self.cs.names.add(n),
            Record::Note { pid, ts_ns, text } => {
                let t = self.rel(ts_ns);
                self.cs.on_note(pid, t, text);
            }
            // Attached at the end: the process's own frames may still follow (the collector reaps a process
            // as soon as it dies, perhaps before its connection's last frames are written).
            Record::Exit(x) => self.exits.push(x),
            // A parent's word that it reaped a child: the collector checks it against what the kernel said of
            // the child and writes an `Exit` (receive/reaped.rs); the raw report is never in a trace it wrote.
            Record::Reaped { .. } => {}
            // Metadata: which GPU each of a process's ordinals is. An ordinal two processes named differently
            // (their own `CUDA_VISIBLE_DEVICES`) has no one UUID for the job.
            Record::Devices { pid, uuids, .. } => {
                // The pid's current image (its hello made the slot at intake, before this).
                if let Some(&slot) = self.by_pid.get(&pid) {
                    self.procs[slot].uuids.extend(uuids.iter().copied());
                }
                for (ordinal, u) in uuids {
                    name_gpu(&mut self.uuids, ordinal, u);
                }
            }
            // Why: the counts themselves came in `Dropped`, merged in time.
            Record::ContextGone {
                pid, ts_ns, device, ..
            } => {
                self.observe(ts_ns);
                let s = self.route(pid, ts_ns);
                self.procs[s].newest = self.procs[s].newest.max(ts_ns);
                self.merge
                    .record(pid, 0, ts_ns, Entry::ContextGone { slot: s, device });
                self.pump();
            }
            Record::Lost {
                pid, count, cause, ..
            } => {
                let s = self.route(pid, self.last_ts);
                let lost = &mut self.procs[s].s.lost;
                match lost.iter_mut().find(|(c, _)| *c == cause) {
                    Some((_, n)) => *n += count,
                    None => lost.push((cause, count)),
                }
                lost.sort_by_key(|l| std::cmp::Reverse(l.1));
            }
            // The bridge's records ride the merge like out-of-memory records: applied at their time.
            Record::FrameworkSample(f) => {
                let s = self.queue_fw(f.pid, f.ts_ns);
                let sample = Box::new(f);
                self.merge.record(
                    sample.pid,
                    0,
                    sample.ts_ns,
                    Entry::Sample { slot: s, sample },
                );
                self.pump();
            }
            Record::Bridge(b) => {
                let s = self.queue_fw(b.pid, b.ts_ns);
                let rec = Box::new(b);
                self.merge
                    .record(rec.pid, 0, rec.ts_ns, Entry::Bridge { slot: s, rec });
                self.pump();
            }
        }
    }

    /// The slot of a bridge record of process `pid` at `ts`, about to join the merge.
    fn queue_fw(&mut self, pid: u32, ts: u64) -> usize {
        self.observe(ts);
        let s = self.route(pid, ts);
        self.procs[s].newest = self.procs[s].newest.max(ts);
        s
    }

    /// Replays framework sample `f` of process `s` at `ts`.
    pub(in crate::model) fn on_sample(&mut self, s: usize, f: &FrameworkSample, ts: u64) {
        let t = self.rel(ts);
        self.fw.on_sample(s, f, t);
    }

    /// Replays bridge record `b` of process `s` at `ts`; a kind this build does not know (a newer bridge's) is
    /// skipped.
    pub(in crate::model) fn on_bridge(&mut self, s: usize, b: &Bridge, ts: u64) {
        let t = self.rel(ts);
        let Some(r) = BridgeRecord::read(b, t) else {
            return;
        };
        match self.fw.on_bridge(s, b.pid, r, t) {
            Some(Told::Oom(fo)) => self.fold_framework_oom(s, b.pid, b.tid, ts, *fo),
            Some(Told::Holders(h)) => self.place_walk(h, t),
            None => {}
        }
    }

    /// A walk of what holds the tensors: at an error, the process's latest framework error before it (the walk
    /// runs in PyTorch's observer, after the `oom` record and before the exception unwinds); else the run's.
    fn place_walk(&mut self, h: Holders, t: u64) {
        if let WalkAt::Oom(_) = h.at {
            let pid = h.pid;
            if let Some(o) = self
                .ooms
                .iter_mut()
                .rev()
                .find(|o| o.pid == pid && o.framework.is_some() && o.time_ns <= t)
            {
                o.holders = Some(h);
                return;
            }
        }
        self.fw.walk(h);
    }

    /// A hello: its slot and promise now (the intake's), what it says about the process when the replay reaches
    /// this point of the file: after every entry handed out before it, as inline, whichever thread merges.
    fn on_hello(&mut self, h: Hello) {
        self.observe(h.ts_ns);
        let s = match self.by_pid.get(&h.pid).copied() {
            Some(s) if !self.procs[s].hello_seen && !self.procs[s].end_seen => s,
            // A second hello: the pid exec'd a new program, or was reused after the first one ended.
            Some(s) => self.new_slot(h.pid, h.ts_ns, Some(s)),
            None => self.new_slot(h.pid, h.ts_ns, None),
        };
        self.procs[s].hello_seen = true;
        self.promise_now(s, h.ts_ns);
        self.merge.mark(Entry::Hello {
            slot: s,
            hello: Box::new(h),
        });
        self.pump();
    }

    /// The replay reached hello `h` of process `s`.
    pub(in crate::model) fn hello_applied(&mut self, s: usize, h: Hello) {
        let rel = self.rel(h.ts_ns);
        let p = &mut self.procs[s];
        p.s.announced = true;
        p.s.ppid = Some(h.ppid);
        p.s.cmdline = h.cmdline;
        p.s.hostname = Some(h.hostname);
        p.s.rank = h.rank;
        p.s.local_rank = h.local_rank;
        p.s.slurm_procid = h.slurm_procid;
        p.s.python_bridge = h
            .extra
            .iter()
            .any(|(k, v)| k == keys::hello::PYTHON_BRIDGE && v == "1");
        p.s.untraced = h
            .extra
            .iter()
            .find(|(k, _)| k == keys::hello::NO_RING)
            .map(|(_, why)| why.clone());
        p.s.start_ns = p.s.start_ns.min(rel);
    }
}
