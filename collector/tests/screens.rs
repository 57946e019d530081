//! What the user reads, on every trace recorded on a GPU that the repo keeps (issue 53): `oom`'s default screen is
//! one screen (at most 40 lines of at most 100 columns for one error, no run of 12 words said twice), `report`
//! says in its first lines what happened (and names `vramtrace oom` when the job ran out of memory), its call
//! sites are one row per line of code with the cache's legend said once, and a step too large for its cap is
//! advised on the job before the cap.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::cli::{text, vramtrace};
use common::golden::manifest_dir;

/// Every trace under the fixtures' GPU folders (recorded on an H200 by scripts/gpu/).
fn gpu_traces() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![manifest_dir().join("tests/fixtures")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "vtrace") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() > 30, "{} traces", out.len());
    out
}

/// A run of `n` words (split at white space) that appears twice, not overlapping itself.
fn repeated_run(t: &str, n: usize) -> Option<String> {
    let w: Vec<&str> = t.split_whitespace().collect();
    let mut first: HashMap<String, usize> = HashMap::new();
    for i in 0..w.len().saturating_sub(n - 1) {
        let k = w[i..i + n].join(" ");
        match first.get(&k) {
            Some(&j) if i >= j + n => return Some(k),
            Some(_) => {}
            None => {
                first.insert(k, i);
            }
        }
    }
    None
}

#[test]
fn the_oom_screen_is_one_screen_that_says_each_fact_once() {
    let mut checked = 0;
    for t in gpu_traces() {
        let a = vramtrace_collector::whatif::trace_file::analyze(&t).unwrap();
        let out = vramtrace("oom", &t, false);
        assert!(out.status.success(), "{}", t.display());
        let s = text(&out.stdout);
        for l in s.lines() {
            assert!(l.chars().count() <= 100, "{}: {l}", t.display());
        }
        if a.oom_records == 0 {
            continue;
        }
        if a.oom_records == 1 {
            assert!(
                s.lines().count() <= 40,
                "{}: {} lines:\n{s}",
                t.display(),
                s.lines().count()
            );
        }
        if let Some(run) = repeated_run(&s, 12) {
            panic!("{}: said twice: {run}\n{s}", t.display());
        }
        // The figures say what was missing, never "needed" beside a "could give" that reads the same, and
        // never that nothing was missing.
        assert!(!s.contains("could give"), "{}", t.display());
        assert!(!s.contains("missing 0 B"), "{}", t.display());
        assert!(!s.contains("the guides'"), "{}", t.display());
        checked += 1;
    }
    assert!(checked >= 15, "{checked} traces with an error");
}

#[test]
fn the_report_says_first_what_happened() {
    for t in gpu_traces() {
        let a = vramtrace_collector::whatif::trace_file::analyze(&t).unwrap();
        let s = text(&vramtrace("report", &t, false).stdout);
        let head: String = s.lines().take(9).collect::<Vec<_>>().join("\n");
        if a.oom_records > 0 {
            assert!(
                head.contains("OUT OF MEMORY on "),
                "{}:\n{head}",
                t.display()
            );
            assert!(
                head.contains(&format!("vramtrace oom {}", t.display())),
                "{}:\n{head}",
                t.display()
            );
            assert!(head.contains("cause: "), "{}:\n{head}", t.display());
        } else {
            assert!(
                head.contains("FINISHED")
                    || head.contains("ENDED")
                    || head.contains("STOPPED after"),
                "{}:\n{head}",
                t.display()
            );
            assert!(!head.contains("vramtrace oom"), "{}:\n{head}", t.display());
        }
    }
}

#[test]
fn call_sites_are_one_row_per_line_and_the_legend_is_said_once() {
    let mut merged = 0;
    for t in gpu_traces() {
        let a = vramtrace_collector::whatif::trace_file::analyze(&t).unwrap();
        let s = text(&vramtrace("report", &t, false).stdout);
        assert!(
            !s.contains("(grew PyTorch's cache"),
            "{}: the legend under a site",
            t.display()
        );
        let legends = s.matches("a call site is where the cache grew").count();
        assert!(legends <= 1, "{}: {legends} legends", t.display());
        if a.processes.iter().any(|p| a.caching_allocator(p.pid)) && a.call_sites.present {
            assert_eq!(legends, 1, "{}", t.display());
        }
        // The rows of the table by bytes allocated: each row's lines (site and callers) differ from every
        // other row's.
        let Some(table) = s.split("CALL SITES BY BYTES ALLOCATED\n").nth(1) else {
            continue;
        };
        let table = table.split("\n\n").next().unwrap();
        let mut rows: Vec<String> = Vec::new();
        for l in table.lines().skip(1) {
            let label = l.get(41..).unwrap_or("").trim().to_string();
            if l.get(..41).is_some_and(|f| !f.trim().is_empty()) {
                rows.push(label);
            } else if let Some(r) = rows.last_mut() {
                r.push('\n');
                r.push_str(&label);
            }
        }
        let mut seen = std::collections::HashSet::new();
        for r in &rows {
            assert!(seen.insert(r.clone()), "{}: row twice:\n{r}", t.display());
        }
        // Rows read the way the sites do: by the distinct lines, not the distinct stacks.
        if rows.len() < a.call_sites.by_allocated.len() {
            merged += 1;
        }
    }
    assert!(merged > 0, "no trace had two sites on one line");
}

#[test]
fn a_step_too_large_for_its_cap_is_advised_on_the_job_before_the_cap() {
    let t = manifest_dir().join("tests/fixtures/gpu/holds/batch_too_large.vtrace");
    let s = text(&vramtrace("oom", &t, false).stdout);
    let advice = s.split("  ADVICE\n").nth(1).expect("advice");
    // First, the one command that finds the largest batch, for this cap (issue 48).
    let fit = advice.find("vramtrace fit --cap 10GiB -- ").expect(&s);
    let batch = advice
        .find("Smaller batch, or micro-batching with gradient accumulation")
        .expect(&s);
    let ckpt = advice.find("Activation checkpointing").expect(&s);
    let amp = advice.find("Mixed precision").expect(&s);
    assert!(fit < batch && batch < ckpt && ckpt < amp, "{advice}");
    // The cap the platform can change is on the one screen too, after the job's own levers.
    let cap = advice.find("A cap of at least").expect(&s);
    assert!(amp < cap, "{advice}");
    // The larger cap is still there, after them (the full report lists every suggestion).
    let full = text(&vramtrace_full(&t).stdout);
    let advice = full.split("  ADVICE\n").nth(1).expect("advice");
    let cap = advice.find("A cap of at least").expect(&full);
    assert!(advice.find("Mixed precision").unwrap() < cap, "{advice}");
    // A serving loop's cache is not told to accumulate gradients.
    let t = manifest_dir().join("tests/fixtures/gpu/holds/serve_double.vtrace");
    let s = text(&vramtrace_full(&t).stdout);
    assert!(!s.contains("gradient accumulation"), "{s}");
    assert!(s.contains("KV cache"), "{s}");
}

fn vramtrace_full(t: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("oom")
        .arg(t)
        .arg("--full")
        .output()
        .unwrap()
}

/// The text, the JSON and the HTML page say the same figures for every device of every GPU fixture: its peak,
/// what was live at the end, how many allocations, and PyTorch's allocated and reserved peaks (the page's header
/// said "in use at the end 0 B" where the text said 5.78 GiB live).
#[test]
fn text_json_and_html_agree_on_every_figure_they_share() {
    use vramtrace_collector::names::units::bytes;
    let dir = common::cli::TempDir::new("screens-agree");
    let mut checked = 0;
    for t in gpu_traces() {
        let a = vramtrace_collector::whatif::trace_file::analyze(&t).unwrap();
        let report = text(&vramtrace("report", &t, false).stdout);
        let json: serde_json::Value =
            serde_json::from_slice(&vramtrace("report", &t, true).stdout).unwrap();
        let page = dir.0.join("p.html");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramtrace"))
            .args(["export", "--force", "--format", "html", "--out"])
            .arg(&page)
            .arg(&t)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let html = std::fs::read_to_string(&page).unwrap();
        let open = "<script type=\"application/json\" id=\"vramtrace-data\">";
        let start = html.find(open).unwrap() + open.len();
        let end = start + html[start..].find("</script>").unwrap();
        let data: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
        for d in a.devices.iter().filter(|d| d.peak_bytes > 0 && !d.on_host) {
            let name = format!("GPU {}", d.device.unwrap());
            let j = json["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["device"].as_u64() == d.device.map(u64::from) && x["on_host"] == false)
                .unwrap();
            let h = data["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{}: {name} on the page", t.display()));
            let what = format!("{}: {name}", t.display());
            for (key, v) in [
                ("peak_bytes", d.peak_bytes),
                ("live_bytes_at_end", d.live_bytes_at_end),
                ("allocations", d.allocations),
                ("in_use_bytes_at_end", d.in_use_bytes_at_end),
            ] {
                assert_eq!(j[key].as_u64(), Some(v), "{what}: JSON {key}");
                assert_eq!(h[key].as_u64(), Some(v), "{what}: page {key}");
            }
            let block = report
                .split(&format!("\n{name}  peak "))
                .nth(1)
                .unwrap_or_else(|| panic!("{what}:\n{report}"));
            // Its lines as one, the wrapping undone.
            let block = block
                .split("\n\n")
                .next()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            assert!(
                block.starts_with(&vramtrace_collector::names::units::bytes_exact(
                    d.peak_bytes
                )),
                "{what}: {block}"
            );
            assert!(
                block.contains(&format!("live at end {}", bytes(d.live_bytes_at_end))),
                "{what}: {block}"
            );
            if let Some(f) = &d.framework {
                let jf = &j["framework"];
                assert_eq!(
                    jf["peak_allocated_bytes"].as_u64(),
                    Some(f.peak_allocated),
                    "{what}"
                );
                assert_eq!(
                    jf["peak_reserved_bytes"].as_u64(),
                    Some(f.peak_reserved),
                    "{what}"
                );
                assert!(
                    block.contains(&format!("allocated peak {}", bytes(f.peak_allocated)))
                        && block.contains(&format!("reserved peak {}", bytes(f.peak_reserved))),
                    "{what}: {block}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 30, "{checked}");
}

/// What the traced program sent through the bridge (its torch version, backend, problems, notes) reaches the
/// terminal escaped: an escape sequence, a C1 control, a bidi override, a line separator or a zero-width
/// character from the program never retitles a window, clears the screen or hides text (issue 50's round).
#[test]
fn the_bridges_words_reach_the_terminal_escaped() {
    use common::*;
    use vramtrace_format::keys::bridge::what;
    use vramtrace_format::{Bridge, EndKind, Record, NO_DEVICE};
    let hostile =
        "2.11\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m\u{202e}evil\u{2028}x\u{200b}y\u{feff}\0";
    let attach = Record::Bridge(Bridge {
        pid: 100,
        tid: 100,
        ts_ns: 1_000_000,
        what: what::ATTACH.to_string(),
        device: NO_DEVICE,
        ack: false,
        doc: serde_json::json!({"torch": hostile, "backend": hostile, "problems": [hostile]})
            .to_string(),
    });
    let t = trace(&[
        hello(100, 0),
        attach,
        events(100, vec![alloc(10, 0, 0xa000, MIB)]),
        end(100, 50, EndKind::Goodbye),
    ]);
    let dir = common::cli::TempDir::new("screens-escaped");
    let f = dir.file("t.vtrace", &t);
    let out = text(&vramtrace("report", &f, false).stdout);
    assert!(out.contains("PYTHON BRIDGE"), "{out}");
    for bad in [
        '\u{1b}', '\u{9b}', '\u{7}', '\u{202e}', '\u{2028}', '\u{200b}', '\u{feff}', '\0',
    ] {
        assert!(!out.contains(bad), "{bad:?} reached the terminal:\n{out}");
    }
    assert!(out.contains("\\u{1b}]0;owned"), "{out}");
}

/// A trace cut short says what it saw before the cut, never that the job had no error or that a process was
/// "still running" when its end is only missing.
#[test]
fn a_cut_trace_says_what_it_saw_before_the_cut() {
    let t = manifest_dir().join("tests/fixtures/gpu/holds/steady_cap.vtrace");
    let bytes = std::fs::read(&t).unwrap();
    let dir = common::cli::TempDir::new("screens-cut");
    let mut checked = 0;
    for cut in [bytes.len() / 4, bytes.len() / 2] {
        let f = dir.file("cut.vtrace", &bytes[..cut]);
        let a = vramtrace_collector::whatif::trace_file::analyze(&f).unwrap();
        let s = text(&vramtrace("report", &f, false).stdout);
        // The banner, the title and the summary.
        let head: String = s.split("\n\n").take(3).collect::<Vec<_>>().join("\n\n");
        assert!(head.contains("PARTIAL TRACE"), "{head}");
        if a.oom_records == 0 {
            assert!(
                head.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .contains("no out-of-memory error recorded before the trace stops"),
                "{head}"
            );
            assert!(!head.contains("still running"), "{head}");
            checked += 1;
        }
    }
    assert!(checked > 0);
}
