//! The program `fit` runs: a command line with `{}` where the knob's value goes, the knob's name read from it,
//! and the reverse, used by the post-mortem: a recorded command line with its batch size put back as `{}`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

pub const PLACEHOLDER: &str = "{}";

/// A command with the knob's place in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    args: Vec<OsString>,
    /// The knob's name as the command spells it (`batch-size` from `--batch-size {}`), else `value`.
    pub knob: String,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("no argument of the command holds {{}}: put {{}} where the value goes (`--batch {{}}`, `--batch-size={{}}`, `seq_len={{}}`)")]
    NoPlaceholder,
    #[error("{{}} is the program itself: put it in one of the program's arguments")]
    InProgram,
}

impl Template {
    pub fn parse(command: &[OsString]) -> Result<Template, TemplateError> {
        let holds = |a: &OsString| contains(a.as_bytes(), PLACEHOLDER.as_bytes());
        let first = command
            .iter()
            .position(holds)
            .ok_or(TemplateError::NoPlaceholder)?;
        if first == 0 {
            return Err(TemplateError::InProgram);
        }
        Ok(Template {
            knob: knob_name(&command[first - 1], &command[first]),
            args: command.to_vec(),
        })
    }

    /// The command at `value`: every `{}` replaced by it.
    pub fn at(&self, value: u64) -> Vec<OsString> {
        let v = value.to_string();
        self.args
            .iter()
            .map(|a| {
                OsString::from_vec(replace(a.as_bytes(), PLACEHOLDER.as_bytes(), v.as_bytes()))
            })
            .collect()
    }

    /// The program's name as `run` names its trace (the last part of its path), for the runs' folder.
    pub fn program(&self) -> String {
        let p = std::path::Path::new(&self.args[0]);
        p.file_name()
            .unwrap_or(p.as_os_str())
            .to_string_lossy()
            .into_owned()
    }

    /// The command as a shell would take it back, with `{}` in place.
    pub fn shown(&self) -> String {
        shell_words(&self.args)
    }
}

/// The knob's name from the argument holding `{}` (`--batch-size={}`, `seq_len={}`) or the flag before it
/// (`--batch {}`).
fn knob_name(before: &OsStr, arg: &OsStr) -> String {
    let arg = arg.to_string_lossy();
    let clean = |s: &str| {
        let s = s.trim_start_matches('-');
        let s: String = s
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
            .collect();
        (!s.is_empty()).then_some(s)
    };
    if let Some((name, _)) = arg.split_once('=') {
        if arg.find('=') < arg.find(PLACEHOLDER) {
            if let Some(n) = clean(name) {
                return n;
            }
        }
    }
    let before = before.to_string_lossy();
    if arg.trim() == PLACEHOLDER && before.starts_with('-') {
        if let Some(n) = clean(&before) {
            return n;
        }
    }
    "value".to_string()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn replace(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// Arguments quoted for a POSIX shell where they need it, and escaped for the terminal (a recorded command line
/// is the traced program's to choose).
pub fn shell_words(args: &[OsString]) -> String {
    args.iter()
        .map(|a| {
            let s = a.to_string_lossy();
            let plain = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%{}".contains(c));
            let q = if plain {
                s.into_owned()
            } else {
                format!("'{}'", s.replace('\'', "'\\''"))
            };
            crate::units::printable(&q)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Names of a batch-size argument, as training scripts and launchers spell them (compared without dashes and
/// underscores, ignoring case).
const BATCH_NAMES: &[&str] = &[
    "batch",
    "batchsize",
    "bs",
    "bsz",
    "perdevicetrainbatchsize",
    "traininbatchsize",
    "trainbatchsize",
    "microbatchsize",
    "microbatch",
    "localbatchsize",
    "perdevicebatchsize",
];

fn batch_flag(name: &str) -> bool {
    let n: String = name
        .trim_start_matches('-')
        .chars()
        .filter(|c| *c != '-' && *c != '_' && *c != '.')
        .flat_map(char::to_lowercase)
        .collect();
    // Any `..._batch_size` of training, not of evaluation (an evaluation's batch is rarely what a job is sized by).
    BATCH_NAMES.contains(&n.as_str())
        || (n.ends_with("batchsize")
            && !["eval", "val", "test", "infer"]
                .iter()
                .any(|x| n.contains(x)))
}

/// The recorded command with its batch size as `{}` (`--batch-size 32`, `--batch_size=32`, `batch_size=32`,
/// `--bs 32`), and the value it ran with; `None` when no argument names a batch size, or more than one does
/// with different values.
pub fn batch_template(argv: &[String]) -> Option<(Vec<String>, u64)> {
    let mut out = argv.to_vec();
    let mut found: Option<u64> = None;
    let mut i = 1;
    while i < argv.len() {
        let a = &argv[i];
        let hit = if let Some((name, v)) = a.split_once('=') {
            batch_flag(name)
                .then(|| v.parse::<u64>().ok())
                .flatten()
                .map(|v| (i, format!("{name}={{}}"), v))
        } else if a.starts_with('-') && batch_flag(a) {
            argv.get(i + 1)
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| (i + 1, PLACEHOLDER.to_string(), v))
        } else {
            None
        };
        if let Some((at, with, v)) = hit {
            if found.is_some_and(|f| f != v) {
                return None;
            }
            found = Some(v);
            out[at] = with;
            i = at + 1;
        } else {
            i += 1;
        }
    }
    found.filter(|&v| v > 0).map(|v| (out, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Template, TemplateError> {
        Template::parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn the_knob_is_named_from_the_argument_or_its_flag() {
        assert_eq!(
            t(&["python", "train.py", "--batch", "{}"]).unwrap().knob,
            "batch"
        );
        assert_eq!(
            t(&["python", "t.py", "--batch-size={}"]).unwrap().knob,
            "batch-size"
        );
        assert_eq!(
            t(&["python", "t.py", "seq_len={}"]).unwrap().knob,
            "seq_len"
        );
        assert_eq!(t(&["python", "t.py", "{}"]).unwrap().knob, "value");
        assert_eq!(t(&["python", "t.py", "-b", "{}"]).unwrap().knob, "b");
        assert_eq!(
            t(&["python", "t.py", "--cfg", "model.bs{}.yaml"])
                .unwrap()
                .knob,
            "value"
        );
        assert_eq!(t(&["python", "t.py"]), Err(TemplateError::NoPlaceholder));
        assert_eq!(t(&["{}", "x"]), Err(TemplateError::InProgram));
    }

    #[test]
    fn every_placeholder_takes_the_value() {
        let x = t(&[
            "torchrun",
            "t.py",
            "--batch",
            "{}",
            "--eval-batch={}",
            "--name=b{}x",
        ])
        .unwrap();
        let at: Vec<String> = x
            .at(24)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            at,
            [
                "torchrun",
                "t.py",
                "--batch",
                "24",
                "--eval-batch=24",
                "--name=b24x"
            ]
        );
        assert_eq!(
            x.shown(),
            "torchrun t.py --batch {} --eval-batch={} --name=b{}x"
        );
        assert_eq!(x.program(), "torchrun");
    }

    #[test]
    fn shown_commands_are_quoted_and_escaped() {
        let a: Vec<OsString> = ["python", "a b.py", "it's", "\x1b]0;x\x07"]
            .iter()
            .map(OsString::from)
            .collect();
        let s = shell_words(&a);
        assert!(s.starts_with("python 'a b.py' 'it'\\''s' "), "{s}");
        assert!(!s.contains('\x1b') && !s.contains('\x07'), "{s}");
    }

    #[test]
    fn a_recorded_batch_size_becomes_the_placeholder() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (cmd, b) = batch_template(&v(&[
            "python",
            "train.py",
            "--batch-size",
            "32",
            "--lr",
            "3",
        ]))
        .unwrap();
        assert_eq!(
            (cmd, b),
            (
                v(&["python", "train.py", "--batch-size", "{}", "--lr", "3"]),
                32
            )
        );
        let (cmd, b) =
            batch_template(&v(&["python", "t.py", "--per_device_train_batch_size=8"])).unwrap();
        assert_eq!(
            (cmd, b),
            (
                v(&["python", "t.py", "--per_device_train_batch_size={}"]),
                8
            )
        );
        let (cmd, b) =
            batch_template(&v(&["python", "t.py", "batch_size=16", "--bs", "16"])).unwrap();
        assert_eq!(
            (cmd, b),
            (v(&["python", "t.py", "batch_size={}", "--bs", "{}"]), 16)
        );
        assert!(batch_template(&v(&["python", "t.py", "--batch", "8", "--bs", "16"])).is_none());
        assert!(batch_template(&v(&["python", "t.py", "--lr", "32"])).is_none());
        assert!(batch_template(&v(&["python", "t.py", "--batch-size", "big"])).is_none());
        assert!(batch_template(&v(&["python", "t.py", "--eval-steps", "32"])).is_none());
    }
}
