//! The shim as it ships is built for glibc 2.17 (scripts/build-compat-shim.sh, run by scripts/test.sh, which
//! names it in VRAMTRACE_COMPAT_SHIM): it must need no symbol version newer than that, nor any libc function
//! left unversioned (a function missing from an old glibc fails the load), and it must work.

use std::path::PathBuf;
use std::process::Command;

use vramtrace_e2e::traced::assert_trace_matches_log;
use vramtrace_e2e::*;

const BASELINE: (u32, u32) = (2, 17);

fn compat_shim() -> Option<PathBuf> {
    match std::env::var_os("VRAMTRACE_COMPAT_SHIM") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs scripts/test.sh, which must set VRAMTRACE_COMPAT_SHIM"
            );
            eprintln!(
                "SKIP: VRAMTRACE_COMPAT_SHIM unset (scripts/test.sh builds the glibc 2.17 shim)"
            );
            None
        }
    }
}

#[test]
fn the_shipped_shim_needs_nothing_newer_than_glibc_2_17() {
    let Some(so) = compat_shim() else { return };
    let out = Command::new("objdump")
        .arg("-T")
        .arg(&so)
        .output()
        .expect("objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut newest = (0, 0);
    for v in text.split("GLIBC_").skip(1) {
        let ver: String = v
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut it = ver.split('.').filter_map(|x| x.parse::<u32>().ok());
        let vv = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        newest = newest.max(vv);
    }
    assert!(
        newest > (2, 0),
        "no GLIBC versions read from {}",
        so.display()
    );
    assert!(newest <= BASELINE, "needs GLIBC_{}.{}", newest.0, newest.1);
    // Undefined, unversioned, not weak: a function that an old glibc lacks fails the load (gettid did).
    let unversioned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("*UND*") && !l.contains("GLIBC_") && !l.contains(" w "))
        .filter(|l| !l.contains("__gmon_start__"))
        .collect();
    assert!(
        unversioned.is_empty(),
        "unversioned undefined symbols: {unversioned:#?}"
    );
}

#[test]
fn the_shipped_shim_records_what_the_driver_saw() {
    let Some(so) = compat_shim() else { return };
    let fc = FakeCuda::new();
    let trace = fc.dir().join("compat.vtrace");
    let mut c = fc.command(vramtrace_e2e::traced::vramtrace());
    c.env("VRAMTRACE_SHIM", &so)
        .args(["run", "--out"])
        .arg(&trace)
        .arg("--")
        .arg(program("door_runtime"));
    let r = wait_with_timeout(
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        std::time::Duration::from_secs(120),
        "door_runtime under the compat shim",
    );
    r.assert_success("door_runtime under the compat shim");
    assert!(r.stdout.contains("PASS"), "{}", r.stdout);
    let t = vramtrace_e2e::traced::read_trace(&trace);
    assert_eq!(t.pids().len(), 1);
    let pid = t.pids()[0];
    let log: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
    let n = assert_trace_matches_log(&log, &t.events[&pid], t.ooms.len());
    assert!(n > 0);
}
