//! Verdicts in the program's own terms (issue 35), on traces built in memory as the bridge writes them: growth
//! counted in the program's steps whatever the wall clock, what held the tensors named in the cause, HELD BY and
//! advice alike, a graph kept across iterations, a rank holding far more than its peers, and advice that a
//! replay or a wall-clock guess does not overstate.

mod common;

use common::traces::{torch_oom, torch_sample};
use common::*;
use serde_json::{json, Value};
use vramtrace_collector::model::{analyze_reader, Analysis, GrowthUnit, StepSource};
use vramtrace_collector::reporters::{oom_json, oom_text};
use vramtrace_collector::verbs::oom::{diagnose, Cause};
use vramtrace_format::{Bridge, EndKind, Record};

fn run(records: &[Record]) -> Analysis {
    analyze_reader(&trace(records)[..]).unwrap()
}

/// `text` with its line breaks and runs of spaces made one space, so a check does not depend on wrapping.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A bridge record as today's bridge sends it: its body one JSON object.
fn bridge(pid: u32, ms: u64, what: &str, device: u32, doc: Value) -> Record {
    Record::Bridge(Bridge {
        pid,
        tid: 1,
        ts_ns: START + ms * MS,
        what: what.into(),
        device,
        ack: false,
        doc: doc.to_string(),
    })
}

/// The bridge's reading at the boundary of optimizer step `n`.
fn step(pid: u32, ms: u64, n: u64, allocated: Option<u64>) -> Record {
    let mut doc = json!({"optimizer": n, "batches": 0});
    if let Some(a) = allocated {
        doc["device"] = json!(0);
        doc["allocated"] = json!(a);
    }
    bridge(pid, ms, "steps", u32::MAX, doc)
}

/// The walk at the process's first error: `holders` as (kind, name, scope, what, tensors, bytes, batches).
fn holders(pid: u32, ms: u64, hs: &[(&str, &str, &str, &str, u64, u64, u64)]) -> Record {
    let list: Vec<Value> = hs
        .iter()
        .map(|h| {
            json!({"kind": h.0, "name": h.1, "scope": h.2, "what": h.3, "tensors": h.4, "bytes": h.5,
                   "batches": h.6})
        })
        .collect();
    let doc = json!({
        "at": "oom",
        "oom": 1,
        "elapsed_ms": 42,
        "tensors": hs.iter().map(|h| h.4).sum::<u64>(),
        "tensor_bytes": hs.iter().map(|h| h.5).sum::<u64>(),
        "holders": list,
    });
    bridge(pid, ms, "holders", 0, doc)
}

/// A training loop of PyTorch's on device 0 that keeps `kept` bytes a step over 1 GiB of weights, `steps`
/// steps of `step_ms`, with a 2 GiB activation a step; the bridge's readings at each step's boundary (when
/// `boundary`), samples every 20 ms, then PyTorch's error asking for 512 MiB.
fn keeping(steps: u64, step_ms: u64, kept: u64, boundary: bool) -> (Vec<Record>, u64) {
    let mut r = vec![
        hello(100, 0),
        events(100, vec![alloc(1, 0, 0xa000, 6 * GIB - 128 * MIB)]),
    ];
    let mut t = 10;
    for n in 0..steps {
        let floor = GIB + kept * n;
        // Samples through the step: its start, its activations, its end.
        let mut s = t;
        while s < t + step_ms {
            let phase = (s - t) * 4 / step_ms.max(1);
            let v = floor + if phase == 1 || phase == 2 { 2 * GIB } else { 0 };
            r.push(torch_sample(100, s, v));
            s += 20.min(step_ms.max(1));
        }
        t += step_ms;
        r.push(step(100, t, n + 1, boundary.then_some(floor + kept)));
    }
    (r, t)
}

#[test]
fn outputs_kept_each_step_under_a_tight_cap_are_growth_per_step_in_seconds() {
    // 15 steps of 130 ms keeping 256 MiB each: the cap fills in 2 s, inside what wall-clock windows could see.
    let (mut r, t) = keeping(15, 130, 256 * MIB, true);
    r.push(torch_oom(
        100,
        t + 5,
        512 * MIB,
        GIB + 15 * 256 * MIB,
        GIB + 16 * 256 * MIB,
    ));
    r.push(holders(
        100,
        t + 6,
        &[
            (
                "variable",
                "kept",
                "global of __main__",
                "list",
                15,
                15 * 256 * MIB,
                0,
            ),
            (
                "parameters",
                "model",
                "global of __main__",
                "Linear",
                2,
                GIB,
                0,
            ),
        ],
    ));
    r.push(end(100, t + 10, EndKind::Vanished));
    let a = run_with(capped_header(6 * GIB, 80 * GIB), &r);
    let s = &a.ooms[0];
    let d = diagnose(&a, s);
    assert_eq!(d.cause, Cause::Growth, "{:?}", d.reason);
    let g = d.growth.as_ref().unwrap();
    assert_eq!(g.unit, GrowthUnit::Steps(StepSource::Optimizer));
    let per = g.rise_bytes / g.steps.unwrap();
    assert!(
        per.abs_diff(256 * MIB) * 20 <= 256 * MIB,
        "{per} a step over {:?}",
        g.steps
    );
    // The holder is named in the cause, HELD BY and the advice; the weights never are the suspect.
    assert_eq!(d.holder.as_ref().unwrap().name, "kept");
    let text = flat(&oom_text::render(&a, None));
    let cause = text
        .split("CAUSE")
        .nth(1)
        .unwrap()
        .split("FIGURES")
        .next()
        .unwrap();
    assert!(cause.contains("kept 256.00 MiB per step over"), "{cause}");
    assert!(cause.contains("kept (list, global of __main__)"), "{cause}");
    let held = text
        .split("HELD BY")
        .nth(1)
        .unwrap()
        .split("FINDINGS")
        .next()
        .unwrap();
    assert!(
        held.contains("15 tensors kept (list, global of __main__)"),
        "{held}"
    );
    let advice = text.split("ADVICE").nth(1).unwrap();
    assert!(advice.contains("`kept`: store what you need"), "{advice}");
    // No cap or setting advised: how long larger ones last instead.
    assert!(!advice.contains("--cap"), "{advice}");
    assert!(advice.contains("more steps"), "{advice}");
    // JSON carries the unit, the step's figure and the holders.
    let json: serde_json::Value = serde_json::from_str(&oom_json::render(&a)).unwrap();
    let e = &json["ooms"][0];
    assert_eq!(e["growth"]["unit"], "optimizer_steps");
    assert_eq!(e["growth"]["per_step_bytes"].as_u64(), Some(per));
    assert_eq!(e["holders"]["holders"][0]["name"], "kept");
    assert_eq!(e["holders"]["holders"][0]["kind"], "variable");
    assert_eq!(e["holders"]["at"], "oom");
}

#[test]
fn growth_is_read_in_steps_whatever_their_length() {
    for (steps, ms) in [(6, 150), (300, 25), (40, 2_000)] {
        let (mut r, t) = keeping(steps, ms, 64 * MIB, true);
        r.push(end(100, t + 1, EndKind::Vanished));
        let a = run(&r);
        let g = a.devices[0]
            .framework
            .as_ref()
            .and_then(|f| f.leak.as_ref())
            .unwrap_or_else(|| panic!("{steps} x {ms} ms: no growth"));
        assert_eq!(g.rise_bytes / g.steps.unwrap(), 64 * MIB, "{steps} x {ms}");
        assert_eq!(g.pid, Some(100));
    }
}

#[test]
fn steady_steps_warm_up_and_state_made_once_are_not_growth() {
    // Nothing kept, sampled only (no boundary readings): the sampler's phase wanders, the floor does not rise.
    let (mut r, t) = keeping(200, 60, 0, false);
    r.push(end(100, t + 1, EndKind::Vanished));
    let a = run(&r);
    assert!(a.devices[0].framework.as_ref().unwrap().leak.is_none());
    // An optimizer's state made at the first step (the floor rises once), readings at every boundary.
    let mut r = vec![hello(100, 0)];
    for n in 1..=60u64 {
        let v = GIB + if n >= 1 { 2 * GIB } else { 0 };
        r.push(torch_sample(100, n * 50, v));
        r.push(step(100, n * 50 + 10, n, Some(v)));
    }
    r.push(end(100, 4_000, EndKind::Vanished));
    let a = run(&r);
    assert!(a.devices[0].framework.as_ref().unwrap().leak.is_none());
}

#[test]
fn a_graph_kept_across_iterations_without_steps_is_growth_named_by_its_variable() {
    // An evaluation loop: no optimizer, no DataLoader. The walk finds `total`'s graph over 6 iterations.
    let mut r = vec![hello(100, 0)];
    for i in 0..8u64 {
        r.push(torch_sample(100, 10 + i * 40, GIB + i * 768 * MIB));
    }
    r.push(torch_oom(100, 330, 256 * MIB, 6 * GIB, 6 * GIB));
    r.push(holders(
        100,
        331,
        &[
            (
                "graph",
                "total",
                "global of __main__",
                "AddBackward0",
                20,
                5 * GIB,
                6,
            ),
            (
                "variable",
                "x",
                "global of __main__",
                "Tensor",
                1,
                256 * MIB,
                0,
            ),
        ],
    ));
    r.push(end(100, 340, EndKind::Vanished));
    let a = run(&r);
    let d = diagnose(&a, &a.ooms[0]);
    assert_eq!(d.cause, Cause::Growth, "{:?}", d.reason);
    let g = d.growth.as_ref().unwrap();
    assert_eq!(g.unit, GrowthUnit::Steps(StepSource::GraphIterations));
    assert_eq!(g.steps, Some(6));
    let text = flat(&oom_text::render(&a, None));
    assert!(text.contains("the autograd graph behind total"), "{text}");
    assert!(text.contains("torch.no_grad()"), "{text}");
    // The same graph reached from a library's frame (a Llama block's `hidden_states = residual + hidden_states`,
    // twice a layer: the chain spans layers, not iterations) is no growth by itself.
    let mut lib = r.clone();
    let n = lib.len();
    if let Record::Bridge(b) = &mut lib[n - 2] {
        let mut doc: Value = serde_json::from_str(&b.doc).unwrap();
        doc["holders"][0]["lib"] = json!(true);
        b.doc = doc.to_string();
    }
    let flat_samples: Vec<Record> = lib
        .into_iter()
        .map(|x| match x {
            Record::FrameworkSample(mut f) => {
                f.allocated = 6 * GIB;
                Record::FrameworkSample(f)
            }
            other => other,
        })
        .collect();
    let a = run(&flat_samples);
    assert!(a.ooms[0].holders.as_ref().unwrap().holders[0].library);
    assert_ne!(diagnose(&a, &a.ooms[0]).cause, Cause::Growth);
    // A graph of one iteration (the step in progress) is no growth, with memory flat across the samples.
    let mut r2 = vec![hello(100, 0)];
    r2.extend((0..8u64).map(|i| torch_sample(100, 10 + i * 40, 6 * GIB)));
    r2.push(torch_oom(100, 330, 256 * MIB, 6 * GIB, 6 * GIB));
    r2.push(holders(
        100,
        331,
        &[(
            "graph",
            "out",
            "global of __main__",
            "MmBackward0",
            3,
            5 * GIB,
            1,
        )],
    ));
    r2.push(end(100, 340, EndKind::Vanished));
    let a = run(&r2);
    assert_ne!(diagnose(&a, &a.ooms[0]).cause, Cause::Growth);
}

#[test]
fn a_rank_holding_far_more_than_its_peers_is_named() {
    // Four ranks of one program (one command line; common::hello gives rank pid % 10), one device each; rank
    // 1 holds 6 GiB at its error, the others about 2.8 GiB.
    let mut r = Vec::new();
    for (i, pid) in [100u32, 101, 102, 103].iter().enumerate() {
        let mut h = hello(*pid, 0);
        if let Record::Hello(h) = &mut h {
            h.cmdline = vec!["python3".into(), "train.py".into()];
        }
        r.push(h);
        let bytes = if *pid == 101 {
            6 * GIB
        } else {
            2800 * MIB + i as u64 * MIB
        };
        r.push(events(
            *pid,
            vec![alloc(5, i as u32, 0x1000 + i as u64, bytes)],
        ));
    }
    r.push(events(101, vec![failed(alloc(50, 1, 0, 512 * MIB), 2)]));
    r.push(Record::Oom({
        let mut o = common::traces::oom_of(101, 50, 512 * MIB);
        o.device = 1;
        o
    }));
    for pid in [100u32, 101, 102, 103] {
        r.push(end(pid, 60, EndKind::Vanished));
    }
    let a = run(&r);
    let d = diagnose(&a, &a.ooms[0]);
    let f = d
        .findings
        .iter()
        .find(|f| f.key() == "rank_asymmetry")
        .unwrap_or_else(|| panic!("{:?}", d.findings));
    let text = vramtrace_collector::reporters::prose::finding(f);
    assert!(text.starts_with("Rank 1 (pid 101) held 6.00 GiB"), "{text}");
    assert!(text.contains("its 3 peers"), "{text}");
    // The same bytes on every rank: nothing to say.
    let even: Vec<Record> = r
        .iter()
        .map(|x| match x {
            Record::Events {
                pid: 101,
                events: e,
            } if e[0].size == 6 * GIB => events(101, vec![alloc(5, 1, 0x1001, 2800 * MIB)]),
            other => other.clone(),
        })
        .collect();
    let a = run(&even);
    let d = diagnose(&a, &a.ooms[0]);
    assert!(d.findings.iter().all(|f| f.key() != "rank_asymmetry"));
}

#[test]
fn a_kv_cache_growing_while_a_request_is_served_is_the_work_not_growth() {
    // No step counted (a generate() loop): allocated bytes rise in wall-clock windows as the sequence grows,
    // and the walk finds the KV cache holding them. The cap is why; the advice bounds the cache and never says
    // to fix what is kept.
    let mut r = vec![
        hello(100, 0),
        events(100, vec![alloc(1, 0, 0xa000, 6 * GIB - 160 * MIB)]),
    ];
    for i in 0..200u64 {
        r.push(torch_sample(100, 10 + i * 20, GIB + i * 16 * MIB));
    }
    r.push(events(100, vec![failed(alloc(4_020, 0, 0, 162 * MIB), 2)]));
    r.push(Record::Oom({
        let mut o = common::traces::oom_of(100, 4_020, 162 * MIB);
        o.flags = vramtrace_format::flags::CAP_REFUSED;
        o.cap_bytes = Some(6 * GIB);
        o
    }));
    r.push(torch_oom(
        100,
        4_021,
        162 * MIB,
        GIB + 199 * 16 * MIB,
        6 * GIB - 160 * MIB,
    ));
    r.push(holders(
        100,
        4_022,
        &[(
            "variable",
            "self.layers",
            "local of update() at cache_utils.py:1397",
            "list",
            22,
            3 * GIB,
            0,
        )],
    ));
    r.push(end(100, 4_030, EndKind::Vanished));
    let a = run_with(capped_header(6 * GIB, 80 * GIB), &r);
    let d = diagnose(&a, &a.ooms[0]);
    assert_eq!(d.cause, Cause::Cap, "{:?}", d.reason);
    assert!(d.work_grows);
    let advice = flat(&vramtrace_collector::reporters::prose::advice(&d).join(" | "));
    assert!(advice.contains("KV cache"), "{advice}");
    assert!(!advice.contains("kept across steps"), "{advice}");
    assert!(advice.contains("at least"), "{advice}");
}

/// One request too long for the cap, in a loop whose steps were counted and kept nothing across them (the floor
/// at every boundary the same): the driver saw the cache grow segment after segment inside that request, which
/// is the request's own need, not memory kept. On the H200 this was called growth in driver cycles, with "a
/// cache that never evicts" about the request's own list and no cap said to serve it (issue 49).
#[test]
fn a_rise_inside_one_step_whose_boundaries_kept_nothing_is_not_growth() {
    let mut r = vec![hello(100, 0), events(100, vec![alloc(1, 0, 0xa000, GIB)])];
    // 20 requests of 40 ms, nothing kept: each one's 64 MiB comes from the cache made in the first.
    r.push(events(100, vec![alloc(5, 0, 0x1_0000_0000, 64 * MIB)]));
    for n in 1..=20u64 {
        r.push(torch_sample(100, n * 40, GIB));
        r.push(torch_sample(100, n * 40 + 20, GIB + 64 * MIB));
        r.push(step(100, n * 40 + 39, n, Some(GIB)));
    }
    // Request 21 asks far more: the cache grows a segment a token (each token's scratch freed), 40 tokens.
    let mut evs = Vec::new();
    let mut t = 900;
    for k in 0..40u64 {
        evs.push(alloc(t, 0, 0x2_0000_0000 + k * 0x1000_0000, 20 * MIB));
        evs.push(alloc(t + 1, 0, 0x9_0000_0000, 2 * MIB));
        evs.push(free(t + 2, 0x9_0000_0000));
        r.push(torch_sample(
            100,
            t + 2,
            GIB + 64 * MIB + (k + 1) * 20 * MIB,
        ));
        t += 5;
    }
    r.push(events(100, evs));
    r.push(events(100, vec![failed(alloc(t, 0, 0, 20 * MIB), 2)]));
    r.push(Record::Oom({
        let mut o = common::traces::oom_of(100, t, 20 * MIB);
        o.flags = vramtrace_format::flags::CAP_REFUSED;
        o.cap_bytes = Some(GIB + 64 * MIB + 800 * MIB);
        o
    }));
    r.push(torch_oom(
        100,
        t + 1,
        20 * MIB,
        GIB + 864 * MIB,
        GIB + 864 * MIB,
    ));
    r.push(end(100, t + 10, EndKind::Vanished));
    let a = run_with(capped_header(GIB + 864 * MIB, 80 * GIB), &r);
    let d = diagnose(&a, &a.ooms[0]);
    assert_ne!(d.cause, Cause::Growth, "{:?}", d.reason);
    let advice = flat(&vramtrace_collector::reporters::prose::advice(&d).join(" | "));
    assert!(!advice.contains("kept across steps"), "{advice}");
    assert!(advice.contains("at least"), "{advice}");
}

/// Issue 50: a program that repeats its `snapshot` record (1,000 times, under one pid and under many) names one
/// file once: every reader that reads exit snapshots reads it once, not a thousand times; past 256 distinct
/// ones the rest are counted and said.
#[test]
fn a_snapshot_record_repeated_is_one_snapshot() {
    let mut recs = vec![hello(100, 0)];
    for i in 0..1000u64 {
        let pid = if i % 2 == 0 { 100 } else { 200 + i as u32 };
        recs.push(bridge(
            pid,
            1 + i / 100,
            "snapshot",
            u32::MAX,
            json!({"at": "exit", "path": "/tmp/one.pickle"}),
        ));
    }
    for i in 0..300u32 {
        recs.push(bridge(
            5000 + i,
            20,
            "snapshot",
            u32::MAX,
            json!({"at": "exit", "path": format!("/tmp/s{i}.pickle")}),
        ));
    }
    recs.push(goodbye(100, 30));
    let a = run(&recs);
    let s = &a.bridge.exit_snapshots;
    assert_eq!(s.iter().filter(|(_, p)| p == "/tmp/one.pickle").count(), 1);
    assert_eq!(s.len(), 256);
    assert_eq!(a.bridge.exit_snapshots_dropped, 45);
    let t = vramtrace_collector::reporters::text::render(&a, None);
    assert!(
        flat(&t).contains("45 more snapshots at exit were named"),
        "{t}"
    );
}
