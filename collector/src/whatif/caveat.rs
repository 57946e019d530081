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
        use crate::names::units::{article, bytes, count};
        match self {
            Caveat::Growth(g) => format!(
                "No setting fits: the run kept memory step after step ({}+{} in all); every setting and cap \
                 only moves the error to a later {}. Fix what grows first (vramtrace oom names what holds it).",
                match g.per_step_bytes {
                    Some(p) => format!("+{} {} {}, ", bytes(p), article(g.noun), g.noun),
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
    let as_run_fits = w.configs.first().is_some_and(|c| c.fits == Some(true));
    (failed_under(w, l) && as_run_fits).then_some(Caveat::Incomplete { errors })
}

/// The run failed under this very limit: the limit is the run's own cap wherever it failed.
fn failed_under(w: &WhatIf, l: &Loaded) -> bool {
    let Some(limit) = w.limit.as_ref() else {
        return false;
    };
    l.run_failed.values().any(|&n| n > 0)
        && l.run_failed.keys().all(|d| {
            limit
                .bytes
                .get(d)
                .is_some_and(|b| l.run_cap.get(d) == Some(b))
        })
}

/// What one row of the table says about its configuration under the limit: the one rule the text and the JSON
/// both read, so that no row says more than the caveat under the table allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its replay of the whole run stays within the limit.
    Fits,
    /// It gets past the request the run failed, but the history ends at that error: what came after is unknown.
    ServesHistory,
    /// Within the limit over the history, which is incomplete: a lower bound, not a fit.
    LowerBound,
    /// The run kept memory step after step: no setting fits, each only moves the error.
    Grows,
    /// Its replay is refused within the limit.
    No,
}

impl Verdict {
    /// The JSON's word.
    pub fn key(self) -> &'static str {
        match self {
            Verdict::Fits => "fits",
            Verdict::ServesHistory => "serves_history",
            Verdict::LowerBound => "lower_bound",
            Verdict::Grows => "grows",
            Verdict::No => "no",
        }
    }

    /// Whether it is shown to fit: only a whole run's replay is.
    pub fn fits(self) -> bool {
        self == Verdict::Fits
    }
}

/// Row `i`'s verdict, `None` without a limit. `as run` (row 0) is never better than the run was: where the run
/// failed under this limit, its replay getting through says the history is short.
pub fn verdict(w: &WhatIf, l: &Loaded, caveat: Option<&Caveat>, i: usize) -> Option<Verdict> {
    w.limit.as_ref()?;
    let c = w.configs.get(i)?;
    if matches!(caveat, Some(Caveat::Growth(_))) {
        return Some(Verdict::Grows);
    }
    if c.fits != Some(true) {
        return Some(Verdict::No);
    }
    if i == 0 && failed_under(w, l) {
        return Some(Verdict::No);
    }
    // cudaMallocAsync's row packs the driver's pool with no waste: a lower bound, never a fit.
    if c.approximate || matches!(caveat, Some(Caveat::Incomplete { .. })) {
        return Some(Verdict::LowerBound);
    }
    if w.histories.iter().any(|h| h.taken_at == "out of memory") {
        return Some(Verdict::ServesHistory);
    }
    Some(Verdict::Fits)
}
