//! Door 1: `dlopen("libcuda.so.1")`, then `dlsym` of each exact (versioned) name, then the PATTERN.

use vramtrace_test_programs::{main_with, open_libcuda, Api};

fn main() {
    let h = open_libcuda();
    main_with("door_dlsym", Api::load(|s| h.sym(s.exact)))
}
