//! The kernel's Python: `--python PATH`, else `python3` on PATH, kept as found (a virtual environment's
//! `bin/python3` is a link to the system's: following it would lose the environment), and asked once what it
//! has: ipykernel (the kernel) and the `vramtrace` package of this version (the `%vramtrace` magics).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::KernelError;

/// What the Python said of itself.
#[derive(Debug, serde::Deserialize)]
pub struct Probe {
    /// `sys.prefix`: `--sys-prefix` installs into `<prefix>/share/jupyter/kernels`.
    pub prefix: PathBuf,
    ipykernel: Option<String>,
    vramtrace: Option<String>,
}

const PROBE: &str = r#"
import json, sys
def version(name):
    try:
        return getattr(__import__(name), "__version__", "?")
    except Exception:
        return None
print(json.dumps({"prefix": sys.prefix, "ipykernel": version("ipykernel"), "vramtrace": version("vramtrace")}))
"#;

/// The Python to record: `given`, or the first `python3` on PATH, as an absolute path.
pub fn find(given: Option<&Path>) -> Result<PathBuf, KernelError> {
    let p = match given {
        Some(p) if p.components().count() > 1 => p.to_path_buf(),
        Some(p) => on_path(p).ok_or_else(|| KernelError::NoPython(p.to_path_buf()))?,
        None => on_path(Path::new("python3"))
            .ok_or_else(|| KernelError::NoPython(PathBuf::from("python3")))?,
    };
    let p = std::path::absolute(&p).map_err(|e| KernelError::Io(p.clone(), e))?;
    if !is_executable(&p) {
        return Err(KernelError::NoPython(p));
    }
    Ok(p)
}

fn on_path(name: &Path) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Asks `python` what it has, and refuses one that cannot run the traced kernel: no ipykernel, no `vramtrace`
/// package, or one of another version than this binary.
pub fn probe(python: &Path) -> Result<Probe, KernelError> {
    // From `/`: `python -c` looks in its working folder first, where anyone could have left an `ipykernel.py`.
    let out = Command::new(python)
        .args(["-c", PROBE])
        .current_dir("/")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| KernelError::Io(python.to_path_buf(), e))?;
    let probe: Probe = serde_json::from_slice(&out.stdout)
        .ok()
        .filter(|_| out.status.success())
        .ok_or_else(|| KernelError::NotPython(python.to_path_buf()))?;
    if probe.ipykernel.is_none() {
        return Err(KernelError::Lacks(python.to_path_buf(), "ipykernel"));
    }
    match probe.vramtrace.as_deref() {
        None => Err(KernelError::Lacks(python.to_path_buf(), "vramtrace")),
        Some(v) if v != env!("CARGO_PKG_VERSION") => Err(KernelError::OtherVersion(
            python.to_path_buf(),
            v.to_string(),
        )),
        Some(_) => Ok(probe),
    }
}
