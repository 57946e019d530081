//! Test harness: finds the built artifacts and runs programs against the simulated driver.
//!
//! - [`program`], [`fakecuda_lib`], [`target_dir`]: built artifacts (`cargo build --workspace` first).
//! - [`fake_lib_dir`]: a private directory with `libcuda.so.1` and `libcuda.so` -> `libfakecuda.so`, and
//!   `libnvidia-ml.so.1` and `libnvidia-ml.so` -> `libfakenvml.so` (the simulated NVML, tests/fakenvml).
//! - [`door_linked`]: `tests/programs/c/door_linked.c` compiled with `cc -lcuda` (once per test process).
//! - [`FakeCuda`]: an environment for running programs on the fake (its own temp dir, driver log,
//!   optional shared device state, extra variables such as `LD_PRELOAD`), and reading back what the driver
//!   saw: [`FakeCuda::log`] (the driver's own call log) and [`FakeCuda::state`] (its device counters).
//! - [`Probe`]: a `probe` process driven line by line.
//!
//! Only std and libc.

pub mod fuzz;
pub mod traced;

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Path of the driver log (one line per memory call; see [`LogLine`]).
pub const ENV_LOG: &str = "FAKECUDA_LOG";
/// Path of the device accounting shared between processes (see [`read_state`]).
pub const ENV_STATE: &str = "FAKECUDA_STATE";
/// Number of simulated devices (default 2, at most 16).
pub const ENV_DEVICES: &str = "FAKECUDA_DEVICES";
/// Size of each device in bytes (default 16 GiB; `K`/`M`/`G`/`T` suffixes and comma lists accepted).
pub const ENV_DEVICE_BYTES: &str = "FAKECUDA_DEVICE_BYTES";
/// The largest single physical allocation that can succeed (fragmentation).
pub const ENV_LARGEST_FREE: &str = "FAKECUDA_LARGEST_FREE";
/// Allocations up to this size keep their contents host-side (default 64 MiB).
pub const ENV_SHADOW_MAX: &str = "FAKECUDA_SHADOW_MAX";

/// Default device size of the fake.
pub const DEFAULT_DEVICE_BYTES: u64 = 16 << 30;
pub const MIB: u64 = 1 << 20;

/// `target/<profile>`, from the test executable's location (`target/<profile>/deps/<test>-<hash>`).
pub fn target_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let mut dir = exe
            .parent()
            .expect("test executable has a directory")
            .to_path_buf();
        if dir.file_name() == Some(OsStr::new("deps")) {
            dir.pop();
        }
        dir
    })
    .clone()
}

/// A built artifact of the workspace in `target/<profile>`; panics clearly when it is missing.
pub fn artifact(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` first (same profile as the tests)",
        p.display()
    );
    p
}

/// `target/<profile>/libfakecuda.so`.
pub fn fakecuda_lib() -> PathBuf {
    artifact("libfakecuda.so")
}

/// `target/<profile>/libfakenvml.so`.
pub fn fakenvml_lib() -> PathBuf {
    artifact("libfakenvml.so")
}

/// A test program of `tests/programs` (`door_dlsym`, `door_runtime`, `hammer`, `probe`).
pub fn program(name: &str) -> PathBuf {
    artifact(name)
}

/// This test process's scratch directory (`$TMPDIR/vramtrace-e2e-<pid>`); those of dead processes are
/// removed on first use.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name
                    .strip_prefix("vramtrace-e2e-")
                    .and_then(|p| p.parse::<i32>().ok())
                {
                    if !pid_alive(pid) {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let dir = tmp.join(format!("vramtrace-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        dir
    })
}

/// Whether a process exists (a zombie counts).
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe {
        libc::kill(pid, 0) == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

/// A directory removed when dropped (kept if `VRAMTRACE_KEEP_TMP` is set).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = scratch_dir().join(format!("{prefix}-{n}"));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("VRAMTRACE_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A private directory holding `libcuda.so.1` and `libcuda.so`, symlinks to `libfakecuda.so`, and
/// `libnvidia-ml.so.1` and `libnvidia-ml.so`, symlinks to `libfakenvml.so`: put it first on `LD_LIBRARY_PATH`
/// (what [`FakeCuda`] does).
pub fn fake_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = fakecuda_lib();
        let dir = scratch_dir().join("lib");
        std::fs::create_dir_all(&dir).expect("create lib dir");
        for name in ["libcuda.so.1", "libcuda.so"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).expect("symlink libcuda");
        }
        let nvml = fakenvml_lib();
        for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&nvml, &link).expect("symlink libnvidia-ml");
        }
        dir
    })
}

/// Compiles the C program `src` into `out` with `cc`, linked against the fakes' directory (`-L`), with `flags`
/// before the sources and `libs` after them. Panics with cc's message if it fails.
pub fn compile_c(src: &Path, out: &Path, flags: &[&str], libs: &[&str]) {
    let r = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .arg("-L")
        .arg(fake_lib_dir())
        .args(libs)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc to build {}: {e}", src.display()));
    assert!(
        r.status.success(),
        "cc failed to build {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&r.stderr)
    );
}

/// `tests/programs/c/<name>.c`, compiled with `cc ... -lcuda -lpthread` against the fake (once per process).
pub fn c_program(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../programs/c/{name}.c"));
    let out = scratch_dir().join(name);
    compile_c(
        &src,
        &out,
        &["-O1", "-Wall"],
        &["-lcuda", "-lpthread", "-ldl"],
    );
    built.push((name.to_string(), out.clone()));
    out
}

/// `tests/programs/c/door_linked.c` (door 3: the exported names through the PLT).
pub fn door_linked() -> PathBuf {
    c_program("door_linked")
}

/// One line of the driver log: `<pid> <tid> <function> <result> <addr-hex> <size> <aux-hex>`.
/// What addr/size/aux hold per function is documented in `tests/fakecuda/src/log.rs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub pid: u32,
    pub tid: u32,
    pub func: String,
    pub rc: u32,
    pub addr: u64,
    pub size: u64,
    pub aux: u64,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// Parses a driver log; panics on a malformed line.
pub fn parse_log(text: &str) -> Vec<LogLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let parsed = (|| {
                if w.len() != 7 {
                    return None;
                }
                Some(LogLine {
                    pid: w[0].parse().ok()?,
                    tid: w[1].parse().ok()?,
                    func: w[2].to_string(),
                    rc: w[3].parse().ok()?,
                    addr: hex(w[4])?,
                    size: w[5].parse().ok()?,
                    aux: hex(w[6])?,
                })
            })();
            parsed.unwrap_or_else(|| panic!("malformed driver log line: {l:?}"))
        })
        .collect()
}

/// Reads and parses a driver log (missing file: no lines).
pub fn read_log(path: &Path) -> Vec<LogLine> {
    match std::fs::read_to_string(path) {
        Ok(t) => parse_log(&t),
        Err(_) => Vec::new(),
    }
}

/// One device's counters in the shared state: bytes in use now and the highest value ever reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DevCounters {
    pub used: u64,
    pub peak: u64,
}

/// Reads a `FAKECUDA_STATE` file (layout in `tests/fakecuda/src/state.rs`): the counters of each device
/// (as many as the first process configured). Missing or empty file: no devices.
pub fn read_state(path: &Path) -> Vec<DevCounters> {
    let Ok(b) = std::fs::read(path) else {
        return Vec::new();
    };
    let word = |i: usize| -> u64 {
        b.get(i * 8..i * 8 + 8)
            .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
    };
    if b.len() < 320 || word(0) == 0 {
        return Vec::new();
    }
    assert_eq!(
        word(0),
        u64::from_le_bytes(*b"FAKECUDA"),
        "{} is not a fakecuda state file",
        path.display()
    );
    let n = (word(2) as usize).clamp(1, 16);
    (0..n)
        .map(|d| DevCounters {
            used: word(8 + 2 * d),
            peak: word(9 + 2 * d),
        })
        .collect()
}

/// What a finished program did.
#[derive(Debug)]
pub struct RunResult {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl RunResult {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the program's output unless it exited 0.
    pub fn assert_success(&self, what: &str) -> &Self {
        assert!(
            self.success(),
            "{what} failed ({}):\n--- stdout\n{}--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless the program's stderr (for vramtrace, its summary) says `text`.
    pub fn says(&self, text: &str) -> &Self {
        assert!(
            self.stderr.contains(text),
            "missing {text:?} in:\n{}",
            self.stderr
        );
        self
    }

    /// Panics if the program's stderr says `text`.
    pub fn never_says(&self, text: &str) -> &Self {
        assert!(!self.stderr.contains(text), "{text:?} in:\n{}", self.stderr);
        self
    }
}

/// Waits for a child with output piped, killing it after `timeout`.
pub fn wait_with_timeout(mut child: Child, timeout: Duration, what: &str) -> RunResult {
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let mut b = Vec::new();
                let _ = r.read_to_end(&mut b);
                s = String::from_utf8_lossy(&b).into_owned();
            }
            s
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {timeout:?}\n--- stdout\n{}--- stderr\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    RunResult {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// An environment for running programs on the simulated driver: a temp dir, the driver log
/// (`FAKECUDA_LOG`, always on), optionally a shared device state (`FAKECUDA_STATE`), and extra variables.
pub struct FakeCuda {
    dir: TempDir,
    log: PathBuf,
    state: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
}

impl Default for FakeCuda {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeCuda {
    /// Process-local device accounting, a fresh log, default devices (2 x 16 GiB).
    pub fn new() -> FakeCuda {
        let dir = TempDir::new("fake");
        let log = dir.path().join("driver.log");
        FakeCuda {
            dir,
            log,
            state: None,
            env: Vec::new(),
            timeout: Duration::from_secs(120),
        }
    }

    /// Devices shared by every process run from this environment (a state file in its temp dir).
    pub fn with_state(mut self) -> FakeCuda {
        self.state = Some(self.dir.path().join("devices.state"));
        self
    }

    /// Devices shared through this state file (e.g. another environment's [`FakeCuda::state_path`]).
    pub fn with_state_file(mut self, path: impl Into<PathBuf>) -> FakeCuda {
        self.state = Some(path.into());
        self
    }

    /// An extra environment variable for the programs (`LD_PRELOAD`, `FAKECUDA_DEVICE_BYTES`, ...).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> FakeCuda {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// How long [`FakeCuda::run`] waits before killing the program (default 120 s).
    pub fn timeout(mut self, t: Duration) -> FakeCuda {
        self.timeout = t;
        self
    }

    /// This environment's temp dir (removed with it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn state_path(&self) -> Option<&Path> {
        self.state.as_deref()
    }

    /// A command for `program` with the environment set: `LD_LIBRARY_PATH` led by [`fake_lib_dir`],
    /// `FAKECUDA_LOG`, `FAKECUDA_STATE` if any, the extra variables; inherited `FAKECUDA_*`, `FAKENVML_*`
    /// and `LD_PRELOAD` are removed first.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        for (k, _) in std::env::vars_os() {
            let k_s = k.to_string_lossy();
            if k_s.starts_with("FAKECUDA_") || k_s.starts_with("FAKENVML_") {
                c.env_remove(&k);
            }
        }
        c.env_remove("LD_PRELOAD");
        let mut ld = OsString::from(fake_lib_dir());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld.push(":");
            ld.push(old);
        }
        c.env("LD_LIBRARY_PATH", ld);
        c.env(ENV_LOG, &self.log);
        if let Some(s) = &self.state {
            c.env(ENV_STATE, s);
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs `program args...` to the end (stdin closed), with a timeout.
    pub fn run<S: AsRef<OsStr>>(&self, program: impl AsRef<OsStr>, args: &[S]) -> RunResult {
        let what = format!("{}", Path::new(program.as_ref()).display());
        let child = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        wait_with_timeout(child, self.timeout, &what)
    }

    /// Starts a [`Probe`] in this environment.
    pub fn probe(&self) -> Probe {
        Probe::start(self.command(program("probe")))
    }

    /// The driver log so far.
    pub fn log(&self) -> Vec<LogLine> {
        read_log(&self.log)
    }

    /// The shared device counters (panics without [`FakeCuda::with_state`]).
    pub fn state(&self) -> Vec<DevCounters> {
        read_state(
            self.state
                .as_deref()
                .expect("this FakeCuda has no shared state"),
        )
    }
}

/// A `probe` process (see `tests/programs/src/bin/probe.rs`) answering one command per line.
pub struct Probe {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub pid: u32,
}

impl Probe {
    /// Starts `probe` from a prepared command and waits for its `ready` line.
    pub fn start(mut cmd: Command) -> Probe {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start probe");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let pid = child.id();
        let mut p = Probe {
            child,
            stdin,
            stdout,
            pid,
        };
        let ready = p.read_line();
        assert!(ready.starts_with("ready"), "probe did not start: {ready:?}");
        p
    }

    fn read_line(&mut self) -> String {
        let mut s = String::new();
        let n = self.stdout.read_line(&mut s).expect("read probe output");
        assert!(n > 0, "probe {} ended unexpectedly", self.pid);
        s.trim_end().to_string()
    }

    /// Sends one command, returns its answer line.
    pub fn cmd(&mut self, line: &str) -> String {
        let w = self.stdin.as_mut().expect("probe stdin closed");
        writeln!(w, "{line}").expect("write to probe");
        w.flush().expect("flush probe");
        self.read_line()
    }

    /// Sends a command answered `<rc> <value>`; returns both.
    pub fn cmd2(&mut self, line: &str) -> (u32, u64) {
        let a = self.cmd(line);
        let w: Vec<&str> = a.split_whitespace().collect();
        let num = |s: &str| {
            s.strip_prefix("0x")
                .map_or_else(|| s.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
        };
        match (
            w.first().and_then(|s| s.parse().ok()),
            w.get(1).and_then(|s| num(s)),
        ) {
            (Some(rc), Some(v)) => (rc, v),
            _ => panic!("probe answered {a:?} to {line:?}"),
        }
    }

    /// Closes stdin and waits for a normal exit.
    pub fn finish(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait for probe")
    }

    /// SIGKILL (no exit handlers run), then reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- The PATTERN (tests/programs/PATTERN.md) as the driver log shows it ----

/// (function, size) of one iteration of PATTERN steps 1-4, in log order; `None` size: checked apart.
pub const PATTERN_ITERATION: [(&str, Option<u64>); 22] = [
    ("cuMemAlloc_v2", Some(MIB)),
    ("cuMemAllocPitch_v2", Some(102_400)),
    ("cuMemAllocManaged", Some(2 * MIB)),
    ("cuMemAllocAsync", Some(3 * MIB)),
    ("cuMemAllocAsync_ptsz", Some(4 * MIB)),
    ("cuMemAllocFromPoolAsync", Some(5 * MIB)),
    ("cuMemAllocFromPoolAsync_ptsz", Some(6 * MIB)),
    ("cuMemCreate", Some(2 * MIB)),
    ("cuMemAddressReserve", Some(4 * MIB)),
    ("cuMemMap", Some(2 * MIB)),
    ("cuMemSetAccess", Some(2 * MIB)),
    ("cuMemGetInfo_v2", None),
    ("cuMemFree_v2", Some(MIB)),
    ("cuMemFree_v2", Some(102_400)),
    ("cuMemFree_v2", Some(2 * MIB)),
    ("cuMemFreeAsync", Some(3 * MIB)),
    ("cuMemFreeAsync", Some(5 * MIB)),
    ("cuMemFreeAsync_ptsz", Some(4 * MIB)),
    ("cuMemFreeAsync_ptsz", Some(6 * MIB)),
    ("cuMemUnmap", Some(2 * MIB)),
    ("cuMemAddressFree", Some(4 * MIB)),
    ("cuMemRelease", Some(2 * MIB)),
];

/// Device 0 bytes live at the cuMemGetInfo_v2 of step 3 (A, B, C, D, E, F, G; H is on device 1).
pub const PATTERN_LIVE_AT_INFO: u64 = 21 * MIB + 102_400;

fn show(lines: &[LogLine]) -> String {
    lines.iter().map(|l| format!("{l:?}\n")).collect()
}

/// Checks `repeat` iterations of steps 1-4 (one thread's lines); returns A of the last iteration.
/// `alone`: the only thread allocating, so it sees the exact free memory and gets its addresses back.
fn check_iterations(lines: &[LogLine], repeat: usize, alone: bool, device_bytes: u64) -> u64 {
    assert_eq!(
        lines.len(),
        repeat * PATTERN_ITERATION.len(),
        "iteration lines:\n{}",
        show(lines)
    );
    let mut first: Option<Vec<u64>> = None;
    let mut a_last = 0;
    for it in lines.chunks(PATTERN_ITERATION.len()) {
        for (l, (func, size)) in it.iter().zip(PATTERN_ITERATION) {
            assert_eq!(
                (l.func.as_str(), l.rc),
                (func, 0),
                "line {l:?}\n{}",
                show(it)
            );
            if let Some(size) = size {
                assert_eq!(l.size, size, "size of {l:?}");
            }
        }
        let [a, b, c, d, e, f, g, h, r] = [0, 1, 2, 3, 4, 5, 6, 7, 8].map(|i| it[i].addr);
        for (x, align) in [
            (a, 512),
            (b, 512),
            (c, 512),
            (d, 512),
            (e, 512),
            (f, 512),
            (g, 512),
            (r, 2 * MIB),
        ] {
            assert!(
                x != 0 && x % align == 0,
                "address {x:#x} not {align}-aligned\n{}",
                show(it)
            );
        }
        assert_eq!(it[1].aux, 1024, "pitch");
        assert_eq!(it[2].aux, 1, "managed flags");
        let stream = it[3].aux;
        assert_ne!(stream, 0, "created stream");
        for i in [3, 4, 5, 6, 15, 16, 17, 18] {
            assert_eq!(it[i].aux, stream, "stream of {:?}", it[i]);
        }
        assert_eq!(it[7].aux, 1, "cuMemCreate on device 1");
        assert_ne!(h, 0, "handle");
        assert_eq!((it[9].addr, it[9].aux), (r, h), "cuMemMap(R, H)");
        assert_eq!(it[10].addr, r, "cuMemSetAccess(R)");
        let info = &it[11];
        assert_eq!(
            (info.addr, info.aux),
            (device_bytes, 0),
            "cuMemGetInfo_v2 total/device"
        );
        if alone {
            assert_eq!(
                info.size,
                device_bytes - PATTERN_LIVE_AT_INFO,
                "cuMemGetInfo_v2 free"
            );
        } else {
            assert!(
                info.size <= device_bytes - PATTERN_LIVE_AT_INFO,
                "cuMemGetInfo_v2 free"
            );
        }
        let freed: Vec<u64> = (12..19).map(|i| it[i].addr).collect();
        assert_eq!(
            freed,
            vec![a, b, c, d, f, e, g],
            "frees in order A B C D F E G"
        );
        assert_eq!(
            [it[19].addr, it[20].addr, it[21].addr],
            [r, r, h],
            "unmap, address free, release"
        );
        // A freed address is reused by the next allocation of the same size.
        let reusable = vec![a, b, d, e, f, g, r];
        match &first {
            None => first = Some(reusable),
            Some(f0) if alone => {
                assert_eq!(&reusable, f0, "addresses of a later iteration (reuse)")
            }
            Some(_) => {}
        }
        a_last = a;
    }
    a_last
}

/// Checks steps 5-6 (four lines).
fn check_tail(lines: &[LogLine], a: u64, device_bytes: u64) {
    assert_eq!(lines.len(), 4, "tail:\n{}", show(lines));
    let got: Vec<(&str, u32, u64, u64)> = lines
        .iter()
        .map(|l| (l.func.as_str(), l.rc, l.addr, l.size))
        .collect();
    assert_eq!(
        got[..3],
        [
            ("cuMemAlloc_v2", 2, 0, device_bytes + MIB),
            ("cuMemFree_v2", 1, 0xdead_0000, 0),
            ("cuMemFree_v2", 1, a, 0),
        ],
        "steps 5: OOM, bogus free, double free"
    );
    assert_eq!(
        (got[3].0, got[3].1, got[3].3),
        ("cuMemAlloc_v2", 0, 7 * MIB),
        "step 6: the leak"
    );
    assert_ne!(got[3].2, 0);
}

/// Checks the driver log of one door-program run (`--repeat repeat --threads threads`): exactly the
/// PATTERN's calls, results, sizes, handles and addresses (freed addresses reused when single-threaded,
/// the exact free memory when single-threaded with process-local accounting), the OOM, the bad frees and
/// the leak. `log` must hold only that process's lines of the PATTERN's calls. Panics on a mismatch.
pub fn check_pattern_log(log: &[LogLine], repeat: usize, threads: usize, device_bytes: u64) {
    let pids: std::collections::BTreeSet<u32> = log.iter().map(|l| l.pid).collect();
    assert_eq!(pids.len(), 1, "one process");
    assert_eq!(
        log.len(),
        threads * repeat * PATTERN_ITERATION.len() + 4,
        "log:\n{}",
        show(log)
    );
    let (body, tail) = log.split_at(log.len() - 4);
    let a = if threads == 1 {
        check_iterations(body, repeat, true, device_bytes)
    } else {
        let mut by_tid: std::collections::BTreeMap<u32, Vec<LogLine>> = Default::default();
        for l in body {
            by_tid.entry(l.tid).or_default().push(l.clone());
        }
        assert_eq!(by_tid.len(), threads, "one tid per pattern thread");
        let last: Vec<u64> = by_tid
            .values()
            .map(|ls| check_iterations(ls, repeat, false, device_bytes))
            .collect();
        assert!(
            last.contains(&tail[2].addr),
            "double free of some thread's A"
        );
        tail[2].addr
    };
    check_tail(tail, a, device_bytes);
}

/// Whether this test can run a process as another user: root, with util-linux's `setpriv`. Without them the
/// test fails, so a security test never passes by not running: CI runs as root; `VRAMTRACE_ALLOW_NO_ROOT=1`
/// lets a developer's unprivileged run skip it (scripts/test.sh sets it when not root).
impl FakeCuda {
    /// `program` run as `uid` (its group too, no others), with no per-user runtime folder of ours: another
    /// local user, or the job's user when the test runs as root. Needs [`can_drop_privileges`].
    pub fn as_user(&self, uid: u32, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        let mut c = self.command("setpriv");
        c.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg("--clear-groups")
            .arg(program)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("TMPDIR");
        c
    }
}

pub fn can_drop_privileges() -> bool {
    // SAFETY: no arguments and no preconditions; it cannot fail.
    let why = if unsafe { libc::geteuid() } != 0 {
        "needs root to run a process as another user"
    } else if !std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        "needs util-linux's setpriv"
    } else {
        return true;
    };
    if std::env::var_os("VRAMTRACE_ALLOW_NO_ROOT").is_some() {
        eprintln!("skipped: {why} (VRAMTRACE_ALLOW_NO_ROOT)");
        return false;
    }
    panic!("{why}; VRAMTRACE_ALLOW_NO_ROOT=1 skips this test");
}

/// The stand-in torch of bridge/tests/faketorch under `<fake's dir>/site-packages/torch`, where PyTorch lives in
/// a real installation (so its frames are library frames, as PyTorch's are). Returns the directory to put on
/// PYTHONPATH.
pub fn fake_torch(fake: &FakeCuda) -> PathBuf {
    let site = fake.dir().join("site-packages");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bridge/tests/faketorch/torch");
    copy_py(&src, &site.join("torch"));
    site
}

/// The `.py` files under `src`, subpackages included, into `dst`.
fn copy_py(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if e.file_type().unwrap().is_dir() {
            if name != "__pycache__" {
                copy_py(&e.path(), &dst.join(&name));
            }
        } else if name.to_string_lossy().ends_with(".py") {
            std::fs::copy(e.path(), dst.join(&name)).unwrap();
        }
    }
}
