//! Telling the causes of an out-of-memory event apart, from its snapshot: the cause (exactly one, with the rule
//! and the figures that decided it), the findings beside it, and advice fitted to both. The figures are
//! gathered once (evidence.rs); the rules are a table tried in order (rules.rs), which a test holds to the order
//! docs/OOM.md states.
//!
//! All of it is data: the reporters say it (reporters/prose.rs holds every sentence), so text, JSON and HTML
//! say the same thing in the same words.

mod advice;
pub mod batch_arg;
mod cause;
mod evidence;
mod findings;
mod growth_line;
mod reason;
mod rules;
mod steps;
mod verdict;

pub use cause::{Cause, Rule};
pub use evidence::{CACHE_MARGIN_PCT, CACHE_SHARE_PCT, GRAPH_MIN_ITERATIONS};
pub use findings::{LEDGER_SLACK_BYTES, RANK_EXCESS_BYTES, RANK_FACTOR_PCT};
pub use growth_line::{GrowthKind, GrowthLine, LineSource};
pub use reason::{CapReason, DriverReason, GrowthOf, Limit, NoFiguresReason, Outside, Reason};
pub use steps::{
    Advice, CapAdvice, FragmentationAdvice, GrowthAdvice, OutsideAdvice, PressureAdvice,
    RequestAdvice,
};
pub use verdict::{
    AllocatorSettings, Diagnosis, Finding, JobSource, View, CAP_STEP_BYTES, CONTEXT_ESTIMATE_BYTES,
};

use crate::model::analysis::{Analysis, OomSnapshot};
use advice::advice;
use evidence::Evidence;

/// Decides the cause of out-of-memory snapshot `s` of analysis `a`.
pub fn diagnose(a: &Analysis, s: &OomSnapshot) -> Diagnosis {
    let e = Evidence::gather(a, s);
    let reason = rules::decide(&e);
    let (cause, rule) = (reason.cause(), reason.rule());
    let findings = findings::findings(s, &e, rule);
    let growth = e.grew.filter(|_| cause == Cause::Growth);
    let mut d = Diagnosis {
        view: view(a, s),
        cause,
        rule,
        reason,
        job_live_bytes: e.job,
        job_live_source: e.job_source,
        cap_bytes: e.cap,
        total_bytes: e.known_total,
        shortfall_bytes: e.shortfall,
        outside_job_bytes: e.outside,
        context_estimate_bytes: e.ctx,
        outside_excess_bytes: e.excess,
        needed_bytes: e.needed,
        available_bytes: e.available,
        short_of_fitting_bytes: e.short,
        suggested_cap_bytes: e.suggested,
        growth: growth.map(|g| g.trend),
        growth_line: e.line.filter(|_| cause == Cause::Growth),
        holder: s
            .holders
            .as_ref()
            .and_then(|h| h.suspects().next().cloned())
            .filter(|h| h.bytes > 0),
        work_grows: e.work_grows,
        findings,
        advice: Vec::new(),
    };
    d.advice = advice(a, s, &d);
    d
}

/// What the diagnosis could see: the driver's calls, and the framework's own figures when the bridge gave them.
fn view(a: &Analysis, s: &OomSnapshot) -> View {
    match (
        s.framework_figures,
        s.framework.as_ref().map(|o| o.framework),
    ) {
        (None, None) => View::Driver,
        (_, Some(vramtrace_format::Framework::Jax)) => View::DriverJax,
        _ => {
            let pid_jax = a.process(s.pid).is_some_and(|p| {
                p.framework
                    .iter()
                    .any(|f| f.framework == vramtrace_format::Framework::Jax)
            });
            if pid_jax {
                View::DriverJax
            } else {
                View::DriverPytorch
            }
        }
    }
}
