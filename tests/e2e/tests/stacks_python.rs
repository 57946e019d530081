//! Python call sites (shim/src/pystack.rs): the allocating thread's Python frames, read without the GIL.
//!
//! - `walker_reads_what_the_interpreter_says`: `tests/e2e/py/pystack_cases.py` calls the shim's diagnostic
//!   export `vramtrace_debug_pystack` through ctypes (which drops the GIL, as frameworks do around their driver
//!   calls) from the main thread, a `threading.Thread`, nested functions, a method of a class with a non-ASCII
//!   name, functions named in UCS-2 and UCS-4, a generator, a lambda, comprehensions, a recursion, a thread
//!   whose only Python is the threading bootstrap and a thread with no Python at all. Each walk must equal
//!   the interpreter's own view of the same frames, and the frames at marked lines must be exactly where the
//!   script says. Run under every Python found: `python3`, `python3.10`..`python3.14` on `PATH` and in
//!   `/usr/bin` and `/usr/local/bin` (a distribution's statically linked `python3` beside a shared one),
//!   pyenv's versions, and `VRAMTRACE_TEST_PYTHONS` (paths separated by `:`); Pythons older than 3.10 must
//!   be refused with a reason.
//! - `trace_stacks_carry_python_frames`: `tests/e2e/py/alloc_frames.py` allocates through ctypes on the
//!   simulated driver under `vramtrace run`; each allocation's `Stack` record must carry its Python frames.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use vramtrace_e2e::traced::{read_trace, shim};
use vramtrace_e2e::*;
use vramtrace_format::{Api, PyFrame};

fn py_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("py")
}

/// A Python interpreter found on this machine.
#[derive(Debug)]
struct Python {
    exe: PathBuf,
    version: (u32, u32),
}

/// Every distinct Python 3 interpreter found (by the real path of its executable and its `libpython`).
fn pythons() -> Vec<Python> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for dir in ["", "/usr/bin/", "/usr/local/bin/"] {
        candidates.push(format!("{dir}python3").into());
        for v in 10..=14 {
            candidates.push(format!("{dir}python3.{v}").into());
        }
    }
    if let Some(list) = std::env::var_os("VRAMTRACE_TEST_PYTHONS") {
        candidates.extend(std::env::split_paths(&list));
    }
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(Ok(entries)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) {
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        dirs.sort();
        candidates.extend(dirs.into_iter().map(|d| d.join("bin/python3")));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    for exe in candidates {
        let probe = "import sys, os, sysconfig; print(sys.version_info[0], sys.version_info[1], \
                     os.path.realpath(sys.executable), sysconfig.get_config_var('INSTSONAME'), \
                     sysconfig.get_config_var('Py_ENABLE_SHARED'))";
        let Ok(out) = Command::new(&exe).args(["-c", probe]).output() else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let w: Vec<&str> = text.split_whitespace().collect();
        let (Some(major), Some(minor)) = (
            w.first().and_then(|s| s.parse::<u32>().ok()),
            w.get(1).and_then(|s| s.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if major == 3 && seen.insert(w[2..].join(" ")) {
            found.push(Python {
                exe,
                version: (major, minor),
            });
        }
    }
    found
}

/// Line numbers of the `# <name>` markers of a script.
fn markers(script: &Path) -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(script).unwrap();
    let mut m = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some((code, name)) = line.rsplit_once("  # ") {
            if !code.trim().is_empty() && !name.contains(' ') {
                assert!(
                    m.insert(name.to_string(), i as u32 + 1).is_none(),
                    "marker {name} twice"
                );
            }
        }
    }
    m
}

type Frame = (String, u32, String);

#[derive(Debug, Default)]
struct Case {
    rc: i64,
    want: Vec<Frame>,
    got: Vec<Frame>,
}

#[derive(Debug, Default)]
struct Report {
    version: String,
    unsupported: Option<String>,
    cases: BTreeMap<String, Case>,
    bench: Option<(u32, u64, u64)>,
}

fn parse_report(text: &str) -> Report {
    let mut r = Report::default();
    let mut current: Option<(String, Case)> = None;
    let frame = |s: &str| -> Frame {
        let w: Vec<&str> = s.split('\t').collect();
        assert_eq!(w.len(), 3, "frame line {s:?}");
        (w[0].to_string(), w[1].parse().unwrap(), w[2].to_string())
    };
    for line in text.lines() {
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (tag, current.as_mut()) {
            ("version", _) => r.version = rest.to_string(),
            ("unsupported", _) => r.unsupported = Some(rest.to_string()),
            ("case", None) => current = Some((rest.to_string(), Case::default())),
            ("rc", Some((_, c))) => c.rc = rest.parse().unwrap(),
            ("want", Some((_, c))) => c.want.push(frame(rest)),
            ("got", Some((_, c))) => c.got.push(frame(rest)),
            ("end", Some(_)) => {
                let (name, c) = current.take().unwrap();
                r.cases.insert(name, c);
            }
            ("bench", None) => {
                let w: Vec<u64> = rest.split(' ').map(|s| s.parse().unwrap()).collect();
                r.bench = Some((w[0] as u32, w[1], w[2]));
            }
            _ => panic!("unexpected line {line:?} in:\n{text}"),
        }
    }
    r
}

/// Runs the cases script under `python`, from a directory with a non-ASCII name (so the file names decode
/// from a non-ASCII string too). Returns the report and the script's path.
fn run_cases(python: &Python, dir: &Path) -> (Report, PathBuf) {
    let sub = dir.join(format!("données-{}.{}", python.version.0, python.version.1));
    std::fs::create_dir_all(&sub).unwrap();
    let script = sub.join("pystack_cases.py");
    std::fs::copy(py_dir().join("pystack_cases.py"), &script).unwrap();
    let out = Command::new(&python.exe)
        .arg(&script)
        .arg(shim())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        python.exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (parse_report(&stdout), script)
}

/// Checks the innermost frames of `got` against (function, marker) pairs, in the script's file.
fn check_site(
    got: &[Frame],
    script: &Path,
    m: &BTreeMap<String, u32>,
    site: &[(&str, &str)],
    what: &str,
) {
    let file = script.to_str().unwrap();
    assert!(got.len() >= site.len(), "{what}: {got:#?}");
    for (i, (func, marker)) in site.iter().enumerate() {
        let want = (file.to_string(), m[*marker], func.to_string());
        assert_eq!(got[i], want, "{what}: frame {i} of {got:#?}");
    }
}

#[test]
fn walker_reads_what_the_interpreter_says() {
    let pythons = pythons();
    assert!(
        pythons.iter().any(|p| p.version >= (3, 10)),
        "no Python 3.10+ found (python3 on PATH, or VRAMTRACE_TEST_PYTHONS): {pythons:?}"
    );
    let tmp = TempDir::new("pystack");
    let mut tested = Vec::new();
    for py in &pythons {
        let (r, script) = run_cases(py, tmp.path());
        let what = format!("{} ({}.{})", py.exe.display(), py.version.0, py.version.1);
        assert_eq!(
            r.version,
            format!("{}.{}", py.version.0, py.version.1),
            "{what}"
        );
        if py.version < (3, 10) {
            let why = r
                .unsupported
                .unwrap_or_else(|| panic!("{what}: walked: {:?}", r.cases));
            assert!(why.contains("older than 3.10"), "{what}: {why}");
            tested.push(format!("{what}: refused"));
            continue;
        }
        assert_eq!(r.unsupported, None, "{what}");
        let names = [
            "bootstrap_only",
            "comprehension_genexpr",
            "comprehension_listcomp",
            "deep",
            "generator",
            "lambda",
            "main_nested",
            "method",
            "no_python",
            "thread_nested",
            "ucs2",
            "ucs4",
        ];
        assert_eq!(r.cases.keys().collect::<Vec<_>>(), names, "{what}");
        for (name, c) in &r.cases {
            assert_eq!(
                c.got, c.want,
                "{what}: case {name}: the walk differs from the interpreter"
            );
            if name == "no_python" {
                assert_eq!(c.rc, 0, "{what}: a thread without Python");
                assert!(c.got.is_empty());
            } else {
                assert!(c.rc > 0 && !c.got.is_empty(), "{what}: case {name}: {c:?}");
            }
        }
        // Where the script says the frames are, independently of the interpreter's view.
        let m = markers(&script);
        let qual = py.version >= (3, 11);
        let q = |plain: &'static str, qualified: &'static str| if qual { qualified } else { plain };
        let case = |n: &str| &r.cases[n].got;
        check_site(
            case("main_nested"),
            &script,
            &m,
            &[
                ("snap", "snap"),
                ("inner", "inner"),
                ("middle", "middle"),
                ("outer", "outer"),
                ("run", "main_nested"),
                ("<module>", "run"),
            ],
            &what,
        );
        assert_eq!(
            case("main_nested").len(),
            6,
            "{what}: nothing beyond <module>"
        );
        check_site(
            case("method"),
            &script,
            &m,
            &[
                ("snap", "snap"),
                (q("forward", "Modèle.forward"), "forward"),
                ("run", "method"),
            ],
            &what,
        );
        check_site(
            case("ucs2"),
            &script,
            &m,
            &[("snap", "snap"), ("関数", "ucs2"), ("run", "call_ucs2")],
            &what,
        );
        check_site(
            case("ucs4"),
            &script,
            &m,
            &[("snap", "snap"), ("𠀀", "ucs4"), ("run", "call_ucs4")],
            &what,
        );
        check_site(
            case("generator"),
            &script,
            &m,
            &[
                ("snap", "snap"),
                ("generator", "generator"),
                ("run", "call_generator"),
            ],
            &what,
        );
        check_site(
            case("lambda"),
            &script,
            &m,
            &[
                ("snap", "snap"),
                (q("<lambda>", "with_lambda.<locals>.<lambda>"), "lambda"),
                ("with_lambda", "call_f"),
                ("run", "call_lambda"),
            ],
            &what,
        );
        let genexpr = q("<genexpr>", "with_comprehensions.<locals>.<genexpr>");
        check_site(
            case("comprehension_genexpr"),
            &script,
            &m,
            &[
                ("snap", "snap"),
                (genexpr, "genexpr"),
                ("with_comprehensions", "genexpr"),
                ("run", "call_comprehensions"),
            ],
            &what,
        );
        // List comprehensions have their own frame up to 3.11 and are inlined from 3.12 (PEP 709).
        let mut listcomp = vec![("snap", "snap")];
        if py.version < (3, 12) {
            listcomp.push((
                q("<listcomp>", "with_comprehensions.<locals>.<listcomp>"),
                "listcomp",
            ));
        }
        listcomp.extend([
            ("with_comprehensions", "listcomp"),
            ("run", "call_comprehensions"),
        ]);
        check_site(
            case("comprehension_listcomp"),
            &script,
            &m,
            &listcomp,
            &what,
        );
        let mut deep = vec![("snap", "snap"), ("deep", "deep_snap")];
        deep.extend([("deep", "deep"); 5]);
        deep.push(("run", "call_deep"));
        check_site(case("deep"), &script, &m, &deep, &what);
        // Other threads: their frames end in the threading module's bootstrap.
        let bootstrap = [
            q("run", "Thread.run"),
            q("_bootstrap_inner", "Thread._bootstrap_inner"),
            q("_bootstrap", "Thread._bootstrap"),
        ];
        let t = case("thread_nested");
        check_site(
            t,
            &script,
            &m,
            &[
                ("snap", "snap"),
                ("inner", "inner"),
                ("middle", "middle"),
                ("outer", "outer"),
            ],
            &what,
        );
        for got in [&t[4..], &case("bootstrap_only")[..]] {
            let funcs: Vec<&str> = got.iter().map(|f| f.2.as_str()).collect();
            assert_eq!(funcs, bootstrap, "{what}: {got:#?}");
            assert!(
                got.iter()
                    .all(|f| f.0.ends_with("/threading.py") && f.1 > 0),
                "{what}: {got:#?}"
            );
        }
        let (frames, ns, ctypes_ns) = r.bench.unwrap();
        assert_eq!(frames, 20, "{what}: bench depth");
        eprintln!(
            "{what}: one walk of 20 frames {ns} ns ({} build of the shim); the ctypes call of the text export \
             {ctypes_ns} ns",
            if cfg!(debug_assertions) { "debug" } else { "release" }
        );
        tested.push(format!("{what}: walked"));
    }
    eprintln!("Pythons tested:\n  {}", tested.join("\n  "));
}

/// Runs `alloc_frames.py` under `vramtrace run` with `python3`; every allocation's stack carries its Python
/// frames, innermost first, in the script's file, at the marked lines.
#[test]
fn trace_stacks_carry_python_frames() {
    let python = pythons()
        .into_iter()
        .find(|p| p.version >= (3, 10))
        .expect("a Python 3.10+");
    let fake = FakeCuda::new();
    let script = fake.dir().join("alloc_frames.py");
    std::fs::copy(py_dir().join("alloc_frames.py"), &script).unwrap();
    let (r, trace) = fake.traced("python", &[], &python.exe, &[&script]);
    r.assert_success("alloc_frames.py under vramtrace run");
    assert!(r.stdout.contains("ok"), "{}", r.stdout);
    let t = read_trace(&trace);
    t.assert_stacks_precede_their_events();
    assert!(
        t.notes.is_empty(),
        "no note (the walker read this Python): {:?}",
        t.notes
    );
    assert_eq!(t.pids().len(), 1);
    let pid = t.pids()[0];
    let allocs: Vec<_> = t.events[&pid]
        .iter()
        .filter(|e| e.api == Api::MemAlloc)
        .copied()
        .collect();
    let sizes: Vec<u64> = allocs.iter().map(|e| e.size).collect();
    assert_eq!(sizes, vec![64 * MIB, 16 * MIB, 1 << 40]);
    assert_ne!(allocs[2].result, 0, "1 TiB is refused");
    let m = markers(&script);
    let file = script.to_str().unwrap().to_string();
    let at = |func: &str, marker: &str| PyFrame {
        file: file.clone(),
        function: func.to_string(),
        line: m[marker],
    };
    let qual = python.version >= (3, 11);
    let python_of = |i: usize| {
        let e = &allocs[i];
        assert_ne!(e.stack, 0, "allocation {i} has a stack: {e:?}");
        let s = t.stack(pid, e.stack).unwrap();
        assert!(!s.native.is_empty(), "{s:?}");
        s.python.clone()
    };
    // Main thread, through a method.
    let method = if qual { "Modèle.poids" } else { "poids" };
    assert_eq!(
        python_of(0),
        vec![
            at("alloc", "alloc"),
            at(method, "poids"),
            at("main", "main_poids"),
            at("<module>", "run"),
        ]
    );
    // Another thread: the script's frames, then the threading bootstrap.
    let thread = python_of(1);
    assert_eq!(
        thread[..2],
        [at("alloc", "alloc"), at("activations", "activations")]
    );
    let funcs: Vec<&str> = thread[2..].iter().map(|f| f.function.as_str()).collect();
    let want: &[&str] = if qual {
        &["Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap"]
    } else {
        &["run", "_bootstrap_inner", "_bootstrap"]
    };
    assert_eq!(funcs, want, "{thread:#?}");
    // A failed allocation gets its call site whatever its size.
    assert_eq!(
        python_of(2),
        vec![
            at("alloc", "alloc"),
            at("main", "too_much"),
            at("<module>", "run")
        ]
    );
}

/// An allocation made while the interpreter is being torn down (a `__del__` run at finalization) records native
/// frames only: the frames and code objects the walker would read are being freed.
#[test]
fn no_python_frames_are_read_while_the_interpreter_finalizes() {
    let python = pythons()
        .into_iter()
        .find(|p| p.version >= (3, 10))
        .expect("a Python 3.10+");
    let fake = FakeCuda::new();
    let script = py_dir().join("alloc_at_finalization.py");
    let (r, trace) = fake.traced("finalizing", &[], &python.exe, &[&script]);
    r.assert_success("alloc_at_finalization.py");
    let t = read_trace(&trace);
    let pid = t.pids()[0];
    let by_size = |size: u64| {
        let e = t.events[&pid]
            .iter()
            .find(|e| e.api == Api::MemAlloc && e.size == size)
            .unwrap_or_else(|| panic!("an allocation of {size}"));
        t.stack(pid, e.stack).expect("a call site").clone()
    };
    let running = by_size(4 * MIB);
    assert!(
        running.python.iter().any(|f| f.function == "running"),
        "{:?}",
        running.python
    );
    let teardown = by_size(8 * MIB);
    assert!(teardown.python.is_empty(), "{:?}", teardown.python);
    assert!(!teardown.native.is_empty());
}

/// A stack met again is the same stack: 80 allocations from two lines name exactly two stacks, each with its
/// line, the first sighting (the walk that validates the walker, by strings) and the later ones (by the frames'
/// keys, no string read) alike.
#[test]
fn a_repeated_python_stack_is_one_stack() {
    let python = pythons()
        .into_iter()
        .find(|p| p.version >= (3, 10))
        .expect("a Python 3.10+");
    let fake = FakeCuda::new();
    let script = fake.dir().join("repeat_sites.py");
    std::fs::copy(py_dir().join("repeat_sites.py"), &script).unwrap();
    let (r, trace) = fake.traced("python", &[], &python.exe, &[&script]);
    r.assert_success("repeat_sites.py under vramtrace run");
    assert!(r.stdout.contains("ok"), "{}", r.stdout);
    let t = read_trace(&trace);
    t.assert_stacks_precede_their_events();
    let pid = t.pids()[0];
    let m = markers(&script);
    let mut by_size: std::collections::BTreeMap<u64, std::collections::BTreeSet<u32>> =
        Default::default();
    for e in t.events[&pid].iter().filter(|e| e.api == Api::MemAlloc) {
        by_size.entry(e.size).or_default().insert(e.stack);
    }
    assert_eq!(by_size.len(), 2, "{by_size:?}");
    for (size, marker) in [(2 * MIB, "even"), (3 * MIB, "odd")] {
        let ids = &by_size[&size];
        assert_eq!(
            ids.len(),
            1,
            "{size}: one stack for 40 allocations, got {ids:?}"
        );
        let s = t.stack(pid, *ids.iter().next().unwrap()).unwrap();
        let top = s.python.first().expect("Python frames");
        assert_eq!(
            (top.function.as_str(), top.line),
            ("step", m[marker]),
            "{s:?}"
        );
        assert_eq!(top.file, script.to_str().unwrap());
    }
}
