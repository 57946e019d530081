//! The Python bridge (bridge/ in the repository), carried inside the binary so that `vramtrace` and the bridge
//! it injects are always of one version; `run` writes it into the job's private runtime directory and puts
//! that first on PYTHONPATH.

use std::io;
use std::path::{Path, PathBuf};

/// (path under the bridge directory, contents).
pub const FILES: &[(&str, &str)] = &[
    (
        "sitecustomize.py",
        include_str!("../../../bridge/sitecustomize.py"),
    ),
    (
        "vramtrace_bridge/__init__.py",
        include_str!("../../../bridge/vramtrace_bridge/__init__.py"),
    ),
    (
        "vramtrace_bridge/_hook.py",
        include_str!("../../../bridge/vramtrace_bridge/_hook.py"),
    ),
    (
        "vramtrace_bridge/_shim.py",
        include_str!("../../../bridge/vramtrace_bridge/_shim.py"),
    ),
    (
        "vramtrace_bridge/_torch.py",
        include_str!("../../../bridge/vramtrace_bridge/_torch.py"),
    ),
    (
        "vramtrace_bridge/_holders.py",
        include_str!("../../../bridge/vramtrace_bridge/_holders.py"),
    ),
    (
        "vramtrace_bridge/_jax.py",
        include_str!("../../../bridge/vramtrace_bridge/_jax.py"),
    ),
];

/// Writes the bridge under `dir` (created); the directory to put on PYTHONPATH.
pub fn write(dir: &Path) -> io::Result<PathBuf> {
    for (rel, text) in FILES {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, text)?;
    }
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_of_the_package_is_carried() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bridge/vramtrace_bridge");
        let mut on_disk: Vec<String> = std::fs::read_dir(&src)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .map(|n| format!("vramtrace_bridge/{n}"))
            .collect();
        on_disk.sort();
        let mut carried: Vec<String> = FILES
            .iter()
            .map(|(p, _)| p.to_string())
            .filter(|p| p.starts_with("vramtrace_bridge/"))
            .collect();
        carried.sort();
        assert_eq!(
            on_disk, carried,
            "bridge_files.rs must list every module of bridge/vramtrace_bridge"
        );
    }
}
