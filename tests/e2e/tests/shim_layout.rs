//! The shim's hot path sits together in one section (`.vramtrace.hot`): on a real GPU each allocation's trip
//! through the kernel leaves caches and TLB cold, and the shim's cost there is the pages it touches (measured in
//! docs/GPU-RESULTS.md, "The 1 MiB loop inside one process"). A wrapper moved out of it would cost a page walk,
//! and so would a `thread_local!` on that path (`__tls_get_addr` reads ld.so's pages: the shim's thread state is
//! in `shim/src/tls.rs` for that reason).

use std::path::Path;
use std::process::Command;

use vramtrace_e2e::traced::shim;

/// (start, end) of the section, from `readelf -SW`.
fn section(so: &Path, name: &str) -> Option<(u64, u64)> {
    let out = Command::new("readelf")
        .arg("-SW")
        .arg(so)
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let Some(rest) = line.split_once(']').map(|x| x.1) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&name) && f.len() >= 5 {
            let addr = u64::from_str_radix(f[2], 16).ok()?;
            let size = u64::from_str_radix(f[4], 16).ok()?;
            return Some((addr, addr + size));
        }
    }
    None
}

/// The addresses of the defined symbols whose demangled name is `name` (with or without a hash), from `nm -C`.
fn demangled(so: &Path, name: &str) -> Vec<u64> {
    let out = Command::new("nm")
        .args(["-C", "--defined-only"])
        .arg(so)
        .output()
        .expect("nm");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let (addr, _kind, sym) = (f.next()?, f.next()?, f.next()?);
            (sym == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .collect()
}

/// The address of a defined symbol, from `nm`.
fn symbol(so: &Path, name: &str) -> Option<u64> {
    let out = Command::new("nm")
        .arg("--defined-only")
        .arg(so)
        .output()
        .expect("nm");
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).ok())?
    })
}

/// The shim as built for the tests, and the one that ships when scripts/test.sh built it.
fn shims() -> Vec<std::path::PathBuf> {
    let mut shims = vec![shim()];
    if let Some(p) = std::env::var_os("VRAMTRACE_COMPAT_SHIM") {
        shims.push(p.into());
    }
    shims
}

/// The shipped (release) shim that scripts/test.sh builds, or `None` (said on stderr) where it did not.
fn shipped_shim() -> Option<std::path::PathBuf> {
    let so = std::env::var_os("VRAMTRACE_COMPAT_SHIM").map(std::path::PathBuf::from);
    if so.is_none() {
        eprintln!("SKIP: VRAMTRACE_COMPAT_SHIM unset (scripts/test.sh builds the shipped shim)");
    }
    so
}

#[test]
fn the_hot_paths_inner_functions_sit_in_the_hot_section_too() {
    // In the shipped (release) build: a debug build keeps closures apart, which `#[link_section]` does not reach.
    let Some(so) = shipped_shim() else { return };
    let (start, end) = section(&so, ".vramtrace.hot").expect("a .vramtrace.hot section");
    let mut seen = 0;
    // What every allocation and free runs (the hooks, the recorder's push with its counter read inlined), and the call-site
    // capture of a chain seen before (the default settings, allocations of 1 MiB and more).
    for name in [
        "vramtrace::hooks::mem_alloc",
        "vramtrace::hooks::mem_free",
        "vramtrace::record::push",
        "vramtrace::stacks::capture",
        "vramtrace::stacks::intern",
        "vramtrace::stacks::local",
        "vramtrace::stacks::hash",
    ] {
        // Each may be inlined into its caller (then it has no symbol); every copy that exists is in the section.
        for a in demangled(&so, name) {
            seen += 1;
            assert!(
                (start..end).contains(&a),
                "{name} at {a:#x}, outside the hot section {start:#x}..{end:#x}"
            );
        }
    }
    assert!(
        seen >= 3,
        "only {seen} of the hot path's functions found by name"
    );
}

#[test]
fn the_hot_path_reaches_its_thread_state_without_tls_get_addr() {
    for so in shims() {
        let out = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn", "-j", ".vramtrace.hot"])
            .arg(&so)
            .output()
            .expect("objdump");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("cuMemAlloc_v2"),
            "{}: no disassembly",
            so.display()
        );
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("__tls_get_addr"))
            .collect();
        assert!(calls.is_empty(), "{}: {calls:?}", so.display());
        // And the library says its TLS is static (what the initial-exec accesses of x86-64 need).
        if !cfg!(target_arch = "x86_64") {
            continue;
        }
        let dynamic = Command::new("readelf")
            .arg("-dW")
            .arg(&so)
            .output()
            .expect("readelf");
        assert!(
            String::from_utf8_lossy(&dynamic.stdout).contains("STATIC_TLS"),
            "{}: no STATIC_TLS flag",
            so.display()
        );
    }
}

#[test]
fn the_memory_wrappers_sit_in_the_hot_section() {
    for so in shims() {
        let (start, end) = section(&so, ".vramtrace.hot")
            .unwrap_or_else(|| panic!("{}: no .vramtrace.hot section", so.display()));
        assert!(
            end - start < 64 << 10,
            "the hot section grew to {} bytes",
            end - start
        );
        for name in [
            "cuMemAlloc_v2",
            "cuMemFree_v2",
            "cuMemAllocAsync",
            "cuMemFreeAsync",
            "cuMemCreate",
            "cuMemRelease",
            "cuMemMap",
            "cuMemUnmap",
        ] {
            let a = symbol(&so, name).unwrap_or_else(|| panic!("{}: no {name}", so.display()));
            assert!(
                (start..end).contains(&a),
                "{}: {name} at {a:#x}, outside the hot section {start:#x}..{end:#x}",
                so.display()
            );
        }
    }
}

#[test]
fn the_hot_paths_data_sits_in_one_page() {
    for so in shims() {
        let (start, end) = section(&so, ".vramtrace.hotdata")
            .unwrap_or_else(|| panic!("{}: no .vramtrace.hotdata section", so.display()));
        let mut pages = std::collections::BTreeSet::new();
        // What an allocation and a free read of the shim's own data: the driver's functions, the recorder, the
        // settings and their call-site copy, the cap, the fork generation and the "no Python" flag.
        for name in [
            "vramtrace::driver::REAL",
            "vramtrace::record::LIVE",
            "vramtrace::record::LIVE_SET",
            "vramtrace::record::FORK_GEN",
            "vramtrace::record::LINK",
            "vramtrace::record::TICKS",
            "vramtrace::record::RING_BASE",
            "vramtrace::record::RING_SLOTS",
            "vramtrace::prefault::ASK_AT",
            "vramtrace::settings::SETTINGS",
            "vramtrace::settings::STACKS",
            "vramtrace::cap::CAP",
            "vramtrace::pystack::ABSENT",
            "vramtrace::driver::ONLY_DEVICE",
        ] {
            let at = demangled(&so, name);
            assert_eq!(at.len(), 1, "{}: {name} at {at:x?}", so.display());
            assert!(
                (start..end).contains(&at[0]),
                "{}: {name} at {:#x}, outside the hot data {start:#x}..{end:#x}",
                so.display(),
                at[0]
            );
            pages.insert(at[0] >> 12);
        }
        // The driver's table, the largest, ends on the page it starts on too.
        let real = demangled(&so, "vramtrace::driver::REAL")[0];
        pages.insert((real + 8 * 39) >> 12);
        assert_eq!(
            pages.len(),
            1,
            "{}: the hot data spans pages {pages:x?}",
            so.display()
        );
    }
}

/// The dynamic relocations of `so` of one type (`readelf -rW`): (where the loader writes, the rest of the line's
/// fields after the type: for `R_X86_64_RELATIVE`, the address written).
fn relocations(so: &Path, kind: &str) -> Vec<(u64, Vec<String>)> {
    let out = Command::new("readelf")
        .arg("-rW")
        .arg(so)
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[2] == kind).then(|| {
                let at = u64::from_str_radix(f[0], 16).ok()?;
                Some((at, f[3..].iter().map(|x| x.to_string()).collect()))
            })?
        })
        .collect()
}

/// Where the dynamic loader writes addresses at load time (`R_X86_64_RELATIVE`): (where, the address written).
fn relative_relocations(so: &Path) -> Vec<(u64, u64)> {
    relocations(so, "R_X86_64_RELATIVE")
        .into_iter()
        .filter_map(|(at, rest)| Some((at, u64::from_str_radix(rest.first()?, 16).ok()?)))
        .collect()
}

/// The hot path reads its data where it lies (`lea`/`mov` relative to the instruction), not through an address
/// in the GOT: that would be a second page of data and more lines on every call. rustc reaches through the GOT
/// any static that another crate could link to, which a shim that is also an rlib had on its every hot static
/// (issue 27); the shim is a cdylib alone, and this keeps it so.
#[test]
fn the_hot_data_is_read_where_it_lies_not_through_the_got() {
    for so in shims() {
        let (start, end) = section(&so, ".vramtrace.hotdata")
            .unwrap_or_else(|| panic!("{}: no .vramtrace.hotdata section", so.display()));
        let (got, got_end) =
            section(&so, ".got").unwrap_or_else(|| panic!("{}: no .got section", so.display()));
        let relocs = relative_relocations(&so);
        assert!(
            relocs.len() > 10,
            "{}: too few relocations read ({}): readelf's output not understood",
            so.display(),
            relocs.len()
        );
        let through_got: Vec<_> = relocs
            .iter()
            .filter(|(at, to)| (got..got_end).contains(at) && (start..end).contains(to))
            .collect();
        assert!(
            through_got.is_empty(),
            "{}: GOT entries hold addresses in the hot data: {through_got:x?}",
            so.display()
        );
    }
}

/// The GOT slots the loader fills with a TLS offset (`R_X86_64_TPOFF64`): what the initial-exec sequence reads.
fn tls_offset_slots(so: &Path) -> Vec<u64> {
    relocations(so, "R_X86_64_TPOFF64")
        .into_iter()
        .map(|(at, _)| at)
        .collect()
}

/// What an allocation and a free run, in the shipped build, loads nothing from the GOT but the thread state's
/// offset: no static's address, no function's (a call into another crate that the compiler hoists as a
/// pointer loaded from the GOT before a loop costs the line on every pass, taken or not). Calls through the GOT
/// (`call *...(%rip)`) are not checked: today they sit on cold paths (panics, the futex wake), and a hot one
/// would show in the GPU figures. The functions listed that the build inlined have no symbol and are skipped.
#[test]
fn the_hot_path_loads_nothing_from_the_got_but_its_tls_offset() {
    let Some(so) = shipped_shim() else { return };
    let (got, got_end) = section(&so, ".got").expect("a .got section");
    let tls = tls_offset_slots(&so);
    assert!(
        !tls.is_empty(),
        "no TLS offset slot: readelf's output not understood"
    );
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-C", "-j", ".vramtrace.hot"])
        .arg(&so)
        .output()
        .expect("objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let hot = [
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "vramtrace::hooks::mem_alloc",
        "vramtrace::hooks::mem_free",
        "vramtrace::record::push",
        "vramtrace::stacks::capture",
    ];
    let mut current = String::new();
    let (mut seen, mut loads) = (std::collections::BTreeSet::new(), vec![]);
    for line in text.lines() {
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")) {
            current = name.1.to_string();
            continue;
        }
        if !hot.contains(&current.as_str()) {
            continue;
        }
        seen.insert(current.clone());
        // "  992ab:\tadd    0x759e(%rip),%rax        # a0850 <_DYNAMIC+0x230>"
        let Some((insn, comment)) = line.split_once('#') else {
            continue;
        };
        let Some(target) = comment
            .split_whitespace()
            .next()
            .and_then(|a| u64::from_str_radix(a, 16).ok())
        else {
            continue;
        };
        let op = insn.split('\t').nth(1).unwrap_or("").trim_start();
        if (got..got_end).contains(&target)
            && !tls.contains(&target)
            && !op.starts_with("call")
            && !op.starts_with("jmp")
        {
            loads.push(format!("{current}: {}", line.trim()));
        }
    }
    assert!(
        seen.contains("cuMemAlloc_v2") && seen.contains("cuMemFree_v2"),
        "the exported wrappers were not found in the hot section: {seen:?}"
    );
    assert!(
        loads.is_empty(),
        "GOT loads on the hot path:\n{}",
        loads.join("\n")
    );
}
