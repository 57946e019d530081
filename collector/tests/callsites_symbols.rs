//! Real symbolisation: a small C program compiled at test time (`cc -g -O0`) prints a return address inside
//! `alloc_weights` (at a line this file knows) and its load bias and code range (`dl_iterate_phdr`, as the shim
//! lists objects). A trace whose stack holds that address must name `alloc_weights` and the exact file:line;
//! the same binary stripped of debug info must still name the function (symbol table), fully stripped give
//! `module+offset` or a name, and never an error; a separate debug file (by build id, or `.gnu_debuglink`)
//! brings file:line back; a deleted file gives `module+offset`; a file rebuilt since says so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use object::Object as _;
use vramtrace_collector::callsites::Site;
use vramtrace_collector::model::{analyze_reader, analyze_reader_with, Analysis};
use vramtrace_collector::names::symbols::{Symbolizer, REBUILT};
use vramtrace_collector::reporters::{json, text};
use vramtrace_format::{EndKind, Record};

const SOURCE: &str = r#"#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>

static int phdr(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (info->dlpi_name[0] != 0) return 0; /* the main program only */
    printf("bias 0x%lx\n", (unsigned long)info->dlpi_addr);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type == PT_LOAD && (p->p_flags & PF_X))
            printf("text 0x%lx 0x%lx\n", (unsigned long)(info->dlpi_addr + p->p_vaddr),
                   (unsigned long)(info->dlpi_addr + p->p_vaddr + p->p_memsz));
    }
    return 0;
}

__attribute__((noinline)) void fake_cu_mem_alloc(void) {
    printf("ret 0x%lx\n", (unsigned long)__builtin_return_address(0));
}

__attribute__((noinline)) void alloc_weights(void) {
    fake_cu_mem_alloc(); /* THE LINE */
}

int main(void) {
    alloc_weights();
    dl_iterate_phdr(phdr, NULL);
    return 0;
}
"#;

/// What the program said about itself.
struct Probe {
    bias: u64,
    text: (u64, u64),
    ret: u64,
    build_id: Vec<u8>,
}

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("callsites-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn the_line() -> u32 {
    SOURCE.lines().position(|l| l.contains("THE LINE")).unwrap() as u32 + 1
}

fn sh(cmd: &mut Command) -> bool {
    match cmd.output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
            false
        }
        Err(e) => {
            eprintln!("{cmd:?}: {e}");
            false
        }
    }
}

/// Compiles `source` to `out` with debug info and a build id; false (the test is skipped) without a compiler.
fn compile(source: &str, src: &Path, out: &Path) -> bool {
    std::fs::write(src, source).unwrap();
    sh(Command::new("cc")
        .args([
            "-g",
            "-O0",
            "-fno-omit-frame-pointer",
            "-Wl,--build-id=sha1",
            "-o",
        ])
        .arg(out)
        .arg(src))
}

fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    let f = object::File::parse(&*data).unwrap();
    f.build_id().unwrap().unwrap_or(&[]).to_vec()
}

fn probe(exe: &Path) -> Probe {
    let out = Command::new(exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let (mut bias, mut range, mut ret) = (None, None, None);
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w[0] {
            "bias" => bias = Some(hex(w[1])),
            "text" => range = Some((hex(w[1]), hex(w[2]))),
            "ret" => ret = Some(hex(w[1])),
            _ => {}
        }
    }
    Probe {
        bias: bias.unwrap(),
        text: range.unwrap(),
        ret: ret.unwrap(),
        build_id: build_id(exe),
    }
}

/// A trace of one allocation whose stack is [the return address, an address in anonymous memory], in an object
/// at `path` described as the program described itself (build id `id`).
fn trace_for(p: &Probe, path: &Path, id: &[u8]) -> Vec<u8> {
    trace(&[
        hello(100, 0),
        objects(
            100,
            1,
            vec![object(path.to_str().unwrap(), p.bias, p.text, id)],
        ),
        stack(100, 1, vec![p.ret, 0x10], vec![]),
        events(100, vec![with_stack(alloc(10, 0, 0xa000, GIB), 1)]),
        Record::ProcessEnd {
            pid: 100,
            ts_ns: START + 20 * MS,
            kind: EndKind::Goodbye,
        },
    ])
}

fn only_site(a: &Analysis) -> &Site {
    assert_eq!(a.call_sites.sites.len(), 1);
    &a.call_sites.sites[0]
}

#[test]
fn native_call_sites_are_symbolised_from_the_files() {
    let d = dir("c");
    let exe = d.join("prog");
    if !compile(SOURCE, &d.join("prog.c"), &exe) {
        eprintln!("no C compiler: skipped");
        return;
    }
    let p = probe(&exe);
    assert!(p.ret >= p.text.0 && p.ret < p.text.1);
    let line = the_line();
    let src = d.join("prog.c").to_str().unwrap().to_string();

    // With debug info: the function, the exact file and line.
    let a = analyze_reader(&trace_for(&p, &exe, &p.build_id)[..]).unwrap();
    let s = only_site(&a);
    assert_eq!(s.site, Some(0));
    let f = &s.frames[0];
    assert_eq!(f.function.as_deref(), Some("alloc_weights"));
    assert_eq!(f.file.as_deref(), Some(src.as_str()));
    assert_eq!(f.line, Some(line));
    assert_eq!(f.offset, Some(p.ret - p.bias));
    assert_eq!(s.frames[1].label(), "0x10");
    let text = text::render(&a, None);
    let want = format!(
        "alloc_weights at {}:{line}",
        vramtrace_collector::callsites::short_path(&src)
    );
    assert!(text.contains(&want), "{want} in {text}");
    let json = json::render(&a);
    assert!(
        json.contains(&format!(
            "\"function\": \"alloc_weights\", \"file\": \"{src}\", \"line\": {line}"
        )),
        "{json}"
    );

    // Without debug info: the symbol table names the function.
    let g = d.join("prog-g");
    std::fs::copy(&exe, &g).unwrap();
    assert!(sh(Command::new("strip").arg("-g").arg(&g)));
    let a = analyze_reader(&trace_for(&p, &g, &p.build_id)[..]).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(f.function.as_deref(), Some("alloc_weights"));
    assert_eq!((f.file.as_deref(), f.line), (None, None));
    assert_eq!(f.label(), "alloc_weights in prog-g");

    // Stripped of everything: whatever the dynamic symbols say, else module+offset; never an error.
    let s_ = d.join("prog-s");
    std::fs::copy(&g, &s_).unwrap();
    assert!(sh(Command::new("strip").arg(&s_)));
    let a = analyze_reader(&trace_for(&p, &s_, &p.build_id)[..]).unwrap();
    let f = &only_site(&a).frames[0];
    assert!(f.file.is_none());
    let label = f.label();
    assert!(
        label == format!("prog-s+{:#x}", p.ret - p.bias) || label.ends_with(" in prog-s"),
        "{label}"
    );

    // A separate debug file found by build id under a debug directory brings file:line back.
    let dbg = d.join("prog.debug");
    assert!(sh(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&exe)
        .arg(&dbg)));
    let root = d.join("debugroot");
    let hex: String = p.build_id.iter().map(|b| format!("{b:02x}")).collect();
    let at = root.join(".build-id").join(&hex[..2]);
    std::fs::create_dir_all(&at).unwrap();
    std::fs::copy(&dbg, at.join(format!("{}.debug", &hex[2..]))).unwrap();
    let mut sym = Symbolizer::with_debug_dirs(vec![root]);
    let a = analyze_reader_with(&trace_for(&p, &s_, &p.build_id)[..], Some(&mut sym)).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(
        (f.function.as_deref(), f.file.as_deref(), f.line),
        (Some("alloc_weights"), Some(src.as_str()), Some(line))
    );

    // ... or by its .gnu_debuglink, beside it.
    let l = d.join("prog-l");
    std::fs::copy(&s_, &l).unwrap();
    assert!(sh(Command::new("objcopy")
        .current_dir(&d)
        .arg("--add-gnu-debuglink=prog.debug")
        .arg(&l)));
    let mut sym = Symbolizer::with_debug_dirs(vec![]);
    let a = analyze_reader_with(&trace_for(&p, &l, &p.build_id)[..], Some(&mut sym)).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(
        (f.file.as_deref(), f.line),
        (Some(src.as_str()), Some(line))
    );

    // Deleted since: module+offset.
    let gone = d.join("prog-gone");
    std::fs::copy(&exe, &gone).unwrap();
    let t = trace_for(&p, &gone, &p.build_id);
    std::fs::remove_file(&gone).unwrap();
    let a = analyze_reader(&t[..]).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(f.label(), format!("prog-gone+{:#x}", p.ret - p.bias));
    assert_eq!(f.note.as_deref(), Some("file not found"));
    assert!(text::render(&a, None).contains(&format!("prog-gone+{:#x}", p.ret - p.bias)));

    // Rebuilt since (another build id at the path): not symbolised, and said.
    let re = d.join("prog-rebuilt");
    assert!(compile(
        &SOURCE.replace("int main(void) {", "int unused_now;\nint main(void) {"),
        &d.join("prog2.c"),
        &re
    ));
    assert_ne!(build_id(&re), p.build_id);
    let a = analyze_reader(&trace_for(&p, &re, &p.build_id)[..]).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(f.note.as_deref(), Some(REBUILT));
    assert_eq!(
        f.label(),
        format!(
            "prog-rebuilt+{:#x} (rebuilt since: not symbolised)",
            p.ret - p.bias
        )
    );
    // Without a recorded build id nothing can tell: it is read.
    let a = analyze_reader(&trace_for(&p, &exe, &[])[..]).unwrap();
    assert_eq!(only_site(&a).frames[0].line, Some(line));

    let _ = std::fs::remove_dir_all(&d);
}

const CPP: &str = r#"#include <link.h>
#include <cstdio>

static int phdr(struct dl_phdr_info *info, size_t, void *) {
    if (info->dlpi_name[0] != 0) return 0;
    std::printf("bias 0x%lx\n", (unsigned long)info->dlpi_addr);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type == PT_LOAD && (p->p_flags & PF_X))
            std::printf("text 0x%lx 0x%lx\n", (unsigned long)(info->dlpi_addr + p->p_vaddr),
                        (unsigned long)(info->dlpi_addr + p->p_vaddr + p->p_memsz));
    }
    return 0;
}

namespace model {
template <typename T> struct Layer {
    __attribute__((noinline)) static void reserve(T n) {
        std::printf("ret 0x%lx\n", (unsigned long)__builtin_return_address(0));
        (void)n;
    }
    __attribute__((noinline)) static void alloc_weights(T n) {
        reserve(n); /* THE LINE */
    }
};
}

int main() {
    model::Layer<int>::alloc_weights(3);
    dl_iterate_phdr(phdr, nullptr);
    return 0;
}
"#;

#[test]
fn cpp_names_are_demangled_from_debug_info_and_symbol_tables() {
    let d = dir("cpp");
    let exe = d.join("layer");
    std::fs::write(d.join("layer.cc"), CPP).unwrap();
    if !sh(Command::new("c++")
        .args(["-g", "-O0", "-Wl,--build-id=sha1", "-o"])
        .arg(&exe)
        .arg(d.join("layer.cc")))
    {
        eprintln!("no C++ compiler: skipped");
        return;
    }
    let p = probe(&exe);
    let line = CPP.lines().position(|l| l.contains("THE LINE")).unwrap() as u32 + 1;
    let a = analyze_reader(&trace_for(&p, &exe, &p.build_id)[..]).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(
        f.function.as_deref(),
        Some("model::Layer<int>::alloc_weights(int)")
    );
    assert_eq!(f.line, Some(line));
    let g = d.join("layer-g");
    std::fs::copy(&exe, &g).unwrap();
    assert!(sh(Command::new("strip").arg("-g").arg(&g)));
    let a = analyze_reader(&trace_for(&p, &g, &p.build_id)[..]).unwrap();
    let f = &only_site(&a).frames[0];
    assert_eq!(
        f.function.as_deref(),
        Some("model::Layer<int>::alloc_weights(int)")
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A trace names files it does not vouch for: one that is a FIFO (or a directory, a device) must neither hang
/// the report nor be read; the frame is `module+offset`.
#[test]
fn a_fifo_named_by_a_trace_never_hangs_the_report() {
    let d = dir("fifo");
    let fifo = d.join("libfake.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let p = Probe {
        bias: 0x7f00_0000_0000,
        text: (0x7f00_0000_1000, 0x7f00_0010_0000),
        ret: 0x7f00_0000_2345,
        build_id: vec![1, 2, 3],
    };
    let bytes = trace_for(&p, &fifo, &p.build_id);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sym = Symbolizer::new();
        let a = analyze_reader_with(&bytes[..], Some(&mut sym)).unwrap();
        let _ = tx.send(only_site(&a).label());
    });
    let label = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the report finished (a FIFO must not block it)");
    assert!(label.contains("libfake.so+0x"), "{label}");
}

#[test]
fn an_object_truncated_and_rewritten_while_it_is_read_never_kills_the_reader() {
    // Issue 36, item 7: the object a trace names was mapped, and another process truncating it while the
    // report read it killed the report with SIGBUS (30 runs in 100). Here the object carries a 32 MiB DWARF
    // section (read whole when the object is loaded: a long read) and a thread truncates it to one page and
    // writes it back, over and over, while `vramtrace report` runs on a trace that names it.
    let d = dir("rewrite");
    let exe = d.join("prog");
    if !compile(SOURCE, &d.join("prog.c"), &exe) {
        eprintln!("no C compiler: skipped");
        return;
    }
    let p = probe(&exe);
    let junk = d.join("junk");
    std::fs::write(
        &junk,
        (0..32u32 << 20).map(|i| i as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    let big = d.join("libbig.so");
    assert!(sh(Command::new("objcopy")
        .arg("--add-section")
        .arg(format!(".debug_loc={}", junk.display()))
        .arg(&exe)
        .arg(&big)));
    let bytes = std::fs::read(&big).unwrap();
    let trace = d.join("t.vtrace");
    std::fs::write(&trace, trace_for(&p, &big, &p.build_id)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, big) = (stop.clone(), big.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
            let mut rounds = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.set_len(4096).unwrap();
                for (i, chunk) in bytes[4096..].chunks(1 << 20).enumerate() {
                    f.write_all_at(chunk, 4096 + (i << 20) as u64).unwrap();
                }
                rounds += 1;
                // Whole for a while: a reader that opens it now maps all of it, then finds it cut.
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            rounds
        })
    };
    let mut deaths = Vec::new();
    for _ in 0..100 {
        let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
            .arg("report")
            .arg(&trace)
            .env("VRAMTRACE_DEBUG_DIRS", d.join("no-debug-dir"))
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = out.status.signal() {
            deaths.push(sig);
        } else {
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 10, "the object was rewritten only {rounds} times");
    assert!(
        deaths.is_empty(),
        "{} of 100 reports died of a signal ({deaths:?}; SIGBUS is {})",
        deaths.len(),
        libc::SIGBUS
    );
}
