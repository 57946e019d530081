//! Where a traced kernel lives: its Jupyter kernel spec (`<kernels>/NAME/kernel.json`) and its own folder
//! (`$XDG_DATA_HOME/vramtrace/kernels/NAME/`, default `~/.local/share/...`: each session's trace, and `spec`,
//! the spec's folder, so that `list` and `remove` find a kernel wherever it was installed). Every folder made
//! here is the user's alone (0700), and one that is a link, or another user's, is refused, never followed.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::error::KernelError;

/// What a kernel's name may be: Jupyter's own rule (letters, digits, `.`, `_`, `-`), and never a path (`..`, a
/// hidden name): it names two folders.
pub fn check_name(name: &str) -> Result<(), KernelError> {
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > 64 {
        "it is longer than 64 characters"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        "only letters, digits, '.', '_' and '-' (Jupyter's kernel names; never a path)"
    } else if name.bytes().any(|b| b.is_ascii_uppercase()) {
        // Jupyter lowercases kernel names: `A` and `a` would be one kernel to it, two to us.
        "lowercase only (Jupyter lowercases kernel names)"
    } else if name.starts_with('.') {
        "it starts with '.'"
    } else {
        return Ok(());
    };
    Err(KernelError::BadName(name.to_string(), why))
}

/// `$XDG_DATA_HOME`, else `~/.local/share`.
fn data_home() -> Result<PathBuf, KernelError> {
    if let Some(d) = absolute_env("XDG_DATA_HOME") {
        return Ok(d);
    }
    absolute_env("HOME")
        .map(|h| h.join(".local/share"))
        .ok_or(KernelError::NoHome)
}

fn absolute_env(k: &str) -> Option<PathBuf> {
    std::env::var_os(k)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// Jupyter's per-user kernels (`jupyter --data-dir`): `$JUPYTER_DATA_DIR/kernels`, else
/// `$XDG_DATA_HOME/jupyter/kernels`.
pub fn user_kernels() -> Result<PathBuf, KernelError> {
    if let Some(d) = absolute_env("JUPYTER_DATA_DIR") {
        return Ok(d.join("kernels"));
    }
    Ok(data_home()?.join("jupyter/kernels"))
}

/// The folder of vramtrace's kernels: one folder per kernel.
pub fn ours() -> Result<PathBuf, KernelError> {
    Ok(data_home()?.join("vramtrace/kernels"))
}

/// `dir`, made if missing, and checked: a real folder of the user's own that no one else may enter. Its missing
/// parents are made as any folder is (the umask's mode): they are shared places (`<prefix>/share/jupyter`, a
/// data home) whose other contents are not ours to hide.
pub fn private_dir(dir: &Path) -> Result<(), KernelError> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| KernelError::Io(parent.to_path_buf(), e))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(KernelError::Io(dir.to_path_buf(), e)),
    }
    own_dir(dir)
}

/// A real folder (not a link to one) of the user's own, that no one else may enter or write.
pub fn own_dir(dir: &Path) -> Result<(), KernelError> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| KernelError::Io(dir.to_path_buf(), e))?;
    // SAFETY: no arguments and no preconditions; it cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(KernelError::NotPrivate(dir.to_path_buf()));
    }
    Ok(())
}

/// Removes `dir` if it is empty (a parent of ours left with nothing in it).
pub fn remove_if_empty(dir: &Path) {
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_never_a_path() {
        for ok in ["vramtrace", "py3.11-cap_20gib", "a"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(65);
        for bad in [
            "", "..", ".", ".hidden", "a/b", "../x", "a b", "é", "a\nb", "A", &long,
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_planted_link_is_not_a_private_folder() {
        let d = std::env::temp_dir().join(format!("vt-kernel-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        let target = d.join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let link = d.join("kernels");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            private_dir(&link),
            Err(KernelError::NotPrivate(_))
        ));
        // The folder itself is private; parents made on the way are shared places, left as any folder is.
        let made = d.join("a/b/c");
        private_dir(&made).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o777, 0o700);
        let parent = std::fs::metadata(d.join("a/b")).unwrap().mode() & 0o777;
        assert_ne!(parent, 0o700, "a shared parent was made private");
        // A folder of ours that others may enter is not private.
        let open = d.join("open");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&open)
            .unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert!(matches!(own_dir(&open), Err(KernelError::NotPrivate(_))));
        let _ = std::fs::remove_dir_all(&d);
    }
}
