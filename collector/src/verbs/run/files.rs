//! The files `run` makes or finds: the shim, the trace's default name, the post-mortems beside it.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Writes `text` to `<trace stem>.<kind>.txt`, never over an existing file (a numbered name instead).
pub(super) fn write_beside(trace: &Path, kind: &str, text: &str) -> io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    // The plain names first, then names nobody can guess: files planted at every `KIND.N.txt` (another user's,
    // in a shared folder) must not stop the post-mortem from being written.
    for n in 0..18u32 {
        let ext = match n {
            0 => format!("{kind}.txt"),
            1..10 => format!("{kind}.{n}.txt"),
            _ => format!(
                "{kind}.{:016x}.txt",
                crate::files::runtime_dir::random_u64()
            ),
        };
        let path = trace.with_extension(ext);
        // Afresh, never through a link; the job's user's alone, as the trace is.
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(mut f) => return f.write_all(text.as_bytes()).map(|_| path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "too many post-mortems beside the trace",
    ))
}

/// Finds `libvramtrace.so`: `VRAMTRACE_SHIM`, else beside this executable, else `../lib/vramtrace/`.
pub(super) fn find_shim() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("VRAMTRACE_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("VRAMTRACE_SHIM names {}, which is not a file", p.display());
        }
        return Ok(std::fs::canonicalize(&p).unwrap_or(p));
    }
    let exe = std::env::current_exe().context("cannot locate the vramtrace executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join("libvramtrace.so"),
        dir.join("../lib/vramtrace/libvramtrace.so"),
    ];
    for c in &candidates {
        if c.is_file() {
            return Ok(std::fs::canonicalize(c).unwrap_or_else(|_| c.clone()));
        }
    }
    bail!(
        "cannot find libvramtrace.so (looked in {} and {}); build it with `cargo build --release` or set VRAMTRACE_SHIM",
        candidates[0].display(),
        candidates[1].display()
    )
}

pub(super) fn default_out(command: &[OsString]) -> PathBuf {
    let prog = Path::new(&command[0])
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into());
    let prog: String = prog
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    PathBuf::from(format!("vramtrace-{prog}-{}.vtrace", std::process::id()))
}

pub(super) fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

// ---- signals and the child -----------------------------------------------------------------------------
