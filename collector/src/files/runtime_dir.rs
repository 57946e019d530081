//! The job's private runtime directory (its socket, the cap's ledger, the Python bridge), and the clean-up of
//! those a killed collector left behind.
//!
//! Each directory holds a `collector` file naming the collector that made it: its pid, the pid's start time,
//! the pid namespace and the boot. A later `run` of the same user removes a directory whose collector is gone
//! (no such pid, or another process by that number, on this boot and in this pid namespace). It never judges a
//! directory it cannot be sure of: another user's, a link, one without the file (still being made, or made by
//! an older vramtrace), or one of another pid namespace or boot (a container beside ours sharing /tmp).

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The directories' names: `vramtrace-` and six characters from `mkdtemp`.
const PREFIX: &str = "vramtrace-";
/// The file that names the directory's collector.
const OWNER_FILE: &str = "collector";

pub(crate) struct RuntimeDir {
    pub(crate) path: PathBuf,
}

/// Where runtime directories are made, first choice first: a socket path must fit in 108 bytes, so the short
/// per-user runtime directory, then TMPDIR, then /tmp, then /dev/shm (a filesystem of its own: /tmp out of
/// inodes need not mean it is), then `last` (the trace's own folder: where the user could write).
fn bases(last: Option<&Path>) -> Vec<PathBuf> {
    let mut bases: Vec<PathBuf> = Vec::new();
    for var in ["XDG_RUNTIME_DIR", "TMPDIR"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            bases.push(PathBuf::from(v));
        }
    }
    bases.push(PathBuf::from("/tmp"));
    bases.push(PathBuf::from("/dev/shm"));
    if let Some(l) = last.and_then(|l| std::path::absolute(l).ok()) {
        bases.push(l);
    }
    bases.retain(|b| b.as_os_str().len() < 80);
    let mut seen = std::collections::HashSet::new();
    bases.retain(|b| seen.insert(b.clone()));
    bases
}

/// No runtime directory could be made anywhere: the job then runs untraced (`run` says what is lost).
#[derive(Debug)]
pub struct NoRuntimeDir {
    pub tried: Vec<PathBuf>,
    pub last: Option<io::Error>,
}

impl std::fmt::Display for NoRuntimeDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tried: Vec<String> = self.tried.iter().map(|p| p.display().to_string()).collect();
        write!(
            f,
            "cannot create a private runtime directory in {}: {}",
            tried.join(", "),
            self.last
                .as_ref()
                .map_or("no usable base directory".into(), |e| e.to_string())
        )
    }
}

impl std::error::Error for NoRuntimeDir {}

impl RuntimeDir {
    /// Makes a fresh directory (mode 0700, ours), after removing the stale ones of this user; `last` is the
    /// base tried after the usual ones.
    pub(crate) fn create(last: Option<&Path>) -> Result<RuntimeDir, NoRuntimeDir> {
        let bases = bases(last);
        // The usual bases are cleaned every run; the last resorts (/dev/shm, the trace's folder: maybe large, or
        // on a network filesystem) only when one is tried.
        let last = last.and_then(|l| std::path::absolute(l).ok());
        let usual = |b: &PathBuf| b != Path::new("/dev/shm") && Some(b) != last.as_ref();
        for base in bases.iter().filter(|b| usual(b)) {
            clean_stale(base);
        }
        let mut err = None;
        for base in &bases {
            if !usual(base) {
                clean_stale(base);
            }
            let Ok(template) =
                CString::new(base.join(format!("{PREFIX}XXXXXX")).as_os_str().as_bytes())
            else {
                continue;
            };
            let mut raw = template.into_bytes_with_nul();
            // SAFETY: `raw` is a NUL-terminated template we own; mkdtemp rewrites its six X's in place.
            let p = unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) };
            if p.is_null() {
                err = Some(io::Error::last_os_error());
                continue;
            }
            raw.pop();
            let dir = RuntimeDir {
                path: PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(&raw))),
            };
            // Without it (a full disk) the directory is only never cleaned by another run; ours removes it.
            let _ = write_owner(&dir.path);
            return Ok(dir);
        }
        Err(NoRuntimeDir {
            tried: bases,
            last: err,
        })
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Who a collector is: pid, its start time (clock ticks since boot, /proc/<pid>/stat field 22), pid namespace,
/// boot id.
#[derive(Debug, PartialEq, Eq)]
struct Owner {
    pid: u32,
    start: u64,
    pid_ns: String,
    boot: String,
}

impl Owner {
    fn me() -> Option<Owner> {
        let pid = std::process::id();
        Some(Owner {
            pid,
            start: start_time(pid)?,
            pid_ns: pid_ns()?,
            boot: boot_id()?,
        })
    }

    fn to_text(&self) -> String {
        format!(
            "pid {}\nstart {}\npid_ns {}\nboot {}\n",
            self.pid, self.start, self.pid_ns, self.boot
        )
    }

    fn parse(text: &str) -> Option<Owner> {
        let get = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(str::to_string)
        };
        Some(Owner {
            pid: get("pid")?.parse().ok()?,
            start: get("start")?.parse().ok()?,
            pid_ns: get("pid_ns")?,
            boot: get("boot")?,
        })
    }
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: after the last ')', the start time is the 20th field.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

fn pid_ns() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

fn write_owner(dir: &Path) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(me) = Owner::me() else {
        return Ok(());
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(OWNER_FILE))?;
    f.write_all(me.to_text().as_bytes())
}

/// Whether the directory `dir` (already checked to be ours) belongs to a collector that is gone.
fn is_stale(dir: &Path, me: &Owner) -> bool {
    // Read without following a link, and only a small regular file.
    let owner = dir.join(OWNER_FILE);
    let Ok(meta) = std::fs::symlink_metadata(&owner) else {
        return false;
    };
    if !meta.is_file() || meta.len() > 4096 || meta.uid() != me_uid() {
        return false;
    }
    let Some(o) = std::fs::read_to_string(&owner)
        .ok()
        .and_then(|t| Owner::parse(&t))
    else {
        return false;
    };
    if o.pid_ns != me.pid_ns || o.boot != me.boot {
        return false;
    }
    if o.pid == me.pid && o.start == me.start {
        return false;
    }
    start_time(o.pid) != Some(o.start)
}

fn me_uid() -> u32 {
    // SAFETY: no arguments and no preconditions; it cannot fail.
    unsafe { libc::geteuid() }
}

/// Removes this user's runtime directories under `base` whose collector is gone. The number removed.
pub(crate) fn clean_stale(base: &Path) -> usize {
    // /proc must be our pid namespace's (not so after `unshare -p` without mounting /proc anew): else the
    // start times read there are another process's, and a live collector's folder could look stale.
    let ours = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id());
    let Some(me) = Owner::me().filter(|_| ours) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten().take(100_000) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(PREFIX) || name.len() != PREFIX.len() + 6 {
            continue;
        }
        let path = e.path();
        // Ours, a real directory, closed to others.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me_uid() {
            continue;
        }
        if is_stale(&path, &me) && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// 64 random bits for names nobody else may guess (the socket, the ledger, an output's temporary, the job's
/// token).
pub(crate) fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: `v` is a local u64, 8 bytes, as the call is told.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n != 8 {
        // No entropy source: still unlikely to be guessed by someone who cannot list the directory.
        v = vramtrace_format::ticks::monotonic() ^ (std::process::id() as u64) << 32;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(name: &str) -> PathBuf {
        let b = std::env::temp_dir().join(format!("vramtrace-rt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&b);
        std::fs::create_dir_all(&b).unwrap();
        b
    }

    /// A runtime directory under `base` whose collector is `o`.
    fn planted(base: &Path, tail: &str, o: Option<&Owner>) -> PathBuf {
        let d = base.join(format!("{PREFIX}{tail}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("sock-1"), b"").unwrap();
        if let Some(o) = o {
            std::fs::write(d.join(OWNER_FILE), o.to_text()).unwrap();
        }
        d
    }

    #[test]
    fn a_dead_collectors_directory_is_removed_and_a_live_ones_kept() {
        let b = base("stale");
        let me = Owner::me().unwrap();
        // A child that has exited and been reaped: a pid no process has now (or another's, started later).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let dead = planted(
            &b,
            "dead01",
            Some(&Owner {
                pid: gone,
                start: 1,
                ..Owner::me().unwrap()
            }),
        );
        let live = planted(&b, "live01", Some(&me));
        // Its pid, but another start: the pid was reused, its collector is gone.
        let reused = planted(
            &b,
            "reuse1",
            Some(&Owner {
                start: me.start + 1,
                ..Owner::me().unwrap()
            }),
        );
        // Another pid namespace or boot: not ours to judge.
        let other_ns = planted(
            &b,
            "ns0001",
            Some(&Owner {
                pid: gone,
                pid_ns: "pid:[1]".into(),
                ..Owner::me().unwrap()
            }),
        );
        let no_file = planted(&b, "nofile", None);
        assert_eq!(clean_stale(&b), 2);
        assert!(!dead.exists() && !reused.exists());
        assert!(live.exists() && other_ns.exists() && no_file.exists());
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn links_and_other_names_are_never_followed_or_removed() {
        let b = base("links");
        let target = base("links-target");
        let victim = planted(
            &target,
            "victim",
            Some(&Owner {
                pid: u32::MAX - 1,
                start: 1,
                ..Owner::me().unwrap()
            }),
        );
        // A link named like a runtime directory, pointing at a stale-looking one elsewhere.
        std::os::unix::fs::symlink(&victim, b.join(format!("{PREFIX}link01"))).unwrap();
        // A directory whose owner file is a link.
        let d = b.join(format!("{PREFIX}flink1"));
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(victim.join(OWNER_FILE), d.join(OWNER_FILE)).unwrap();
        // Another name.
        let other = b.join("vramtrace-notours-at-all");
        std::fs::create_dir(&other).unwrap();
        assert_eq!(clean_stale(&b), 0);
        assert!(victim.exists() && d.exists() && other.exists());
        std::fs::remove_dir_all(&b).unwrap();
        std::fs::remove_dir_all(&target).unwrap();
    }

    #[test]
    fn a_new_directory_names_its_collector() {
        let dir = RuntimeDir::create(None).unwrap();
        let o = Owner::parse(&std::fs::read_to_string(dir.path.join(OWNER_FILE)).unwrap());
        assert_eq!(o, Owner::me());
        let path = dir.path.clone();
        drop(dir);
        assert!(!path.exists());
    }
}
