//! What a what-if must say before its table can be read: a run that kept memory step after step fits no setting
//! (each only moves the error), and a history whose replay under the run's own settings and cap does not fail
//! where the run failed is incomplete (its answers are lower bounds). The verb never says "fits" for a run that
//! failed, nor names a setting that "saves most" over either.

use super::answer::WhatIf;
use super::from_trace::{Loaded, RunGrowth};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caveat {
    /// The run grew step after step: no setting fits.
    Growth(RunGrowth),
    /// The run failed (`errors` raised under its own cap) but its history, replayed with its own settings under
    /// that cap, does not.
    Incomplete { errors: u64 },
}

impl Caveat {
    pub fn key(&self) -> &'static str {
        match self {
            Caveat::Growth(_) => "growth",
            Caveat::Incomplete { .. } => "history_incomplete",
        }
    }

    /// In words, for the text and the JSON alike.
    pub fn text(&self) -> String {
        use crate::units::{bytes, count};
        match self {
            Caveat::Growth(g) => format!(
                "No setting fits: the run kept memory step after step ({}+{} in all); every setting and cap \
                 only moves the error to a later {}. Fix what grows first (vramtrace oom names what holds it).",
                match g.per_step_bytes {
                    Some(p) => format!("+{} a {}, ", bytes(p), g.noun),
                    None => String::new(),
                },
                bytes(g.rise_bytes),
                g.noun
            ),
            Caveat::Incomplete { errors } => format!(
                "The run failed ({} out-of-memory error{}) under this limit, but its history replayed with its \
                 own settings does not: the history is incomplete (PyTorch kept it from late in the run, or it \
                 wrapped), so every answer here is a lower bound, and no setting is shown to fit.",
                count(*errors),
                if *errors == 1 { "" } else { "s" }
            ),
        }
    }
}

/// The caveat of `w` for the run `l` describes, if any.
pub fn caveat(w: &WhatIf, l: &Loaded) -> Option<Caveat> {
    if let Some(g) = &l.growth {
        return Some(Caveat::Growth(g.clone()));
    }
    let errors: u64 = l.run_failed.values().sum();
    let limit = w.limit.as_ref()?;
    // The limit is the run's own wherever it failed; the as-run replay under it got through.
    let same = l.run_failed.keys().all(|d| {
        limit
            .bytes
            .get(d)
            .is_some_and(|b| l.run_cap.get(d) == Some(b))
    });
    let as_run_fits = w.configs.first().is_some_and(|c| c.fits == Some(true));
    (errors > 0 && same && as_run_fits).then_some(Caveat::Incomplete { errors })
}
