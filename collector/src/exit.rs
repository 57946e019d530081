//! Exit codes, documented in the README: the only place the binary decides how it ends.
//!
//! 0 success; 1 an internal failure after the job ran (the trace is still on disk); 2 bad usage or bad input
//! (nothing started, or a file that cannot be read as a trace); 126 the command is not executable; 127 the
//! command was not found; otherwise `run` exits with its command's code, or 128+N when signal N ended it.

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
            // clap's message is several lines; the first says what is wrong.
            let msg = e.render().to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("bad usage")
                .trim_start_matches("error: ");
            eprintln!("vramtrace: {first} (see 'vramtrace --help')");
            process::exit(USAGE)
        }
    }
}

/// One clear line on stderr, then the code.
pub fn fail(code: Code, msg: impl std::fmt::Display) -> Code {
    eprintln!("vramtrace: {msg}");
    code
}

pub fn with(code: Code) -> ! {
    process::exit(code)
}
