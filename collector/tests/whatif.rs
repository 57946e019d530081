//! `vramtrace whatif` against runs recorded on a GPU (collector/tests/fixtures/whatif/, from
//! scripts/gpu/whatif.sh on an H200, 2026-11-26; snapshots slimmed by scripts/gpu/slim_snapshot.py): four
//! workloads, each run once under vramtrace with its whole PyTorch history, and again under each setting
//! (gpu_results.json: PyTorch's own max_memory_reserved, and a capped run's out-of-memory step and line).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::{text, unpack_run, TempDir};
use serde_json::Value;
use vramtrace_collector::whatif::answer::{answer, Limit, WhatIf};
use vramtrace_collector::whatif::from_trace::{load, Loaded};
use vramtrace_collector::whatif::history::Op;
use vramtrace_collector::whatif::native::Model;
use vramtrace_collector::whatif::settings::Settings;

const CASES: [&str; 4] = ["train", "finetune", "serve", "frag"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whatif")
}

/// The case's trace and its snapshot (gunzipped) in `dir`.
fn unpack(dir: &TempDir, case: &str) -> PathBuf {
    unpack_run(&fixtures(), dir, case)
}

fn loaded(dir: &TempDir, case: &str) -> (PathBuf, Loaded) {
    let trace = unpack(dir, case);
    let a = vramtrace_collector::whatif::trace_file::analyze(&trace).unwrap();
    let l = load(&a, &trace);
    (trace, l)
}

fn real() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("gpu_results.json")).unwrap())
        .unwrap()
}

fn whatif(l: Loaded, confs: &[&str], limit: Option<u64>) -> WhatIf {
    let configs: Vec<Settings> = confs.iter().map(|c| Settings::parse(c).unwrap()).collect();
    let limit = limit.map(|b| Limit {
        bytes: BTreeMap::from([(0, b)]),
        what: "test".into(),
    });
    answer(
        l.histories,
        l.outside,
        l.device_total,
        l.others,
        &configs,
        limit,
    )
}

#[test]
fn replaying_its_own_settings_the_model_makes_the_runs_segments_one_for_one() {
    for case in CASES {
        let dir = TempDir::new(&format!("whatif-own-{case}"));
        let (_, l) = loaded(&dir, case);
        assert_eq!(l.histories.len(), 1, "{case}: {:?}", l.notes);
        let h = &l.histories[0];
        assert!(
            h.complete(),
            "{case}: the fixture's history starts at the first allocation"
        );
        let mut m = Model::new(h.recorded.clone(), 141 << 30);
        m.hint_addresses(&h.segment_addresses);
        for e in &h.entries {
            match e.op {
                Op::Alloc { id, size, stream } => assert!(m.malloc(id, size, stream, u64::MAX)),
                Op::Free { id } => m.free(id),
                Op::EmptyCache => m.release_cached(),
                Op::Oom { .. } => {}
            }
        }
        let first_difference = m
            .segment_log()
            .iter()
            .zip(&h.recorded_segments)
            .position(|(a, b)| a != b);
        assert_eq!(
            first_difference, None,
            "{case}: segments differ from the run's"
        );
        assert_eq!(m.segment_log().len(), h.recorded_segments.len(), "{case}");
        assert_eq!(
            m.outcome().reserved_peak,
            h.recorded_reserved_peak,
            "{case}"
        );
    }
}

#[test]
fn under_each_setting_the_model_is_within_1_percent_of_pytorchs_own_reserve() {
    // Each setting was run for real; the model replays the defaults run's history under it. roundup
    // varies between real runs of the same workload (a second run moved its peak by 1.39% and 1.06%,
    // scripts/gpu/whatif_matrix.sh), so it is held to that spread rather than 1%.
    let real = real();
    for case in CASES {
        let dir = TempDir::new(&format!("whatif-settings-{case}"));
        let (_, l) = loaded(&dir, case);
        let settings = [
            ("expandable_segments:True", 1.0),
            ("max_split_size_mb:256", 1.0),
            ("roundup_power2_divisions:4", 1.5),
        ];
        let confs: Vec<&str> = settings.iter().map(|s| s.0).collect();
        let w = whatif(l, &confs, None);
        let check = |label: &str, modelled: u64, tolerance: f64| {
            let r = real[case][label].as_u64().unwrap() as f64;
            let err = (modelled as f64 - r) / r * 100.0;
            assert!(
                err.abs() <= tolerance,
                "{case} {label}: model {modelled}, PyTorch {r}: {err:+.2}%"
            );
        };
        check("defaults", w.configs[0].processes[0].reserved_peak, 1.0);
        for (conf, tolerance) in settings {
            let c = w.configs.iter().find(|c| c.conf == conf).unwrap();
            check(conf, c.processes[0].reserved_peak, tolerance);
        }
        // The setting with the lowest reserve is the real lowest.
        let lowest_real = ["defaults"]
            .iter()
            .chain(confs.iter())
            .min_by_key(|k| real[case][**k].as_u64().unwrap())
            .copied()
            .unwrap();
        let lowest_model = w
            .configs
            .iter()
            .min_by_key(|c| c.processes[0].reserved_peak)
            .map(|c| {
                if c.settings.is_none() {
                    "defaults"
                } else {
                    c.conf.as_str()
                }
            })
            .unwrap();
        assert_eq!(lowest_model, lowest_real, "{case}");
    }
}

#[test]
fn under_the_cap_the_run_failed_at_the_model_fails_at_the_same_step_and_line() {
    let real = real();
    for case in CASES {
        let dir = TempDir::new(&format!("whatif-cap-{case}"));
        let (_, l) = loaded(&dir, case);
        let capped = &real[case]["_cap"];
        let cap = capped["bytes"].as_u64().unwrap();
        let w = whatif(l, &[], Some(cap));
        let f = w.configs[0]
            .first_failure
            .as_ref()
            .unwrap_or_else(|| panic!("{case}: the model says the defaults fit {cap}"));
        let steps: Vec<u64> = capped["steps_us"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64().unwrap())
            .collect();
        let step = steps.iter().filter(|&&s| s <= f.t_us).count() as i64 - 1;
        assert_eq!(step, capped["oom"]["step"].as_i64().unwrap(), "{case}");
        // Requests of the backward pass carry no Python line; where one is known it is the run's.
        if let Some(site) = w.histories[0].site(f.site) {
            let line = format!("whatif_case.py:{} ", capped["oom"]["line"]);
            assert!(site.contains(&line), "{case}: {site} against {line}");
        }
    }
}

#[test]
fn the_verb_says_what_fits_and_what_to_set() {
    let dir = TempDir::new("whatif-cli");
    let trace = unpack(&dir, "train");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vramtrace"))
            .arg("whatif")
            .args(args)
            .arg(&trace)
            .output()
            .unwrap()
    };
    // Under 2.15 GiB the defaults fail in the backward pass; expandable segments fit, which the GPU confirmed
    // (scripts/gpu/whatif.sh: run under a 2.143 GiB cap, it peaked at 1.996 GiB), and are named with the line
    // that sets them.
    let out = run(&["--cap", "2.15GiB"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        t.contains("PyTorch's own segments peaked at 2.25 GiB (+0.0%)"),
        "{t}"
    );
    let row = t
        .lines()
        .find(|l| l.trim_start().starts_with("as run"))
        .unwrap();
    assert!(row.contains(" no: ") && row.contains("128.00 MiB"), "{row}");
    let row = t
        .lines()
        .find(|l| l.trim_start().starts_with("expandable_segments:True"))
        .unwrap();
    // A history from the first allocation to exit: the whole run's replay, so "fits".
    assert!(row.ends_with("  fits"), "{row}");
    assert!(
        t.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True vramtrace run"),
        "{t}"
    );
    // JSON: the best, and every configuration judged against the cap.
    let out = run(&[
        "--json",
        "--cap",
        "2.15GiB",
        "--alloc-conf",
        "expandable_segments:True",
    ]);
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &d["traces"][0];
    assert_eq!(t["best"]["conf"], "expandable_segments:True");
    assert_eq!(t["best"]["verdict"], "fits");
    assert_eq!(t["configs"][0]["fits"], false);
    assert_eq!(t["configs"][0]["verdict"], "no");
    assert_eq!(t["configs"][1]["fits"], true);
    assert_eq!(t["configs"][1]["verdict"], "fits");
    assert!(
        t["configs"][1]["smallest_cap"].as_u64().unwrap() <= (2.15 * (1u64 << 30) as f64) as u64
    );
    // A setting that does not parse: one line, exit 2.
    let out = run(&["--alloc-conf", "max_split_size_mb:10"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("more than 20"), "{err}");
}

/// The replay of the run as it ran is within 1% of PyTorch's own segments where the history starts at the
/// first allocation; where it starts late and misses by more, the line says why (issue 53: 6.03 against
/// 5.78 GiB was shown with no reason).
#[test]
fn the_as_run_replay_is_within_1_percent_or_says_why_not() {
    let dir = TempDir::new("whatif-as-run");
    let whatif_text = |trace: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
            .arg("whatif")
            .arg(trace)
            .output()
            .unwrap();
        text(&out.stdout)
    };
    let percent = |t: &str| -> f64 {
        let line = t
            .lines()
            .find(|l| l.contains("the model peaks at"))
            .expect(t);
        let p = line.split(" (").last().unwrap();
        p[..p.find('%').unwrap()].parse().unwrap()
    };
    for case in CASES {
        let t = whatif_text(&unpack(&dir, case));
        assert!(percent(&t).abs() <= 1.0, "{case}: {t}");
        assert!(!t.contains("the history starts late"), "{case}: {t}");
    }
    let late =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu/verdict_growth_free.vtrace");
    let t = whatif_text(&late);
    assert!(percent(&t).abs() > 1.0, "{t}");
    assert!(t.contains("PyTorch kept the last entries only"), "{t}");
    assert!(
        t.contains("the history starts late, so the tensors live before it are laid out anew"),
        "{t}"
    );
}

#[test]
fn a_trace_without_history_says_so_and_gives_the_driver_level_peak() {
    let dir = TempDir::new("whatif-none");
    let trace = dir.0.join("serve.vtrace");
    // The trace alone: its snapshot is not beside it.
    std::fs::copy(fixtures().join("serve.vtrace"), &trace).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["whatif"])
        .arg(&trace)
        .output()
        .unwrap();
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(t.contains("No PyTorch allocation history"), "{t}");
    assert!(
        t.contains("As run, from the driver's calls: GPU 0 peaked at"),
        "{t}"
    );
    assert!(t.contains("not found beside the trace"), "{t}");
}

#[test]
fn a_post_mortem_replays_the_failure_and_names_the_setting_that_gets_past_it() {
    // The train run's history cut where the model, under 2.15 GiB for PyTorch's allocator, first refuses: that
    // request becomes the run's own failed one, as in an out-of-memory snapshot.
    let dir = TempDir::new("whatif-postmortem");
    let (_, l) = loaded(&dir, "train");
    let mut h = l.histories[0].clone();
    let limit = (2.15 * (1u64 << 30) as f64) as u64 - l.outside[0];
    let w = whatif(
        Loaded {
            histories: vec![h.clone()],
            outside: vec![0],
            ..Loaded::default()
        },
        &[],
        Some(limit),
    );
    let f = w.configs[0].first_failure.clone().unwrap();
    let Op::Alloc { size, stream, .. } = h.entries[f.entry].op else {
        panic!("refused a non-request");
    };
    h.entries.truncate(f.entry);
    h.entries.push(vramtrace_collector::whatif::history::Entry {
        t_us: f.t_us,
        op: Op::Oom { size, stream },
        site: f.site,
    });
    h.oom_reserved = Some(0);
    let r =
        vramtrace_collector::whatif::postmortem::replay_history(h.clone(), Some(limit)).unwrap();
    assert!(r.reproduced, "{r:?}");
    assert_eq!(r.limit, limit);
    // Expandable segments get past it (the GPU run under that cap did: 1.996 GiB at most).
    assert_eq!(r.passes[0].0, "expandable_segments:True", "{:?}", r.passes);
    // Each pass's reserve is the one it served the request with, within the limit (the unlimited replay's was
    // said before: 4.42 GiB "in the same 3.87 GiB" on an H200).
    assert!(
        r.passes.iter().all(|p| p.1 <= limit),
        "{:?} over {limit}",
        r.passes
    );
    assert!(r.needs > limit);
    // With room for what the run's settings need, the failure is not reproduced: its advice would be withheld.
    let r = vramtrace_collector::whatif::postmortem::replay_history(h, Some(limit + (256 << 20)))
        .unwrap();
    assert!(!r.reproduced);
}

#[test]
fn the_html_page_has_the_whatif_table() {
    let dir = TempDir::new("whatif-html");
    let trace = unpack(&dir, "train");
    let page = dir.0.join("train.html");
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["export", "--format", "html", "--out"])
        .arg(&page)
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    let open = "<script type=\"application/json\" id=\"vramtrace-data\">";
    let at = html.find(open).unwrap() + open.len();
    let data: Value =
        serde_json::from_str(&html[at..at + html[at..].find("</script>").unwrap()]).unwrap();
    let w = &data["whatif"];
    let rows = w["rows"].as_array().unwrap();
    assert_eq!(rows[0]["settings"], "as run");
    let e = rows
        .iter()
        .find(|r| r["settings"] == "expandable_segments:True")
        .unwrap();
    assert!(e["peak_bytes"].as_u64().unwrap() < rows[0]["peak_bytes"].as_u64().unwrap());
    assert!(
        w["best"]
            .as_str()
            .unwrap()
            .contains("expandable_segments:True"),
        "{w}"
    );
    // The page draws it with no error (where a browser is at hand).
    if let Some(browser) = common::cli::chromium() {
        let o = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/html_check.py"))
            .arg(&page)
            .args(["--browser", &browser])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    }
}

#[test]
fn forged_sizes_and_counts_are_left_out_or_saturate_never_overflow() {
    // A snapshot as a traced program could write it: sizes near 2^64, a negative one, a million tensors of
    // 200 TiB each never freed, an address at the top of the address space, a forged device total.
    let dir = TempDir::new("whatif-forged");
    let path = dir.0.join("forged.pickle");
    let program = format!(
        "import pickle\n\
         big = 200 << 40\n\
         t = [dict(action='alloc', addr=(1 << 40) + i * 4096, size=big, stream=0, time_us=i) for i in range(100000)]\n\
         t += [dict(action='alloc', addr=5, size=(1 << 64) - 1, stream=0, time_us=1),\n\
               dict(action='alloc', addr=6, size=-5, stream=0, time_us=2),\n\
               dict(action='segment_alloc', addr=(1 << 64) - 4096, size=1 << 21, stream=0, time_us=3),\n\
               dict(action='free_completed', addr=7, size=(1 << 63), stream=-1, time_us=-9)]\n\
         pickle.dump(dict(segments=[dict(device=0, total_size=(1 << 64) - 1, stream=0, blocks=[\n\
             dict(address=9, size=(1 << 64) - 1, requested_size=-1, state='active_allocated')])],\n\
             device_traces=[t]), open({:?}, 'wb'), protocol=4)",
        path.display().to_string()
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&program)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = vramtrace_collector::inputs::torch_snapshot::load(&path).unwrap();
    let mut notes = Vec::new();
    let hs =
        vramtrace_collector::whatif::history::from_snapshot(&v, 1, "forged", "exit", &mut notes);
    assert_eq!(hs.len(), 1);
    assert!(
        hs[0]
            .notes
            .iter()
            .any(|n| n.contains("left out (forged or corrupt)")),
        "{:?}",
        hs[0].notes
    );
    let w = answer(
        hs,
        vec![u64::MAX],
        BTreeMap::from([(0, u64::MAX)]),
        BTreeMap::from([(0, u64::MAX)]),
        &[
            Settings::parse("expandable_segments:True").unwrap(),
            Settings::default(),
        ],
        Some(Limit {
            bytes: BTreeMap::from([(0, 1 << 50)]),
            what: "test".into(),
        }),
    );
    // Figures saturate rather than wrap: the peak is at least the 100,000 tensors' 200 TiB each would be.
    assert!(w.peak(0) >= 1 << 63, "{}", w.peak(0));
    assert_eq!(w.configs[0].fits, Some(false));
}

#[test]
fn a_page_of_several_hosts_has_each_hosts_whatif_table() {
    let dir = TempDir::new("whatif-html-hosts");
    let (a, b) = (unpack(&dir, "train"), unpack(&dir, "frag"));
    let page = dir.0.join("job.html");
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["export", "--format", "html", "--force", "--out"])
        .arg(&page)
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    // One data block per host, each with its own table: train's history and frag's.
    let tables: Vec<&str> = html.split("\"whatif\":").skip(1).collect();
    assert_eq!(tables.len(), 2, "{}", &html[..200.min(html.len())]);
    assert!(tables.iter().any(|t| t.contains("23205 entries")));
    assert!(tables.iter().any(|t| t.contains("1440 entries")));
}

/// Issue 35: a run that failed from growth fits no setting: the what-if says so instead of naming one that
/// "saves most", in text and JSON.
#[test]
fn a_run_that_grew_fits_no_setting() {
    let trace = fixtures().join("../gpu/verdict_growth.vtrace");
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .args(["whatif", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &d["traces"][0];
    assert_eq!(t["caveat"]["kind"], "growth", "{t}");
    assert!(t["best"].is_null(), "{t}");
    // Every row says what the conclusion says: the cudaMallocAsync lower bound replayed within the cap, and
    // still "grows", not "fits".
    let configs = t["configs"].as_array().unwrap();
    assert!(configs.len() > 5);
    for c in configs {
        assert_eq!(c["verdict"], "grows", "{c}");
        assert_eq!(c["fits"], false, "{c}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("whatif")
        .arg(&trace)
        .output()
        .unwrap();
    let t = text(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        t.contains("No setting fits: the run kept memory step after step"),
        "{t}"
    );
    assert!(!t.contains("Saves most"), "{t}");
    assert!(!t.contains(" fits ") && !t.contains(" yes "), "{t}");
}

/// Every trace the repo keeps with a history: no row says more than the conclusion under the table, and "as
/// run" never fits under the cap the run failed at.
#[test]
fn the_rows_agree_with_the_conclusion_on_every_trace() {
    let dir = TempDir::new("whatif-agree");
    let mut traces: Vec<PathBuf> = CASES.iter().map(|c| unpack(&dir, c)).collect();
    for f in std::fs::read_dir(fixtures().join("../gpu")).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "vtrace") {
            traces.push(p);
        }
    }
    let mut judged = 0;
    for trace in &traces {
        let a = vramtrace_collector::whatif::trace_file::analyze(trace).unwrap();
        // Under the run's own cap where it had one, else under a tight one, so that rows differ.
        let json = |args: &[&str]| -> Value {
            let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
                .args(["whatif", "--json"])
                .args(args)
                .arg(trace)
                .output()
                .unwrap();
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let mut d = json(&[]);
        if d["traces"][0]["limit"].is_null() {
            d = json(&["--cap", "2.15GiB"]);
        }
        let t = &d["traces"][0];
        let Some(configs) = t["configs"].as_array() else {
            continue;
        };
        judged += 1;
        let caveat = t["caveat"]["kind"].as_str();
        for c in configs {
            let v = c["verdict"].as_str().unwrap();
            assert_eq!(c["fits"], v == "fits", "{}: {c}", trace.display());
            // A lower bound (cudaMallocAsync's pool packed with no waste) is never shown to fit.
            if c["approximate"] == true {
                assert_ne!(v, "fits", "{}: {c}", trace.display());
            }
            match caveat {
                Some("growth") => assert_eq!(v, "grows", "{}", trace.display()),
                Some(_) => assert_ne!(v, "fits", "{}", trace.display()),
                None => {}
            }
        }
        if a.oom_records > 0
            && t["limit"]["what"]
                .as_str()
                .is_some_and(|w| w.contains("run's cap"))
        {
            let v = configs[0]["verdict"].as_str().unwrap();
            assert!(v == "no" || v == "grows", "{}: as run {v}", trace.display());
        }
        if !t["best"].is_null() {
            assert!(caveat.is_none(), "{}", trace.display());
            // The best says what its row says: never more than the verdict under the limit (issue 53).
            let b = t["best"]["conf"].as_str().unwrap();
            let row = configs.iter().find(|c| c["conf"] == b).unwrap();
            assert_eq!(t["best"]["verdict"], row["verdict"], "{}", trace.display());
        }
    }
    assert!(judged >= 4, "{judged}");
}

/// `--knob`: the GPU's training run as two runs of a program whose step tensors double with the batch (the
/// recorded run at 8, its steps' requests doubled at 16). Predicted at 24, the replay is that of the run with the
/// steps' requests tripled, request for request, under each setting.
#[test]
fn the_knob_whatif_extrapolates_a_real_history_and_refuses_another_code_path() {
    use vramtrace_collector::whatif::batch::align::steps;
    use vramtrace_collector::whatif::batch::synth::{self, Which};
    use vramtrace_collector::whatif::batch::{align, KnobRun};
    use vramtrace_collector::whatif::sim::Job;
    let dir = TempDir::new("whatif-knob");
    let (_, l) = loaded(&dir, "train");
    let h = l.histories[0].clone();
    let sites: Vec<u32> = h
        .entries
        .iter()
        .filter_map(|e| matches!(e.op, Op::Alloc { .. }).then_some(e.site))
        .collect();
    let setup = steps(&sites).setup;
    assert!(setup > 0 && setup < sites.len() / 4, "{setup}");
    let scaled = |n: u64| {
        let mut x = h.clone();
        let mut k = 0;
        for e in &mut x.entries {
            if let Op::Alloc { size, .. } = &mut e.op {
                if k >= setup {
                    *size *= n;
                }
                k += 1;
            }
        }
        x
    };
    let run = |value: u64, h| KnobRun {
        value,
        label: format!("b{value}"),
        histories: vec![h],
        command: Vec::new(),
    };
    let a = align(vec![run(8, scaled(1)), run(16, scaled(2))]).unwrap();
    let got = synth::at(&a, 24, Which::Fitted).histories;
    let want = [scaled(3)];
    for conf in ["", "expandable_segments:True"] {
        let s = Settings::parse(conf).unwrap();
        let peak = |hs: &[vramtrace_collector::whatif::history::History]| {
            let job = Job::new(hs, vec![0], BTreeMap::new(), BTreeMap::new());
            let r = job.replay(&|_| s.clone(), &BTreeMap::new());
            (r.outcomes[0].reserved_peak, r.outcomes[0].allocated_peak)
        };
        assert_eq!(peak(&got), peak(&want), "{conf}");
    }

    // At the command line: the training run against the fine-tuning one (another loop) is refused, in one line
    // naming the line whose count differs; a run not given as FILE=VALUE too.
    let train = unpack(&dir, "train");
    let finetune = unpack(&dir, "finetune");
    let knob = |args: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_vramtrace"))
            .args(["whatif", "--knob", "batch"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = knob(&[
        format!("{}=8", train.display()),
        format!("{}=16", finetune.display()),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("different code paths") && err.contains("whatif_case.py:61 in train"),
        "{err}"
    );
    let out = knob(&[train.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("FILE=VALUE"));
    // One trace at two values is one run: refused (issue 50).
    let out = knob(&[
        format!("{}=8", train.display()),
        format!("{}=16", train.display()),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("one trace given at two values"));
    // Two copies of the same run at two values: every size constant, the peak at 40 is the run's own (2.25 GiB,
    // as modelled), outside the runs by 24, and under 3 GiB it fits as far as the search goes.
    let dir2 = TempDir::new("whatif-knob-copy");
    let copy = unpack(&dir2, "train");
    let out = knob(&[
        format!("{}=8", train.display()),
        format!("{}=16", copy.display()),
        "--at".into(),
        "40".into(),
        "--cap".into(),
        "3GiB".into(),
        "--json".into(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["fits"][0]["shape"], "constant");
    let at = &d["configs"][0]["at"][0];
    assert_eq!(at["outside_runs"]["by"], 24);
    assert_eq!(
        at["predicted"]["reserved_peaks"][0].as_u64().unwrap(),
        l.histories[0].recorded_reserved_peak
    );
    let largest = &d["configs"][0]["largest"];
    assert_eq!(
        (largest["value"].as_u64(), largest["at_least"].as_bool()),
        (Some(256), Some(true))
    );
}
