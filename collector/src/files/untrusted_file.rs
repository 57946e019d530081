//! Opening a file whose contents nobody vouches for: a trace, a snapshot it names, an object file its stacks
//! name. Only a regular file is opened: a FIFO would wait for a writer for good, a character device
//! (`/dev/zero`, a terminal) never ends or has side effects, a socket is not a file. The path is looked at
//! first (a device is never opened by a name it was given), then opened without waiting (`O_NONBLOCK`: a FIFO
//! swapped in between is opened at once, not waited on) and the file actually opened is checked again
//! (`fstat`), so a swap between the look and the open is caught; waiting is then turned back on for reading.
//!
//! A regular file can still be a pseudo-file that waits or takes what it gives (`/proc/kmsg` hands out the
//! kernel's log, once): such files say they hold 0 bytes, so [`read_whole`] reads at most what `fstat` says,
//! and nothing of an empty file.
//!
//! Links are followed (no `O_NOFOLLOW`). A trace given on the command line is the user's own choice, and a
//! link to it is as good as the file. Separate debug files are found by build id through links by design
//! (`/usr/lib/debug/.build-id/xx/....debug`). For paths a trace names, refusing a link in the last component
//! would add nothing: the process that writes the name can name the link's target itself, and links in the
//! directories above are followed whatever the flag. What a reader can be led to is bounded by what it does
//! with the file, not by how it got there: a regular file only, read in bounded memory and time, and parsed
//! as a pickle or an ELF object (only what those say reaches the output).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Why a path is not read: the kind of file it is, when it is not a regular file.
fn not_regular(t: std::fs::FileType) -> io::Error {
    if t.is_dir() {
        return io::Error::new(io::ErrorKind::IsADirectory, "is a directory");
    }
    let what = if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({what}): not read"),
    )
}

/// An I/O error as a person reads it: "no such file or directory", without Rust's " (os error 2)".
pub fn said(e: &io::Error) -> String {
    let s = e.to_string();
    let s = match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => &s[..i],
        _ => &s,
    };
    let mut c = s.chars();
    c.next().map_or(String::new(), |f| {
        f.to_lowercase().chain(c).collect::<String>()
    })
}

/// `path` opened for reading if it is a regular file (links followed), else why not.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let t = std::fs::metadata(path)?.file_type();
    if !t.is_file() {
        return Err(not_regular(t));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        return Err(not_regular(t));
    }
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(f)
}

/// The whole regular file at `path`, if it holds at most `max` bytes: read up to the size `fstat` gives when
/// it is opened (a file growing meanwhile is read as it was), never a byte of a file that says it is empty.
pub fn read_whole(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata()?.len();
    if len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "empty (a pseudo-file such as /proc/kmsg says so too): not read",
        ));
    }
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, over the {} MiB this reads", max >> 20),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened_and_pseudo_files_are_not_read() {
        let dir = std::env::temp_dir().join(format!("vt-untrusted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&fifo).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
        let e = open_regular(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a character device"), "{e}");
        // Through a link: what it leads to is what counts.
        let link = dir.join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(open_regular(&link).is_err());
        assert!(open_regular(&dir).is_err());
        // /proc/self/status is a regular file that says it holds 0 bytes, like /proc/kmsg.
        let e = read_whole(Path::new("/proc/self/status"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let f = dir.join("f");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(read_whole(&f, 3).unwrap(), b"abc");
        assert!(read_whole(&f, 2).unwrap_err().to_string().contains("over"));
        std::fs::symlink_metadata(&f).unwrap();
        assert_eq!(read_whole(&link.with_file_name("f"), 3).unwrap(), b"abc");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
