//! Exit codes, documented in the README: the only place the binary decides how it ends.
//!
//! 0 success; 1 an internal failure after the job ran (the trace is still on disk); 2 bad usage or bad input
//! (nothing started, or a file that cannot be read as a trace); 126 the command is not executable; 127 the
//! command was not found; otherwise `run` exits with its command's code, or 128+N when signal N ended it.

use std::fmt;
use std::io::{self, Write};
use std::process;

pub const OK: i32 = 0;
pub const FAILURE: i32 = 1;
pub const USAGE: i32 = 2;
pub const NOT_EXECUTABLE: i32 = 126;
pub const NOT_FOUND: i32 = 127;

/// A verb's outcome: the exit code.
pub type Code = i32;

/// clap's errors: help and version go to stdout with 0; anything else is one line and exit 2.
pub fn usage(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            process::exit(
                if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    USAGE
                } else {
                    OK
                },
            )
        }
        _ => {
            crate::note!("vramtrace: {}", usage_line(&e));
            process::exit(USAGE)
        }
    }
}

/// The verbs, for the help a usage error points to.
const VERBS: [&str; 6] = ["run", "report", "oom", "export", "demo", "top"];

/// clap's error as one line that says what to do: the missing arguments named, the accepted values listed,
/// clap's own tip (`--` before the command to trace), and the help of the verb that was used.
fn usage_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let strings = |k: ContextKind| -> Vec<String> {
        match e.get(k) {
            Some(ContextValue::String(s)) => vec![s.clone()],
            Some(ContextValue::Strings(v)) => v.clone(),
            Some(ContextValue::StyledStr(s)) => vec![s.to_string()],
            Some(ContextValue::StyledStrs(v)) => v.iter().map(|s| s.to_string()).collect(),
            _ => Vec::new(),
        }
    };
    // clap's message is several lines; the first says what is wrong.
    let msg = e.render().to_string();
    let mut line = msg
        .lines()
        .next()
        .unwrap_or("bad usage")
        .trim_start_matches("error: ")
        .trim_end_matches(':')
        .to_string();
    if e.kind() == ErrorKind::MissingRequiredArgument {
        let missing = strings(ContextKind::InvalidArg);
        if !missing.is_empty() {
            line = format!("missing {}", missing.join(", "));
        }
    }
    let valid = strings(ContextKind::ValidValue);
    if !valid.is_empty() {
        line.push_str(&format!(" (one of: {})", valid.join(", ")));
    }
    for tip in strings(ContextKind::Suggested) {
        line.push_str(&format!("; {}", tip.trim().trim_start_matches("tip: ")));
    }
    // The verb's own help, read off the usage clap printed ("Usage: vramtrace run [OPTIONS] ..."), else the
    // verb as given.
    let verb = strings(ContextKind::Usage)
        .first()
        .and_then(|u| {
            let mut w = u
                .split_whitespace()
                .skip_while(|w| *w != "vramtrace")
                .skip(1);
            w.next()
                .filter(|v| !v.starts_with(['[', '<', '-']))
                .map(str::to_string)
        })
        .or_else(|| {
            std::env::args_os()
                .nth(1)
                .and_then(|v| v.into_string().ok())
                .filter(|v| VERBS.contains(&v.as_str()))
        });
    // `vramtrace run python train.py`: the command goes after `--`.
    if e.kind() == ErrorKind::UnknownArgument
        && verb.as_deref() == Some("run")
        && strings(ContextKind::InvalidArg)
            .first()
            .is_some_and(|a| !a.starts_with('-'))
    {
        line.push_str(
            "; the command to trace goes after '--': vramtrace run [OPTIONS] -- COMMAND ...",
        );
    }
    let verb = verb.map_or(String::new(), |v| format!(" {v}"));
    format!("{line} (see 'vramtrace{verb} --help')")
}

/// One clear line on stderr, then the code.
pub fn fail(code: Code, msg: impl std::fmt::Display) -> Code {
    crate::note!("vramtrace: {msg}");
    code
}

/// Text on stderr. A closed stderr (`vramtrace run ... 2>&1 | head`) is no reason to die: `run` still owes the
/// job its trace and its exit code, so a failed write is dropped, never a panic as `eprintln!` would make it.
pub fn write_err(args: fmt::Arguments) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// Text on stdout; false once the reader has gone (a closed pipe: `vramtrace demo | head -3`), which the caller
/// takes as a quiet end rather than an error.
pub fn write_out(args: fmt::Arguments) -> bool {
    let mut out = io::stdout().lock();
    out.write_fmt(args).and_then(|()| out.flush()).is_ok()
}

/// `eprintln!` that never panics: see [`write_err`].
#[macro_export]
macro_rules! note {
    ($($t:tt)*) => { $crate::process::exit::write_err(format_args!("{}\n", format_args!($($t)*))) };
}

/// `println!` that never panics: see [`write_out`]; the value is whether the reader is still there.
#[macro_export]
macro_rules! say {
    () => { $crate::process::exit::write_out(format_args!("\n")) };
    ($($t:tt)*) => { $crate::process::exit::write_out(format_args!("{}\n", format_args!($($t)*))) };
}

pub fn with(code: Code) -> ! {
    process::exit(code)
}
