//! The shim's hot path sits together in one section (`.vramtrace.hot`): on a real GPU each allocation's trip
//! through the kernel leaves caches and TLB cold, and the shim's cost there is the pages it touches (measured in
//! docs/GPU-RESULTS.md, "The 1 MiB loop inside one process"). A wrapper moved out of it would cost a page walk.

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

#[test]
fn the_memory_wrappers_sit_in_the_hot_section() {
    let mut shims = vec![shim()];
    if let Some(p) = std::env::var_os("VRAMTRACE_COMPAT_SHIM") {
        shims.push(p.into());
    }
    for so in shims {
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
