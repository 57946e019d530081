//! Several traces of one job: two "nodes" made with two UTS namespaces (`unshare --uts` + `hostname`, as root),
//! each tracing its own rank under `vramtrace run`, then merged by `vramtrace report A B` with the right
//! per-host peaks, ranks across hosts, the job's totals and clocks aligned by each trace's wall-clock start;
//! a trace of another job is refused unless `--force`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::{program, FakeCuda, MIB};

fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--uts", "hostname", "vramtrace-check"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `vramtrace run --job-name JOB` of `probe CMDS...` on host `host` (its own UTS namespace), with `RANK=rank`.
fn node(fake: &FakeCuda, host: &str, job: &str, rank: u32, cmds: &[String]) -> PathBuf {
    let trace = fake.dir().join(format!("{host}-{job}.vtrace"));
    let script = r#"hostname "$0" && exec "$@""#;
    let out = fake
        .command("unshare")
        .env("RANK", rank.to_string())
        .args(["--uts", "sh", "-c", script, host])
        .arg(vramtrace())
        .args(["run", "-q", "--job-name", job, "--out"])
        .arg(&trace)
        .arg("--")
        .arg(program("probe"))
        .args(cmds)
        .output()
        .expect("unshare");
    assert!(
        out.status.success(),
        "node {host}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}

fn report(args: &[&Path], extra: &[&str]) -> std::process::Output {
    Command::new(vramtrace())
        .arg("report")
        .args(extra)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn two_hosts_merge_into_one_job() {
    if !unshare_works() {
        if std::env::var_os("VRAMTRACE_ALLOW_NO_UNSHARE").is_some() {
            eprintln!("SKIPPED: unshare --uts does not work here (needs root)");
            return;
        }
        panic!("unshare --uts does not work here (the test needs root); VRAMTRACE_ALLOW_NO_UNSHARE=1 skips");
    }
    let fake = FakeCuda::new();
    // node-a: rank 0 holds 3 + 1 MiB on device 0. node-b, started later: rank 1 holds 5 MiB on device 0 and
    // 2 MiB on device 1.
    let a = node(
        &fake,
        "node-a",
        "fleet-1",
        0,
        &[format!("alloc {}", 3 * MIB), format!("alloc {}", MIB)],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let b = node(
        &fake,
        "node-b",
        "fleet-1",
        1,
        &[
            format!("alloc {}", 5 * MIB),
            "device 1".into(),
            format!("alloc {}", 2 * MIB),
        ],
    );
    // Given in either order, the traces line up by their starts.
    let out = report(&[&b, &a], &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hosts: Vec<&str> = j["job"]["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["node-a", "node-b"]);
    let off_b = j["job"]["hosts"][1]["offset_ns"].as_u64().unwrap();
    assert_eq!(j["job"]["hosts"][0]["offset_ns"].as_u64(), Some(0));
    assert!(off_b >= 300_000_000, "node-b started 0.3 s later: {off_b}");
    let peak = |host: &str, dev: u64| -> (u64, u64) {
        let d = j["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["host"] == host && d["device"] == dev)
            .unwrap_or_else(|| panic!("no device {dev} of {host}: {}", j["devices"]));
        (
            d["peak_bytes"].as_u64().unwrap(),
            d["peak_time_ns"].as_u64().unwrap(),
        )
    };
    assert_eq!(peak("node-a", 0).0, 4 * MIB);
    assert_eq!(peak("node-b", 0).0, 5 * MIB);
    assert_eq!(peak("node-b", 1).0, 2 * MIB);
    assert!(
        j["devices"].as_array().unwrap().len() == 3,
        "{}",
        j["devices"]
    );
    // On the job's clock, node-b's peaks come after node-a's start by at least its offset.
    assert!(peak("node-b", 1).1 >= off_b);
    assert!(peak("node-a", 0).1 < off_b);
    assert_eq!(j["job"]["device_peaks_sum_bytes"].as_u64(), Some(11 * MIB));
    assert_eq!(j["job"]["allocations"].as_u64(), Some(4));
    assert_eq!(j["job"]["key"], "job fleet-1");
    let ranks: Vec<(u64, &str)> = j["job"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["rank"].as_u64().unwrap(), r["host"].as_str().unwrap()))
        .collect();
    assert_eq!(ranks, [(0, "node-a"), (1, "node-b")]);
    for p in j["processes"].as_array().unwrap() {
        let h = p["hostname"].as_str().unwrap();
        assert!(h == "node-a" || h == "node-b", "{p}");
    }
    assert_eq!(j["traces"].as_array().unwrap().len(), 2);

    // The text says the same.
    let out = report(&[&a, &b], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("job fleet-1, 2 traces from 2 hosts"),
        "{text}"
    );
    assert!(text.contains("== host node-b"), "{text}");
    assert!(text.contains("ranks (rank=host/pid): 0=node-a/"), "{text}");

    // Another job's trace is refused (one line, exit 2) unless --force.
    let c = node(&fake, "node-c", "fleet-2", 0, &[format!("alloc {}", MIB)]);
    let out = report(&[&a, &c], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("different jobs") && err.contains("--force"),
        "{err}"
    );
    // The same trace twice would count everything twice: refused, even with --force.
    for extra in [&[][..], &["--force"][..]] {
        let out = report(&[&a, &b, &a], extra);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("are the same trace"), "{err}");
    }
    let out = report(&[&a, &c], &["--json", "--force"]);
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["job"]["device_peaks_sum_bytes"].as_u64(), Some(5 * MIB));

    // `oom` takes several traces too: each host's post-mortem.
    let out = Command::new(vramtrace())
        .args(["oom"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("== host node-a") && text.contains("== host node-b"),
        "{text}"
    );
}
