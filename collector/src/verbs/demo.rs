//! `vramtrace demo`: the README's first command. Runs the bundled workload (`vramtrace-workload`) under
//! `vramtrace run`, on the real driver where one answers with a device and on the simulated driver
//! (`libfakecuda.so`) otherwise, then prints the report of the trace.
//!
//! The pieces are looked up beside the `vramtrace` executable (a cargo `target/<profile>/` folder), else in
//! `../lib/vramtrace/` (an installed prefix, `scripts/install.sh`). Whether a real driver is here is asked of a
//! child (`vramtrace-workload --probe`), so this process never loads libcuda. The simulated driver is put in front
//! of the run's `LD_LIBRARY_PATH` as `libcuda.so.1` (and `libcuda.so`) symlinks in a private temporary folder.
//! That folder, with the trace unless `--out` put it elsewhere, is removed before the demo ends: a demo leaves
//! nothing behind. The workload's own counters (`workload: ...`) show only with `--verbose`.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::exit::{fail, Code, FAILURE, OK, USAGE};

const WORKLOAD: &str = "vramtrace-workload";
const FAKE_DRIVER: &str = "libfakecuda.so";
/// The probe initialises the driver; on a busy machine that can take seconds, never this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Where to write the trace, kept (default: a temporary file, removed once the report is printed).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replace the file at --out if it exists (never one that is another user's).
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Use the simulated driver even where a real GPU is present.
    #[arg(long)]
    pub simulated: bool,
    /// Training steps of the workload (its default: 20).
    #[arg(long, value_name = "N")]
    pub steps: Option<u32>,
    /// Also the workload's own lines (its sizes and counts, `workload: ...`).
    #[arg(long)]
    pub verbose: bool,
}

/// Which driver the run uses.
enum Driver {
    Real { devices: String },
    Simulated { why: String },
}

pub fn main(args: DemoArgs) -> Code {
    // Refused before the workload runs, not reported after it as the workload's failure.
    if let Some(out) = &args.out {
        if let Err(e) = crate::files::out_file::check_dest(out, args.force) {
            return fail(USAGE, format!("demo: {e}"));
        }
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return fail(
                FAILURE,
                format!("demo: cannot find the vramtrace executable: {e}"),
            )
        }
    };
    let Some(workload) = find_piece(&exe, WORKLOAD) else {
        return fail(
            USAGE,
            format!("{WORKLOAD} not found beside vramtrace: build with `cargo build --release`"),
        );
    };

    let driver = if args.simulated {
        Driver::Simulated {
            why: "--simulated".into(),
        }
    } else {
        probe(&workload)
    };

    // One private folder: the default trace, and the simulated driver's symlinks; removed at the end, trace and
    // all, unless the trace went elsewhere (`--out`).
    let tmp = match private_temp_dir() {
        Ok(d) => d,
        Err(e) => {
            return fail(
                FAILURE,
                format!("demo: cannot create a temporary folder: {e}"),
            )
        }
    };
    let out = args.out.clone().unwrap_or_else(|| tmp.join("demo.vtrace"));
    let (workload_args, lib_dir) = match driver_setup(&args, &driver, &exe, &tmp) {
        Ok(set) => set,
        Err(code) => return code,
    };
    if args.out.is_some() {
        crate::say!("vramtrace demo: trace: {}", out.display());
    }

    let ran = run_traced(
        &args,
        &exe,
        &out,
        &workload,
        &workload_args,
        lib_dir.as_deref(),
    );
    // The run's children have exited: the symlinks are no longer needed.
    if let Some(dir) = &lib_dir {
        let _ = fs::remove_dir_all(dir);
    }
    if args.out.is_some() {
        let _ = fs::remove_dir(&tmp); // empty unless the trace went there
    }
    let run_ok = match ran {
        Ok(status) if status.success() => true,
        Ok(status) => {
            crate::note!(
                "vramtrace: demo: the traced workload failed ({})",
                describe(status)
            );
            false
        }
        Err(e) => return fail(FAILURE, format!("demo: cannot start `vramtrace run`: {e}")),
    };
    if !out.is_file() {
        if args.out.is_none() {
            let _ = fs::remove_dir_all(&tmp);
        }
        return fail(
            FAILURE,
            format!("demo: no trace was written to {}", out.display()),
        );
    }
    if let Err(code) = report(&args, &exe, &out, &tmp) {
        return code;
    }
    if run_ok {
        OK
    } else {
        FAILURE
    }
}

/// What the driver found asks of the run, said as it is chosen: the workload's arguments, and for the simulated
/// driver the folder of its `libcuda` symlinks (made in `tmp`), to put first on the run's LD_LIBRARY_PATH. On
/// failure the demo's exit code, its temporary folder removed.
fn driver_setup(
    args: &DemoArgs,
    driver: &Driver,
    exe: &Path,
    tmp: &Path,
) -> Result<(Vec<OsString>, Option<PathBuf>), Code> {
    let mut workload_args: Vec<OsString> = Vec::new();
    let mut lib_dir = None;
    match driver {
        Driver::Real { devices } => {
            crate::say!("vramtrace demo: driver: the real NVIDIA driver (libcuda.so.1, {devices} device(s))");
        }
        Driver::Simulated { why } => {
            let Some(fake) = find_piece(exe, FAKE_DRIVER) else {
                let _ = fs::remove_dir_all(tmp);
                return Err(fail(
                    USAGE,
                    format!("{FAKE_DRIVER} not found beside vramtrace: build with `cargo build --release`"),
                ));
            };
            let dir = tmp.join("driver");
            if let Err(e) = simulated_driver_dir(&fake, &dir) {
                let _ = fs::remove_dir_all(tmp);
                return Err(fail(
                    FAILURE,
                    format!(
                        "demo: cannot set up the simulated driver in {}: {e}",
                        dir.display()
                    ),
                ));
            }
            crate::say!(
                "vramtrace demo: driver: simulated ({}; {why}), small sizes",
                fake.display()
            );
            workload_args.push("--small".into());
            lib_dir = Some(dir);
        }
    }
    if !args.verbose {
        workload_args.push("--quiet".into());
    }
    if let Some(n) = args.steps {
        workload_args.push("--steps".into());
        workload_args.push(n.to_string().into());
    }
    Ok((workload_args, lib_dir))
}

/// `vramtrace run` of the workload into `out`, waited for; the simulated driver's folder (`lib_dir`) first on
/// its LD_LIBRARY_PATH.
fn run_traced(
    args: &DemoArgs,
    exe: &Path,
    out: &Path,
    workload: &Path,
    workload_args: &[OsString],
    lib_dir: Option<&Path>,
) -> io::Result<ExitStatus> {
    let mut run = Command::new(exe);
    run.arg("run").arg("--out").arg(out);
    if args.force {
        run.arg("--force");
    }
    run.arg("--").arg(workload).args(workload_args);
    if let Some(dir) = lib_dir {
        let mut path = OsString::from(dir.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(old);
        }
        run.env("LD_LIBRARY_PATH", path);
    }
    run.status()
}

/// Prints the trace's report (`vramtrace report`), then what became of the trace; the temporary folder goes
/// once the report is printed, unless the trace went elsewhere (`--out`). On failure the demo's exit code.
fn report(args: &DemoArgs, exe: &Path, out: &Path, tmp: &Path) -> Result<(), Code> {
    crate::say!();
    let reported = Command::new(exe).arg("report").arg(out).status();
    if args.out.is_none() {
        let _ = fs::remove_dir_all(tmp);
    }
    match reported {
        Ok(status) if status.success() => {}
        Ok(status) => {
            return Err(fail(
                FAILURE,
                format!("demo: `vramtrace report` failed ({})", describe(status)),
            ))
        }
        Err(e) => {
            return Err(fail(
                FAILURE,
                format!("demo: cannot start `vramtrace report`: {e}"),
            ))
        }
    };
    crate::say!();
    if args.out.is_some() {
        crate::say!(
            "vramtrace demo: the trace stays at {} (`vramtrace report --json` reads it too)",
            out.display()
        );
    } else {
        crate::say!(
            "vramtrace demo: the trace was temporary and is gone; `vramtrace demo --out FILE` keeps it \
             (then `vramtrace report FILE`, `vramtrace export FILE --format html --out PAGE`)"
        );
    }
    Ok(())
}

/// `name` beside the executable, else in `../lib/vramtrace/` from its folder.
fn find_piece(exe: &Path, name: &str) -> Option<PathBuf> {
    // Resolve a symlinked `vramtrace` (e.g. ~/bin/vramtrace -> prefix/bin/vramtrace) to its real folder.
    let real = fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let mut dirs = Vec::new();
    for e in [exe, real.as_path()] {
        if let Some(d) = e.parent() {
            dirs.push(d.to_path_buf());
            dirs.push(d.join("../lib/vramtrace"));
        }
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .map(|p| fs::canonicalize(&p).unwrap_or(p))
}

/// Asks `vramtrace-workload --probe` whether the real driver loads and reports a device.
fn probe(workload: &Path) -> Driver {
    let child = Command::new(workload)
        .arg("--probe")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return Driver::Simulated {
                why: format!("cannot run the driver probe: {e}"),
            }
        }
    };
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Driver::Simulated {
                    why: "the real driver did not answer within 60 s".into(),
                };
            }
        }
    };
    let output = child.wait_with_output().ok();
    let text = |f: fn(&std::process::Output) -> &Vec<u8>| {
        output
            .as_ref()
            .map(|o| String::from_utf8_lossy(f(o)).into_owned())
            .unwrap_or_default()
    };
    if status.success() {
        // "probe: driver=libcuda.so.1 devices=N"
        let stdout = text(|o| &o.stdout);
        let devices = stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix("devices="))
            .unwrap_or("some")
            .to_string();
        Driver::Real { devices }
    } else {
        let stderr = text(|o| &o.stderr);
        let why = stderr
            .lines()
            .next()
            .map(|l| {
                l.trim_start_matches("vramtrace-workload: ")
                    .trim_start_matches("probe: ")
                    .to_string()
            })
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| format!("the driver probe failed ({})", describe(status)));
        Driver::Simulated { why }
    }
}

/// `dir/libcuda.so.1` and `dir/libcuda.so`, both symlinks to the simulated driver (cudarc tries `libcuda.so`
/// first, the runtime and most programs `libcuda.so.1`).
fn simulated_driver_dir(fake: &Path, dir: &Path) -> io::Result<()> {
    let fake = fs::canonicalize(fake)?;
    fs::DirBuilder::new().mode(0o700).create(dir)?;
    symlink(&fake, dir.join("libcuda.so.1"))?;
    symlink(&fake, dir.join("libcuda.so"))?;
    Ok(())
}

/// A new folder only this user can read, under the system's temporary folder.
fn private_temp_dir() -> io::Result<PathBuf> {
    let base = std::env::temp_dir();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for attempt in 0..100u32 {
        let dir = base.join(format!(
            "vramtrace-demo-{}-{nanos:x}{attempt}",
            std::process::id()
        ));
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free name"))
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    }
}
