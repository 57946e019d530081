//! Outputs (a run's trace, an export) written where the user said, even into a folder other users share
//! (`/tmp`, a team's 1777 scratch folder): never through a link someone planted at that name, never into a file
//! someone else made there, and never half-written over what was there before.
//!
//! The output is first a private temporary beside it (made afresh: `O_EXCL|O_NOFOLLOW`, mode 0600, so nobody
//! else holds it open or can read it), then renamed onto the name. A rename replaces the directory entry, a
//! planted link included, and never writes through it. Without `--force` the rename refuses an existing name
//! (`RENAME_NOREPLACE`); with it, a name that is another user's (a file, a link, anything) is refused before
//! anything is written, and in a sticky folder the kernel refuses it too.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why an output could not be made; each says it in one line.
#[derive(Debug)]
pub enum OutError {
    /// The name is taken and `--force` was not given.
    Exists(PathBuf),
    /// The name is another user's (`uid`): never replaced, `--force` or not.
    Theirs(PathBuf, u32),
    /// The name is a folder.
    Folder(PathBuf),
    Io(PathBuf, io::Error),
}

impl std::fmt::Display for OutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutError::Exists(p) => write!(
                f,
                "{} already exists; choose another --out or add --force",
                p.display()
            ),
            OutError::Theirs(p, uid) => write!(
                f,
                "{} belongs to another user (uid {uid}): not replaced, --force or not; choose another --out",
                p.display()
            ),
            OutError::Folder(p) => write!(f, "{} is a folder; --out names a file", p.display()),
            OutError::Io(p, e) => write!(f, "cannot write {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for OutError {}

/// An output being written: the temporary file, renamed onto its name by [`OutFile::commit`], removed if
/// dropped before.
pub struct OutFile {
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
    force: bool,
}

impl OutFile {
    /// Checks `dest` and makes the temporary beside it. Nothing at `dest` is touched yet.
    pub fn create(dest: &Path, force: bool) -> Result<OutFile, OutError> {
        let dest = dest.to_path_buf();
        check_dest(&dest, force)?;
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest
            .file_name()
            .ok_or_else(|| OutError::Folder(dest.clone()))?;
        let mut last = None;
        for _ in 0..16 {
            let mut t = OsString::from(".");
            t.push(name);
            t.push(format!(
                ".vramtrace-{:016x}",
                crate::files::runtime_dir::random_u64()
            ));
            // A name too long for the folder with the suffix: a shorter one beside it.
            if t.as_bytes().len() > 255 {
                t = OsString::from(format!(
                    ".vramtrace-out-{:016x}",
                    crate::files::runtime_dir::random_u64()
                ));
            }
            let tmp = dir.join(t);
            match std::fs::OpenOptions::new()
                .write(true)
                .read(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
            {
                Ok(file) => {
                    return Ok(OutFile {
                        file: Some(file),
                        tmp,
                        dest,
                        force,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(OutError::Io(dest, e)),
            }
        }
        Err(OutError::Io(
            dest,
            last.unwrap_or_else(|| io::Error::other("no free temporary name")),
        ))
    }

    /// The file to write (the temporary until committed; the same open file after).
    pub fn file(&mut self) -> &mut File {
        self.file
            .as_mut()
            .expect("an OutFile always holds its file")
    }

    /// Puts the output at its name: atomically, replacing what is there only with `--force` (and then only what
    /// is the user's own, checked again). Returns the open file, still writable (a run's trace grows on).
    pub fn commit(mut self) -> Result<File, OutError> {
        check_dest(&self.dest, self.force)?;
        let r = if self.force {
            std::fs::rename(&self.tmp, &self.dest)
        } else {
            rename_noreplace(&self.tmp, &self.dest)
        };
        match r {
            Ok(()) => {
                self.tmp = PathBuf::new();
                Ok(self.file.take().expect("an OutFile always holds its file"))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(OutError::Exists(self.dest.clone()))
            }
            // A sticky folder's entry of another user's, made between the check and the rename; any other
            // EPERM is the filesystem's own (one without hard links or RENAME_NOREPLACE, such as some FUSE
            // mounts), said as it is.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                // SAFETY: no arguments and no preconditions; it cannot fail.
                let me = unsafe { libc::geteuid() };
                match std::fs::symlink_metadata(&self.dest) {
                    Ok(m) if m.uid() != me => Err(OutError::Theirs(self.dest.clone(), m.uid())),
                    _ => Err(OutError::Io(self.dest.clone(), e)),
                }
            }
            Err(e) => Err(OutError::Io(self.dest.clone(), e)),
        }
    }

    /// Where the output will be.
    pub fn dest(&self) -> &Path {
        &self.dest
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// What is at `dest` now, judged before writing: nothing, or (with `force`) a file or link of the user's own.
/// Whether `dest` may be written (`--force` or not), before any work is done for it: a verb that runs a job
/// first (`demo`) refuses at once rather than after the job.
pub fn check_dest(dest: &Path, force: bool) -> Result<(), OutError> {
    let m = match std::fs::symlink_metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OutError::Io(dest.to_path_buf(), e)),
    };
    if m.is_dir() {
        return Err(OutError::Folder(dest.to_path_buf()));
    }
    // SAFETY: no arguments and no preconditions; it cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(OutError::Theirs(dest.to_path_buf(), m.uid()));
    }
    if !force {
        return Err(OutError::Exists(dest.to_path_buf()));
    }
    Ok(())
}

/// `rename`, failing with `AlreadyExists` if `to` exists. Filesystems without `RENAME_NOREPLACE` (some network
/// ones) get `link` then `unlink`, which refuses an existing name the same way.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // The system call itself: glibc's wrapper is 2.28's, newer than the wheel's baseline (2.17).
    // SAFETY: two NUL-terminated paths that outlive the call; integer flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
        return Err(e);
    }
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vt-out-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn a_planted_link_is_replaced_never_followed() {
        let d = dir("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"the victim's own words").unwrap();
        let out = d.join("trace.vtrace");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        let mut o = OutFile::create(&out, true).unwrap();
        o.file().write_all(b"trace").unwrap();
        o.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"the victim's own words");
        let m = std::fs::symlink_metadata(&out).unwrap();
        assert!(m.is_file(), "the link itself was replaced by a file");
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&out).unwrap(), b"trace");
        // Nothing of ours is left beside it.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn without_force_an_existing_name_is_kept_and_a_failure_leaves_the_old_output_whole() {
        let d = dir("keep");
        let out = d.join("out.html");
        std::fs::write(&out, b"old").unwrap();
        let e = OutFile::create(&out, false).err().unwrap();
        assert!(matches!(e, OutError::Exists(_)), "{e}");
        // With --force, an output abandoned half-way (dropped) leaves the old one as it was.
        let mut o = OutFile::create(&out, true).unwrap();
        o.file().write_all(b"half").unwrap();
        drop(o);
        let mut s = String::new();
        File::open(&out).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "old");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        // A name made between create and commit is not replaced without --force.
        let fresh = d.join("fresh");
        let o = OutFile::create(&fresh, false).unwrap();
        std::fs::write(&fresh, b"raced").unwrap();
        assert!(matches!(o.commit(), Err(OutError::Exists(_))));
        assert_eq!(std::fs::read(&fresh).unwrap(), b"raced");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_folder_is_not_an_output() {
        let d = dir("folder");
        let e = OutFile::create(&d, true).err().unwrap();
        assert!(matches!(e, OutError::Folder(_)), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
