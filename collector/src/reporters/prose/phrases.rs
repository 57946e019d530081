//! The phrases the sentences share: a count of a noun, a growth's size, a holder, a cap as `--cap` takes it.

use crate::model::{GrowthUnit, LeakTrend, StepSource};
use crate::names::units::{bytes as b, count, counted, secs};

/// A holder in words (its name, what and where): [`Holder::label`](crate::model::holders::Holder::label).
pub fn holder_label(h: &crate::model::holders::Holder) -> String {
    h.label()
}

/// `1 step`, `3 batches`: a count of `noun`.
pub fn nouns(noun: &str, n: u64) -> String {
    match (n, noun) {
        (1, _) => noun.to_string(),
        (_, "batch") => "batches".to_string(),
        (_, "entry") => "entries".to_string(),
        _ => format!("{noun}s"),
    }
}

/// A growth's size in one phrase: what a step kept and over how many (when the program's steps or the
/// driver's cycles were counted), in all, from when.
pub fn growth_size(l: &LeakTrend) -> String {
    let first = l.minima[0];
    let last = l.minima[l.minima.len() - 1];
    let whole = format!(
        "+{} from {} (at {}) to {} (at {})",
        b(l.rise_bytes),
        b(first.bytes),
        secs(first.t_ns),
        b(last.bytes),
        secs(last.t_ns),
    );
    let noun = l.unit.noun();
    match (l.steps.filter(|&n| n > 0), l.unit) {
        (Some(n), GrowthUnit::Steps(StepSource::HeldEntries)) => format!(
            "it holds {} in {} added as the run went on, about {} an entry",
            b(l.rise_bytes),
            counted(n, "tensor", "tensors"),
            b(l.rise_bytes / n)
        ),
        (Some(n), GrowthUnit::Steps(StepSource::GraphIterations)) => format!(
            "it holds {} of saved tensors over {} {}, about {} an {noun}",
            b(l.rise_bytes),
            count(n),
            nouns(noun, n),
            b(l.rise_bytes / n)
        ),
        (Some(n), GrowthUnit::Steps(src)) => format!(
            "kept {} per {noun} over {} {} ({}), {whole}",
            b(l.rise_bytes / n),
            count(n),
            nouns(noun, n),
            match src {
                StepSource::Optimizer => "the program's optimizer steps",
                StepSource::Batches => "the program's DataLoader batches",
                StepSource::Scopes => "the program's no_grad or inference_mode calls",
                StepSource::GraphIterations => "the iterations its graph spans",
                StepSource::HeldEntries => "the tensors a container holds",
            }
        ),
        (Some(n), GrowthUnit::Cycles) => format!(
            "kept about {} per {noun} over {} {} of its allocations (driver level: no step count), {whole}",
            b(l.rise_bytes / n),
            count(n),
            nouns(noun, n),
        ),
        (Some(n), GrowthUnit::Time) => format!(
            "{whole}, over {} {} of the bytes in use (about {} a {noun})",
            count(n),
            nouns(noun, n),
            b(l.rise_bytes / n)
        ),
        (None, _) => whole,
    }
}

/// `20.25GiB`, `8GiB`: a cap spec for `--cap`.
pub fn cap_spec(bytes: u64) -> String {
    let s = format!("{:.2}", bytes as f64 / (1u64 << 30) as f64);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}GiB")
}
