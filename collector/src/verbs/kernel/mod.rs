//! `vramtrace kernel install|list|remove`: a Jupyter kernel whose every session runs under `vramtrace run`, its
//! trace kept per session, with the `%vramtrace` magics loaded (python/vramtrace, docs/NOTEBOOKS.md).
//!
//! - `paths.rs`: where the spec and the kernel's own folder are, the name's rule, private folders;
//! - `spec.rs`: the `kernel.json` written and read back;
//! - `python.rs`: the kernel's Python, found and asked what it has;
//! - `launch.rs`: what the spec runs (`kernel launch`, hidden): the session's trace, then `run`;
//! - `error.rs`: why it failed, in one line, and the exit code it gives.
//!
//! Bad input (a name that is a path, a Python without ipykernel, a kernel that exists) is one line and exit 2.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::files::out_file::OutFile;
use crate::process::exit::{self, Code};

mod error;
mod launch;
mod paths;
mod python;
mod spec;

pub use error::KernelError;

use spec::{Ours, Spec};

#[derive(Debug, clap::Args)]
pub struct KernelArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Write a Jupyter kernel spec whose kernel runs under `vramtrace run`, each session's trace kept (where
    /// `vramtrace kernel list` says), with the `%vramtrace` magics loaded.
    Install(InstallArgs),
    /// The kernels vramtrace installed, and their traces.
    List,
    /// Remove a kernel vramtrace installed: its spec and its traces.
    Remove {
        /// The kernel's name.
        name: String,
        /// Keep its traces (the folder `list` shows) and remove only the spec.
        #[arg(long)]
        keep_traces: bool,
    },
    /// (internal) What the spec runs: `vramtrace run` with this session's trace.
    #[command(hide = true)]
    Launch {
        #[arg(long)]
        traces: PathBuf,
        /// Sessions kept in `traces`, this one included (0: all).
        #[arg(long, default_value_t = 0)]
        keep: u32,
        #[arg(long)]
        cap: Option<String>,
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
}

#[derive(Debug, clap::Args)]
struct InstallArgs {
    /// The kernel's name (letters, digits, '.', '_', '-').
    #[arg(long, default_value = "vramtrace")]
    name: String,
    /// The name Jupyter shows (default: "Python (vramtrace)", with the cap if any).
    #[arg(long)]
    display_name: Option<String>,
    /// Cap each session's device memory, as `vramtrace run --cap` (20GiB, 50%, 0=20GiB,1=10GiB).
    #[arg(long, value_name = "SPEC")]
    cap: Option<String>,
    /// Sessions whose traces are kept: each new session removes the oldest past this many (0: keep all).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_KEEP)]
    keep_sessions: u32,
    /// The kernel's Python: it needs ipykernel and the `vramtrace` package of this version (`pip install
    /// vramtrace`). Default: python3 on PATH.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Install for this user (Jupyter's data folder: $JUPYTER_DATA_DIR, else ~/.local/share/jupyter). The default.
    #[arg(long, conflicts_with = "sys_prefix")]
    user: bool,
    /// Install into the Python's environment (<sys.prefix>/share/jupyter), seen by Jupyter run from there.
    #[arg(long)]
    sys_prefix: bool,
    /// Replace a kernel of that name that vramtrace installed (another's is never replaced).
    #[arg(long)]
    force: bool,
}

pub fn main(args: KernelArgs) -> Code {
    let r = match args.action {
        Action::Install(a) => install(&a),
        Action::List => list(),
        Action::Remove { name, keep_traces } => remove(&name, keep_traces),
        Action::Launch {
            traces,
            keep,
            cap,
            command,
        } => Err(launch::exec(&traces, keep, cap.as_deref(), &command)),
    };
    match r {
        Ok(()) => exit::OK,
        Err(e) => exit::fail(e.code(), e),
    }
}

/// The `spec` file in a kernel's own folder: the folder of its kernel.json.
const POINTER: &str = "spec";
const KERNEL_JSON: &str = "kernel.json";
/// Sessions kept by default: a few weeks of a notebook a day, a few GiB at most.
const DEFAULT_KEEP: u32 = 20;

fn install(a: &InstallArgs) -> Result<(), KernelError> {
    paths::check_name(&a.name)?;
    if let Some(cap) = &a.cap {
        vramtrace_format::cap::CapSpec::parse(cap)
            .map_err(|e| KernelError::BadCap(cap.clone(), e.to_string()))?;
    }
    let py = python::find(a.python.as_deref())?;
    let probe = python::probe(&py)?;
    let kernels = if a.sys_prefix {
        probe.prefix.join("share/jupyter/kernels")
    } else {
        paths::user_kernels()?
    };
    let spec_dir = kernels.join(&a.name);
    let own = paths::ours()?.join(&a.name);
    let exe = std::env::current_exe().map_err(|e| KernelError::Io("/proc/self/exe".into(), e))?;
    for p in [&py, &own, &exe] {
        if !spec::utf8(p) {
            return Err(KernelError::NotUtf8(p.to_path_buf()));
        }
    }
    // An existing kernel of that name: replaced only with --force, and only if it is ours.
    if std::fs::symlink_metadata(&spec_dir).is_ok() {
        match read_spec(&spec_dir) {
            Some(s) if s.ours().is_some() && a.force => {}
            Some(s) if s.ours().is_some() => {
                return Err(KernelError::Exists(a.name.clone(), spec_dir))
            }
            _ => return Err(KernelError::NotOurs(a.name.clone(), spec_dir)),
        }
    }
    if let Some(other) = pointer(&own).filter(|d| d.join(KERNEL_JSON).is_file()) {
        // Installed elsewhere (the user's kernels against --sys-prefix): replacing the pointer would leave that
        // spec behind, pointing at traces `remove` then takes away, or hiding this one from Jupyter.
        if other != spec_dir {
            return Err(KernelError::Elsewhere(a.name.clone(), other));
        }
        if !a.force {
            return Err(KernelError::Exists(a.name.clone(), other));
        }
    }
    let display = a.display_name.clone().unwrap_or_else(|| match &a.cap {
        Some(c) => format!("Python (vramtrace, cap {c})"),
        None => "Python (vramtrace)".to_string(),
    });
    let ours = Ours {
        version: env!("CARGO_PKG_VERSION").to_string(),
        traces: own.clone(),
        python: py.clone(),
        cap: a.cap.clone(),
        keep_sessions: a.keep_sessions,
    };
    paths::private_dir(&own)?;
    paths::private_dir(&spec_dir)?;
    write_private(
        &spec_dir.join(KERNEL_JSON),
        Spec::new(&exe, ours, display.clone()).to_json().as_bytes(),
        true,
    )?;
    let mut p = spec_dir.clone().into_os_string().into_encoded_bytes();
    p.push(b'\n');
    write_private(&own.join(POINTER), &p, true)?;
    crate::say!(
        "installed the kernel {:?} (\"{display}\"): {}\n  Python {}; each session's trace in {}\n  in a notebook: %vramtrace (the last out-of-memory error), %vramtrace holders; undo: vramtrace kernel remove {}",
        a.name,
        spec_dir.join(KERNEL_JSON).display(),
        py.display(),
        own.display(),
        a.name
    );
    Ok(())
}

/// A file of the user's alone, never written through a link planted at its name (`out_file`).
fn write_private(dest: &Path, bytes: &[u8], force: bool) -> Result<(), KernelError> {
    let mut o = OutFile::create(dest, force)?;
    o.file()
        .write_all(bytes)
        .map_err(|e| KernelError::Io(dest.to_path_buf(), e))?;
    o.commit()?;
    Ok(())
}

fn read_spec(dir: &Path) -> Option<Spec> {
    Spec::parse(&std::fs::read_to_string(dir.join(KERNEL_JSON)).ok()?)
}

/// The spec folder a kernel's own folder names.
fn pointer(own: &Path) -> Option<PathBuf> {
    let p = own.join(POINTER);
    if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
        return None;
    }
    std::fs::read(&p).ok().map(spec::pointer_target)
}

/// A kernel of ours: its name, its own folder, and its spec's folder (if it is still there and ours).
struct Installed {
    name: String,
    own: PathBuf,
    spec_dir: Option<PathBuf>,
    spec: Option<Spec>,
}

fn installed() -> Result<Vec<Installed>, KernelError> {
    let base = paths::ours()?;
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&base) else {
        return Ok(out);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if paths::check_name(&name).is_err() || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let own = e.path();
        let spec_dir = pointer(&own);
        let spec = spec_dir
            .as_deref()
            .and_then(read_spec)
            .filter(|s| s.ours().is_some_and(|o| o.traces == own));
        out.push(Installed {
            name,
            own,
            spec_dir,
            spec,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The traces in a kernel's folder, oldest first (their names sort by time).
fn traces(own: &Path) -> Vec<(String, u64)> {
    let mut t: Vec<(String, u64)> = std::fs::read_dir(own)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            let m = e.metadata().ok()?;
            (n.ends_with(".vtrace") && m.is_file()).then_some((n, m.len()))
        })
        .collect();
    t.sort();
    t
}

fn list() -> Result<(), KernelError> {
    let all = installed()?;
    if all.is_empty() {
        crate::say!("no kernel installed by vramtrace (`vramtrace kernel install` makes one)");
        return Ok(());
    }
    for k in &all {
        let head = match &k.spec {
            Some(s) => {
                let o = s.ours().expect("filtered: ours");
                format!(
                    "{}  \"{}\"  Python {}",
                    k.name,
                    s.display_name,
                    o.python.display()
                )
            }
            None => format!(
                "{}  (its spec is gone{}: `vramtrace kernel remove {}` clears the rest)",
                k.name,
                k.spec_dir
                    .as_ref()
                    .map_or(String::new(), |d| format!(" from {}", d.display())),
                k.name
            ),
        };
        let t = traces(&k.own);
        let keep = match k
            .spec
            .as_ref()
            .and_then(Spec::ours)
            .map(|o| o.keep_sessions)
        {
            Some(0) => "; all kept".to_string(),
            Some(n) => format!("; the newest {n} kept"),
            None => String::new(),
        };
        let traces = match t.last() {
            None => "no session yet".to_string(),
            Some((last, size)) => format!(
                "{} session{}, the latest {last} ({}){keep}",
                t.len(),
                if t.len() == 1 { "" } else { "s" },
                crate::names::units::bytes(*size)
            ),
        };
        let spec = k
            .spec
            .as_ref()
            .and(k.spec_dir.as_ref())
            .map_or(String::new(), |d| {
                format!("  spec    {}\n", d.join(KERNEL_JSON).display())
            });
        if !crate::say!("{head}\n{spec}  traces  {}: {traces}", k.own.display()) {
            break;
        }
    }
    Ok(())
}

fn remove(name: &str, keep_traces: bool) -> Result<(), KernelError> {
    paths::check_name(name)?;
    let own = paths::ours()?.join(name);
    let found = std::fs::symlink_metadata(&own).is_ok();
    // Its spec where its folder says, else where `install` puts one by default.
    let spec_dir = pointer(&own).or_else(|| {
        let d = paths::user_kernels().ok()?.join(name);
        d.exists().then_some(d)
    });
    // Everything checked before anything goes: our folder is ours, and the spec's holds nothing else.
    if found {
        paths::own_dir(&own)?;
    }
    let mut removed_spec = None;
    if let Some(d) = spec_dir {
        match read_spec(&d) {
            Some(s) if s.ours().is_some() => {
                let others = std::fs::read_dir(&d)
                    .map_or(true, |r| r.flatten().any(|e| e.file_name() != KERNEL_JSON));
                if others {
                    return Err(KernelError::NotEmpty(d.clone()));
                }
                remove_file(&d.join(KERNEL_JSON))?;
                std::fs::remove_dir(&d).map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOTEMPTY) => KernelError::NotEmpty(d.clone()),
                    _ => KernelError::Io(d.clone(), e),
                })?;
                removed_spec = Some(d);
            }
            // Another's kernel now holds that name: left as it is, and said so if nothing of ours is left.
            _ if !found && d.join(KERNEL_JSON).exists() => {
                return Err(KernelError::NotOurs(name.to_string(), d));
            }
            // Gone already (`jupyter kernelspec remove`): only our folder is left.
            _ => {}
        }
    }
    if !found && removed_spec.is_none() {
        return Err(KernelError::NotFound(name.to_string()));
    }
    let kept = if found && keep_traces {
        remove_file(&own.join(POINTER))?;
        traces(&own).len()
    } else {
        if found {
            std::fs::remove_dir_all(&own).map_err(|e| KernelError::Io(own.clone(), e))?;
        }
        // Our folders, when nothing else is left in them.
        let base = paths::ours()?;
        paths::remove_if_empty(&base);
        if let Some(parent) = base.parent() {
            paths::remove_if_empty(parent);
        }
        0
    };
    let spec = removed_spec.map_or(String::new(), |d| format!(" ({})", d.display()));
    if kept > 0 {
        crate::say!(
            "removed the kernel {name:?}{spec}; its {kept} trace(s) kept in {}",
            own.display()
        );
    } else {
        crate::say!("removed the kernel {name:?}{spec} and its traces");
    }
    Ok(())
}

fn remove_file(p: &Path) -> Result<(), KernelError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(KernelError::Io(p.to_path_buf(), e)),
    }
}
