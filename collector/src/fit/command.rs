//! The program `fit` runs: a command line with `{}` where the knob's value goes, the knob's name read from it,
//! and the reverse, used by the post-mortem: a recorded command line with its batch size put back as `{}`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

pub use crate::model::diagnose::batch_arg::PLACEHOLDER;

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
            crate::names::units::printable(&q)
        })
        .collect::<Vec<_>>()
        .join(" ")
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
}
