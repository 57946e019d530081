//! `vramtrace export --format html`: the page's embedded JSON agrees with the report (each device's timeline
//! peaks at the report's peak, each process's at its peak on that device, the stacked parts add up to the
//! job's line in every bucket, every out-of-memory error is marked and the analysed ones carry their
//! post-mortem), the page names no address, and it loads in headless Chromium without a console error and
//! draws its plots (tests/html_check.py, over the DevTools protocol).
//!
//! The browser test needs Chromium (`scripts/test.sh` installs Debian's). Without one it says so loudly on
//! stderr and skips, unless `VRAMTRACE_REQUIRE_BROWSER=1` (set by scripts/test.sh once it installed it), where
//! a missing browser fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::cli::{assert_usage_error, chromium, python_check, text, TempDir};
use common::*;
use vramtrace_collector::model::Analysis;
use vramtrace_collector::whatif::trace_file::analyze;

fn export(trace: &Path, out: &Path, force: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vramtrace"));
    c.arg("export")
        .arg(trace)
        .args(["--format", "html", "--out"])
        .arg(out);
    if force {
        c.arg("--force");
    }
    c.output().unwrap()
}

/// The page and the JSON it embeds.
fn exported(dir: &TempDir, trace: &Path, name: &str) -> (PathBuf, String, String) {
    let out = dir.0.join(name);
    let o = export(trace, &out, true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&out).unwrap();
    let open = "<script type=\"application/json\" id=\"vramtrace-data\">";
    let start = page.find(open).expect("the data") + open.len();
    let len = page[start..].find("</script>").expect("its end");
    (out, page.clone(), page[start..start + len].to_string())
}

fn q(json: &str, expr: &str) -> String {
    python_check(json.as_bytes(), &format!("print({expr})"))
        .trim()
        .to_string()
}

/// The page agrees with the report `a`.
fn assert_agrees(a: &Analysis, page: &str, json: &str, what: &str) {
    for scheme in ["http://", "https://"] {
        assert!(!page.contains(scheme), "{what}: the page names an address");
    }
    assert!(!json.contains('<'), "{what}: `<` is escaped in the data");
    // Each device: its highest bucket is the report's peak.
    for d in &a.devices {
        if d.peak_bytes == 0 {
            continue;
        }
        let name = match d.device {
            Some(n) => format!("GPU {n}"),
            None => "GPU ?".into(),
        };
        let dev = format!("[x for x in d['devices'] if x['name'] == '{name}'][0]");
        assert_eq!(
            q(json, &format!("max({dev}['job'])")),
            d.peak_bytes.to_string(),
            "{what}: {name}"
        );
        // The parts add up to the job's line in every bucket, by process and by call site.
        let sums = q(
            json,
            &format!(
                "[all(sum(p['at'][i] for p in {dev}[k]) == j for i, j in enumerate({dev}['job'])) \
                 for k in ('processes', 'sites') if {dev}[k]]"
            ),
        );
        assert!(!sums.contains("False"), "{what}: {name}: {sums}");
        // Each process's own maximum on the device is its peak there.
        for (slot, p) in a.processes.iter().enumerate() {
            for pd in p.per_device.iter().filter(|pd| pd.device == d.device) {
                let own = q(
                    json,
                    &format!(
                        "[max(p['at'] + [v for _, v in p['peaks']]) for p in {dev}['processes'] \
                         if p['slot'] == {slot}]"
                    ),
                );
                assert_eq!(
                    own,
                    format!("[{}]", pd.peak_bytes),
                    "{what}: pid {} on {name}",
                    p.pid
                );
            }
        }
    }
    // Every out-of-memory error is marked; each analysed one has its post-mortem, `vramtrace oom`'s text.
    let marked: u64 = q(json, "len(d['ooms'])").parse().unwrap();
    assert!(marked >= a.oom_records, "{what}: {marked} marked");
    assert_eq!(
        q(json, "len(d['post_mortems'])"),
        a.ooms.len().to_string(),
        "{what}"
    );
    for (i, s) in a.ooms.iter().enumerate() {
        assert_eq!(
            q(
                json,
                &format!(
                    "[m['t_ns'] for m in d['ooms'] if m['post_mortem'] == {i} and m['pid'] == {}][-1:]",
                    s.pid
                )
            ),
            format!("[{}]", s.time_ns),
            "{what}: oom {i}"
        );
        // Numbered where there are several, as `vramtrace oom` numbers them.
        let title = if a.oom_records > 1 {
            format!("OUT OF MEMORY {} of", i + 1)
        } else {
            "OUT OF MEMORY on".to_string()
        };
        assert!(q(
            json,
            &format!("d['post_mortems'][{i}]['text'].startswith('{title}')")
        )
        .eq("True"));
    }
    // The tables: every process, with how it ended and its peak.
    assert_eq!(
        q(json, "[p['peak_bytes'] for p in d['processes']]"),
        format!(
            "[{}]",
            a.processes
                .iter()
                .map(|p| p.peak_bytes.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "{what}"
    );
}

#[test]
fn the_page_agrees_with_the_report() {
    let dir = TempDir::new("html-synthetic");
    let t = dir.file("t.vtrace", &export_trace());
    let (_, page, json) = exported(&dir, &t, "t.html");
    let a = analyze(&t).unwrap();
    assert_agrees(&a, &page, &json, "synthetic");
    // The cap refusal and the driver's OOM, on their devices, with the driver's free bytes.
    assert_eq!(
        q(
            &json,
            "sorted((m['device'], m['requested_bytes'], m['cap_refused'], m['device_free_bytes']) for m in d['ooms'])"
        ),
        format!(
            "[('GPU 0', {}, False, {}), ('GPU 1', {}, True, {})]",
            80 * GIB,
            3 * GIB,
            16 * GIB,
            40 * GIB
        )
    );
    // Call sites: the allocation with one is drawn under its label.
    assert!(
        q(&json, "[s['name'] for s in d['devices'][0]['sites']]").contains("train.py:42 in step")
    );
    assert_eq!(
        q(&json, "[p['name'] for p in d['processes']]"),
        "['rank 1: worker11 --x (pid 11)', 'rank 2: worker12 --x (pid 12)']"
    );
}

#[test]
fn the_gpu_fixtures_agree_with_the_report() {
    let dir = TempDir::new("html-gpu");
    for name in [
        "keep.vtrace",
        "frag.vtrace",
        "backward.vtrace",
        "huge.vtrace",
    ] {
        let (_, page, json) = exported(&dir, &fixture(name), "f.html");
        let a = analyze(&fixture(name)).unwrap();
        assert!(a.oom_records > 0, "{name}");
        assert_agrees(&a, &page, &json, name);
        assert!(page.len() < 1 << 20, "{name}: {} bytes", page.len());
        // The verdict, structured as the report's, and PyTorch's curves beside the driver's.
        assert_eq!(
            q(
                &json,
                "json.dumps([p['cause'] for p in d['post_mortems']], separators=(',', ','))"
            ),
            format!(
                "{:?}",
                a.ooms
                    .iter()
                    .map(|s| vramtrace_collector::verbs::oom::diagnose(&a, s).cause.key())
                    .collect::<Vec<_>>()
            ),
            "{name}"
        );
        assert_eq!(
            q(
                &json,
                "all(len(p['advice']) > 0 and len(p['figures']) >= 4 for p in d['post_mortems'])"
            ),
            "True",
            "{name}"
        );
        match a
            .devices
            .first()
            .and_then(|d| d.framework.as_ref())
            .filter(|_| q(&json, "len(d['devices'])") != "0")
        {
            Some(f) => {
                // The page draws the timeline, whose most is the peak; a peak PyTorch counted at a time not
                // known (a bridge before `peak` records sent its counters at the error only) is above it.
                let drawn = f.allocated.buckets.iter().map(|b| b.max_bytes).max();
                assert_eq!(
                    q(&json, "max(d['devices'][0]['framework']['allocated'])"),
                    drawn.unwrap_or(0).to_string(),
                    "{name}"
                );
                assert!(
                    Some(f.peak_allocated) == drawn
                        || (f.peak_allocated_time_ns.is_none() && Some(f.peak_allocated) > drawn),
                    "{name}: peak {} drawn {drawn:?}",
                    f.peak_allocated
                );
            }
            None => assert_eq!(
                q(
                    &json,
                    "[x['framework'] for x in d['devices'] if x['framework']]"
                ),
                "[]",
                "{name}"
            ),
        }
        // One error is one error on the page: the allocator's retried refusal points at it, folded.
        assert_eq!(
            q(
                &json,
                "len([m for m in d['ooms'] if not m['folded'] and not m['recovered']])"
            ),
            a.oom_records.to_string(),
            "{name}"
        );
    }
    // The growth fixture: its line in the verdict.
    let (_, _, json) = exported(&dir, &fixture("keep.vtrace"), "k.html");
    assert!(
        q(&json, "d['post_mortems'][0]['line']").ends_with("bridge_case.py:79 in keep"),
        "{json}"
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2_and_an_existing_page_is_kept() {
    let dir = TempDir::new("html-bad");
    let out = dir.0.join("o.html");
    let junk = dir.file("junk.vtrace", b"not a trace at all");
    assert_usage_error(&export(&junk, &out, true), "junk.vtrace");
    assert!(!out.exists(), "nothing half-written is left");
    let t = dir.file("t.vtrace", &export_trace());
    std::fs::write(&out, "mine").unwrap();
    let o = export(&t, &out, false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "mine");
    assert_eq!(export(&t, &out, true).status.code(), Some(0));
}

/// Where Chromium is, or `None` (said loudly: a skipped browser test must not look like a passing one).

#[test]
fn the_page_loads_in_a_headless_browser_with_no_error_and_draws_its_plots() {
    let Some(browser) = chromium() else {
        return;
    };
    let dir = TempDir::new("html-browser");
    let t = dir.file("t.vtrace", &export_trace());
    let pages = [
        exported(&dir, &t, "t.html").0,
        exported(&dir, &fixture("keep.vtrace"), "keep.html").0,
    ];
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/html_check.py");
    for (page, plots) in pages.iter().zip(["2 plots", "1 plots"]) {
        let o = Command::new("python3")
            .arg(&script)
            .arg(page)
            .args(["--browser", &browser])
            .output()
            .expect("python3");
        assert!(
            o.status.success(),
            "{}: {}{}",
            page.display(),
            text(&o.stdout),
            text(&o.stderr)
        );
        let summary = text(&o.stdout);
        assert_eq!(q(&summary, "d['ready']"), plots, "{summary}");
        assert_eq!(q(&summary, "d['errors']"), "[]");
    }
}

/// The data blocks of a page: the first (by its id), then the other hosts' (by class).
fn data_blocks(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for open in [
        "<script type=\"application/json\" id=\"vramtrace-data\">",
        "<script type=\"application/json\" class=\"vramtrace-data\">",
    ] {
        let mut rest = page;
        while let Some(i) = rest.find(open) {
            let body = &rest[i + open.len()..];
            let len = body.find("</script>").expect("its end");
            out.push(body[..len].to_string());
            rest = &body[len..];
        }
    }
    out
}

#[test]
fn several_traces_of_one_job_make_one_page_a_section_per_host() {
    let dir = TempDir::new("html-hosts");
    // node-b started 2.5 s after node-a; given first, it still comes second (the job's clock is node-a's).
    let (a, b) = two_node_traces(&dir);
    let out = dir.0.join("job.html");
    let o = export_several(&[&b, &a], "html", &out);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&out).unwrap();
    let blocks = data_blocks(&page);
    assert_eq!(blocks.len(), 2);
    for (json, (trace, host, offset)) in blocks
        .iter()
        .zip([(&a, "node-a", 0u64), (&b, "node-b", 2_500_000_000)])
    {
        let an = analyze(trace).unwrap();
        assert_agrees(&an, &page, json, host);
        assert_eq!(
            q(json, "(d['host'], d['host_offset_ns'])"),
            format!("('{host}', {offset})")
        );
    }
    // Each host's own peak (the same pid on both).
    assert_eq!(
        q(&blocks[0], "max(d['devices'][0]['job'])"),
        (12 * MIB).to_string()
    );
    assert_eq!(
        q(&blocks[1], "max(d['devices'][0]['job'])"),
        (6 * MIB).to_string()
    );
    // Traces of different jobs are refused, and nothing is written.
    assert_refused_together(&dir, &a, "html");
    // In a browser: both hosts' plots drawn, no error.
    let Some(browser) = chromium() else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/html_check.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&out)
        .args(["--browser", &browser])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let summary = text(&o.stdout);
    assert_eq!(q(&summary, "d['ready']"), "2 plots", "{summary}");
    assert_eq!(q(&summary, "d['errors']"), "[]");
}
