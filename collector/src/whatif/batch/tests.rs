//! The knob's what-if on synthetic programs whose sizes are known functions of the knob: what the fits
//! synthesize at an untried value is checked against the program generated at that value and replayed alike.

use std::collections::BTreeMap;

use super::align::{align, steps, KnobError, KnobRun};
use super::answer::{answer, Beyond, KnobJob};
use super::fit::Shape;
use super::synth::{self, Which};
use crate::whatif::answer::Limit;
use crate::whatif::history::{Entry, History, Op, NO_SITE};
use crate::whatif::settings::Settings;
use crate::whatif::sim::Job;

const MIB: u64 = 1 << 20;

type Size = fn(u64) -> u64;

/// A training loop at knob value `x`: three weights, then `steps` steps, each asking for the `per_step` tensors
/// (freed in reverse), a workspace freed at once, optimizer state on the first step only; `extra`: one more
/// tensor each step from another line (a code path taken only at some values).
fn program(x: u64, per_step: &[(u32, Size)], steps: usize, extra: bool) -> History {
    let mut h = History {
        pid: 7,
        sites: [
            "train.py:10 in setup",
            "train.py:20 in forward",
            "train.py:30 in forward",
            "train.py:40 in attention",
            "train.py:50 in step",
            "train.py:60 in workspace",
            "train.py:99 in branch",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..History::default()
    };
    let mut id = 0u64;
    let push = |h: &mut History, op: Op, site: u32| {
        let t_us = h.entries.len() as u64 + 1;
        h.entries.push(Entry { t_us, op, site });
    };
    let mut alloc = |h: &mut History, size: u64, site: u32| {
        id += 1;
        push(
            h,
            Op::Alloc {
                id,
                size,
                stream: 0,
            },
            site,
        );
        id
    };
    for w in [40 * MIB, 40 * MIB, 8 * MIB + 100] {
        alloc(&mut h, w, 0);
    }
    for step in 0..steps {
        let live: Vec<u64> = per_step
            .iter()
            .map(|&(site, f)| alloc(&mut h, f(x), site))
            .collect();
        let ws = alloc(&mut h, 2 * MIB + 7, 5);
        let ex = extra.then(|| alloc(&mut h, 3 * MIB, 6));
        if step == 0 {
            alloc(&mut h, 40 * MIB, 4);
            alloc(&mut h, 40 * MIB, 4);
        }
        for i in std::iter::once(ws).chain(ex).chain(live.into_iter().rev()) {
            push(&mut h, Op::Free { id: i }, NO_SITE);
        }
    }
    h
}

/// [`program`] at `x` with 5 steps, run out of memory at its `cut`-th request (from 0): the history up to it,
/// then the refused request.
fn failing(x: u64, cut: usize) -> History {
    let mut h = program(x, &BATCH, 5, false);
    let at = h
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.op, Op::Alloc { .. }))
        .nth(cut)
        .map(|(i, _)| i)
        .expect("the cut is a request");
    h.entries.truncate(at + 1);
    if let Op::Alloc { size, stream, .. } = h.entries[at].op {
        h.entries[at].op = Op::Oom { size, stream };
    }
    h
}

fn run(x: u64, h: History) -> KnobRun {
    KnobRun {
        value: x,
        label: format!("run{x}"),
        histories: vec![h],
        command: Vec::new(),
    }
}

fn job(runs: Vec<KnobRun>) -> KnobJob {
    KnobJob {
        aligned: align(runs).expect("the runs match"),
        search_factor: crate::whatif::batch::answer::SEARCH_FACTOR,
        outside: vec![0],
        device_total: BTreeMap::from([(0, 80 << 30)]),
        others: BTreeMap::new(),
    }
}

/// The job's peaks replaying `h` as it is.
fn replayed(h: History, s: &Settings) -> (u64, u64) {
    let hs = [h];
    let job = Job::new(&hs, vec![0], BTreeMap::new(), BTreeMap::new());
    let r = job.replay(&|_| s.clone(), &BTreeMap::new());
    (r.outcomes[0].reserved_peak, r.outcomes[0].allocated_peak)
}

const BATCH: [(u32, Size); 2] = [
    // Activations: batch × 256 × 1024 × 4 bytes.
    (1, |b| b * 256 * 1024 * 4),
    // A constant part and a proportional one.
    (2, |b| 4096 + b * 1024 * 3),
];

#[test]
fn two_runs_fit_constant_linear_and_affine_and_predict_an_untried_batch_exactly() {
    let j = job(vec![
        run(16, program(16, &BATCH, 5, false)),
        run(8, program(8, &BATCH, 5, false)),
    ]);
    assert_eq!(j.aligned.values, vec![8, 16], "sorted by value");
    let slot = &j.aligned.slots[0];
    let shapes: Vec<Shape> = slot.fits.iter().map(|f| f.shape).collect();
    // Setup: three weights; each step: the two tensors and the workspace; the first also optimizer state.
    assert_eq!(&shapes[..3], &[Shape::Constant; 3]);
    assert_eq!(
        &shapes[3..8],
        &[
            Shape::Linear,
            Shape::Affine,
            Shape::Constant,
            Shape::Constant,
            Shape::Constant
        ]
    );
    // The first step made the optimizer state: it is setup; the other four repeat.
    assert_eq!(
        slot.steps[0],
        super::align::Steps {
            setup: 8,
            period: 3,
            count: 4
        }
    );
    for x in [4, 12, 24, 40] {
        let s = synth::at(&j.aligned, x, Which::Fitted);
        let truth = program(x, &BATCH, 5, false);
        let sizes = |h: &History| -> Vec<u64> {
            h.entries
                .iter()
                .filter_map(|e| match e.op {
                    Op::Alloc { size, .. } => Some(size),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(sizes(&s.histories[0]), sizes(&truth), "at {x}");
        for conf in ["", "expandable_segments:True"] {
            let set = Settings::parse(conf).unwrap();
            assert_eq!(
                replayed(s.histories[0].clone(), &set),
                replayed(truth.clone(), &set),
                "{x} {conf}"
            );
        }
    }
    // The affine tensor is ambiguous with two runs: its alternative (a + c·x²) is larger beyond the runs.
    let w = answer(&j, &[Settings::default()], &[12, 40], None);
    let at40 = &w.configs[0].at[1];
    assert_eq!(at40.beyond, Beyond::Above(24));
    assert!(at40.beyond.far(&j.aligned.values));
    let alt = at40.alternative.as_ref().expect("an ambiguous fit");
    assert!(alt.allocated_peak > at40.fitted.allocated_peak);
    assert_eq!(w.configs[0].at[0].beyond, Beyond::Inside);
    let affine = w.shapes.iter().find(|c| c.shape == Shape::Affine).unwrap();
    assert_eq!((affine.requests, affine.ambiguous), (5, 5));
}

const SEQ: [(u32, Size); 2] = [
    (1, |s| s * 1024 * 2),
    // Attention with a bias: a + b·s + c·s².
    (3, |s| 512 + s * 64 + s * s * 2),
];

#[test]
fn three_runs_fit_a_quadratic_and_confirm_a_line() {
    let j = job(vec![
        run(256, program(256, &SEQ, 4, false)),
        run(512, program(512, &SEQ, 4, false)),
        run(1024, program(1024, &SEQ, 4, false)),
    ]);
    let f = &j.aligned.slots[0].fits;
    assert_eq!(
        (f[3].shape, f[3].alternative, f[4].shape, f[4].alternative),
        (Shape::Linear, None, Shape::Quadratic, Some(Shape::Chord))
    );
    let truth = program(1536, &SEQ, 4, false);
    let s = synth::at(&j.aligned, 1536, Which::Fitted);
    assert_eq!(
        replayed(s.histories[0].clone(), &Settings::default()),
        replayed(truth, &Settings::default())
    );
}

#[test]
fn a_different_code_path_is_refused_with_the_lines_that_differ() {
    let e = align(vec![
        run(8, program(8, &BATCH, 5, false)),
        run(16, program(16, &BATCH, 5, true)),
    ])
    .unwrap_err();
    let KnobError::Mismatch(m) = &e else {
        panic!("{e}")
    };
    assert_eq!(m.requests, vec![(8, 20), (16, 25)]);
    let (k, place, sites) = m.first.as_ref().unwrap();
    // The 9th request: after the first step's three and its workspace, the branch.
    assert_eq!(*k, 6);
    assert_eq!(
        place,
        "before the steps repeat (the setup, or a first step unlike the rest)"
    );
    assert_eq!(
        sites[1],
        (16, Some("train.py:99 in branch".to_string())),
        "{sites:?}"
    );
    assert_eq!(
        m.lines,
        vec![("train.py:99 in branch".to_string(), vec![0, 5])]
    );
    let text = e.to_string();
    assert!(
        text.contains("different code paths") && text.contains("train.py:99 in branch (0 / 5)")
    );
}

#[test]
fn runs_that_cannot_be_matched_say_why() {
    let p = || program(8, &BATCH, 2, false);
    assert_eq!(align(vec![run(8, p())]).unwrap_err(), KnobError::Runs(1));
    assert_eq!(
        align(vec![run(8, p()), run(8, p())]).unwrap_err(),
        KnobError::SameValue(8)
    );
    let mut late = p();
    late.assumed_live = 3;
    assert!(matches!(
        align(vec![run(8, p()), run(16, late)]).unwrap_err(),
        KnobError::Incomplete { value: 16, .. }
    ));
    // One run that failed is matched up to its failure; two are not.
    assert!(matches!(
        align(vec![
            run(8, failing(8, 9)),
            run(16, failing(16, 9)),
            run(4, p())
        ])
        .unwrap_err(),
        KnobError::Failed { value: 16, .. }
    ));
    // A failed run that asked another line before its failure took another path.
    let mut other = failing(16, 9);
    other.entries[3].site = 6;
    assert!(matches!(
        align(vec![run(8, p()), run(16, other)]).unwrap_err(),
        KnobError::Mismatch(_)
    ));
    // The same process on another GPU in the other run: its limit and memory would be another device's.
    let mut moved = p();
    moved.device = 1;
    assert!(matches!(
        align(vec![run(8, p()), run(16, moved)]).unwrap_err(),
        KnobError::Devices { slot: 0, .. }
    ));
    let mut two = run(16, p());
    two.histories.push(p());
    assert!(matches!(
        align(vec![run(8, p()), two]).unwrap_err(),
        KnobError::Processes(_)
    ));
}

#[test]
fn the_largest_batch_is_the_brute_force_answer_under_each_setting() {
    let j = job(vec![
        run(4, program(4, &BATCH, 4, false)),
        run(8, program(8, &BATCH, 4, false)),
    ]);
    let limits = BTreeMap::from([(0, 200 * MIB)]);
    for conf in ["", "expandable_segments:True", "max_split_size_mb:128"] {
        let s = Settings::parse(conf).unwrap();
        let fits = |x: u64| {
            let h = synth::at(&j.aligned, x, Which::Fitted).histories;
            let job = Job::new(&h, vec![0], BTreeMap::new(), BTreeMap::new());
            job.replay(&|_| s.clone(), &limits).failures == 0
        };
        // The largest that fits, trying every batch. Fitting is not monotone in the batch: under the defaults
        // batches 10 and 11 fail where 12 to 18 fit (a tensor of 10 MiB or more gets a segment of its own
        // size, under 10 MiB it shares a 20 MiB one), so the search's answer is checked against every batch.
        let all: Vec<u64> = (1..=128u64).filter(|&x| fits(x)).collect();
        if conf.is_empty() {
            assert!(!fits(10) && fits(12), "{all:?}");
        }
        let brute = all.last().copied();
        let got = j.largest(Which::Fitted, Some(&s), &limits, None);
        assert_eq!(got.value, brute, "{conf}");
        assert!(brute.is_some_and(|b| b > 8 && b < 64), "{conf}: {brute:?}");
        assert!(!got.at_least);
        let f = got.next_failure.expect("the next batch's refusal");
        assert!(f.size > 0);
        assert!(got.replays < 20, "{}", got.replays);
        // From a hint (another configuration's answer) the answer fits and the next value is refused, wherever
        // the hint lies; from one past the gap of refused batches, it is the largest, in fewer replays when near.
        let b = brute.unwrap();
        for hint in [1, 5, 9, b - 3, b - 1, b, b + 1, b + 5, 127, 1000] {
            let g = j.largest(Which::Fitted, Some(&s), &limits, Some(hint));
            let v = g.value.expect("1 fits");
            assert!(fits(v) && !fits(v + 1), "{conf} hint {hint}: {v}");
            if hint >= 12 {
                assert_eq!(v, b, "{conf} hint {hint}");
            }
            if hint.abs_diff(b) <= 1 {
                assert!(g.replays <= 4, "{conf} hint {hint}: {} replays", g.replays);
            }
        }
    }
    // Under a limit nothing reaches, the search stops at 16 times the largest run and says so.
    let roomy = BTreeMap::from([(0, 1u64 << 40)]);
    let g = j.largest(Which::Fitted, None, &roomy, None);
    assert_eq!((g.value, g.at_least), (Some(128), true));
    // Under one nothing fits in, none.
    let tight = BTreeMap::from([(0, 50 * MIB)]);
    assert_eq!(j.largest(Which::Fitted, None, &tight, None).value, None);
    // The answer per configuration, and which reaches furthest; a smaller value asked about and refused (10,
    // under the defaults) is listed below the answer, which the bisection alone never sees.
    let w = answer(
        &j,
        &[
            Settings::default(),
            Settings::parse("expandable_segments:True").unwrap(),
        ],
        &[10, 12],
        Some(Limit {
            bytes: limits,
            what: "test".into(),
        }),
    );
    let reach: Vec<Option<u64>> = w
        .configs
        .iter()
        .map(|c| c.largest.as_ref().unwrap().value)
        .collect();
    assert_eq!(w.configs[0].label, "as run");
    assert!(reach.iter().all(Option::is_some));
    let defaults = w.configs[0].largest.as_ref().unwrap();
    assert_eq!(defaults.refused_below, vec![10], "{:?}", defaults.value);
    match w.best {
        Some(b) => assert!(reach[b] > reach[0]),
        None => assert!(reach.iter().all(|r| *r <= reach[0])),
    }
}

#[test]
fn the_step_cycle_is_found_from_the_lines_alone() {
    // Setup 0 1 2, a first step that differs (5 6 7 9), then five steps of 5 6 7.
    let mut l = vec![0, 1, 2, 5, 6, 7, 9];
    for _ in 0..5 {
        l.extend([5, 6, 7]);
    }
    let s = steps(&l);
    assert_eq!((s.setup, s.period, s.count), (7, 3, 5));
    assert_eq!(
        s.place(3),
        "before the steps repeat (the setup, or a first step unlike the rest)"
    );
    assert_eq!(s.place(7 + 3 * 2), "in repeat 3 of 5 of the step cycle");
    assert_eq!(steps(&[1, 2, 3]).count, 0);
}

/// The sizes of a history's requests, in order.
fn asked(h: &History) -> Vec<u64> {
    h.entries
        .iter()
        .filter_map(|e| match e.op {
            Op::Alloc { size, .. } => Some(size),
            _ => None,
        })
        .collect()
}

#[test]
fn a_run_that_failed_is_matched_up_to_its_failure_and_its_later_steps_come_from_its_earlier_ones() {
    // Setup 3 + a first step of 5 + steps of 3: request 14 is in the fourth step.
    let j = job(vec![
        run(4, program(4, &BATCH, 5, false)),
        run(8, program(8, &BATCH, 5, false)),
        run(16, failing(16, 14)),
    ]);
    let a = &j.aligned;
    assert_eq!(a.failed, Some(2));
    assert_eq!(a.reference(), 1, "the largest run that finished");
    assert_eq!(a.nearest(16), 1, "a failed run is never the template");
    let slot = &a.slots[0];
    assert_eq!(slot.requests(), asked(&program(4, &BATCH, 5, false)).len());
    // Two runs finished: what the failed one never asked is their fit's, nothing guessed.
    assert_eq!(slot.filled, Default::default());
    // Every fit is what three finished runs give, so the history at 12 is the program's own.
    let whole = job(vec![
        run(4, program(4, &BATCH, 5, false)),
        run(8, program(8, &BATCH, 5, false)),
        run(16, program(16, &BATCH, 5, false)),
    ]);
    assert_eq!(slot.fits, whole.aligned.slots[0].fits);
    let s = synth::at(a, 12, Which::Fitted);
    assert_eq!(
        asked(&s.histories[0]),
        asked(&program(12, &BATCH, 5, false))
    );
    // With one run that finished, its later steps come from its earlier ones.
    let one = job(vec![
        run(8, program(8, &BATCH, 5, false)),
        run(16, failing(16, 14)),
    ]);
    let f = one.aligned.slots[0].filled;
    assert_eq!((f.from_step, f.from_kin, f.in_proportion), (5, 0, 0));
    let whole = job(vec![
        run(8, program(8, &BATCH, 5, false)),
        run(16, program(16, &BATCH, 5, false)),
    ]);
    assert_eq!(one.aligned.slots[0].fits, whole.aligned.slots[0].fits);
    // It failed in its first step: what it never asked is sized in proportion to the batch.
    let early = job(vec![
        run(8, program(8, &BATCH, 5, false)),
        run(16, failing(16, 4)),
    ]);
    let f = early.aligned.slots[0].filled;
    // The first step differs from the rest (optimizer state): it is setup, so no step it made repeats later.
    // Ten of the fifteen asked a size it had asked before (its kin: the workspace, the activations of its
    // first step), the rest in proportion.
    assert_eq!((f.from_step, f.from_kin, f.in_proportion), (0, 10, 5));
    let truth = asked(&program(12, &BATCH, 5, false));
    let got = asked(&synth::at(&early.aligned, 12, Which::Fitted).histories[0]);
    assert_eq!(got.len(), truth.len());
    assert!(
        got.iter().zip(&truth).all(|(g, t)| g >= t),
        "in proportion is an upper bound for sizes that grow at most in proportion"
    );
}

#[test]
fn the_post_mortem_advises_only_where_the_model_fails_no_later_than_the_run() {
    use super::postmortem::{advise, Failed};
    let advice = |limit: u64| {
        advise(Failed {
            knob: "--batch",
            value: 16,
            // Refused at its fourth request: the first step's first tensor (16 MiB over 88 MiB of weights).
            history: failing(16, 3),
            beside: vec![("run8".into(), 8, program(8, &BATCH, 5, false))],
            limit,
            device_total: 80 << 30,
            commands: Vec::new(),
        })
        .outcome
    };
    // Under 150 MiB the program at 16 is refused only later, at the optimizer's state: another failure than the
    // run's, so nothing is advised.
    let e = advice(150 * MIB).unwrap_err();
    assert!(e.contains("does not reproduce"), "{e}");
    // Under 100 MiB it is refused where the run was, and at any batch: the weights and the optimizer's state
    // alone (168 MiB) do not fit, which the advice says rather than naming a batch.
    let f = advice(100 * MIB).expect("reproduced");
    assert_eq!(f.largest, None);
    // Above what the whole program needs at 16, the model fits it where the run failed: nothing advised.
    assert!(advice(1 << 40).unwrap_err().contains("fits"));
}

/// `h` (a [`program`] at `x`) taking the sorting path of a kernel chosen by size: after each workspace (line 60),
/// a sort's buffer of `x / 4` MiB from the same line, freed at once.
fn sorting(mut h: History, x: u64) -> History {
    let mut id = 1_000_000u64;
    let mut out = Vec::new();
    for e in h.entries.drain(..) {
        out.push(e);
        if matches!(e.op, Op::Alloc { .. }) && e.site == 5 {
            id += 1;
            let size = x * MIB / 4;
            for op in [
                Op::Alloc {
                    id,
                    size,
                    stream: 0,
                },
                Op::Free { id },
            ] {
                out.push(Entry { op, ..e });
            }
        }
    }
    h.entries = out;
    h
}

/// [`program`] at `x` with 5 steps, on the sorting path or not.
fn on_path(x: u64, sort: bool) -> History {
    let h = program(x, &BATCH, 5, false);
    if sort {
        sorting(h, x)
    } else {
        h
    }
}

#[test]
fn a_kernel_chosen_by_size_is_matched_and_followed_on_its_side() {
    let at = on_path;
    let j = job(vec![run(8, at(8, false)), run(16, at(16, true))]);
    let slot = &j.aligned.slots[0];
    let m = slot.paths.as_ref().expect("the paths differ");
    assert_eq!(
        m.lines,
        vec![("train.py:60 in workspace".to_string(), vec![5, 10])]
    );
    assert_eq!((slot.own[0].len(), slot.own[1].len()), (0, 5));
    assert_eq!(
        slot.requests(),
        at(8, false)
            .entries
            .iter()
            .filter(|e| matches!(e.op, Op::Alloc { .. }))
            .count()
    );
    assert!(
        j.ambiguous(),
        "differing paths bound the answers with an alternative"
    );
    let s = Settings::default();
    // Past the larger run: its path, its own requests in proportion (exact here).
    let syn = synth::at(&j.aligned, 32, Which::Fitted);
    assert_eq!(syn.template, 1);
    assert_eq!(
        replayed(syn.histories[0].clone(), &s),
        replayed(at(32, true), &s)
    );
    // Below the smaller run: its path, without the sort.
    let syn = synth::at(&j.aligned, 4, Which::Fitted);
    assert_eq!(
        replayed(syn.histories[0].clone(), &s),
        replayed(at(4, false), &s)
    );
    // Between them, nearer 8: its path as fitted; the alternative adds 16's sort (as asked there, an upper bound)
    // and holds at least what either path would.
    let fitted = replayed(
        synth::at(&j.aligned, 10, Which::Fitted).histories[0].clone(),
        &s,
    );
    assert_eq!(fitted, replayed(at(10, false), &s));
    let alt = synth::at(&j.aligned, 10, Which::Alternative);
    let n = |h: &History| {
        h.entries
            .iter()
            .filter(|e| matches!(e.op, Op::Alloc { .. }))
            .count()
    };
    assert_eq!(n(&alt.histories[0]), n(&at(10, true)));
    let alt = replayed(alt.histories[0].clone(), &s);
    let truth = replayed(at(10, true), &s);
    assert!(
        alt.0 >= truth.0 && alt.1 >= truth.1 && alt.1 >= fitted.1,
        "{alt:?} {truth:?} {fitted:?}"
    );
    // At a run's own value its path is known: no alternative path added.
    let alt16 = synth::at(&j.aligned, 16, Which::Alternative);
    assert_eq!(n(&alt16.histories[0]), n(&at(16, true)));
    // The answers carry the alternative as a range.
    let w = answer(&j, &[], &[10], None);
    let a = &w.configs[0].at[0];
    assert!(a.alternative.as_ref().unwrap().allocated[0] >= a.fitted.allocated[0]);
}

#[test]
fn two_runs_on_one_path_do_not_add_their_requests_twice() {
    // At 8 no sort; at 16 and 32 the sort path: both hold its buffers as their own.
    let at = on_path;
    let j = job(vec![
        run(8, at(8, false)),
        run(16, at(16, true)),
        run(32, at(32, true)),
    ]);
    let slot = &j.aligned.slots[0];
    assert_eq!(
        (slot.own[0].len(), slot.own[1].len(), slot.own[2].len()),
        (0, 5, 5)
    );
    let n = |h: &History| {
        h.entries
            .iter()
            .filter(|e| matches!(e.op, Op::Alloc { .. }))
            .count()
    };
    // Between 16 and 32 the path is known: the alternative adds nothing.
    let alt = synth::at(&j.aligned, 24, Which::Alternative);
    assert_eq!(n(&alt.histories[0]), n(&at(24, true)));
    // Between 8 and 16, nearer 8: the sort added once.
    let alt = synth::at(&j.aligned, 10, Which::Alternative);
    assert_eq!(n(&alt.histories[0]), n(&at(10, true)));
}

#[test]
fn a_failed_run_on_another_kernel_path_is_matched_up_to_its_failure() {
    let mut f = sorting(program(16, &BATCH, 5, false), 16);
    // Refused at the workspace of its second step (the step before it asked its sort).
    let allocs: Vec<usize> = f
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.op, Op::Alloc { .. }))
        .map(|(i, _)| i)
        .collect();
    let cut = allocs[3 + 6 + 2];
    f.entries.truncate(cut + 1);
    if let Op::Alloc { size, stream, .. } = f.entries[cut].op {
        f.entries[cut].op = Op::Oom { size, stream };
    }
    let a = align(vec![run(8, program(8, &BATCH, 5, false)), run(16, f)]).expect("matched");
    let slot = &a.slots[0];
    assert_eq!(a.failed, Some(1));
    assert!(slot.paths.is_some());
    // Its one sort before the failure is its own; the requests every run made, up to its refused one.
    assert_eq!(slot.own[1].len(), 1);
    assert_eq!(slot.at[1].len(), 3 + 5 + 2 + 1);
    // Another line of its own, before the failure, is a branch: refused.
    let mut g = sorting(program(16, &BATCH, 5, false), 16);
    g.entries[allocs[4]].site = 6;
    assert!(matches!(
        align(vec![run(8, program(8, &BATCH, 5, false)), run(16, g)]),
        Err(KnobError::Mismatch(_))
    ));
}

/// Two 20 MiB segments each hold a free 6 MiB block; the next 6 MiB request takes the one at the lower address.
/// Where that is the first segment, a 20 MiB request later finds the second whole and reuses it; where it is the
/// second, the first is whole instead: the same. But freeing only the first segment's other block leaves it
/// whole in one order and not in the other, and the 20 MiB request then needs a third segment: 60 MiB reserved
/// against 40, by addresses alone. The spread measures it on the runs, either way.
#[test]
fn the_runs_addresses_alone_move_the_reserve_and_the_spread_says_how_much() {
    let history = |addrs: [u64; 2]| {
        let mut h = History {
            pid: 7,
            sites: vec!["train.py:1 in f".to_string()],
            segment_addresses: vec![(20 * MIB, addrs[0]), (20 * MIB, addrs[1])],
            ..History::default()
        };
        let ops = [
            Op::Alloc {
                id: 1,
                size: 6 * MIB,
                stream: 0,
            },
            Op::Alloc {
                id: 2,
                size: 14 * MIB,
                stream: 0,
            },
            Op::Alloc {
                id: 3,
                size: 6 * MIB,
                stream: 0,
            },
            Op::Alloc {
                id: 4,
                size: 14 * MIB,
                stream: 0,
            },
            Op::Free { id: 1 },
            Op::Free { id: 3 },
            Op::Alloc {
                id: 5,
                size: 6 * MIB,
                stream: 0,
            },
            Op::Free { id: 2 },
            Op::Alloc {
                id: 6,
                size: 20 * MIB,
                stream: 0,
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            h.entries.push(Entry {
                t_us: i as u64 + 1,
                op,
                site: 0,
            });
        }
        h
    };
    let (lo, hi) = (0x7f00_0000_0000u64, 0x7f10_0000_0000u64);
    let recorded = Settings::default();
    assert_eq!(replayed(history([hi, lo]), &recorded).0, 40 * MIB);
    assert_eq!(replayed(history([lo, hi]), &recorded).0, 60 * MIB);
    let j = job(vec![run(4, history([hi, lo])), run(8, history([lo, hi]))]);
    let s = super::addresses::spread(&j).expect("two runs with addresses");
    assert_eq!(s.pairs, 2);
    assert!((s.high - 0.5).abs() < 1e-9, "{s:?}");
    assert!((s.low + 1.0 / 3.0).abs() < 1e-9, "{s:?}");
    assert!(s.matters());
    // The same addresses in both runs: nothing moves, and nothing is said.
    let same = job(vec![run(4, history([hi, lo])), run(8, history([hi, lo]))]);
    let s = super::addresses::spread(&same).expect("two runs with addresses");
    assert!(!s.matters(), "{s:?}");
    // Runs that recorded no addresses (expandable segments map, they do not allocate): no spread.
    let mut bare = history([hi, lo]);
    bare.segment_addresses.clear();
    assert_eq!(
        super::addresses::spread(&job(vec![run(4, bare.clone()), run(8, bare)])),
        None
    );
}

/// A workspace of a few bytes at 4 and 8 MiB a sample at 8 (another algorithm): from two finished runs it follows
/// the runs' algorithms; beside a run that failed, whose sizes past its failure are fits themselves, it keeps its
/// fit (the failed run is never the one a value's size is taken from).
#[test]
fn a_switched_workspace_is_told_from_finished_runs_only() {
    let per: [(u32, Size); 2] = [
        (1, |b| b * 256 * 1024 * 4),
        (3, |b| if b >= 8 { b * MIB } else { 100 }),
    ];
    let j = job(vec![
        run(4, program(4, &per, 5, false)),
        run(8, program(8, &per, 5, false)),
    ]);
    let shapes: Vec<Shape> = j.aligned.slots[0].fits.iter().map(|f| f.shape).collect();
    assert_eq!(shapes.iter().filter(|&&s| s == Shape::Switched).count(), 5);
    let mut failed = program(16, &per, 5, false);
    let cut = failed
        .entries
        .iter()
        .rposition(|e| matches!(e.op, Op::Alloc { .. }))
        .unwrap();
    failed.entries.truncate(cut + 1);
    if let Op::Alloc { size, stream, .. } = failed.entries[cut].op {
        failed.entries[cut].op = Op::Oom { size, stream };
    }
    let j = job(vec![
        run(4, program(4, &per, 5, false)),
        run(8, program(8, &per, 5, false)),
        run(16, failed),
    ]);
    assert!(j.aligned.failed.is_some());
    assert!(j.aligned.slots[0]
        .fits
        .iter()
        .all(|f| f.shape != Shape::Switched && f.shape != Shape::Capped));
}
