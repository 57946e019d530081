//! `vramtrace oom FILE [--json] [--full] [--beside RUN[=VALUE]]... [--value V] [--knob NAME]`: the post-mortem of a job that ran out of GPU memory (docs/OOM.md).
//!
//! For each out-of-memory record the shim sent (the first [`MAX_OOM_SNAPSHOTS`] of them), what was live at that
//! moment, the cause (exactly one of cap, fragmentation, external, pressure) with the figures that decided it,
//! findings beside it (leak trend, how far the peak was from fitting) and advice. A trace without one still gets
//! a post-mortem: how each process ended, what it left live, each device's peak and headroom.
//!
//! A file that cannot be read as a trace is one line on stderr and exit 2, as for `report`; a trace cut short
//! is reported up to where it stops, with a note saying where (exit 0).
//!
//! [`MAX_OOM_SNAPSHOTS`]: crate::model::MAX_OOM_SNAPSHOTS

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

pub use crate::model::diagnose::{diagnose, Cause, Diagnosis, Finding, CONTEXT_ESTIMATE_BYTES};
pub use crate::reporters::prose::cap_spec;

use crate::model::Analysis;
use crate::names::units::{bytes, secs};
use crate::process::exit::{self, Code};
use crate::reporters::{oom_json, oom_text, prose};

pub use super::oom_batch::BesideArgs;

pub fn main(file: &Path, json: bool, full: bool, beside: &BesideArgs) -> Code {
    let mut a = match crate::whatif::trace_file::analyze(file) {
        Ok(a) => a,
        Err(e) => return exit::fail(exit::USAGE, e),
    };
    if let Err(e) = super::oom_batch::attach(&mut a, file, beside) {
        return exit::fail(exit::USAGE, e);
    }
    let text = if json {
        oom_json::render(&a)
    } else if full {
        oom_text::render(&a, Some(file))
    } else {
        oom_text::render_short(&a, Some(file))
    };
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => exit::fail(exit::FAILURE, format_args!("cannot write the report: {e}")),
    }
}

/// The whole out-of-memory report: text (as `vramtrace oom` prints it, without the file name in the title) or
/// the documented JSON (docs/JSON-SCHEMA.md). Ends with a newline.
pub fn render(a: &Analysis, json: bool) -> String {
    if json {
        oom_json::render(a)
    } else {
        oom_text::render(a, None)
    }
}

/// The post-mortem as `vramtrace oom` prints it by default (one screen per error), as written beside a trace.
pub fn render_short(a: &Analysis) -> String {
    oom_text::render_short(a, None)
}

/// Every out-of-memory snapshot of `a` with its diagnosis, in time order.
pub fn diagnoses(a: &Analysis) -> Vec<Diagnosis> {
    a.ooms.iter().map(|s| diagnose(a, s)).collect()
}

/// A few lines for the end of `vramtrace run` when the job met an out-of-memory event (the first one: the
/// cause, its reason and the first advice), `None` when the trace has none. Every line ends with a newline.
pub fn summary(a: &Analysis) -> Option<String> {
    if a.oom_records == 0 {
        return None;
    }
    let mut o = String::new();
    let Some(s) = a.ooms.first() else {
        writeln!(
            o,
            "out of memory: {} event{} recorded (none could be analysed)",
            a.oom_records,
            if a.oom_records == 1 { "" } else { "s" }
        )
        .ok();
        return Some(o);
    };
    let d = diagnose(a, s);
    // A framework's own refusal made no driver call to name.
    let asked = match (&s.framework, s.api, s.api_code) {
        (Some(f), None, 0) => format!("{}'s allocator", oom_text::framework_name(f.framework)),
        _ => oom_text::api_label(s.api, s.api_code, s.ptsz),
    };
    writeln!(
        o,
        "out of memory on {} at {}: pid {} asked {asked} for {}",
        crate::reporters::text::oom_place(s),
        secs(s.time_ns),
        s.pid,
        bytes(s.requested_bytes)
    )
    .ok();
    writeln!(o, "cause: {}: {}", d.cause.key(), prose::reason(&d)).ok();
    if let Some(first) = d.advice.first() {
        writeln!(o, "advice: {}", prose::advice_text(first)).ok();
    }
    if a.oom_records > 1 {
        writeln!(
            o,
            "{} more out-of-memory error{} after it",
            a.oom_records - 1,
            if a.oom_records == 2 { "" } else { "s" }
        )
        .ok();
    }
    if a.refusals_recovered > 0 {
        writeln!(
            o,
            "and {} refusal{} recovered from (not errors; {} of stalls)",
            a.refusals_recovered,
            if a.refusals_recovered == 1 { "" } else { "s" },
            crate::names::units::duration(a.refusal_stall_ns)
        )
        .ok();
    }
    Some(o)
}
