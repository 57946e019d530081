//! The runs beside a trace that differ from it in one knob: two commands that differ in exactly one argument, a
//! whole number in both (`--batch-size 32` and `--batch-size 16`, or `--batch=32` and `--batch=16`), are one
//! program at two values of that knob. `vramtrace oom` looks in the failed trace's folder for such runs (their
//! headers only), so that the advice can name the largest batch without being asked.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use vramtrace_format::TraceReader;

/// The largest knob value taken, in a run or `--at`: no batch or sequence length comes near it, and below it
/// the fits' arithmetic stays exact.
pub const MAX_VALUE: u64 = 1 << 32;

/// How many traces of the folder are read, at most.
pub const MAX_ENTRIES: usize = 512;

/// A knob's value in one argument: the whole argument, or what follows `=` in `--flag=N`.
fn number(arg: &str) -> Option<(&str, u64)> {
    let (prefix, digits) = match arg.rsplit_once('=') {
        Some((p, d)) => (p, d),
        None => ("", arg),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u64 = digits.parse().ok()?;
    (1..=MAX_VALUE).contains(&v).then_some((prefix, v))
}

/// The knob two commands differ in, and its value in each: `None` unless exactly one argument differs and it is
/// a whole number (1 to [`MAX_VALUE`]) in both, under the same flag. Its name: the flag (`--batch-size`), else
/// `argument N` (counted from the program, 0).
pub fn knob_between(a: &[String], b: &[String]) -> Option<(String, u64, u64)> {
    if a.len() != b.len() {
        return None;
    }
    let mut differ = a.iter().zip(b).enumerate().filter(|(_, (x, y))| x != y);
    let (i, (x, y)) = differ.next()?;
    if differ.next().is_some() {
        return None;
    }
    let ((px, vx), (py, vy)) = (number(x)?, number(y)?);
    if px != py {
        return None;
    }
    let name = if !px.is_empty() {
        px.to_string()
    } else if i > 0 && is_flag(&a[i - 1]) {
        a[i - 1].clone()
    } else {
        format!("argument {i}")
    };
    Some((name, vx, vy))
}

/// Whether commands are one program's at other values of its knobs: as long as each other, and every argument
/// the same in all of them or a whole number (under the same `--flag=`) in all. Unknown (any empty): `None`.
pub fn alike(commands: &[&[String]]) -> Option<bool> {
    if commands.iter().any(|c| c.is_empty()) {
        return None;
    }
    let first = commands[0];
    if commands.iter().any(|c| c.len() != first.len()) {
        return Some(false);
    }
    Some((0..first.len()).all(|i| {
        commands.iter().all(|c| c[i] == first[i]) || {
            let p = number(&first[i]).map(|x| x.0);
            p.is_some() && commands.iter().all(|c| number(&c[i]).map(|x| x.0) == p)
        }
    }))
}

/// The command a trace's header records, if `path` is a regular file that opens as a trace.
pub fn command(path: &Path) -> Option<Vec<String>> {
    read_command(path).ok()
}

/// [`command`], or why the file cannot be read as a trace, in one phrase.
pub fn read_command(path: &Path) -> Result<Vec<String>, String> {
    let f = crate::files::untrusted_file::open_regular(path)
        .map_err(|e| crate::files::untrusted_file::said(&e))?;
    TraceReader::open(BufReader::new(f))
        .map(|(_, h)| h.command)
        .map_err(|e| e.to_string())
}

/// `--name` or `-n`, not a negative number.
fn is_flag(arg: &str) -> bool {
    arg.strip_prefix('-')
        .is_some_and(|r| r.starts_with(|c: char| !c.is_ascii_digit()))
}

/// A run found beside a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beside {
    pub path: PathBuf,
    pub knob: String,
    /// The knob's value in the trace, and in this run.
    pub this: u64,
    pub value: u64,
}

/// How many entries of a folder are looked through at most (a folder of millions is read in part).
pub const MAX_SCANNED: usize = 1 << 16;

/// A knob discovery may take: a batch or a sequence length by its flag's name. Any other number the commands
/// differ in (`--steps`, `--seed`, `--port`) changes something else than the memory per step, so a run that differs
/// in it is only used when given (`--beside`).
pub fn batch_like(knob: &str) -> bool {
    if knob.starts_with("argument ") {
        return false;
    }
    let k = knob.to_ascii_lowercase();
    k.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
        matches!(
            w,
            "bs" | "mbs" | "len" | "length" | "ctx" | "context" | "tokens" | "micro"
        ) || w.starts_with("batch")
            || w.starts_with("seq")
    })
}

/// The runs in `trace`'s folder (`*.vtrace`) whose command differs from `command` in one batch-like knob
/// ([`batch_like`]), nearest value first (at most `max`, each at its own value, one knob: the one the nearest run
/// differs in). Only traces owned by whoever runs this and by the trace's own owner are read: another user who can
/// write in the folder cannot steer the advice.
pub fn discover(trace: &Path, command: &[String], max: usize) -> Vec<Beside> {
    use std::os::unix::fs::MetadataExt;
    let dir = match trace.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(meta) = std::fs::metadata(trace) else {
        return Vec::new();
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<Beside> = entries
        .take(MAX_SCANNED)
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "vtrace"))
        .take(MAX_ENTRIES)
        .filter(|p| {
            // Owned by this user, a regular file, and not the trace itself.
            std::fs::metadata(p).is_ok_and(|m| {
                m.is_file() && m.uid() == me && !(m.dev() == meta.dev() && m.ino() == meta.ino())
            })
        })
        .filter_map(|p| {
            let (knob, this, value) = knob_between(command, &self::command(&p)?)?;
            batch_like(&knob).then_some(Beside {
                path: p,
                knob,
                this,
                value,
            })
        })
        .collect();
    found.sort_by(|a, b| {
        (a.value.abs_diff(a.this), a.value, &a.path).cmp(&(
            b.value.abs_diff(b.this),
            b.value,
            &b.path,
        ))
    });
    let Some(knob) = found.first().map(|b| b.knob.clone()) else {
        return found;
    };
    let mut out: Vec<Beside> = Vec::new();
    for b in found {
        if b.knob == knob && !out.iter().any(|o| o.value == b.value) && out.len() < max {
            out.push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn one_whole_number_apart_is_a_knob() {
        let k = |a, b| knob_between(&v(a), &v(b));
        assert_eq!(
            k(
                "python train.py --batch-size 32",
                "python train.py --batch-size 16"
            ),
            Some(("--batch-size".into(), 32, 16))
        );
        assert_eq!(
            k(
                "python train.py --batch=32 --lr 3",
                "python train.py --batch=16 --lr 3"
            ),
            Some(("--batch".into(), 32, 16))
        );
        assert_eq!(
            k("python t.py 32", "python t.py 16"),
            Some(("argument 2".into(), 32, 16))
        );
        // Two arguments apart, a word, another flag, zero, past 2^32, a sign: not one knob.
        assert_eq!(k("t.py --b 32 --s 8", "t.py --b 16 --s 4"), None);
        assert_eq!(k("t.py --b 32", "t.py --b big"), None);
        assert_eq!(k("t.py --b=32", "t.py --c=16"), None);
        assert_eq!(k("t.py --b 32", "t.py --b 0"), None);
        assert_eq!(k("t.py --b 32", "t.py --b 4294967297"), None);
        assert_eq!(k("t.py --b 32", "t.py --b -16"), None);
        assert_eq!(k("t.py --b 32", "t.py --b 32"), None, "the same command");
        let c = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let (a, b, d) = (
            c("t.py train --b 32 --seq=9"),
            c("t.py train --b 8 --seq=12"),
            c("t.py tune --b 8 --seq=9"),
        );
        assert_eq!(alike(&[&a, &b]), Some(true), "numbers differ");
        assert_eq!(alike(&[&a, &d]), Some(false), "a word differs");
        assert_eq!(
            alike(&[&a, &c("t.py train --b 32")]),
            Some(false),
            "another length"
        );
        assert_eq!(
            alike(&[&a, &c("t.py train --b 32 --len=9")]),
            Some(false),
            "another flag"
        );
        assert_eq!(alike(&[&a, &[]]), None, "unknown");
        assert_eq!(k("t.py --b 32", "t.py --b 32 x"), None);
        // The number before it is not a flag's name.
        assert_eq!(
            k("t.py -3 32", "t.py -3 16"),
            Some(("argument 2".into(), 32, 16))
        );
    }

    #[test]
    fn only_a_batch_or_a_sequence_is_taken_unasked() {
        for k in [
            "--batch-size",
            "--batch",
            "-bs",
            "--micro_batch_size",
            "--seq-len",
            "--max_length",
            "--context",
            "--tokens-per-batch",
            "--batchsize",
            "--seqlen",
        ] {
            assert!(batch_like(k), "{k}");
        }
        for k in [
            "--steps",
            "--seed",
            "--port",
            "--nproc-per-node",
            "--epochs",
            "argument 2",
            "--lr",
            "--jobs",
            "--absolute",
        ] {
            assert!(!batch_like(k), "{k}");
        }
    }
}
