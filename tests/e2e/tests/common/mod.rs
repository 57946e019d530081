//! What the tests of `vramtrace run --metrics` and `vramtrace top` share: a job held alive by `probe`.

use std::path::Path;
use std::time::{Duration, Instant};

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::{program, FakeCuda, Probe};

/// The job's metrics address, from the attach file `vramtrace run` writes in `$XDG_RUNTIME_DIR/vramtrace`.
pub fn attach_addr(runtime: &Path, pid: u32) -> String {
    let f = runtime.join("vramtrace").join(format!("{pid}.addr"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(t) = std::fs::read_to_string(&f) {
            if let Some(a) = t.lines().find_map(|l| l.strip_prefix("addr=")) {
                return a.to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no attach file {} from vramtrace run --metrics",
            f.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `vramtrace run -q ARGS --out <dir>/m.vtrace -- probe`, with `XDG_RUNTIME_DIR` at `<dir>/run`: the probe and
/// the job's metrics address.
pub fn start_job(fake: &FakeCuda, args: &[&str]) -> (Probe, String) {
    let runtime = fake.dir().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let mut c = fake.command(vramtrace());
    c.env("XDG_RUNTIME_DIR", &runtime)
        .args(["run", "-q"])
        .args(args)
        .arg("--out")
        .arg(fake.dir().join("m.vtrace"))
        .arg("--")
        .arg(program("probe"));
    let probe = Probe::start(c);
    let addr = attach_addr(&runtime, probe.pid);
    (probe, addr)
}
