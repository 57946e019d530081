//! The kernel spec Jupyter reads (`kernel.json`): its command runs the kernel under `vramtrace run`
//! (`vramtrace kernel launch`, [`super::launch`]), and its `metadata.vramtrace` marks it as ours, with what
//! `kernel list` shows.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a spec of ours records (`metadata.vramtrace`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ours {
    /// The binary's version that wrote it.
    pub version: String,
    /// Where each session's trace goes.
    pub traces: PathBuf,
    /// The kernel's Python.
    pub python: PathBuf,
    pub cap: Option<String>,
    /// Sessions kept (`kernel launch --keep`; 0: all). Absent in a spec of an earlier build: all kept.
    #[serde(default)]
    pub keep_sessions: u32,
}

/// The parts of `kernel.json` we write and read back.
#[derive(Debug, Serialize, Deserialize)]
pub struct Spec {
    pub argv: Vec<String>,
    pub display_name: String,
    pub language: String,
    /// `message`: Jupyter asks the kernel to interrupt itself. Its default (`signal`) sends SIGINT to the process
    /// group, `vramtrace run` included, which passes it on: the kernel would get it twice.
    #[serde(default)]
    pub interrupt_mode: String,
    #[serde(default)]
    pub metadata: Metadata,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vramtrace: Option<Ours>,
}

/// The extension the kernel loads at start (`%load_ext vramtrace`).
pub const EXTENSION: &str = "vramtrace";

impl Spec {
    /// The spec of a traced kernel: `vramtrace kernel launch --traces DIR [--cap SPEC] -- PYTHON -m
    /// ipykernel_launcher -f {connection_file} --ext vramtrace`.
    pub fn new(exe: &Path, ours: Ours, display_name: String) -> Spec {
        let mut argv = vec![
            text(exe),
            "kernel".into(),
            "launch".into(),
            "--traces".into(),
            text(&ours.traces),
            "--keep".into(),
            ours.keep_sessions.to_string(),
        ];
        if let Some(cap) = &ours.cap {
            argv.extend(["--cap".into(), cap.clone()]);
        }
        argv.extend([
            "--".into(),
            text(&ours.python),
            "-m".into(),
            "ipykernel_launcher".into(),
            "-f".into(),
            "{connection_file}".into(),
            "--ext".into(),
            EXTENSION.into(),
        ]);
        Spec {
            argv,
            display_name,
            language: "python".into(),
            interrupt_mode: "message".into(),
            metadata: Metadata {
                vramtrace: Some(ours),
            },
        }
    }

    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a spec is always JSON");
        s.push('\n');
        s
    }

    /// A `kernel.json` read back; None when it is not JSON, or not a spec.
    pub fn parse(text: &str) -> Option<Spec> {
        serde_json::from_str(text).ok()
    }

    /// What it records of ours; None for a kernel vramtrace did not write.
    pub fn ours(&self) -> Option<&Ours> {
        self.metadata.vramtrace.as_ref()
    }
}

/// JSON holds text: a path that is not UTF-8 cannot be written into a spec (refused before: [`utf8`]).
fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Whether `p` can go into a spec unchanged.
pub fn utf8(p: &Path) -> bool {
    p.to_str().is_some()
}

/// The spec's folder named in a kernel's `spec` file.
pub fn pointer_target(bytes: Vec<u8>) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let mut b = bytes;
    while b.last() == Some(&b'\n') {
        b.pop();
    }
    PathBuf::from(OsString::from_vec(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_runs_the_kernel_under_vramtrace_and_reads_back() {
        let ours = Ours {
            version: "9.9.9".into(),
            traces: "/home/u/.local/share/vramtrace/kernels/k".into(),
            python: "/venv/bin/python3".into(),
            cap: Some("20GiB".into()),
            keep_sessions: 20,
        };
        let s = Spec::new(Path::new("/venv/bin/vramtrace"), ours.clone(), "K".into());
        let back = Spec::parse(&s.to_json()).unwrap();
        assert_eq!(
            back.argv,
            [
                "/venv/bin/vramtrace",
                "kernel",
                "launch",
                "--traces",
                "/home/u/.local/share/vramtrace/kernels/k",
                "--keep",
                "20",
                "--cap",
                "20GiB",
                "--",
                "/venv/bin/python3",
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
                "--ext",
                "vramtrace"
            ]
        );
        assert_eq!(back.ours(), Some(&ours));
        assert_eq!(back.interrupt_mode, "message");
        // Another's kernel (ipykernel's own) is not ours.
        let theirs = r#"{"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                         "display_name": "Python 3", "language": "python", "interrupt_mode": "signal",
                         "metadata": {"debugger": true}}"#;
        assert!(Spec::parse(theirs).unwrap().ours().is_none());
        assert!(Spec::parse("not json").is_none());
        // A spec of an earlier build, without keep_sessions: read back as keeping all.
        let earlier = r#"{"argv": [], "display_name": "K", "language": "python",
                          "metadata": {"vramtrace": {"version": "0.1.0", "traces": "/t", "python": "/p", "cap": null}}}"#;
        assert_eq!(
            Spec::parse(earlier).unwrap().ours().unwrap().keep_sessions,
            0
        );
    }
}
