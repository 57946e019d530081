//! The Python bridge (bridge/ in the repository), carried inside the binary so that `vramtrace` and the bridge
//! it injects are always of one version; `run` writes it into the job's private runtime directory and puts
//! that first on PYTHONPATH.

use std::io;
use std::path::{Path, PathBuf};

/// (path under the bridge directory, contents): sitecustomize.py and every module of the package, as
/// `build.rs` found them.
pub const FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/bridge_files.rs"));

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
        assert_eq!(FILES[0].0, "sitecustomize.py");
        assert!(FILES.iter().all(|(_, text)| !text.is_empty()));
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
            "build.rs must carry every module of bridge/vramtrace_bridge"
        );
    }
}
