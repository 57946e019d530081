//! A second user on the node, as an attacker would be: it can read /proc/net/unix and learn where a job's
//! socket is, and it can race the collector's checks with processes that connect and vanish. It reaches
//! nothing of another user's job, and none of what it sends gets into a job's trace.

use std::process::Stdio;
use std::time::{Duration, Instant};

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::*;

/// A directory every user may write (the job's user is not root here).
fn open_dir(name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = std::env::temp_dir().join(format!("vramtrace-2u-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

#[test]
fn another_user_finds_a_jobs_socket_and_reaches_nothing() {
    if !can_drop_privileges() {
        return;
    }
    let fc = FakeCuda::new();
    let dir = open_dir("reach");
    let trace = dir.join("t.vtrace");
    // The job's user: 65533, with a cap (so a ledger exists).
    let mut job = fc.as_user(65533, vramtrace());
    job.args(["run", "--cap", "1GiB", "--python-agent", "off", "--out"])
        .arg(&trace)
        .args(["--", "sleep", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut running = job.spawn().unwrap();
    // The other user: 65534, until it sees the socket.
    let start = Instant::now();
    let said = loop {
        let out = fc
            .as_user(65534, program("forger"))
            .args(["attack", "65533"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !said.starts_with("found 0") || start.elapsed() > Duration::from_secs(10) {
            break said;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let status = running.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success());
    assert!(
        !said.starts_with("found 0"),
        "the socket was never seen: {said}"
    );
    assert!(
        said.ends_with("connected 0 listed 0 opened 0"),
        "another user reached the job: {said}"
    );
}

#[test]
fn processes_of_another_user_that_vanish_at_once_are_turned_away_whatever_their_hello_claims() {
    // Run as root (its job's processes may drop privileges, so its socket is open to all): another user's
    // processes connect, say hello naming the collector as their parent, send 6 GiB and exit at once; with the
    // acceptor held back they are gone before the kernel can be asked where they came from. Without the job's
    // token none is taken.
    if !can_drop_privileges() {
        return;
    }
    let fc = FakeCuda::new();
    let probe = program("probe");
    let sock_file = fc.dir().join("socket-name");
    let path = fc.dir().join("dash.vtrace");
    let script = format!(
        "{p} 'alloc 1048576' >/dev/null; echo \"$VRAMTRACE_SOCKET\" > {f}; sleep 3",
        p = probe.display(),
        f = sock_file.display()
    );
    let running = fc
        .command(vramtrace())
        .env("VRAMTRACE_TEST_ACCEPT_DELAY_MS", "300")
        .args(["run", "--python-agent", "off", "--out"])
        .arg(&path)
        .args(["--", "bash", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let collector = running.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let socket = loop {
        let s = std::fs::read_to_string(&sock_file).unwrap_or_default();
        if !s.trim().is_empty() || Instant::now() > deadline {
            break s.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!socket.is_empty());
    let dashed = fc
        .as_user(65534, program("forger"))
        .args(["dash", &collector.to_string(), "40"])
        .env("VRAMTRACE_SOCKET", &socket)
        .output()
        .unwrap();
    let run = running.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let dashed: Vec<u32> = String::from_utf8_lossy(&dashed.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(dashed.len(), 40);
    let a = vramtrace_collector::whatif::trace_file::analyze(&path).unwrap();
    assert!(
        a.processes.iter().all(|p| !dashed.contains(&p.pid)),
        "{:?}",
        a.processes.iter().map(|p| p.pid).collect::<Vec<_>>()
    );
    assert_eq!(
        a.devices[0].peak_bytes,
        1 << 20,
        "another user's bytes got in"
    );
    assert!(
        stderr.contains("(uid 65534): not a process of this job"),
        "{stderr}"
    );
}
