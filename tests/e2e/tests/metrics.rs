//! `vramtrace run --metrics`: a real Prometheus server (Debian's `prometheus`, started here on loopback) scrapes a
//! running job held alive by `probe`, and its HTTP API must give back exactly the bytes the probe holds, per
//! GPU, and the job's totals; a freed buffer and an ended process must show. `promtool check metrics` lints a
//! scrape body. scripts/test.sh installs prometheus; without it these tests fail unless
//! `VRAMTRACE_ALLOW_NO_PROMETHEUS=1` says to skip (loudly).

use std::path::{Path, PathBuf};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vramtrace_collector::live::http::{get, get_with};
use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::{FakeCuda, MIB};

mod common;
use common::start_job;

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether prometheus and promtool are here; fails (or skips loudly, when allowed) otherwise.
fn prometheus_here() -> bool {
    if have("prometheus") && have("promtool") {
        return true;
    }
    if std::env::var_os("VRAMTRACE_ALLOW_NO_PROMETHEUS").is_some() {
        eprintln!("SKIPPED: prometheus/promtool are not installed (apt-get install prometheus)");
        return false;
    }
    panic!(
        "prometheus and promtool are needed (Debian package prometheus; scripts/test.sh installs it); \
         VRAMTRACE_ALLOW_NO_PROMETHEUS=1 skips"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Prometheus {
    child: Child,
    addr: String,
    _dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &Path, target: &str) -> Prometheus {
        let cfg = dir.join("prometheus.yml");
        // honor_labels: the job's own `job` label (--job-name) is kept rather than renamed `exported_job`.
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: vramtrace\n    \
                 honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus {
            child,
            addr,
            _dir: dir.to_path_buf(),
        }
    }

    /// `/api/v1/query?query=Q`: (labels, value) of each series.
    fn query(&self, q: &str) -> Vec<(serde_json::Map<String, Value>, f64)> {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let Ok((200, body)) = get(&self.addr, &path, Duration::from_secs(2)) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).expect("prometheus answers JSON");
        v["data"]["result"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| {
                        (
                            r["metric"].as_object().cloned().unwrap_or_default(),
                            r["value"][1].as_str().unwrap().parse::<f64>().unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until `q`'s series satisfy `ok` (Prometheus scrapes every second); returns them.
    fn wait_for(
        &self,
        q: &str,
        ok: impl Fn(&[(serde_json::Map<String, Value>, f64)]) -> bool,
    ) -> Vec<(serde_json::Map<String, Value>, f64)> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let r = self.query(q);
            if ok(&r) {
                return r;
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self._dir.join("prometheus.log")).unwrap_or_default();
                panic!("prometheus never answered {q} as expected; last answer {r:?}\nprometheus log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn label<'a>(m: &'a serde_json::Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or("")
}

#[test]
fn prometheus_scrapes_the_bytes_a_running_job_holds() {
    if !prometheus_here() {
        return;
    }
    let fake = FakeCuda::new().with_state();
    let runtime = fake.dir().join("run");
    let (mut probe, addr) = start_job(
        &fake,
        &[
            "--metrics",
            "127.0.0.1:0",
            "--metrics-pids",
            "--job-name",
            "e2e-job",
        ],
    );

    // Device 0: 3 MiB + 5 MiB; device 1: 2 MiB.
    let (rc, _a) = probe.cmd2(&format!("alloc {}", 3 * MIB));
    assert_eq!(rc, 0);
    let (rc, b) = probe.cmd2(&format!("alloc {}", 5 * MIB));
    assert_eq!(rc, 0);
    assert_eq!(probe.cmd("device 1"), "0");
    let (rc, _c) = probe.cmd2(&format!("alloc {}", 2 * MIB));
    assert_eq!(rc, 0);

    let scratch = fake.dir().join("prom");
    std::fs::create_dir_all(&scratch).unwrap();
    let prom = Prometheus::start(&scratch, &addr);

    let per_gpu = |want0: f64, want1: f64| {
        move |r: &[(serde_json::Map<String, Value>, f64)]| {
            let on = |g: &str| {
                r.iter()
                    .filter(|(m, _)| label(m, "gpu") == g)
                    .map(|(_, v)| v)
                    .sum::<f64>()
            };
            r.len() == 2 && on("0") == want0 && on("1") == want1
        }
    };
    let r = prom.wait_for(
        "vramtrace_memory_used_bytes",
        per_gpu((8 * MIB) as f64, (2 * MIB) as f64),
    );
    for (m, _) in &r {
        assert_eq!(label(m, "job"), "e2e-job", "{m:?}");
        assert!(!label(m, "host").is_empty(), "{m:?}");
        assert!(label(m, "pid").parse::<u32>().is_ok(), "{m:?}");
    }
    prom.wait_for(
        "vramtrace_device_used_bytes",
        per_gpu((8 * MIB) as f64, (2 * MIB) as f64),
    );
    prom.wait_for("vramtrace_allocations_total", |r| {
        r.iter().map(|(_, v)| v).sum::<f64>() == 3.0
    });

    // Freed: the gauge drops, the peak stays.
    assert_eq!(probe.cmd(&format!("free {b}")), "0");
    prom.wait_for(
        "vramtrace_memory_used_bytes",
        per_gpu((3 * MIB) as f64, (2 * MIB) as f64),
    );
    prom.wait_for(
        "vramtrace_memory_peak_bytes",
        per_gpu((8 * MIB) as f64, (2 * MIB) as f64),
    );

    // promtool lints what the server serves to a client that does not ask for OpenMetrics (Prometheus's text
    // format: promtool's parser); Prometheus itself asked for, and read, OpenMetrics above.
    let (code, body) = get(&addr, "/metrics", Duration::from_secs(2)).unwrap();
    assert_eq!(code, 200);
    assert!(!body.contains("# EOF"), "{body}");
    assert!(
        body.contains("# TYPE vramtrace_allocations_total counter"),
        "{body}"
    );
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    lint.stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(get(&addr, "/other", Duration::from_secs(2)).unwrap().0, 404);
    // Asked for OpenMetrics (as Prometheus asks): the same figures, in OpenMetrics.
    let (code, ctype, om) = get_with(
        &addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(code, 200);
    assert!(
        ctype.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ctype}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains("# UNIT vramtrace_memory_used_bytes bytes"),
        "{om}"
    );

    // The job ends: the server goes with it, and so does the attach file.
    let status = probe.finish();
    assert!(status.success(), "{status:?}");
    assert!(get(&addr, "/metrics", Duration::from_secs(1)).is_err());
    assert!(std::fs::read_dir(runtime.join("vramtrace"))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn an_ended_process_takes_its_series_with_it() {
    // No Prometheus needed: the scrape body itself, across a child's life.
    let fake = FakeCuda::new();
    let (mut probe, addr) = start_job(&fake, &["--metrics"]);
    let (rc, _) = probe.cmd2(&format!("alloc {}", 4 * MIB));
    assert_eq!(rc, 0);
    // A child that allocates, frees and exits: its series come and go; only the probe's stay.
    let (status, _pid) = probe.cmd2(&format!("fork {}", MIB));
    assert_eq!(status, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (_, body) = get(&addr, "/metrics", Duration::from_secs(2)).unwrap();
        let series = body
            .lines()
            .filter(|l| l.starts_with("vramtrace_memory_used_bytes{"))
            .count();
        let one_process = body
            .lines()
            .any(|l| l.starts_with("vramtrace_processes{") && l.ends_with(" 1"));
        // The child's events reach the collector after the fork's answer: wait for its allocation too.
        let both_counted = body
            .lines()
            .any(|l| l.starts_with("vramtrace_allocations_total{") && l.ends_with(" 2"));
        if series == 1 && one_process && both_counted {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "series of the ended child stayed:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let used: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("vramtrace_memory_used_bytes{"))
        .collect();
    assert!(used[0].ends_with(&format!(" {}", 4 * MIB)), "{body}");
    // The job's peak on the device: the probe's 4 MiB, with the child's 1 MiB beside it when the probe's
    // allocation was replayed first (the live figures are the report's replay, which goes as far as every
    // process has promised: the child's may not have been yet). `report` gives the exact, time-ordered 5 MiB.
    let peak: u64 = body
        .lines()
        .find(|l| l.starts_with("vramtrace_device_peak_bytes{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(peak == 4 * MIB || peak == 5 * MIB, "{body}");
    probe.finish();
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_the_server_exports() {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use vramtrace_collector::live::{JobLabels, Live};
    use vramtrace_format::codec;
    use vramtrace_format::{Api, Event, Record, TraceHeader};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana/vramtrace.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    fn exprs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => exprs(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
            _ => {}
        }
    }
    let mut qs = Vec::new();
    exprs(&dash, &mut qs);
    assert!(qs.len() >= 10, "{qs:?}");
    // Everything the server can say: a job with a cap, a device size, an allocation, a refusal, an OOM.
    let header = TraceHeader {
        start_unix_ns: 0,
        start_mono_ns: 0,
        command: vec![],
        hostname: "h".into(),
        vramtrace_version: "t".into(),
        extra: vec![
            ("cap_bytes.0".into(), "1000".into()),
            ("device_total.0".into(), "2000".into()),
        ],
    };
    let st = Live::new(
        JobLabels::default(),
        &header,
        None,
        0,
        Arc::new(AtomicU64::new(0)),
        false,
    );
    let mut b = Vec::new();
    let e = Event {
        ts_ns: 1,
        tid: 1,
        api: Api::MemAlloc,
        flags: 0,
        device: 0,
        result: 0,
        addr: 0x1000,
        size: 100,
        aux: 0,
        stack: 0,
    };
    codec::put_events(&mut b, 7, &[e]);
    codec::put_record(
        &mut b,
        &Record::Dropped {
            pid: 7,
            ts_ns: 1,
            count: 1,
        },
    );
    st.feed(&b);
    st.finish();
    let body = st.render();
    let served: std::collections::BTreeSet<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split('{').next())
        .collect();
    let mut named = std::collections::BTreeSet::new();
    for q in &qs {
        let mut rest = q.as_str();
        while let Some(i) = rest.find("vramtrace_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            named.insert(name);
        }
    }
    for n in &named {
        assert!(
            served.contains(n.as_str()),
            "the dashboard queries {n}, which is not served: {served:?}"
        );
    }
    // And it shows every family the issue asks for.
    for n in [
        "vramtrace_memory_used_bytes",
        "vramtrace_memory_peak_bytes",
        "vramtrace_device_used_bytes",
        "vramtrace_cap_bytes",
        "vramtrace_allocations_total",
        "vramtrace_cap_refusals_total",
        "vramtrace_oom_total",
        "vramtrace_events_dropped_total",
    ] {
        assert!(named.contains(n), "the dashboard does not show {n}");
    }
}

#[test]
fn a_run_that_cannot_start_leaves_no_trace_file_behind() {
    // A bad --metrics address is found after the trace file was made: the file goes, so that the same command,
    // corrected, is not refused for an existing --out.
    let dir = std::env::temp_dir().join(format!("vramtrace-e2e-nostart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("t.vtrace");
    let run = |metrics: Option<&str>| {
        let mut c = Command::new(vramtrace());
        c.arg("run").arg("-q").arg("--out").arg(&out);
        if let Some(m) = metrics {
            c.args(["--metrics", m]);
        }
        c.args(["--", "true"]).output().unwrap()
    };
    let bad = run(Some("256.0.0.1:9"));
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--metrics 256.0.0.1:9"), "{err}");
    assert!(
        !out.exists(),
        "a run that never started left {}",
        out.display()
    );
    let good = run(None);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(out.exists());
    // An existing file the user gave is still kept when a run refuses to start.
    let kept = std::fs::metadata(&out).unwrap().len();
    assert_eq!(run(Some("256.0.0.1:9")).status.code(), Some(2));
    assert_eq!(std::fs::metadata(&out).unwrap().len(), kept);
    let _ = std::fs::remove_dir_all(&dir);
}
