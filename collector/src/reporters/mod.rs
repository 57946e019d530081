//! The reporters: one file per output format, each rendering an analysis (or, for the exports, the replay as it
//! goes: `model::observe::tap`): `text` and `json` (`report`), `oom_text` and `oom_json` (the post-mortem), `memory_viz`
//! (with `pickle`), `perfetto` and `html` (`export`). They read the model; the model never reads them. `prose`
//! says the diagnosis (model/diagnose) in words, for all of them.

pub mod fit_json;
pub mod fit_text;
pub mod html;
pub mod json;
pub mod memory_viz;
pub mod oom_json;
pub mod oom_text;
pub mod perfetto;
pub mod pickle;
pub mod prose;
pub mod text;
pub mod whatif_json;
pub mod whatif_knob_json;
pub mod whatif_knob_text;
pub mod whatif_text;

use crate::callsites::{choose_site, Frame, Site};
use crate::model::ProcessStats;
use crate::reporters::text::short_command;

/// `rank 3: python train.py (pid 812)`: a process as the exports name it.
pub fn process_name(p: &ProcessStats) -> String {
    let cmd = if p.cmdline.is_empty() {
        "(not announced)".to_string()
    } else {
        short_command(&p.cmdline)
    };
    match p.rank {
        Some(r) => format!("rank {r}: {cmd} (pid {})", p.pid),
        None => format!("{cmd} (pid {})", p.pid),
    }
}

/// A call site from its frames, with none of the report's figures (the exports label their own).
pub fn site_of(stack: u32, frames: Vec<Frame>) -> Site {
    Site {
        pid: 0,
        stack,
        site: choose_site(&frames),
        frames,
        missing: false,
        allocations: 0,
        allocated_bytes: 0,
        live_bytes_at_end: 0,
        per_device: Vec::new(),
        extra: Vec::new(),
    }
}

/// A call site's label from its frames, as the report writes it (without what would tell it apart from another
/// process's sites); `stack N (frames not recorded)` without them.
pub fn site_label(stack: u32, frames: Option<Vec<Frame>>) -> String {
    match frames {
        Some(frames) => site_of(stack, frames).label(),
        None => format!("stack {stack} (frames not recorded)"),
    }
}
