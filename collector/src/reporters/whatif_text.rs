//! `vramtrace whatif` as text: what was replayed and how well the model replays the run, then one row per
//! configuration (its peak, the smallest cap it fits, whether it fits the limit and where it would first fail),
//! then the configuration that saves most with the line to set it.

use std::fmt::Write as _;

use crate::names::units::{bytes, count};
use crate::whatif::answer::WhatIf;
use crate::whatif::answered::Answered;
use crate::whatif::caveat::{Caveat, Verdict};
use crate::whatif::history::History;
use crate::whatif::sim::Failure;

fn secs_from(t_us: u64, start_us: u64) -> String {
    format!("{:.1} s", t_us.saturating_sub(start_us) as f64 / 1e6)
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

fn history_line(h: &History, start_us: u64) -> String {
    let span = if h.complete() {
        "from its first allocation".to_string()
    } else {
        format!(
            "from {} (PyTorch kept the last entries only: {} tensors, {}, live before it are assumed allocated at its start)",
            secs_from(h.start_us(), start_us),
            count(h.assumed_live),
            bytes(h.assumed_live_bytes)
        )
    };
    let conf = h.recorded.conf();
    format!(
        "pid {} GPU {}: {} entries {}, {} snapshot; ran with {}",
        h.pid,
        h.device,
        count(h.entries.len() as u64),
        span,
        h.taken_at,
        if conf.is_empty() {
            "the defaults".to_string()
        } else {
            conf
        }
    )
}

fn failure(w: &WhatIf, f: &Failure, start_us: u64) -> String {
    let h = &w.histories[f.history];
    let site = match (h.site(f.site), f.the_runs_own) {
        (Some(s), true) => format!("{s}, the request the run itself failed"),
        (Some(s), false) => s.to_string(),
        (None, true) => "the request the run itself failed".to_string(),
        (None, false) => "(no Python line: the backward pass or a C++ thread)".to_string(),
    };
    format!(
        "{} at {} (pid {} GPU {}, {} in use): {site}",
        bytes(f.size),
        secs_from(f.t_us, start_us),
        h.pid,
        h.device,
        bytes(f.job_bytes),
    )
}

pub fn render(a: &Answered) -> String {
    let mut o = String::new();
    let start = a.loaded.start_unix_us;
    writeln!(o, "What if: {}", a.file.display()).ok();
    let Some(w) = &a.whatif else {
        no_history(&mut o, a);
        return o;
    };
    replayed(&mut o, a, w, start);
    writeln!(o).ok();
    let caveat = crate::whatif::caveat::caveat(w, &a.loaded);
    let verdicts: Vec<Option<Verdict>> = (0..w.configs.len())
        .map(|i| crate::whatif::caveat::verdict(w, &a.loaded, caveat.as_ref(), i))
        .collect();
    table(&mut o, w, &verdicts, start);
    writeln!(o).ok();
    saves_most(&mut o, w, caveat.as_ref(), &verdicts);
    for n in &a.loaded.notes {
        writeln!(o, "  note: {}", crate::names::units::printable(n)).ok();
    }
    o
}

/// No history to replay: what the driver saw instead, and why nothing more can be judged.
fn no_history(o: &mut String, a: &Answered) {
    crate::reporters::text::wrap(
        o,
        "  No PyTorch allocation history in this trace: the what-if replays one (`vramtrace run \
         --torch-history 4000000` keeps it from the start). Other settings cannot be judged without it.",
        "  ",
        crate::reporters::text::WIDTH,
    );
    for (d, p) in &a.loaded.driver_peak {
        writeln!(
            o,
            "  As run, from the driver's calls: GPU {d} peaked at {}{}.",
            bytes(*p),
            a.loaded
                .run_cap
                .get(d)
                .map(|c| format!(" under a cap of {}", bytes(*c)))
                .unwrap_or_default()
        )
        .ok();
    }
    for n in &a.loaded.notes {
        writeln!(o, "  note: {}", crate::names::units::printable(n)).ok();
    }
}

/// What was replayed, how closely the model follows each history, what is counted as held, and the limit.
fn replayed(o: &mut String, a: &Answered, w: &WhatIf, start: u64) {
    writeln!(
        o,
        "  Replayed through a model of PyTorch's caching allocator:"
    )
    .ok();
    for (h, c) in w.histories.iter().zip(&w.checks) {
        writeln!(o, "  - {}", history_line(h, start)).ok();
        let err = c.error() * 100.0;
        writeln!(
            o,
            "    replaying those settings, the model peaks at {}; PyTorch's own segments peaked at {} ({:+.1}%){}",
            bytes(c.modelled_peak),
            bytes(c.recorded_peak),
            err,
            match (err.abs() > 1.0, h.complete()) {
                (false, _) => "",
                // A known cause: the tensors live before the history began are laid out anew at its start.
                (true, false) => ": the history starts late, so the tensors live before it are laid out anew \
                                   at its start; take its answers within that margin",
                (true, true) if err.abs() > 5.0 => {
                    ": the model does not follow this run closely, take its answers as rough"
                }
                (true, true) => ": take its answers within that margin",
            }
        )
        .ok();
        for n in &h.notes {
            writeln!(o, "    note: {}", crate::names::units::printable(n)).ok();
        }
    }
    if !a.loaded.without_history.is_empty() {
        let pids: Vec<String> = a
            .loaded
            .without_history
            .iter()
            .map(|p| p.to_string())
            .collect();
        writeln!(
            o,
            "  Without a history (their peak counted as held throughout): pid {}",
            pids.join(", ")
        )
        .ok();
    }
    let outside: u64 = w.outside.iter().sum();
    if outside > 0 {
        writeln!(
            o,
            "  Held outside PyTorch's allocator (counted as held throughout): {}",
            bytes(outside)
        )
        .ok();
    }
    match &w.limit {
        Some(l) => {
            let per: Vec<String> = l
                .bytes
                .iter()
                .map(|(d, b)| format!("{} on GPU {d}", bytes(*b)))
                .collect();
            writeln!(o, "  Limit: {} ({})", l.what, per.join(", ")).ok();
        }
        None => {
            writeln!(
                o,
                "  No limit given (--cap or --device-memory), and the run had no cap."
            )
            .ok();
        }
    }
}

/// One row per configuration: its modelled peak, the smallest cap that serves it, and its verdict.
fn table(o: &mut String, w: &WhatIf, verdicts: &[Option<Verdict>], start: u64) {
    let width = w
        .configs
        .iter()
        .map(|c| c.label.len() + if c.approximate { 14 } else { 0 })
        .max()
        .unwrap_or(10)
        .max(10);
    let fits_col = w.limit.is_some();
    // What each column means, in its header: the peak is the model's, the smallest cap the least this history
    // needs, and the verdict is against the limit above.
    writeln!(
        o,
        "  {:width$}  {:>10}  {:>13}{}",
        "settings",
        "peak",
        "smallest cap",
        if fits_col { "  under the limit" } else { "" }
    )
    .ok();
    writeln!(
        o,
        "  {:width$}  {:>10}  {:>13}{}",
        "",
        "(modelled)",
        "(to serve it)",
        if fits_col {
            "  (and where it is first refused)"
        } else {
            ""
        }
    )
    .ok();
    for (i, c) in w.configs.iter().enumerate() {
        let mut label = c.label.clone();
        if c.approximate {
            label.push_str(" (lower bound)");
        }
        let refused = || {
            c.first_failure
                .as_ref()
                .map(|f| format!(": {}", failure(w, f, start)))
                .unwrap_or_default()
        };
        let fits = match verdicts[i] {
            None => String::new(),
            Some(Verdict::Fits) => "  fits".to_string(),
            Some(Verdict::ServesHistory) => "  serves this history".to_string(),
            Some(Verdict::LowerBound) => "  ? (a lower bound)".to_string(),
            Some(Verdict::Grows) => format!("  grows{}", refused()),
            // The run itself failed there: its replay getting through says the history is short.
            Some(Verdict::No) if c.fits == Some(true) => {
                "  no (the run failed: see below)".to_string()
            }
            Some(Verdict::No) => format!("  no{}", refused()),
        };
        writeln!(
            o,
            "  {:width$}  {:>10}  {:>13}{}",
            label,
            bytes(w.peak(i)),
            bytes(w.needs(i)),
            fits
        )
        .ok();
    }
    let multi = w.configs.first().is_some_and(|c| c.devices.len() > 1);
    if multi {
        writeln!(
            o,
            "  (peak and smallest cap: the largest over the job's GPUs; --json has each)"
        )
        .ok();
    }
}

/// The configuration that saves most and the line to set it, or the caveat that says why none is named.
fn saves_most(o: &mut String, w: &WhatIf, caveat: Option<&Caveat>, verdicts: &[Option<Verdict>]) {
    match (w.best, caveat) {
        (_, Some(c)) => {
            let mut t = String::new();
            crate::reporters::text::wrap(
                &mut t,
                &format!("  {}", c.text()),
                "  ",
                crate::reporters::text::WIDTH,
            );
            o.push_str(&t);
        }
        (Some(b), None) => {
            let c = &w.configs[b];
            let saved = w.needs(0).saturating_sub(w.needs(b));
            writeln!(
                o,
                "  Saves most: {} needs {}, {} ({}) less than as run.",
                c.label,
                bytes(w.needs(b)),
                bytes(saved),
                share(saved, w.needs(0))
            )
            .ok();
            if verdicts.contains(&Some(Verdict::ServesHistory)) {
                writeln!(
                    o,
                    "  (Up to the error the history ends at: what the run needed after it is not known.)"
                )
                .ok();
            }
            let mut how = format!("    PYTORCH_CUDA_ALLOC_CONF={} vramtrace run ...", c.conf);
            if let Some(f) = c.settings.as_ref().and_then(|s| s.fraction_note()) {
                how.push_str(&format!("  (and {f} in the program)"));
            }
            writeln!(o, "{how}").ok();
        }
        (None, None) => {
            writeln!(o, "  None of these settings needs less than the run's own.").ok();
        }
    }
    if let Some(c) = w.configs.iter().find(|c| c.approximate) {
        writeln!(
            o,
            "  {}: the driver's pool is not public; the model packs it with no waste (a lower bound).",
            c.label
        )
        .ok();
    }
}
