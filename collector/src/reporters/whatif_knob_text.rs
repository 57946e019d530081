//! `vramtrace whatif --knob NAME ...` as text: the runs and how their requests matched, the fits, then per value
//! asked a row per configuration (peaks, the range the ambiguous fits leave, the limit), then per configuration
//! the largest value that fits the limit, and the configuration that reaches furthest.

use std::fmt::Write as _;

use crate::names::units::{bytes, count};
use crate::whatif::batch::answer::{Beyond, Largest};
use crate::whatif::batch::answered::KnobAnswered;
use crate::whatif::sim::Failure;

fn where_(values: &[u64], b: Beyond) -> String {
    let far = if b.far(values) {
        ": far outside them, a rough guess"
    } else {
        ""
    };
    match b {
        Beyond::Inside => "within the runs".to_string(),
        Beyond::Below(by) => format!("{by} below the runs' smallest{far}"),
        Beyond::Above(by) => format!("{by} above the runs' largest{far}"),
    }
}

pub(crate) fn refusal(a: &KnobAnswered, value: u64, f: &Failure) -> String {
    let (pid, device, site, place) = a.job.place(value, f);
    format!(
        "{} refused {place} (pid {pid} GPU {device}, {} in use): {site}",
        bytes(f.size),
        bytes(f.job_bytes)
    )
}

fn largest_line(a: &KnobAnswered, l: &Largest) -> String {
    let k = &a.knob;
    let values = &a.job.aligned.values;
    let mut s = match (l.value, l.at_least) {
        (None, _) => format!("nothing fits, not even {k} 1"),
        (Some(v), true) => format!(
            "{k} {v} or more: it fits up to where the search stops ({}× the largest run)",
            a.job.search_factor
        ),
        (Some(v), false) => format!("{k} {v} ({})", where_(values, Beyond::of(values, v))),
    };
    if let Some(f) = &l.next_failure {
        let next = l.value.map_or(1, |v| v + 1);
        let _ = write!(s, "; at {next}: {}", refusal(a, next, f));
    }
    if let Some(alt) = l.alternative {
        if alt != l.value {
            let paths = a.job.aligned.slots.iter().any(|x| x.paths.is_some());
            let _ = write!(
                s,
                "; {} with the alternatives ({})",
                alt.map_or("none".to_string(), |v| v.to_string()),
                if paths {
                    "the other run's code path, and the ambiguous fits' other shapes"
                } else {
                    "the ambiguous fits' other shapes"
                }
            );
        }
    }
    if !l.refused_below.is_empty() {
        let v: Vec<String> = l.refused_below.iter().map(u64::to_string).collect();
        let _ = write!(
            s,
            "; refused at the smaller {} too (the allocator's segment sizes make fitting uneven)",
            v.join(", ")
        );
    }
    s
}

pub fn render(a: &KnobAnswered) -> String {
    let w = &a.answer;
    let mut o = String::new();
    matched(&mut o, a);
    shapes(&mut o, a);
    let n_at = w.configs.first().map_or(0, |c| c.at.len());
    for i in 0..n_at {
        at_value(&mut o, a, i);
    }
    if w.limit.is_some() {
        largest(&mut o, a);
    }
    if w.limit.is_none() && n_at == 0 {
        let _ = writeln!(
            o,
            "\nAsk for values with --at, or for the largest that fits with --cap or --device-memory."
        );
    }
    for n in &a.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

/// The runs, and how their requests matched history by history: the setup, the step, the code paths and the
/// failed run's requests it never made.
fn matched(o: &mut String, a: &KnobAnswered) {
    let j = &a.job.aligned;
    let k = &a.knob;
    let runs: Vec<String> = j
        .runs
        .iter()
        .map(|r| format!("{} ({})", r.value, r.label))
        .collect();
    let _ = writeln!(
        o,
        "What if the {k} were other: from runs at {}",
        runs.join(", ")
    );
    for (i, slot) in j.slots.iter().enumerate() {
        let h = &j.runs[0].histories[i];
        let st = &slot.steps[0];
        let _ = writeln!(
            o,
            "pid {} GPU {}: {} requests {}{}; {} before the steps repeat (the setup, a first step unlike the rest), then {} repeats of a step of {}",
            h.pid,
            h.device,
            count(slot.requests() as u64),
            if slot.paths.is_some() {
                "made by every run"
            } else {
                "matched one for one in every run"
            },
            if j.failed.is_some() {
                " (the failed run's up to its failure)"
            } else {
                ""
            },
            count(st.setup as u64),
            count(st.count as u64),
            count(st.period as u64)
        );
        if let Some(m) = &slot.paths {
            let own: Vec<String> = j
                .runs
                .iter()
                .enumerate()
                .map(|(r, run)| {
                    format!(
                        "{} ({}) at {}",
                        count(slot.own[r].len() as u64),
                        bytes(slot.own_bytes(r, &run.histories[i])),
                        run.value
                    )
                })
                .collect();
            let lines: Vec<String> = m
                .lines
                .iter()
                .map(|(l, c)| {
                    let c: Vec<String> = c.iter().map(|n| count(*n)).collect();
                    format!("{l} ({})", c.join(" / "))
                })
                .collect();
            let _ = writeln!(
                o,
                "  the runs' code paths differ by a few requests, from the same lines: their own requests {}; lines \
                 asked a different number of times: {}. Libraries choose kernels by size (workspaces, sort \
                 buffers): each value follows the nearest run's path, its own requests in proportion to the {k} \
                 (an upper bound), and the alternative adds the other side's",
                own.join(", "),
                lines.join("; ")
            );
        }
        if let Some(r) = j.failed {
            let f = slot.filled;
            let made = slot.at[r].len();
            let _ = writeln!(
                o,
                "  the run at {} ran out of memory at its request {}: of the {} it never made, {} are sized from its \
                 earlier steps, {} as its requests of the same size in another run (a guess) and {} in proportion \
                 to the {k} (an upper bound){}",
                j.values[r],
                count(made as u64),
                count(slot.requests().saturating_sub(made) as u64),
                count(f.from_step),
                count(f.from_kin),
                count(f.in_proportion),
                if f == Default::default() && slot.requests() > made {
                    "; with two runs that finished, the rest are their fits"
                } else {
                    ""
                }
            );
        }
    }
}

/// How each request's size follows the knob, and the limit.
fn shapes(o: &mut String, a: &KnobAnswered) {
    let w = &a.answer;
    let k = &a.knob;
    let _ = writeln!(
        o,
        "\nHow each request's size follows the {k} (with the bytes they ask over the largest run):"
    );
    for c in &w.shapes {
        let amb = if c.ambiguous > 0 {
            format!(
                ", {} ambiguous (the runs fit another shape as well)",
                count(c.ambiguous)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "  {:<16} {:>10} requests {:>12}{amb}",
            c.shape.formula(),
            count(c.requests),
            bytes(c.bytes)
        );
    }
    if let Some(l) = &w.limit {
        let b: Vec<String> = l
            .bytes
            .iter()
            .map(|(d, b)| format!("GPU {d} {}", bytes(*b)))
            .collect();
        let _ = writeln!(o, "\nLimit: {} ({})", l.what, b.join(", "));
    }
}

/// One value asked: a row per configuration (its peaks, the range the alternative fits leave, the limit).
fn at_value(o: &mut String, a: &KnobAnswered, i: usize) {
    let j = &a.job.aligned;
    let w = &a.answer;
    let k = &a.knob;
    let v = w.configs[0].at[i].value;
    let _ = writeln!(
        o,
        "\nAt {k} {v} ({}):",
        where_(&j.values, w.configs[0].at[i].beyond)
    );
    let _ = writeln!(
        o,
        "  {:<50} {:>12} {:>12}  {:<27} under the limit",
        "configuration", "allocated", "peak", "range (alternative fits)"
    );
    for c in &w.configs {
        let x = &c.at[i];
        let range = x.alternative.as_ref().map_or("-".to_string(), |alt| {
            let (lo, hi) = (x.fitted.peak.min(alt.peak), x.fitted.peak.max(alt.peak));
            format!("{} to {}", bytes(lo), bytes(hi))
        });
        let fits = match (x.fits, &x.first_failure) {
            (None, _) => "-".to_string(),
            (Some(true), _) => "fits".to_string(),
            (Some(false), Some(f)) => format!("fails: {}", refusal(a, v, f)),
            (Some(false), None) => "fails".to_string(),
        };
        let label = if c.approximate {
            format!("{} (lower bound)", c.label)
        } else {
            c.label.clone()
        };
        let _ = writeln!(
            o,
            "  {label:<50} {:>12} {:>12}  {range:<27} {fits}",
            bytes(x.fitted.allocated_peak),
            bytes(x.fitted.peak)
        );
        if x.clamped > 0 {
            let _ = writeln!(
                o,
                "    {} requests' fits fall below zero there, taken as zero",
                count(x.clamped)
            );
        }
    }
}

/// Per configuration the largest value that fits the limit, and the configuration that reaches furthest.
fn largest(o: &mut String, a: &KnobAnswered) {
    let w = &a.answer;
    let k = &a.knob;
    let _ = writeln!(o, "\nThe largest {k} that fits the limit:");
    for c in &w.configs {
        if let Some(l) = &c.largest {
            let _ = writeln!(o, "  {}: {}", c.label, largest_line(a, l));
        }
    }
    let reach = |c: usize| w.configs[c].largest.as_ref().and_then(|l| l.value);
    match (w.best, reach(0)) {
        (Some(b), run) => {
            let c = &w.configs[b];
            let _ = writeln!(
                o,
                "\n{k} {} with PYTORCH_CUDA_ALLOC_CONF={}, or {} as run, fits.",
                reach(b).unwrap_or(0),
                c.conf,
                run.map_or("none".to_string(), |v| v.to_string())
            );
        }
        (None, Some(v)) => {
            let _ = writeln!(o, "\n{k} {v} as run fits; no setting reaches further.");
        }
        (None, None) => {}
    }
}
