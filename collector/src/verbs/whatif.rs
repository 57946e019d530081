//! `vramtrace whatif TRACE... [--cap SPEC | --device-memory SPEC] [--alloc-conf CONF]... [--json]`: replays each
//! process's PyTorch history (kept by `run --torch-history`) through a model of PyTorch's allocator under other
//! settings, and says which fit, the smallest cap each needs, where each would first fail, and which saves most.
//! Each trace is one host: its devices and cap are its own.
//!
//! With `--knob NAME`, the traces are runs at different values of a knob (`FILE=VALUE`): `whatif_knob`.
//!
//! A trace that cannot be read, or a setting or size that does not parse, is one line and exit 2. A trace
//! with no history gets the driver-level answer and says what is missing (exit 0).

use std::io::{self, Write};
use std::path::Path;

use crate::process::exit::{self, Code};
use crate::reporters::{whatif_json, whatif_text};
use crate::whatif::answer::answer;
use crate::whatif::answered::Answered;
pub use crate::whatif::args::{configs, limit_for, WhatifArgs, CONTEXT_ALLOWANCE};
use crate::whatif::from_trace::load;
use crate::whatif::settings::Settings;

/// Loads one trace and answers for it; an error names the file once.
pub fn answer_file(
    file: &Path,
    args: &WhatifArgs,
    configs: &[Settings],
) -> Result<Answered, String> {
    let a = crate::whatif::trace_file::analyze(file).map_err(|e| e.to_string())?;
    let mut loaded = load(&a, file);
    if loaded.histories.is_empty() {
        return Ok(Answered {
            file: file.to_owned(),
            loaded,
            whatif: None,
        });
    }
    let processes: Vec<u32> = loaded.histories.iter().map(|h| h.device).collect();
    let limit =
        limit_for(args, &loaded, &processes).map_err(|e| format!("{}: {e}", file.display()))?;
    let histories = std::mem::take(&mut loaded.histories);
    let w = answer(
        histories,
        loaded.outside.clone(),
        loaded.device_total.clone(),
        loaded.others.clone(),
        configs,
        limit,
    );
    Ok(Answered {
        file: file.to_owned(),
        loaded,
        whatif: Some(w),
    })
}

pub fn main(args: WhatifArgs) -> Code {
    if let Some(knob) = &args.knob {
        return super::whatif_knob::main(&args, knob);
    }
    let configs = match configs(&args.alloc_conf) {
        Ok(c) => c,
        Err(e) => return exit::fail(exit::USAGE, e),
    };
    let mut answered = Vec::new();
    for f in &args.files {
        match answer_file(f, &args, &configs) {
            Ok(a) => answered.push(a),
            Err(e) => return exit::fail(exit::USAGE, e),
        }
    }
    let text = if args.json {
        whatif_json::render(&answered)
    } else {
        answered
            .iter()
            .map(whatif_text::render)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => exit::fail(exit::FAILURE, format_args!("cannot write the what-if: {e}")),
    }
}
