//! What a process may say. Every frame a process sends, on its socket or through its ring, is checked here
//! before it is written: a process speaks only for itself (the pid the kernel gave its connection, never the
//! one it claims), only in the kinds of record a shim or the bridge writes, and only in records that decode.
//! Anything else is refused, counted against the process that sent it (`LossCause::Refused`), and never
//! reaches the trace: a hostile process costs at most its own records.

use vramtrace_format::codec;
use vramtrace_format::Record;

/// Who a connection speaks for: its pid by the kernel (`SO_PEERCRED`, in the collector's pid namespace), and
/// the pid its hello said (its own view: another number in a pid namespace of its own). Records must carry the
/// pid it said; they are written with the kernel's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Speaker {
    pub kernel: u32,
    pub said: u32,
}

/// Why a frame was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// A kind only the collector writes (process ends, exits, losses, promises), a second hello, or a kind
    /// this collector does not know.
    NotAProcessKind(u8),
    /// It does not decode.
    Undecodable(u8),
    /// It speaks for another process.
    OtherPid { kind: u8, pid: u32 },
    /// Larger than the collector's room for unfinished records (`budget`).
    TooLarge { bytes: u64 },
    /// Sent before the process said who it is.
    BeforeHello(u8),
    /// Past what one process may write in records other than its events (`RECORD_QUOTA`).
    OverQuota(u8),
}

impl Refusal {
    pub(super) fn describe(&self) -> String {
        match self {
            Refusal::NotAProcessKind(k) => {
                format!("a record of kind {k}, which no shim sends (only the collector writes it)")
            }
            Refusal::Undecodable(k) => format!("a record of kind {k} that does not decode"),
            Refusal::OtherPid { kind, pid } => {
                format!("a record of kind {kind} that speaks for pid {pid}, not for itself")
            }
            Refusal::TooLarge { bytes } => format!(
                "a record of {bytes} bytes, more than the collector's room for unfinished records allowed it"
            ),
            Refusal::BeforeHello(k) => format!("a record of kind {k} before its hello"),
            Refusal::OverQuota(k) => format!(
                "a record of kind {k} past the {} MiB a process may write besides its events",
                RECORD_QUOTA >> 20
            ),
        }
    }
}

/// The kinds a process's shim (and the bridge through it) writes after its hello. The hello itself is taken
/// by the connection, once.
fn from_a_process(k: u8) -> bool {
    codec::kind_info(k).is_some_and(|i| i.writer == codec::Writer::Process)
}

/// What is let through: the frame as it came, or rewritten to the kernel's pid.
#[derive(Debug)]
pub(super) enum Admitted {
    AsItCame,
    Rewritten(Record),
}

/// Checks one frame from `who`.
pub(super) fn admit(k: u8, payload: &[u8], who: Speaker) -> Result<Admitted, Refusal> {
    if !from_a_process(k) {
        return Err(Refusal::NotAProcessKind(k));
    }
    let mut rec = match codec::decode_record(k, payload) {
        Ok(Some(r)) => r,
        _ => return Err(Refusal::Undecodable(k)),
    };
    let Some(pid) = rec.pid_mut() else {
        return Err(Refusal::NotAProcessKind(k));
    };
    if *pid != who.said {
        return Err(Refusal::OtherPid { kind: k, pid: *pid });
    }
    if who.kernel == who.said {
        return Ok(Admitted::AsItCame);
    }
    *pid = who.kernel;
    Ok(Admitted::Rewritten(rec))
}

/// Appends `k`/`payload` as admitted to `out` (the caller has checked it).
pub(super) fn put_admitted(out: &mut Vec<u8>, k: u8, payload: &[u8], a: &Admitted) {
    match a {
        Admitted::AsItCame => codec::put_frame(out, k, |o| o.extend_from_slice(payload)),
        Admitted::Rewritten(r) => codec::put_record(out, r),
    }
}

/// What one process may write into the trace in records other than its events (notes, call sites, objects,
/// the bridge's): far past what any shim writes, short of what would fill the disk for everyone.
pub(super) const RECORD_QUOTA: u64 = 1 << 30;

/// A process's refused records: counted, the first one described. Written into the trace as they come
/// (`take_new`), as a `Lost` record of cause `Refused` and, once, a note saying what the first one was.
#[derive(Default)]
pub(super) struct Refused {
    /// Bytes of records other than events admitted so far (`RECORD_QUOTA`).
    written_bytes: u64,
    count: u64,
    written: u64,
    first: Option<Refusal>,
    said: bool,
}

impl Refused {
    /// Counts `n` bytes of a record of kind `k` against the quota: refused (and counted) past it.
    pub(super) fn charge(&mut self, k: u8, n: usize) -> bool {
        self.written_bytes = self.written_bytes.saturating_add(n as u64);
        if self.written_bytes > RECORD_QUOTA {
            self.add(Refusal::OverQuota(k));
            return false;
        }
        true
    }

    pub(super) fn add(&mut self, why: Refusal) {
        self.count += 1;
        self.first.get_or_insert(why);
    }

    /// What is not yet in the trace: the count since the last call, and the first refusal's description the
    /// first time there is one.
    pub(super) fn take_new(&mut self) -> Option<(u64, Option<String>)> {
        if self.count == self.written {
            return None;
        }
        let n = self.count - self.written;
        self.written = self.count;
        let first = (!self.said).then(|| {
            self.said = true;
            self.first
                .as_ref()
                .map(Refusal::describe)
                .unwrap_or_default()
        });
        Some((n, first))
    }

    #[cfg(test)]
    pub(super) fn count(&self) -> u64 {
        self.count
    }
}

/// Whether `token` is the job's: both non-empty and equal, compared in time independent of where they differ.
pub(super) fn same_token(job: &str, token: &str) -> bool {
    if job.is_empty() || job.len() != token.len() {
        return false;
    }
    job.bytes()
        .zip(token.bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// The hello key that carries the job's token (`VRAMTRACE_JOB_TOKEN`): checked, then taken out before the
/// hello is written.
pub(super) const TOKEN_KEY: &str = vramtrace_format::keys::hello::JOB_TOKEN;

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_format::codec::kind;
    use vramtrace_format::{EndKind, Exit, ExitStatus};

    fn frame(r: &Record) -> (u8, Vec<u8>) {
        let mut b = Vec::new();
        codec::put_record(&mut b, r);
        let (k, p) = codec::frames(&b).next().unwrap();
        (k, p.to_vec())
    }

    fn note(pid: u32) -> Record {
        Record::Note {
            pid,
            ts_ns: 5,
            text: "hi".into(),
        }
    }

    const ME: Speaker = Speaker {
        kernel: 700,
        said: 700,
    };

    #[test]
    fn a_process_speaks_for_itself_only() {
        let (k, p) = frame(&note(700));
        assert!(matches!(admit(k, &p, ME), Ok(Admitted::AsItCame)));
        let (k, p) = frame(&note(1));
        assert_eq!(
            admit(k, &p, ME).unwrap_err(),
            Refusal::OtherPid { kind: k, pid: 1 }
        );
    }

    #[test]
    fn the_collectors_own_kinds_are_refused_from_a_process() {
        for r in [
            Record::ProcessEnd {
                pid: 700,
                ts_ns: 1,
                kind: EndKind::Vanished,
            },
            Record::Exit(Exit {
                pid: 700,
                ts_ns: 1,
                status: ExitStatus::Signal {
                    signal: 9,
                    core: false,
                },
            }),
            Record::Tick { pid: 700, ts_ns: 1 },
            Record::Dropped {
                pid: 700,
                ts_ns: 1,
                count: 1 << 50,
            },
            Record::End { ts_ns: 1 },
        ] {
            let (k, p) = frame(&r);
            assert_eq!(
                admit(k, &p, ME).unwrap_err(),
                Refusal::NotAProcessKind(k),
                "{r:?}"
            );
        }
        assert_eq!(
            admit(200, &[1, 2, 3], ME).unwrap_err(),
            Refusal::NotAProcessKind(200)
        );
    }

    #[test]
    fn an_undecodable_record_is_refused() {
        assert_eq!(
            admit(kind::NOTE, &[0xff; 3], ME).unwrap_err(),
            Refusal::Undecodable(kind::NOTE)
        );
    }

    #[test]
    fn a_process_in_a_pid_namespace_is_written_with_the_kernels_pid() {
        let who = Speaker {
            kernel: 4000,
            said: 12,
        };
        let (k, p) = frame(&note(12));
        let Ok(a) = admit(k, &p, who) else {
            panic!("refused")
        };
        let mut out = Vec::new();
        put_admitted(&mut out, k, &p, &a);
        let (k2, p2) = codec::frames(&out).next().unwrap();
        assert_eq!(codec::decode_record(k2, p2).unwrap(), Some(note(4000)));
        // Its kernel pid is not what it says it is: a record naming it is another's.
        let (k, p) = frame(&note(4000));
        assert!(admit(k, &p, who).is_err());
    }

    #[test]
    fn refusals_are_counted_and_the_first_described_once() {
        let mut r = Refused::default();
        assert_eq!(r.take_new(), None);
        r.add(Refusal::OtherPid { kind: 11, pid: 1 });
        r.add(Refusal::Undecodable(7));
        let (n, first) = r.take_new().unwrap();
        assert_eq!(n, 2);
        assert!(first.unwrap().contains("pid 1"));
        r.add(Refusal::Undecodable(7));
        assert_eq!(r.take_new(), Some((1, None)));
    }

    #[test]
    fn tokens_must_match_whole() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "ab"));
        assert!(!same_token("", ""));
    }
}
