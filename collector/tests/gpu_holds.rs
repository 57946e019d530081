//! Issue 35's cases as real GPUs traced them (H200 and 2 x H200, PyTorch 2.11, 2026-11-27;
//! scripts/gpu/holds.sh, docs/GPU-RESULTS.md "Issue 35"): the traces in tests/fixtures/gpu/holds/, read by the
//! collector of today. A verdict is judged on real jobs: each must keep saying what the GPU run showed.

use std::path::PathBuf;

use serde_json::Value;
use vramtrace_collector::model::Analysis;
use vramtrace_collector::reporters::{json as report_json, oom_json, oom_text};
use vramtrace_collector::verbs::oom::diagnose;
use vramtrace_collector::whatif::trace_file::analyze;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu/holds")
        .join(format!("{name}.vtrace"))
}

fn load(name: &str) -> (Analysis, Value, Value) {
    let a = analyze(&trace(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let oom: Value = serde_json::from_str(&oom_json::render(&a)).unwrap();
    let report: Value = serde_json::from_str(&report_json::render(&a)).unwrap();
    (a, oom, report)
}

fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

const MIB: u64 = 1 << 20;

fn advice(e: &Value) -> String {
    e["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[test]
fn outputs_kept_under_a_cap_are_growth_at_the_steps_figure_held_by_their_list() {
    // 11 steps of 256 MiB kept in `kept` fill a 6 GiB cap in 1.3 s.
    let (a, j, _) = load("keep_cap");
    let e = &j["ooms"][0];
    assert_eq!(e["cause"], "growth");
    assert_eq!(e["growth"]["unit"], "optimizer_steps");
    assert_eq!(e["growth"]["per_step_bytes"].as_u64(), Some(256 * MIB));
    assert_eq!(e["holders"]["holders"][0]["name"], "kept");
    assert_eq!(e["holders"]["holders"][0]["tensors"].as_u64(), Some(11));
    let adv = advice(e);
    // Named as the program names it; its bytes and scope are HELD BY's and the cause's, said once there.
    assert!(adv.starts_with("`kept`: store what you need"), "{adv}");
    assert!(
        !adv.contains("--cap") && !adv.contains("PYTORCH_CUDA_ALLOC_CONF"),
        "{adv}"
    );
    // The one screen: HELD BY names the list, not the autograd node that grew PyTorch's cache.
    let text = flat(&oom_text::render(&a, None));
    let held = text
        .split("HELD BY")
        .nth(1)
        .unwrap()
        .split("FINDINGS")
        .next()
        .unwrap();
    assert!(
        held.contains("11 tensors kept (list, global of __main__)"),
        "{held}"
    );
    assert!(!held.contains("PowBackward0"), "{held}");
}

#[test]
fn the_same_over_300_steps_without_a_cap_is_growth_in_the_report_held_at_exit_by_the_list() {
    let (_, j, r) = load("keep_free");
    assert_eq!(j["ooms"].as_array().map(Vec::len), Some(0));
    let leak = &r["devices"][0]["framework"]["allocated_leak"];
    assert_eq!(leak["unit"], "optimizer_steps");
    assert_eq!(leak["per_step_bytes"].as_u64(), Some(32 * MIB));
    let walk = &r["bridge"]["walks"][0];
    assert_eq!(walk["at"], "exit");
    assert_eq!(walk["holders"][0]["name"], "kept");
}

#[test]
fn an_evaluation_without_no_grad_summing_losses_is_growth_held_by_the_graph_of_its_total() {
    let (_, j, _) = load("eval_graph");
    let e = &j["ooms"][0];
    assert_eq!(e["cause"], "growth");
    assert_eq!(e["growth"]["unit"], "dataloader_batches");
    let per = e["growth"]["per_step_bytes"].as_u64().unwrap();
    // The program kept 272.2 MiB a batch (its own memory_allocated() between batches).
    assert!(per.abs_diff(272 * MIB) * 20 <= 272 * MIB, "{per}");
    let h = &e["holders"]["holders"][0];
    assert_eq!(
        (h["kind"].as_str(), h["name"].as_str()),
        (Some("graph"), Some("total"))
    );
    assert!(advice(e).contains("torch.no_grad()"));
}

#[test]
fn one_ddp_rank_keeping_tensors_is_growth_on_that_rank_and_the_asymmetry_is_named() {
    let (_, j, _) = load("ddp_keep");
    let e = &j["ooms"][0];
    assert_eq!(e["cause"], "growth");
    assert_eq!(e["growth"]["per_step_bytes"].as_u64(), Some(128 * MIB));
    let f = e["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "rank_asymmetry")
        .expect("the asymmetry");
    assert_eq!(f["rank"].as_u64(), Some(1));
    assert_eq!(f["peers"].as_u64(), Some(1));
    assert!(f["bytes"].as_u64().unwrap() > 2 * f["peers_median_bytes"].as_u64().unwrap());
}

#[test]
fn work_that_grows_a_step_too_large_and_memory_made_once_are_not_growth() {
    // A serving loop whose batch doubles (the KV cache grows with it), a steady loop at the cap, a batch too
    // large from its first step, losses kept as tensors (512 B a step), a compiled warm-up then steady steps.
    for name in [
        "serve_double",
        "steady_cap",
        "batch_too_large",
        "losses_then_big",
    ] {
        let (a, j, _) = load(name);
        let e = &j["ooms"][0];
        assert_ne!(e["cause"], "growth", "{name}");
        let adv = advice(e);
        assert!(
            !adv.contains("gets past") && !adv.contains("kept across steps"),
            "{name}: {adv}"
        );
        if e["cause"] == "cap" {
            assert!(adv.contains("at least"), "{name}: {adv}");
        }
        if name == "serve_double" {
            assert!(adv.contains("KV cache"), "{adv}");
        }
        assert!(diagnose(&a, &a.ooms[0]).growth.is_none(), "{name}");
    }
    for name in ["losses_list", "warmup_steady"] {
        let (_, j, r) = load(name);
        assert_eq!(j["ooms"].as_array().map(Vec::len), Some(0), "{name}");
        let d = &r["devices"][0];
        assert!(d["growth"].is_null(), "{name}: {}", d["growth"]);
        assert!(d["framework"]["allocated_leak"].is_null(), "{name}");
    }
}

#[test]
fn tensors_kept_by_reference_cycles_are_held_by_a_cycle() {
    let (_, j, _) = load("cycle");
    let h = &j["ooms"][0]["holders"]["holders"][0];
    assert_eq!(h["kind"], "cycle");
    // The program made 64 (its 65th step failed): every one of them in the cycle holder, none unreached.
    assert_eq!(h["tensors"].as_u64(), Some(64));
}
