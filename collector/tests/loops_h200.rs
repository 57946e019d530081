//! Issue 49's verdicts on traces of real loops, recorded on an H200 (PyTorch 2.11, 2026-11-29,
//! scripts/gpu/loops.sh and step_need_fp.sh; docs/GPU-RESULTS.md, "session 57, final build"), committed under
//! tests/fixtures/gpu/loops/. Each was a wrong verdict of an earlier build on the same program.

use std::path::{Path, PathBuf};

use vramtrace_collector::model::diagnose::{Advice, CapAdvice};
use vramtrace_collector::model::Analysis;
use vramtrace_collector::reporters::prose;
use vramtrace_collector::verbs::oom::{diagnose, Cause, Diagnosis, Finding};
use vramtrace_collector::whatif::trace_file::analyze;

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu/loops")
        .join(name)
}

fn first_oom(name: &str) -> (Analysis, Diagnosis) {
    let a = analyze(&fixture(name)).expect("fixture reads");
    assert!(!a.ooms.is_empty(), "{name}: an out-of-memory error");
    let d = diagnose(&a, &a.ooms[0]);
    (a, d)
}

fn need(d: &Diagnosis) -> Option<&vramtrace_collector::model::StepNeed> {
    d.findings.iter().find_map(|f| match f {
        Finding::StepNeedRises(n) => Some(n),
        _ => None,
    })
}

/// A generation request of 2,048 tokens among requests of 192 to 499, under a 2 GiB cap: the request outgrew
/// every one before it, and its length is what to bound. (Before: a cap "as a floor" of 2.25 GiB was all the
/// advice, and under it the same request failed again.)
#[test]
fn one_request_far_longer_than_the_rest_outgrew_them() {
    let (_, d) = first_oom("gen_long.vtrace");
    assert_eq!(d.cause, Cause::Cap, "{}", prose::reason(&d));
    let n = need(&d).expect("step_need_rises");
    assert!(n.outgrew);
    // PyTorch's peak counter at the last boundary (the six requests before), and what the seventh held and asked
    // at the error (its allocated bytes and the 166 MiB request, as its OOM record says).
    assert_eq!(n.first_peak, 956_563_456);
    assert_eq!(n.last_peak, 2_025_455_616);
    let advice = prose::advice(&d);
    assert!(
        advice[0].starts_with("Bound what each iteration takes in"),
        "{advice:#?}"
    );
    assert!(
        !advice.iter().any(|x| x.contains("Fix what")),
        "{advice:#?}"
    );
}

/// Padded GPT-2 batches of shuffled lengths: PyTorch's counter rose at the first steps' record lengths, and the
/// step at the error asked no more than step 6 had needed. No rising need (an earlier build said "each step
/// needed more than the last").
#[test]
fn record_lengths_early_in_shuffled_data_are_no_rising_need() {
    let (_, d) = first_oom("padded11.vtrace");
    assert_eq!(d.cause, Cause::FragmentationCache, "{}", prose::reason(&d));
    assert!(need(&d).is_none(), "{:?}", need(&d));
    // Its graph's row (3.03 GiB, with the tensors it saved) is more than the walk's count of tensors as Python
    // objects (1.83 GiB): the header says so, on one line.
    let (a, _) = first_oom("padded11.vtrace");
    let text = vramtrace_collector::reporters::oom_text::event_text(&a, &a.ooms[0], &d, 1);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("1.83 GiB + graphs' saved)"), "{text}");
}

/// Each step's sequence 128 tokens longer, in a training step: a rising need, and a setting the allocator's
/// replay shows getting past the error is said with the reserve it served it in, within the limit (before: the
/// replay with no limit, 4.42 GiB "in the same 3.87 GiB").
#[test]
fn a_setting_that_gets_past_is_said_with_the_reserve_it_served_it_in() {
    let (_, d) = first_oom("longer_opt.vtrace");
    assert_eq!(d.cause, Cause::Cap, "{}", prose::reason(&d));
    let n = need(&d).expect("step_need_rises");
    assert!(!n.outgrew);
    assert!(n.last_peak > n.first_peak + 1024 * MIB, "{n:?}");
    let past = d.advice.iter().find_map(|a| match a {
        Advice::Cap(CapAdvice::SettingGetsPast { reserve, limit, .. }) => Some((*reserve, *limit)),
        _ => None,
    });
    let (reserve, limit) = past.expect("a setting gets past (the history was kept)");
    assert!(reserve <= limit, "reserve {reserve} over the limit {limit}");
    assert!(
        prose::advice(&d)[0].starts_with("Bound what each step takes in"),
        "{:#?}",
        prose::advice(&d)
    );
}
