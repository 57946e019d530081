//! `vramtrace fit` as text: the answer first (the largest value, the first request refused one past it, the
//! range), then the settings that move it, the accumulation that keeps a larger batch, the runs it came from
//! and what `--verify` found. One screen.

use std::fmt::Write as _;

use crate::fit::runs::Ending;
use crate::fit::{as_run, Fitted, Role};
use crate::names::units::{bytes, shown_path};
use crate::reporters::whatif_knob_text::refusal;

const WIDTH: usize = 100;

fn wrap(o: &mut String, text: &str, indent: &str) {
    crate::reporters::text::wrap(o, text, indent, WIDTH);
}

pub fn render(f: &Fitted) -> String {
    let a = &f.answered;
    let k = &f.knob;
    let mut o = String::new();
    wrap(
        &mut o,
        &format!("vramtrace fit: the largest {k} for {}", f.template.shown()),
        "  ",
    );
    if let Some(l) = &a.answer.limit {
        let per: Vec<String> = l
            .bytes
            .iter()
            .map(|(d, b)| format!("GPU {d} {}", bytes(*b)))
            .collect();
        wrap(
            &mut o,
            &format!("Limit: {} ({})", per.join(", "), f.limit_label),
            "  ",
        );
    }
    o.push('\n');
    match as_run(a) {
        Some(l) => {
            let head = match (l.value, l.at_least) {
                (None, _) => format!("NOTHING FITS, not even {k} 1"),
                (Some(v), true) => format!(
                    "{} {v} OR MORE fits: the search stops there ({}× the largest run)",
                    k.to_uppercase(),
                    a.job.search_factor
                ),
                (Some(v), false) => match f.verified.and_then(|b| b.pinned()).filter(|&w| w != v) {
                    Some(w) => format!(
                        "{} {w} fits, as run, found by runs (the replay said {v})",
                        k.to_uppercase()
                    ),
                    None => format!("{} {v} fits, as run", k.to_uppercase()),
                },
            };
            let found = f
                .verified
                .and_then(|b| b.pinned())
                .filter(|&w| Some(w) != l.value);
            let next = match (&l.next_failure, l.at_least || found.is_some()) {
                (Some(x), false) => {
                    let n = l.value.map_or(1, |v| v + 1);
                    format!("; at {n}: {}", refusal(a, n, x))
                }
                _ => String::new(),
            };
            wrap(&mut o, &format!("{head}{next}"), "  ");
            if let (Some(alt), Some(v)) = (l.alternative, l.value) {
                if alt != Some(v) {
                    let alt = alt.unwrap_or(0);
                    wrap(
                        &mut o,
                        &format!(
                            "  the fits allow {} to {}: some sizes fit another shape as well (note below)",
                            v.min(alt),
                            v.max(alt)
                        ),
                        "    ",
                    );
                }
            }
        }
        None => {
            let _ = writeln!(o, "No limit to answer for.");
        }
    }
    settings(&mut o, f);
    if let Some(acc) = f.accumulation {
        if acc.steps > 1 {
            wrap(
                &mut o,
                &format!(
                    "  to keep a {k} of {}: {} steps of {} with gradient accumulation{}",
                    acc.target,
                    acc.steps,
                    acc.micro,
                    if acc.steps * acc.micro != acc.target {
                        format!(" (an effective {k} of {})", acc.steps * acc.micro)
                    } else {
                        String::new()
                    }
                ),
                "    ",
            );
        } else {
            let _ = writeln!(o, "  a {k} of {} fits as it is", acc.target);
        }
    }
    runs(&mut o, f);
    verified(&mut o, f);
    for n in f.story.iter().chain(&a.notes) {
        wrap(&mut o, &format!("note: {n}"), "  ");
    }
    let files: Vec<String> = a
        .files
        .iter()
        .map(|(p, v)| format!("{}={v}", shown_path(p)))
        .collect();
    wrap(
        &mut o,
        &format!(
            "Peaks at other values: vramtrace whatif --knob {k} {}{} --at VALUE",
            files.join(" "),
            f.limit_flags
                .iter()
                .map(|x| format!(" {x}"))
                .collect::<String>()
        ),
        "  ",
    );
    o
}

/// The settings, grouped by the value each fits (largest first): which move the answer, and which do not.
fn settings(o: &mut String, f: &Fitted) {
    let configs = &f.answered.answer.configs;
    if configs.len() < 2 {
        return;
    }
    let mut groups: Vec<(Option<u64>, bool, Vec<String>)> = Vec::new();
    for c in configs {
        let Some(l) = &c.largest else { continue };
        let label = if c.approximate {
            format!("{} (a lower bound)", c.label)
        } else {
            c.label.clone()
        };
        match groups
            .iter_mut()
            .find(|(v, least, _)| *v == l.value && *least == l.at_least)
        {
            Some(g) => g.2.push(label),
            None => groups.push((l.value, l.at_least, vec![label])),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.0));
    let _ = writeln!(
        o,
        "  by allocator setting, as replayed (PYTORCH_CUDA_ALLOC_CONF):"
    );
    for (v, least, labels) in groups {
        let value = match (v, least) {
            (None, _) => "none".to_string(),
            (Some(v), true) => format!("{v}+"),
            (Some(v), false) => v.to_string(),
        };
        let shown: Vec<&str> = labels.iter().take(4).map(String::as_str).collect();
        let more = labels.len().saturating_sub(shown.len());
        let text = format!(
            "{value:>8}  {}{}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
        wrap(o, &format!("    {text}"), "              ");
    }
}

/// What `--verify`'s runs found, against the replay's answer.
fn verified(o: &mut String, f: &Fitted) {
    let k = &f.knob;
    let (Some(b), Some(model)) = (f.verified, as_run(&f.answered).and_then(|l| l.value)) else {
        return;
    };
    let runs: Vec<String> = f
        .verify
        .iter()
        .map(|v| format!("{}{}", v.value, if v.fitted { "" } else { " failed" }))
        .collect();
    let line = match b.pinned() {
        Some(w) if w == model => {
            format!("Verified: {k} {w} fitted and {} ran out of memory, as predicted.", w + 1)
        }
        Some(w) => format!(
            "Verified by runs: {k} {w} fits and {} does not; the replay's {model} was {:.1}% {} (runs at {}).",
            w + 1,
            (w.abs_diff(model) as f64) * 100.0 / (w.max(1) as f64),
            if w > model { "low" } else { "high" },
            runs.join(", ")
        ),
        None => format!(
            "NOT VERIFIED: the runs contradict the replay's {model} and did not pin the answer: the largest that \
             fitted {}, the smallest that failed {} (runs at {}).",
            b.fits.map_or("none".to_string(), |x| x.to_string()),
            b.fails.map_or("none".to_string(), |x| x.to_string()),
            runs.join(", ")
        ),
    };
    wrap(o, &line, "  ");
}

/// `a, b and c`.
fn and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn runs(o: &mut String, f: &Fitted) {
    let k = &f.knob;
    let made: Vec<String> = f
        .runs
        .iter()
        .filter(|r| r.role != Role::Verify)
        .map(|r| {
            let how = match r.ran.ending {
                Ending::OutOfMemory => ", out of memory".to_string(),
                Ending::Finished => ", ended by itself".to_string(),
                _ if r.ran.caught_ooms > 0 => format!(
                    ", {} out-of-memory {} raised and caught on the way",
                    r.ran.caught_ooms,
                    if r.ran.caught_ooms == 1 {
                        "error"
                    } else {
                        "errors"
                    }
                ),
                _ => String::new(),
            };
            format!("{}{how} ({:.1} s)", r.ran.value, r.ran.seconds)
        })
        .collect();
    let used: Vec<String> = f.used.iter().map(u64::to_string).collect();
    o.push('\n');
    wrap(
        o,
        &format!(
            "Runs: {k} {}, {} steps each, {:.0} s in all; the answer is from {}; traces and the program's \
             output in {}",
            made.join(", "),
            f.steps,
            f.seconds,
            and(&used),
            shown_path(&f.dir)
        ),
        "  ",
    );
}
