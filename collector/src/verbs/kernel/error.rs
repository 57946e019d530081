//! Why `vramtrace kernel` failed: one error for installing, listing, removing and launching, each said in one
//! line, with the exit code it gives.

use std::path::PathBuf;

use crate::files::out_file::OutError;
use crate::process::exit::{self, Code};

/// Why a kernel could not be installed, listed or removed; each says it in one line.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel name {0:?}: {1}")]
    BadName(String, &'static str),
    #[error("--cap {0}: {1}")]
    BadCap(String, String),
    #[error(
        "HOME is not set (or not absolute): nowhere to keep the kernel; set HOME or XDG_DATA_HOME"
    )]
    NoHome,
    #[error("no Python at {0}; name one with --python PATH")]
    NoPython(PathBuf),
    #[error("{0} did not answer as a Python 3 would; name another with --python PATH")]
    NotPython(PathBuf),
    #[error("{0} cannot import {1}: install it there (`{0} -m pip install {1}`) or name another with --python")]
    Lacks(PathBuf, &'static str),
    #[error("{0} has the vramtrace package {1}, this vramtrace is {v}: install the same version there (`{0} -m pip install vramtrace=={v}`)", v = env!("CARGO_PKG_VERSION"))]
    OtherVersion(PathBuf, String),
    #[error("a kernel {0:?} exists ({1}); add --force to replace it, or choose another --name")]
    Exists(String, PathBuf),
    #[error("the kernel {0:?} is installed at {1}: `vramtrace kernel remove {0}` first")]
    Elsewhere(String, PathBuf),
    #[error("the kernel {0:?} at {1} is not one vramtrace installed: left as it is; choose another --name")]
    NotOurs(String, PathBuf),
    #[error("no kernel {0:?} installed by vramtrace (`vramtrace kernel list` shows them)")]
    NotFound(String),
    #[error("{0} is not a private folder of this user's own (a link, another user's, or open to others): not used")]
    NotPrivate(PathBuf),
    #[error("{0} is not UTF-8: it cannot be written into a kernel spec (JSON)")]
    NotUtf8(PathBuf),
    #[error("{0} still holds files vramtrace did not write: left there")]
    NotEmpty(PathBuf),
    #[error(transparent)]
    Out(#[from] OutError),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

impl KernelError {
    /// Bad input is 2 (nothing changed); a failure of the system's is 1.
    pub(super) fn code(&self) -> Code {
        match self {
            KernelError::Io(..) | KernelError::NotEmpty(_) => exit::FAILURE,
            _ => exit::USAGE,
        }
    }
}
