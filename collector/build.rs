//! Lists the Python bridge's files (bridge/sitecustomize.py and every module of bridge/vramtrace_bridge) for
//! `files/bridge_files.rs` to carry in the binary: a module added to the package is carried without a hand list.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let bridge = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bridge");
    println!(
        "cargo:rerun-if-changed={}",
        bridge.join("sitecustomize.py").display()
    );
    let package = bridge.join("vramtrace_bridge");
    println!("cargo:rerun-if-changed={}", package.display());
    let mut files = vec!["sitecustomize.py".to_string()];
    let mut modules: Vec<String> = std::fs::read_dir(&package)
        .expect("bridge/vramtrace_bridge")
        .map(|e| {
            e.expect("bridge/vramtrace_bridge")
                .file_name()
                .into_string()
                .expect("a UTF-8 name")
        })
        .filter(|n| n.ends_with(".py"))
        .collect();
    modules.sort();
    for m in &modules {
        println!("cargo:rerun-if-changed={}", package.join(m).display());
        files.push(format!("vramtrace_bridge/{m}"));
    }
    let mut out = String::from("&[\n");
    for f in &files {
        let path = bridge.join(f);
        writeln!(
            out,
            "    ({f:?}, include_str!({:?})),",
            path.display().to_string()
        )
        .unwrap();
    }
    out.push_str("]\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("bridge_files.rs");
    std::fs::write(dest, out).expect("write bridge_files.rs");
}
