//! `vramtrace top` against a running job: in a real pseudo-terminal (tmux: `capture-pane` reads the screen,
//! `send-keys` quits), and in its plain-text form (`--once`, and stdout not a terminal), with the bytes the probe
//! holds. scripts/test.sh installs tmux; without it the terminal test fails unless `VRAMTRACE_ALLOW_NO_TMUX=1`.

use std::process::Command;
use std::time::{Duration, Instant};

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::{FakeCuda, MIB};

mod common;
use common::start_job;

fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux").args(args).output().expect("tmux");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn top_shows_a_running_job_in_a_terminal_and_as_text() {
    let fake = FakeCuda::new();
    let (mut probe, addr): (_, String) = start_job(
        &fake,
        &["--metrics", "--job-name", "top-job", "--cap", "64MiB"],
    );
    let (rc, _) = probe.cmd2(&format!("alloc {}", 6 * MIB));
    assert_eq!(rc, 0);
    assert_eq!(probe.cmd("device 1"), "0");
    let (rc, _) = probe.cmd2(&format!("alloc {}", 2 * MIB));
    assert_eq!(rc, 0);

    // Plain text, once: the figures, exactly, from the job's own status file (found through the attach file,
    // as the job's user's `top` finds it).
    let runtime = fake.dir().join("run");
    let top = || {
        let mut c = Command::new(vramtrace());
        c.env("XDG_RUNTIME_DIR", &runtime);
        c
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let o = top().args(["top", "--once"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        if t.contains("6.00 MiB") && t.contains("2.00 MiB") {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "top --once never showed the bytes:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains("job top-job"), "{text}");
    // GPU 0: 6 MiB in use under a 64 MiB cap: 58 MiB of headroom.
    let gpu0 = text.lines().find(|l| l.starts_with("GPU 0")).unwrap();
    assert!(
        gpu0.contains("6.00 MiB") && gpu0.contains("64.0 MiB") && gpu0.contains("58.0 MiB"),
        "{gpu0}"
    );
    // The GPUs are named as the driver names them (cuDeviceGetUuid_v2, the UUID nvidia-smi -L prints), in
    // the typed status and in every Prometheus series: the probe's shim tells the collector once its driver
    // answers.
    let want = |d: u8| {
        let mut u = *b"fakecuda-gpu-00\0";
        u[14] = b'0' + d;
        vramtrace_format::gpu_uuid(&u)
    };
    let status = runtime
        .join("vramtrace")
        .join(format!("{}.status.json", probe.pid));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body = std::fs::read_to_string(&status).unwrap_or_default();
        let st: vramtrace_collector::live::Status = serde_json::from_str(&body).unwrap_or_default();
        let named: Vec<(u32, String)> = st.gpus.iter().map(|g| (g.gpu, g.uuid.clone())).collect();
        if named == [(0, want(0)), (1, want(1))] {
            assert!(st.processes.iter().all(|p| !p.command.is_empty()));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the GPUs were never named: {named:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, metrics) =
        vramtrace_collector::live::http::get(&addr, "/metrics", Duration::from_secs(2)).unwrap();
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("vramtrace_memory_used_bytes{"))
        .collect::<Vec<_>>();
    assert!(!series.is_empty(), "{metrics}");
    for l in series {
        assert!(
            l.contains(&format!("uuid=\"{}\"", want(0)))
                || l.contains(&format!("uuid=\"{}\"", want(1))),
            "{l}"
        );
    }

    // Each process row names its command (the probe).
    let row = text
        .lines()
        .find(|l| !l.starts_with("GPU") && l.contains("GPU 1") && l.contains("2.00 MiB"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("probe"), "{row}");

    // What the TCP port serves any local user: the metrics, no command lines, no pids (not asked for), no
    // typed status. The status file is the job's user's alone.
    let (code, _) =
        vramtrace_collector::live::http::get(&addr, "/status.json", Duration::from_secs(2))
            .unwrap();
    assert_eq!(code, 404);
    assert!(
        !metrics.contains("pid=") && !metrics.contains("probe"),
        "{metrics}"
    );
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&status).unwrap();
        assert_eq!(m.mode() & 0o077, 0, "the status file is open to others");
        let dir = std::fs::metadata(status.parent().unwrap()).unwrap();
        assert_eq!(dir.mode() & 0o077, 0, "the attach folder is open to others");
    }
    // `top --addr` reads what the port serves: the same bytes per GPU, its processes by rank.
    let o = top()
        .args(["top", "--once", "--addr", &addr])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let remote = String::from_utf8_lossy(&o.stdout).into_owned();
    let gpu0r = remote.lines().find(|l| l.starts_with("GPU 0")).unwrap();
    assert!(
        gpu0r.contains("6.00 MiB") && gpu0r.contains("64.0 MiB"),
        "{remote}"
    );
    assert!(!remote.contains("probe"), "{remote}");

    // Bad input: one line, exit 2.
    let o = Command::new(vramtrace())
        .args(["top", "--once", "--addr", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);

    // The terminal UI, in tmux.
    if Command::new("tmux").arg("-V").output().is_err() {
        if std::env::var_os("VRAMTRACE_ALLOW_NO_TMUX").is_some() {
            eprintln!("SKIPPED: tmux is not installed: the terminal half of this test did not run");
            probe.finish();
            return;
        }
        panic!("tmux is needed (scripts/test.sh installs it); VRAMTRACE_ALLOW_NO_TMUX=1 skips");
    }
    let session = format!("vramtrace-top-{}", std::process::id());
    let cmd = format!(
        "XDG_RUNTIME_DIR={} {} top --interval 200",
        runtime.display(),
        vramtrace().display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "40",
        &cmd,
    ]);
    let screen = |want: &[&str]| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let s = tmux(&["capture-pane", "-p", "-t", &session]);
            if want.iter().all(|w| s.contains(w)) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "top's screen never showed {want:?}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let s = screen(&[
        "vramtrace top: job top-job",
        "GPU 0",
        "GPU 1",
        "6.00 MiB",
        "processes",
    ]);
    assert!(s.contains("58.0 MiB"), "{s}");
    // It refreshes: a new allocation shows.
    let (rc, _) = probe.cmd2(&format!("alloc {}", 3 * MIB));
    assert_eq!(rc, 0);
    screen(&["5.00 MiB"]);
    tmux(&["send-keys", "-t", &session, "q"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Command::new("tmux")
        .args(["has-session", "-t", &session])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "top did not quit on q");
        std::thread::sleep(Duration::from_millis(50));
    }
    probe.finish();
}

/// Issue 50: the attach folder's name (`/tmp/vramtrace-<uid>`, or `vramtrace` in the runtime folder) taken
/// first by someone else, open to all: the job writes its attach file to the user's own fallback
/// (`~/.cache/vramtrace/attach`, private), and `top` finds it there; before, `top` could not attach at all.
#[test]
fn a_squatted_attach_folder_falls_back_to_the_users_own() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeCuda::new();
    let runtime = fake.dir().join("run");
    let squatted = runtime.join("vramtrace");
    std::fs::create_dir_all(&squatted).unwrap();
    std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let home = fake.dir().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut c = fake.command(vramtrace());
    c.env("XDG_RUNTIME_DIR", &runtime)
        .env("HOME", &home)
        .args(["run", "-q", "--metrics", "--out"])
        .arg(fake.dir().join("m.vtrace"))
        .arg("--")
        .arg(vramtrace_e2e::program("probe"));
    let mut probe = vramtrace_e2e::Probe::start(c);
    let (rc, _) = probe.cmd2(&format!("alloc {}", 6 * MIB));
    assert_eq!(rc, 0);
    let fallback = home.join(".cache/vramtrace/attach");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let o = Command::new(vramtrace())
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("HOME", &home)
            .args(["top", "--once"])
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() && t.contains("6.00 MiB") {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "top never attached: {t}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains("GPU 0"), "{text}");
    // Nothing was written into the folder someone else could have planted; the fallback is private.
    assert_eq!(std::fs::read_dir(&squatted).unwrap().count(), 0);
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&fallback).unwrap();
        assert_eq!(m.mode() & 0o077, 0, "the fallback is open to others");
    }
    assert!(std::fs::read_dir(&fallback).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".addr")));
    drop(probe);
}

/// A trace read while its job still runs (a notebook's kernel reading its own): said so, in place of the reasons
/// a trace is cut short; once `run` is gone without its end record (killed), those reasons again.
#[test]
fn a_trace_read_while_its_job_runs_says_so() {
    let fake = FakeCuda::new();
    let (mut probe, _addr) = start_job(&fake, &["--metrics"]);
    let (rc, _) = probe.cmd2(&format!("alloc {}", 6 * MIB));
    assert_eq!(rc, 0);
    let trace = fake.dir().join("m.vtrace");
    let report = || {
        let o = Command::new(vramtrace())
            .arg("report")
            .arg(&trace)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let running = loop {
        let t = report();
        if t.contains("6.00 MiB") {
            break t;
        }
        assert!(Instant::now() < deadline, "{t}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(running.contains("the job is still running"), "{running}");
    assert!(!running.contains("was killed"), "{running}");
    // `run` killed outright: no end record, and no one writing.
    // SAFETY: kill(2) on the run we started.
    unsafe { libc::kill(probe.pid as i32, libc::SIGKILL) };
    drop(probe);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = report();
        if t.contains("vramtrace was killed") {
            assert!(
                !t.contains("the job is still running (vramtrace run"),
                "{t}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{t}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
