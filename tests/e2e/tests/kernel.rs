//! `vramtrace kernel`: a real Jupyter kernel started from the installed spec by jupyter_client (as JupyterLab
//! starts one), on the simulated driver with the stand-in torch, cells that fill the memory and fail, and the
//! `%vramtrace` magics' answers as the notebook gets them (text and HTML); the trace it kept; `kernel remove`
//! leaving nothing. scripts/test.sh makes the environment with jupyter_client and ipykernel (from the package
//! index, cached in target/jupyter-venv) and names its Python in VRAMTRACE_JUPYTER_PYTHON.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use vramtrace_e2e::traced::vramtrace;
use vramtrace_e2e::{fake_torch, wait_with_timeout, FakeCuda};

const NAME: &str = "nb-test";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn jupyter_python() -> Option<PathBuf> {
    match std::env::var_os("VRAMTRACE_JUPYTER_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs scripts/test.sh, which must set VRAMTRACE_JUPYTER_PYTHON"
            );
            eprintln!(
                "SKIP: VRAMTRACE_JUPYTER_PYTHON unset (scripts/test.sh makes the environment)"
            );
            None
        }
    }
}

/// The simulated driver (one 8 GiB GPU), the stand-in torch and the checkout's `vramtrace` package on
/// PYTHONPATH, and a home of the test's own (where Jupyter and vramtrace keep kernels).
fn setup() -> (FakeCuda, PathBuf) {
    let fake = FakeCuda::new()
        .env("FAKECUDA_DEVICES", "1")
        .env("FAKECUDA_DEVICE_BYTES", "8G");
    let site = fake_torch(&fake);
    let home = fake.dir().join("home");
    std::fs::create_dir(&home).unwrap();
    let mut path = std::ffi::OsString::from(repo().join("python"));
    path.push(":");
    path.push(&site);
    let fake = fake
        .env("PYTHONPATH", path)
        .env("HOME", &home)
        .env("JUPYTER_RUNTIME_DIR", home.join("jupyter-runtime"))
        .env("XDG_DATA_HOME", home.join("data"));
    (fake, home)
}

fn kernel(fake: &FakeCuda, args: &[&str]) -> Output {
    fake.command(vramtrace())
        .arg("kernel")
        .args(args)
        .env_remove("JUPYTER_DATA_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("vramtrace kernel")
}

fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit 2 and one line on stderr: the documented answer to bad input.
fn refused(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
    assert!(err.starts_with("vramtrace: "), "{what}: {err}");
    err
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o777
}

/// The cells' outputs as jupyter_client received them (tests/e2e/py/kernel_session.py).
fn session(fake: &FakeCuda, python: &Path, cells: &[&str]) -> Vec<serde_json::Value> {
    let mut c = fake.command(python);
    c.arg(repo().join("tests/e2e/py/kernel_session.py"))
        .arg(NAME)
        .arg(serde_json::to_string(cells).unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let r = wait_with_timeout(
        c.spawn().unwrap(),
        Duration::from_secs(180),
        "the kernel session",
    );
    r.assert_success("the kernel session");
    serde_json::from_str::<serde_json::Value>(&r.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
        .as_array()
        .unwrap()
        .clone()
}

/// A cell's one result: (text/plain, text/html).
fn shown(cell: &serde_json::Value) -> (String, String) {
    let outs: Vec<&serde_json::Value> = cell["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "execute_result")
        .collect();
    assert_eq!(outs.len(), 1, "{cell}");
    let data = &outs[0]["data"];
    (
        data["text/plain"].as_str().unwrap().to_string(),
        data["text/html"].as_str().unwrap().to_string(),
    )
}

fn stdout(cell: &serde_json::Value) -> String {
    cell["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "stream" && o["name"] == "stdout")
        .map(|o| o["text"].as_str().unwrap())
        .collect()
}

#[test]
fn a_traced_kernel_names_what_holds_the_memory_after_a_failed_cell_and_leaves_nothing_when_removed()
{
    let Some(python) = jupyter_python() else {
        return;
    };
    let (fake, home) = setup();
    let data = home.join("data");
    let py = python.to_str().unwrap();
    let out = ok(
        &kernel(
            &fake,
            &["install", "--name", NAME, "--cap", "4GiB", "--python", py],
        ),
        "kernel install",
    );
    let spec_dir = data.join("jupyter/kernels").join(NAME);
    let own = data.join("vramtrace/kernels").join(NAME);
    assert!(
        out.contains(&spec_dir.join("kernel.json").display().to_string()),
        "{out}"
    );
    assert_eq!(mode(&spec_dir), 0o700);
    assert_eq!(mode(&spec_dir.join("kernel.json")), 0o600);
    assert_eq!(mode(&own), 0o700);

    let cells = session(
        &fake,
        &python,
        &[
            "import torch\nkept = [torch.empty_cuda(1 << 30) for _ in range(3)]",
            // Past the 4 GiB cap: PyTorch's out-of-memory error.
            "more = [torch.empty_cuda(1 << 30) for _ in range(10)]",
            "%vramtrace",
            "%vramtrace holders",
            "%vramtrace report",
            "%vramtrace whatif",
            "import vramtrace\nprint(vramtrace.trace_path())\nprint(vramtrace.oom()['ooms'][0]['cause'])",
            "%vramtrace nonsense",
            // Interrupted once (the spec asks for interrupts as messages: a signal to the process group would
            // reach the kernel twice, once from Jupyter and once passed on by `run`).
            "# interrupt\nimport time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('once')\n    time.sleep(1)\n    print('not twice')",
        ],
    );
    assert_eq!(cells[0]["status"], "ok", "{}", cells[0]);
    assert_eq!(cells[1]["ename"], "OutOfMemoryError", "{}", cells[1]);

    // %vramtrace: the post-mortem of that error, as `vramtrace oom` prints it, and escaped in the HTML.
    let (text, page) = shown(&cells[2]);
    for want in [
        "OUT OF MEMORY on GPU 0",
        "CAUSE: cap (the vramtrace cap)",
        "kept (list, global of __main__)",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert!(page.starts_with("<div class=\"vramtrace\""), "{page}");
    assert!(page.contains("<pre"), "{page}");
    // The site of the request is the cell (`<listcomp>`; `<module>` from Python 3.12, which inlines
    // comprehensions): markup in the HTML would hide it.
    let site = ["<listcomp>", "<module>"]
        .into_iter()
        .find(|s| text.contains(&format!("in {s}")))
        .unwrap_or_else(|| panic!("{text}"));
    let escaped = site.replace('<', "&lt;").replace('>', "&gt;");
    assert!(
        page.contains(&format!("in {escaped}")) && !page.contains(site),
        "{page}"
    );

    // %vramtrace holders: what holds the memory now, the failed cell's tensors gone.
    let (text, page) = shown(&cells[3]);
    let row = text
        .lines()
        .find(|l| l.starts_with("kept (list, global of __main__)"))
        .unwrap_or_else(|| panic!("no row for kept: {text}"));
    assert_eq!(
        row.split_whitespace().rev().take(4).collect::<Vec<_>>(),
        ["variable", "3", "GiB", "3.00"],
        "{row}"
    );
    assert!(
        text.starts_with("3 CUDA tensors, 3.00 GiB, held by:"),
        "{text}"
    );
    assert!(
        text.contains("PyTorch's cache (reserved but free)"),
        "{text}"
    );
    assert!(
        page.contains("<td style=\"text-align:left\">kept (list, global of __main__)</td><td style=\"text-align:right\">3.00 GiB</td>"),
        "{page}"
    );

    // %vramtrace report and whatif: the command line's figures.
    let (text, _) = shown(&cells[4]);
    assert!(text.contains("GPU 0  peak 4.00 GiB"), "{text}");
    let (text, _) = shown(&cells[5]);
    assert!(text.starts_with("What if: "), "{text}");

    // The API, in the kernel: its trace, and the verbs' JSON.
    let printed = stdout(&cells[6]);
    let mut lines = printed.lines();
    let trace = PathBuf::from(lines.next().unwrap());
    assert_eq!(lines.next(), Some("cap"), "{printed}");
    assert_eq!(trace.parent(), Some(own.as_path()), "{printed}");
    assert!(trace.extension().is_some_and(|e| e == "vtrace"));

    // A verb it does not know: its usage, as an error.
    let (text, _) = shown(&cells[7]);
    assert!(
        text.contains("no verb 'nonsense'") && text.contains("usage: %vramtrace"),
        "{text}"
    );

    assert_eq!(stdout(&cells[8]), "once\nnot twice\n", "{}", cells[8]);

    // The trace, once the kernel is gone: the user's alone, and it names the error and what held the memory.
    assert_eq!(mode(&trace), 0o600);
    let o = Command::new(vramtrace())
        .args(["oom", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_str(&ok(&o, "oom --json")).unwrap();
    assert_eq!(j["ooms"][0]["cause"], "cap", "{j}");
    assert!(j.to_string().contains("kept"), "{j}");
    let listed = ok(&kernel(&fake, &["list"]), "kernel list");
    assert!(
        listed.contains(&format!("{NAME}  \"Python (vramtrace, cap 4GiB)\"")),
        "{listed}"
    );
    assert!(
        listed.contains(&format!(
            "1 session, the latest {}",
            trace.file_name().unwrap().to_str().unwrap()
        )),
        "{listed}"
    );

    // Removed: the spec, the traces and our folders; Jupyter's own folder stays as Jupyter keeps it.
    let out = ok(&kernel(&fake, &["remove", NAME]), "kernel remove");
    assert!(out.contains("removed the kernel"), "{out}");
    assert!(!spec_dir.exists());
    assert!(
        !data.join("vramtrace").exists(),
        "vramtrace's folder is left"
    );
    let left: Vec<_> = std::fs::read_dir(data.join("jupyter/kernels"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let o = kernel(&fake, &["list"]);
    assert!(ok(&o, "list").starts_with("no kernel installed by vramtrace"));
    refused(&kernel(&fake, &["remove", NAME]), "remove it again");
}

/// A stand-in Python that answers the install's question as one with `ipykernel` and `vramtrace` at these
/// versions (None: cannot import it) and the prefix `prefix` would.
fn fake_python(
    dir: &Path,
    name: &str,
    prefix: &Path,
    ipykernel: Option<&str>,
    vt: Option<&str>,
) -> PathBuf {
    let q = |v: Option<&str>| v.map_or("null".to_string(), |v| format!("\"{v}\""));
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho '{{\"prefix\": \"{}\", \"ipykernel\": {}, \"vramtrace\": {}}}'\n",
            prefix.display(),
            q(ipykernel),
            q(vt)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// A Python with ipykernel and this version's package, in an environment of the test's own.
fn good_python(fake: &FakeCuda) -> PathBuf {
    let env = fake.dir().join("env");
    fake_python(
        fake.dir(),
        "python-good",
        &env,
        Some("7.0"),
        Some(env!("CARGO_PKG_VERSION")),
    )
}

#[test]
fn bad_input_is_one_line_and_exit_2_and_changes_nothing() {
    let (fake, home) = setup();
    let data = home.join("data");
    let kernels = data.join("jupyter/kernels");
    let version = env!("CARGO_PKG_VERSION");
    let env_prefix = fake.dir().join("env");
    let good = fake_python(
        fake.dir(),
        "python-good",
        &env_prefix,
        Some("7.0"),
        Some(version),
    );
    let good = good.to_str().unwrap();
    for (args, says) in [
        (
            vec!["install", "--name", "a/b", "--python", good],
            "never a path",
        ),
        (
            vec!["install", "--name", "..", "--python", good],
            "starts with '.'",
        ),
        (
            vec!["install", "--name", "", "--python", good],
            "it is empty",
        ),
        (vec!["remove", "../x"], "never a path"),
        (
            vec!["remove", "absent"],
            "no kernel \"absent\" installed by vramtrace",
        ),
        (
            vec!["install", "--cap", "lots", "--python", good],
            "--cap lots",
        ),
        (
            vec!["install", "--python", "/nonexistent/python3"],
            "no Python at /nonexistent/python3",
        ),
        (
            vec!["install", "--python", "/bin/true"],
            "did not answer as a Python 3 would",
        ),
    ] {
        let err = refused(&kernel(&fake, &args), &format!("{args:?}"));
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let no_ipykernel = fake_python(fake.dir(), "python-bare", &env_prefix, None, Some(version));
    let err = refused(
        &kernel(
            &fake,
            &["install", "--python", no_ipykernel.to_str().unwrap()],
        ),
        "no ipykernel",
    );
    assert!(err.contains("cannot import ipykernel"), "{err}");
    let old = fake_python(
        fake.dir(),
        "python-old",
        &env_prefix,
        Some("7.0"),
        Some("0.0.1"),
    );
    let err = refused(
        &kernel(&fake, &["install", "--python", old.to_str().unwrap()]),
        "another version",
    );
    assert!(
        err.contains(&format!(
            "has the vramtrace package 0.0.1, this vramtrace is {version}"
        )),
        "{err}"
    );
    assert!(!data.exists(), "bad input wrote something");

    // Another's kernel of that name (ipykernel's own), and a link planted at a name: never replaced, never
    // written through, --force or not.
    std::fs::create_dir_all(kernels.join("python3")).unwrap();
    let theirs = r#"{"argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Python 3", "language": "python"}"#;
    std::fs::write(kernels.join("python3/kernel.json"), theirs).unwrap();
    let elsewhere = fake.dir().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, kernels.join("planted")).unwrap();
    for name in ["python3", "planted"] {
        for force in [false, true] {
            let mut args = vec!["install", "--name", name, "--python", good];
            if force {
                args.push("--force");
            }
            let err = refused(&kernel(&fake, &args), name);
            assert!(err.contains("is not one vramtrace installed"), "{err}");
        }
        // Removed: neither (the link holds no kernel at all).
        let err = refused(&kernel(&fake, &["remove", name]), name);
        let says = match name {
            "python3" => "is not one vramtrace installed",
            _ => "no kernel \"planted\" installed by vramtrace",
        };
        assert!(err.contains(says), "{err}");
    }
    assert_eq!(
        std::fs::read_to_string(kernels.join("python3/kernel.json")).unwrap(),
        theirs
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

    // --sys-prefix: into the Python's environment; `list` and `remove` find it there.
    ok(
        &kernel(
            &fake,
            &[
                "install",
                "--sys-prefix",
                "--name",
                "envk",
                "--python",
                good,
            ],
        ),
        "install --sys-prefix",
    );
    let spec = env_prefix.join("share/jupyter/kernels/envk/kernel.json");
    assert_eq!(mode(&spec), 0o600);
    let err = refused(
        &kernel(
            &fake,
            &[
                "install",
                "--sys-prefix",
                "--name",
                "envk",
                "--python",
                good,
            ],
        ),
        "the same name again",
    );
    assert!(err.contains("add --force"), "{err}");
    // Elsewhere (the user's kernels), even with --force: that would leave this spec behind.
    let err = refused(
        &kernel(
            &fake,
            &["install", "--force", "--name", "envk", "--python", good],
        ),
        "the same name elsewhere",
    );
    assert!(err.contains("vramtrace kernel remove envk` first"), "{err}");
    assert!(ok(&kernel(&fake, &["list"]), "list").contains(&spec.display().to_string()));
    ok(&kernel(&fake, &["remove", "envk"]), "remove envk");
    assert!(!spec.parent().unwrap().exists());
    assert!(!data.join("vramtrace").exists());
}

/// `install` asks the Python what it has from `/`, never from the folder it was run in: an `ipykernel.py` (or
/// `vramtrace.py`) someone left there would run as the user, and could pass the version check.
#[test]
fn install_runs_no_module_planted_in_the_working_folder() {
    let fake = FakeCuda::new();
    let planted = fake.dir().join("planted");
    std::fs::create_dir_all(&planted).unwrap();
    let marker = fake.dir().join("ran");
    for m in ["ipykernel", "vramtrace"] {
        std::fs::write(
            planted.join(format!("{m}.py")),
            format!(
                "open({:?}, 'w').write('{m}')\n__version__ = {:?}\n",
                marker.display().to_string(),
                env!("CARGO_PKG_VERSION")
            ),
        )
        .unwrap();
    }
    let o = fake
        .command(vramtrace())
        .current_dir(&planted)
        .env("HOME", fake.dir())
        .env_remove("JUPYTER_DATA_DIR")
        .args([
            "kernel", "install", "--name", "planted", "--python", "python3",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!marker.exists(), "a planted module ran: {o:?}");
    // The system python3 has neither: refused, in one line.
    let err = refused(&o, "a python without ipykernel");
    assert!(err.contains("cannot import"), "{err}");
}

/// `remove` checks before it deletes: a spec folder that holds a file vramtrace did not write is left whole,
/// its kernel.json and the kernel's traces with it (before, kernel.json went first and the rest was left half).
#[test]
fn remove_leaves_a_spec_folder_holding_others_files_whole() {
    let (fake, home) = setup();
    let kernels = home.join("data/jupyter/kernels");
    let good = good_python(&fake);
    let good = good.to_str().unwrap();
    ok(
        &kernel(&fake, &["install", "--name", "full", "--python", good]),
        "install",
    );
    let spec = kernels.join("full");
    std::fs::write(spec.join("logo-64x64.png"), b"theirs").unwrap();
    let o = kernel(&fake, &["remove", "full"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("still holds files vramtrace did not write"),
        "{err}"
    );
    assert!(spec.join("kernel.json").is_file());
    assert!(home.join("data/vramtrace/kernels/full").is_dir());
}

/// Each session leaves a trace: a kernel started daily would fill the disk. Install records how many sessions
/// to keep, and each launch removes the oldest past it (the trace and what `run` wrote beside it), never a file
/// of another name.
#[test]
fn each_launch_keeps_only_the_newest_sessions() {
    let (fake, home) = setup();
    let good = good_python(&fake);
    ok(
        &kernel(
            &fake,
            &[
                "install",
                "--name",
                "daily",
                "--python",
                good.to_str().unwrap(),
                "--keep-sessions",
                "2",
            ],
        ),
        "install",
    );
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(home.join("data/jupyter/kernels/daily/kernel.json")).unwrap(),
    )
    .unwrap();
    let argv: Vec<&str> = spec["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let traces = home.join("data/vramtrace/kernels/daily");
    assert_eq!(
        argv[1..6],
        [
            "kernel",
            "launch",
            "--traces",
            traces.to_str().unwrap(),
            "--keep"
        ]
    );
    assert_eq!(argv[6], "2");
    let mine = traces.join("my-notes.txt");
    std::fs::write(&mine, b"mine").unwrap();
    let sessions = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&traces)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".vtrace"))
            .collect();
        v.sort();
        v
    };
    let mut started = Vec::new();
    for i in 0..4 {
        // The spec's own command, with a program that ends at once in place of the kernel.
        let o = fake
            .command(vramtrace())
            .args(&argv[1..7])
            .args(["--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        ok(&o, &format!("launch {i}"));
        let now = sessions();
        let new: Vec<String> = now
            .iter()
            .filter(|n| !started.contains(*n))
            .cloned()
            .collect();
        assert_eq!(new.len(), 1, "session {i}: {now:?}");
        started.push(new[0].clone());
        assert_eq!(now.len(), (i + 1).min(2), "session {i}: {now:?}");
        // Stamps are to the second: the next session's name must sort after this one's.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    assert_eq!(sessions(), started[2..], "the newest two are kept");
    assert!(mine.is_file(), "a file of another name is never removed");
    assert!(ok(&kernel(&fake, &["list"]), "list").contains("the newest 2 kept"));
}
