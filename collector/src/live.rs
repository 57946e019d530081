//! The job's memory as it runs, for `vramtrace run --metrics ADDR` (Prometheus/OpenMetrics at
//! `http://ADDR/metrics`) and `vramtrace top`.
//!
//! Off the receivers' path: the receivers only append whole frames to the trace, as ever, and publish how many
//! bytes of it are whole ([`TraceWriter::written`](crate::receive)); [`Live`] reads the trace file itself, behind
//! them, on its own thread (every [`CATCH_UP`]) and once more at each scrape, so ingest pays one atomic store
//! per write.
//!
//! The figures are the report's: the frames feed the report's own replay (`model::stream`), and
//! [`figures::Figures`] is what its observers say at the moment asked. Bytes, peaks, allocations, refusals and
//! errors follow one set of rules, in the replay's time order: what a scrape shows is what `vramtrace report` says of
//! the trace up to the moment every process had promised (the collector's ticks keep that within a few tens of
//! milliseconds of now). The cap's check against the GPU reads its own count ([`counted`]), which must not
//! wait for that promise.

pub mod counted;
pub mod figures;
pub mod http;
mod labels;
mod render;

pub use counted::Counted;
pub use figures::Figures;
pub use http::{serve, Metrics, Server};
#[cfg(test)]
use labels::command_line;
pub use labels::{job_name, uuids_from_env, JobLabels};
pub use render::{GpuStatus, ProcStatus, Status};

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use vramtrace_format::TraceHeader;

use crate::model::stream::Stream;

/// How often the background thread reads what the receivers wrote.
pub const CATCH_UP: Duration = Duration::from_millis(100);
/// The most trace bytes read at once.
const CHUNK: usize = 4 << 20;

/// The live figures of a running job, read from its trace file behind the receivers.
pub struct Live {
    labels: JobLabels,
    /// Whole bytes in the trace, published by the writer.
    written: Arc<AtomicU64>,
    inner: Mutex<Inner>,
    stop: AtomicBool,
}

struct Inner {
    /// The report's replay, fed as the trace grows, [`Figures`] its tap.
    stream: Stream,
    /// Each process's count for the cap's check, when it runs.
    cap: Option<counted::CapView>,
    file: Option<File>,
    /// How far the trace has been read (starts past the header).
    pos: u64,
    buf: Vec<u8>,
}

/// Whole frames to the replay, and to the cap's count when it is kept.
fn feed(stream: &mut Stream, cap: &mut Option<counted::CapView>, frames: &[u8]) {
    stream.feed(frames, |f| {
        if let Some(c) = cap.as_mut() {
            c.look(f);
        }
    });
}

impl Inner {
    fn figures(&self) -> Figures {
        self.stream.now().into()
    }
}

impl Live {
    /// `file` reads the trace (a clone of the writer's descriptor: reads do not move its offset); `start` is
    /// where the frames begin; `written` is the writer's count of whole bytes. `counts`: keep each process's
    /// count for the cap's check ([`Live::counted`]).
    pub fn new(
        labels: JobLabels,
        header: &TraceHeader,
        file: Option<File>,
        start: u64,
        written: Arc<AtomicU64>,
        counts: bool,
    ) -> Arc<Live> {
        Arc::new(Live {
            labels,
            written,
            inner: Mutex::new(Inner {
                stream: Stream::new(header),
                cap: counts.then(counted::CapView::default),
                file,
                pos: start,
                buf: Vec::new(),
            }),
            stop: AtomicBool::new(false),
        })
    }

    /// Reads what the writer has added since the last time.
    pub fn catch_up(&self) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Inner {
            stream,
            cap,
            file,
            pos,
            buf,
        } = &mut *g;
        let Some(file) = file.as_ref() else {
            return;
        };
        loop {
            let end = self.written.load(Ordering::Acquire);
            if *pos >= end {
                return;
            }
            let want = ((end - *pos) as usize).min(CHUNK);
            buf.resize(want, 0);
            let Ok(n) = file.read_at(&mut buf[..want], *pos) else {
                return;
            };
            if n == 0 {
                return;
            }
            // Only whole frames: a chunk can end inside one.
            let whole = whole_prefix(&buf[..n]);
            if whole == 0 {
                if n < CHUNK {
                    return;
                }
                // A frame larger than a chunk: read it whole.
                let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
                let mut big = vec![0u8; 4 + len as usize];
                if file.read_exact_at(&mut big, *pos).is_err() {
                    return;
                }
                feed(stream, cap, &big);
                *pos += big.len() as u64;
                continue;
            }
            feed(stream, cap, &buf[..whole]);
            *pos += whole as u64;
        }
    }

    /// Applies frames directly (tests, benchmarks: a `Live` without a file).
    pub fn feed(&self, frames: &[u8]) {
        if let Ok(mut g) = self.inner.lock() {
            let Inner { stream, cap, .. } = &mut *g;
            feed(stream, cap, frames);
        }
    }

    /// The job is over: reads the rest, and the replay gives out what it held back; refusals still open are
    /// errors (as the report counts them).
    pub fn finish(&self) {
        self.catch_up();
        if let Ok(mut g) = self.inner.lock() {
            g.stream.drain();
        }
    }

    /// The figures now, with everything written up to now (as far as every process has promised).
    pub fn figures(&self) -> Figures {
        self.catch_up();
        self.inner.lock().map(|g| g.figures()).unwrap_or_default()
    }

    /// The OpenMetrics text, with everything written up to now.
    pub fn render(&self) -> String {
        self.catch_up();
        match self.inner.lock() {
            Ok(g) => g.figures().render(&self.labels),
            Err(_) => "# EOF\n".into(),
        }
    }

    /// The typed status, with everything written up to now.
    pub fn status(&self) -> Status {
        self.catch_up();
        self.inner
            .lock()
            .map(|g| g.figures().status(&self.labels))
            .unwrap_or_default()
    }

    /// What the trace says of each process, with everything written up to now (`cap_check.rs`); empty unless
    /// made with `counts`.
    pub fn counted(&self) -> Vec<Counted> {
        self.catch_up();
        self.inner
            .lock()
            .map(|g| g.cap.as_ref().map(|c| c.counted()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// Bytes live now on `device`, all processes (tests).
    pub fn device_used(&self, device: u32) -> u64 {
        self.catch_up();
        self.inner
            .lock()
            .map_or(0, |g| g.figures().device_used(device))
    }

    /// Starts the background reader: every [`CATCH_UP`] until [`Live::stop`]. With `status`, the typed status
    /// is kept there (replaced whole when the figures change) for `vramtrace top`: a file in the owner's
    /// private attach folder, so that command lines and pids reach nobody else.
    pub fn spawn(
        self: &Arc<Live>,
        status: Option<std::path::PathBuf>,
    ) -> Option<thread::JoinHandle<()>> {
        let me = self.clone();
        thread::Builder::new()
            .name("vramtrace-live".into())
            .spawn(move || {
                let mut said = None;
                while !me.stop.load(Ordering::Acquire) {
                    me.catch_up();
                    if let Some(path) = &status {
                        let st = me.status();
                        if said.as_ref() != Some(&st) {
                            // A failed write (a full disk) is tried again at the next change.
                            if write_status(path, &st).is_ok() {
                                said = Some(st);
                            }
                        }
                    }
                    thread::park_timeout(CATCH_UP);
                }
            })
            .ok()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The length of the longest prefix of `bytes` made of whole frames.
fn whole_prefix(bytes: &[u8]) -> usize {
    let mut pos = 0usize;
    while bytes.len() - pos >= 4 {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        if bytes.len() - pos - 4 < len {
            break;
        }
        pos += 4 + len;
    }
    pos
}

/// `--metrics ADDR`: an address (`0.0.0.0:9400`, `[::]:9400`), or a port alone (loopback).
pub fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    let s = s.trim();
    if let Ok(port) = s.trim_start_matches(':').parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| "not an address (examples: 9400, 127.0.0.1:9400, 0.0.0.0:9400)".to_string())
}

/// A running job's metrics: the reader, the server, and the attach file `vramtrace top` finds it by. All
/// stopped and removed when dropped.
pub struct Running {
    pub live: Arc<Live>,
    pub server: Server,
    reader: Option<thread::JoinHandle<()>>,
    attach: Option<std::path::PathBuf>,
    /// `<attach_dir>/<pid>.status.json`, the typed status `top` reads.
    status: Option<std::path::PathBuf>,
}

impl Running {
    /// Binds `addr`, starts the reader and the server, and writes the attach file (`job`, `command`, `trace`
    /// for `top` to show).
    pub fn start(
        addr: std::net::SocketAddr,
        live: Arc<Live>,
        command: &str,
        trace: &std::path::Path,
    ) -> std::io::Result<Running> {
        let server = serve(addr, live.clone())?;
        let attach = match private_attach_dir()
            .and_then(|dir| write_attach(dir, &server.addr, &live.labels.job, command, trace))
        {
            Ok(p) => Some(p),
            Err(e) => {
                crate::note!(
                        "vramtrace: no attach file for `vramtrace top` ({e}): give it --addr {} (it then shows \
                         what /metrics serves: no command lines)",
                        server.addr
                    );
                None
            }
        };
        let status = attach.as_ref().map(|a| a.with_extension("status.json"));
        let reader = live.spawn(status.clone());
        Ok(Running {
            live,
            server,
            reader,
            attach,
            status,
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.live.stop();
        if let Some(t) = self.reader.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        for p in [self.attach.take(), self.status.take()]
            .into_iter()
            .flatten()
        {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Replaces `path` (in the private attach folder) with `st`: a temporary made afresh beside it, renamed over it,
/// so `top` never reads half a status.
fn write_status(path: &std::path::Path, st: &Status) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("json.part");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(serde_json::to_string(st).unwrap_or_default().as_bytes())?;
    std::fs::rename(&tmp, path)
}

/// Where running jobs leave their attach files: `$XDG_RUNTIME_DIR/vramtrace`, else `/tmp/vramtrace-<uid>`; then,
/// where another user took that name first (it is one anyone can take in /tmp), `~/.cache/vramtrace/attach`.
pub fn attach_dirs() -> Vec<std::path::PathBuf> {
    let first = match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => std::path::PathBuf::from(d).join("vramtrace"),
        // SAFETY: no arguments and no preconditions; it cannot fail.
        None => std::path::PathBuf::from(format!("/tmp/vramtrace-{}", unsafe { libc::geteuid() })),
    };
    let mut v = vec![first];
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        v.push(std::path::PathBuf::from(home).join(".cache/vramtrace/attach"));
    }
    v
}

/// The first attach folder that is ours and private (made if missing), checked as another user could have left
/// it: a real directory (not a link), ours, that no one else may enter or write. Where none is, why the first
/// was not.
pub fn private_attach_dir() -> std::io::Result<std::path::PathBuf> {
    let mut first_err = None;
    for (i, d) in attach_dirs().into_iter().enumerate() {
        if i > 0 {
            // The fallback's parents (~/.cache) may not exist yet; they are the user's own.
            if let Some(parent) = d.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
        }
        match private_dir(d) {
            Ok(d) => return Ok(d),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.unwrap_or_else(|| std::io::Error::other("no attach folder")))
}

/// Every attach folder that is ours and private (`top` reads them all: a job that fell back to the second
/// wrote there).
pub fn private_attach_dirs() -> Vec<std::path::PathBuf> {
    attach_dirs()
        .into_iter()
        .filter(|d| d.is_dir())
        .filter_map(|d| private_dir(d).ok())
        .collect()
}

/// `dir`, made if missing (its parent must exist), if it is a real directory of ours no one else may enter.
fn private_dir(dir: std::path::PathBuf) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(&dir)?;
    // SAFETY: no arguments and no preconditions; it cannot fail.
    let me = unsafe { libc::geteuid() };
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} {why}: not used", dir.display()),
        ))
    };
    if !m.file_type().is_dir() {
        return refuse("is not a directory".into());
    }
    if m.uid() != me {
        return refuse(format!("belongs to uid {}, not {me}", m.uid()));
    }
    if m.mode() & 0o077 != 0 {
        return refuse(format!("is open to others (mode {:o})", m.mode() & 0o777));
    }
    Ok(dir)
}

/// `<attach_dir>/<pid>.addr`: `addr=`, `job=`, `command=`, `trace=` lines, made afresh (never through a link
/// or into a file someone else left), readable by us only.
fn write_attach(
    dir: std::path::PathBuf,
    addr: &std::net::SocketAddr,
    job: &str,
    command: &str,
    trace: &std::path::Path,
) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = private_dir(dir)?;
    let path = dir.join(format!("{}.addr", std::process::id()));
    let clean = |s: &str| s.replace(['\n', '\r'], " ");
    // A stale file of a dead run with our pid: ours (the folder is), removed first.
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    f.write_all(
        format!(
            "addr={addr}\njob={}\ncommand={}\ntrace={}\n",
            clean(job),
            clean(command),
            clean(&trace.display().to_string())
        )
        .as_bytes(),
    )?;
    Ok(path)
}

impl Metrics for Live {
    fn render(&self) -> String {
        Live::render(self)
    }
}

#[cfg(test)]
mod tests;
