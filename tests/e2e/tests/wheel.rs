//! The wheel as it ships (`pip install vramtrace`): scripts/build-wheel.sh builds it and scripts/test.sh names it
//! in VRAMTRACE_WHEEL. Installed into a fresh virtual environment (offline: `--no-index`), it must put
//! `vramtrace` on the environment's PATH with its shim beside it; `vramtrace demo` must run from it, and a Python
//! program run under it must be traced exactly as the driver saw it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use vramtrace_e2e::traced::assert_trace_matches_log;
use vramtrace_e2e::*;

fn wheel() -> Option<PathBuf> {
    match std::env::var_os("VRAMTRACE_WHEEL") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs scripts/test.sh, which must set VRAMTRACE_WHEEL"
            );
            eprintln!("SKIP: VRAMTRACE_WHEEL unset (scripts/test.sh builds the wheel)");
            None
        }
    }
}

fn ok(c: &mut Command, what: &str) -> String {
    let o = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        o.status.success(),
        "{what}: {}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh virtual environment with the wheel installed, offline.
fn install(whl: &Path, dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    ok(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    ok(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--no-index", "--no-deps", "-q"])
            .arg(whl),
        "pip install the wheel",
    );
    venv
}

#[test]
fn the_wheel_installs_vramtrace_on_the_path_with_its_shim() {
    let Some(whl) = wheel() else { return };
    let name = whl.file_name().unwrap().to_string_lossy().into_owned();
    // Both names of the glibc 2.17 baseline, in whichever order maturin writes them.
    let platforms: Vec<&str> = name
        .strip_suffix(".whl")
        .and_then(|n| n.strip_prefix("vramtrace-"))
        .and_then(|n| n.split('-').nth(3))
        .map_or(Vec::new(), |p| p.split('.').collect());
    assert!(name.contains("-py3-none-"), "{name}");
    for tag in ["manylinux_2_17_x86_64", "manylinux2014_x86_64"] {
        assert!(platforms.contains(&tag), "{name}: not tagged {tag}");
    }
    let fc = FakeCuda::new();
    let venv = install(&whl, fc.dir());
    let bin = venv.join("bin/vramtrace");
    for f in ["libvramtrace.so", "libfakecuda.so", "vramtrace-workload"] {
        assert!(
            venv.join("lib/vramtrace").join(f).is_file(),
            "{f} is not in the environment"
        );
    }
    // On the environment's PATH, as an activated environment has it.
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let which = ok(
        Command::new("sh")
            .args(["-c", "command -v vramtrace"])
            .env("PATH", &path),
        "command -v vramtrace",
    );
    assert_eq!(which.trim(), bin.to_str().unwrap());

    // The README's first command, from the wheel alone: the bundled workload on the simulated driver.
    let demo_trace = fc.dir().join("demo.vtrace");
    let out = ok(
        Command::new(&bin)
            .args(["demo", "--simulated", "--steps", "3", "--out"])
            .arg(&demo_trace)
            .env_remove("VRAMTRACE_SHIM")
            .env_remove("LD_PRELOAD"),
        "vramtrace demo from the wheel",
    );
    assert!(out.contains("peak"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(
        Command::new(&bin)
            .args(["report", "--json"])
            .arg(&demo_trace),
        "report the demo",
    ))
    .unwrap();
    assert!(json["events"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["dropped_events"].as_u64(), Some(0));
}

#[test]
fn a_python_program_under_the_wheels_vramtrace_is_traced_as_the_driver_saw_it() {
    let Some(whl) = wheel() else { return };
    let fc = FakeCuda::new();
    let venv = install(&whl, fc.dir());
    let trace = fc.dir().join("py.vtrace");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/alloc_frames.py");
    let mut c = fc.command(venv.join("bin/vramtrace"));
    c.env_remove("VRAMTRACE_SHIM")
        .args(["run", "--out"])
        .arg(&trace)
        .arg("--")
        .arg(venv.join("bin/python"))
        .arg(&script);
    let r = wait_with_timeout(
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(120),
        "alloc_frames.py under the wheel's vramtrace",
    );
    r.assert_success("alloc_frames.py under the wheel's vramtrace");
    assert!(r.stdout.contains("ok"), "{}", r.stdout);
    // The shim that traced it is the wheel's.
    let t = vramtrace_e2e::traced::read_trace(&trace);
    assert_eq!(t.pids().len(), 1);
    let pid = t.pids()[0];
    let log: Vec<LogLine> = fc.log().into_iter().filter(|l| l.pid == pid).collect();
    let n = assert_trace_matches_log(&log, &t.events[&pid], t.ooms.len());
    assert!(n >= 4, "{n} calls compared");
    let json: serde_json::Value = serde_json::from_str(&ok(
        Command::new(venv.join("bin/vramtrace"))
            .args(["report", "--json"])
            .arg(&trace),
        "report",
    ))
    .unwrap();
    // 64 MiB, then 16 MiB from a thread, both live at once; the 1 TiB request refused.
    let dev = &json["devices"][0];
    assert_eq!(dev["peak_bytes"].as_u64(), Some(80 << 20), "{dev}");
    assert_eq!(dev["allocations"].as_u64(), Some(2), "{dev}");
    // Its Python frames too: the call site names the script's line.
    let sites = json["call_sites"].to_string();
    assert!(sites.contains("alloc_frames.py"), "{sites}");
}

#[test]
fn the_wheel_carries_the_python_package_of_the_binarys_version() {
    let Some(whl) = wheel() else { return };
    let fc = FakeCuda::new();
    let venv = install(&whl, fc.dir());
    let version = ok(
        Command::new(venv.join("bin/vramtrace")).arg("--version"),
        "vramtrace --version",
    );
    // Untraced, with the stand-in torch: the walk is the wheel's own copy of the bridge's.
    let site = vramtrace_e2e::fake_torch(&fc);
    let out = ok(
        Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import torch, vramtrace, vramtrace_bridge\n\
                 kept = [torch.empty_cuda(1 << 20)]\n\
                 h = vramtrace.holders()\n\
                 print(vramtrace.__version__, vramtrace.binary(), vramtrace.trace_path())\n\
                 print([(x.name, x.bytes) for x in h])\n\
                 print(vramtrace_bridge.__file__)",
            ])
            .env("PYTHONPATH", &site)
            .env("FAKETORCH_TOTAL", (1u64 << 30).to_string())
            .env_remove("VRAMTRACE_TRACE")
            .env_remove("VRAMTRACE_BIN"),
        "import vramtrace from the wheel",
    );
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "{} {} None",
            version.trim().trim_start_matches("vramtrace "),
            venv.join("bin/vramtrace").display()
        )
    );
    // 1 MiB in a segment of 2 (PyTorch's small pool): the rest is the cache's.
    assert_eq!(
        lines.next().unwrap(),
        "[('kept', 1048576), (\"PyTorch's cache (reserved but free)\", 1048576)]",
        "{out}"
    );
    assert!(
        lines.next().unwrap().starts_with(venv.to_str().unwrap()),
        "{out}"
    );
    assert!(venv
        .join("lib")
        .read_dir()
        .unwrap()
        .flatten()
        .any(|py| py.path().join("site-packages/vramtrace/py.typed").is_file()));
}
