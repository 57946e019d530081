//! `vramtrace whatif --knob NAME RUN_A=VALUE RUN_B=VALUE [RUN_C=VALUE] [--at VALUE]... [--cap SPEC |
//! --device-memory SPEC] [--alloc-conf CONF]... [--json]`: from runs of one program at different values of a
//! knob, the peaks at other values and the largest value that fits, per allocator configuration.
//!
//! Exit 2 with one line: a file not given as FILE=VALUE, a trace that cannot be read, a setting that does not
//! parse, or runs that cannot be extrapolated from (no history, a history cut short, different code paths: the
//! line names the requests and lines that differ).

use std::io::{self, Write};

use crate::process::exit::{self, Code};
use crate::reporters::{whatif_knob_json, whatif_knob_text};
use crate::whatif::args::WhatifArgs;
use crate::whatif::batch::answered::answered;

pub fn main(args: &WhatifArgs, knob: &str) -> Code {
    let a = match answered(args, knob) {
        Ok(a) => a,
        Err(e) => return exit::fail(exit::USAGE, e),
    };
    let text = if args.json {
        whatif_knob_json::render(&a)
    } else {
        whatif_knob_text::render(&a)
    };
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => exit::fail(exit::FAILURE, format_args!("cannot write the what-if: {e}")),
    }
}
