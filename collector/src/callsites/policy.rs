//! Which frames are the program's own: the tables and rules by which a stack's call site is chosen (see the
//! module above). Kept apart from the types and the rendering: the lists grow with every framework seen.

use super::frame::{base_name, Frame, FrameKind};

/// Native objects that are never the call site when another frame is: the CUDA driver and runtime, the shim,
/// the frameworks' native libraries, the Python interpreter and the C/C++ runtimes. Matched on the start of the
/// file's name; libraries under [`INTERNAL_DIRS`] too.
pub const INTERNAL_MODULES: &[&str] = &[
    "libcuda.so",
    "libcudart",
    "libvramtrace",
    "libc10",
    "libtorch",
    "libcublas",
    "libcudnn",
    "libnccl",
    "libcufft",
    "libcurand",
    "libcusparse",
    "libcusolver",
    "libnvrtc",
    "libnvJitLink",
    "libxla",
    "xla_extension",
    "libjax",
    "libpython",
    "python",
    "libc.so",
    "libstdc++",
    "libpthread",
    "libgcc_s",
    "ld-linux",
];
/// Of those, the ones that are never the call site even when all frames are internal.
pub const CORE_MODULES: &[&str] = &["libcuda.so", "libcudart", "libvramtrace"];
/// The CUDA runtime linked statically into a program (nvcc's default) lives in the program's own file: its
/// frames are told apart by function name instead. Matched on the start of the demangled name.
pub const RUNTIME_FUNCTIONS: &[&str] = &[
    "libcudart_static_",
    "cudart::",
    "__cudart",
    "cudaMalloc",
    "cudaFree",
];

/// Whether a native frame is CUDA plumbing by its function's name (a statically linked runtime).
pub(crate) fn runtime_function(f: &Frame) -> bool {
    f.function
        .as_deref()
        .is_some_and(|n| RUNTIME_FUNCTIONS.iter().any(|p| n.starts_with(p)))
}
/// Native functions that are library code wherever they are linked, by the start of their demangled name
/// (after a leading `<`, `&`, `mut ` or `dyn ` of a trait implementation): Rust's standard library, the C++
/// runtime, PyTorch (`c10`, ATen, `torch`, caffe2), CUDA's C++ libraries, Rust's CUDA crates (cudarc: its
/// `malloc_async`, `CudaStream::alloc`, `CudaContext` internals) and the frameworks over them.
pub const LIBRARY_FUNCTIONS: &[&str] = &[
    "std::",
    "core::",
    "alloc::",
    "__rust_",
    "__gnu_cxx::",
    "__cxxabiv1::",
    "c10::",
    "at::",
    "torch::",
    "caffe2::",
    "thrust::",
    "cub::",
    "cudarc::",
    "cust::",
    "cust_raw::",
    "candle_core::",
    "candle_nn::",
];
/// The C runtime's functions that start a program or a thread (in the program's own file too).
pub const CRT_FUNCTIONS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
];
/// Source files of library code, by a part of their path: third-party Rust crates (cargo's registry and git
/// checkouts), Rust's standard library (`/rustc/<hash>/library/`, or the `rust-src` component), C and C++
/// system headers, the headers of Python wheels (`site-packages/torch/include/...`) and of the CUDA toolkit.
pub const LIBRARY_SOURCES: &[&str] = &[
    "/.cargo/registry/",
    "/.cargo/git/",
    "/rustlib/src/rust/library/",
    "/usr/include/",
    "/site-packages/",
    "/dist-packages/",
    "/usr/local/cuda",
];
/// Of the library functions, the allocators' own and the runtimes': never the site while another frame
/// outside [`CORE_MODULES`] is there (when a stack has none of the program's own frames).
pub const PLUMBING_FUNCTIONS: &[&str] = &[
    "c10::",
    "at::empty",
    "at::detail::empty",
    "at::native::empty",
    "at::_ops::empty",
    "at::TensorBase::",
    "cudarc::",
    "cust::",
    "cust_raw::",
    "std::",
    "core::",
    "alloc::",
    "__rust_",
    "__gnu_cxx::",
];
/// PyTorch's autograd nodes outside `torch::autograd::generated` (whose every node counts), by class name.
pub const AUTOGRAD_NODES: &[&str] = &[
    "AccumulateGrad",
    "CopyBackwards",
    "CopySlices",
    "PyNode",
    "GraphRoot",
    "Error",
    "DelayedError",
    "UndefinedGrad",
    "UndefinedGradBackward",
    "Identity",
    "Scatter",
    "Gather",
];
/// Frames of PyTorch's autograd engine that run a node: a stack through one of them is the backward pass.
pub const AUTOGRAD_ENGINE: &[&str] = &[
    "torch::autograd::Engine::",
    "torch::autograd::Node::operator()",
    "torch::autograd::call_function",
];

/// A demangled name without the `<`, `&`, `mut ` and `dyn ` before a trait implementation's type.
pub(crate) fn name_path(n: &str) -> &str {
    let mut n = n;
    loop {
        let m = n
            .trim_start_matches(['<', '&'])
            .trim_start_matches("mut ")
            .trim_start_matches("dyn ");
        if m.len() == n.len() {
            return n;
        }
        n = m;
    }
}

/// Whether a native frame is library code by its function's name or its source file.
pub(crate) fn library_native(f: &Frame) -> bool {
    let by_name = f.function.as_deref().is_some_and(|n| {
        let p = name_path(n);
        LIBRARY_FUNCTIONS.iter().any(|l| p.starts_with(l))
            || CRT_FUNCTIONS.contains(&n)
            || runtime_function(f)
    });
    let by_file = f
        .file
        .as_deref()
        .is_some_and(|p| p.starts_with("/rustc/") || LIBRARY_SOURCES.iter().any(|l| p.contains(l)));
    by_name || by_file
}

/// Whether a native frame is an allocator's or a runtime's own function (see [`PLUMBING_FUNCTIONS`]).
pub(crate) fn plumbing_native(f: &Frame) -> bool {
    runtime_function(f)
        || f.function.as_deref().is_some_and(|n| {
            let p = name_path(n);
            PLUMBING_FUNCTIONS.iter().any(|l| p.starts_with(l)) || CRT_FUNCTIONS.contains(&n)
        })
}

/// Whether a native frame is the program's own: outside the internal libraries, not library code.
pub fn own_native(f: &Frame) -> bool {
    f.kind == FrameKind::Native
        && !f
            .module
            .as_deref()
            .is_some_and(|m| module_in(m, INTERNAL_MODULES, INTERNAL_DIRS))
        && !library_native(f)
}

/// Whether a frame is the program's own code: a Python frame outside the standard library and the frameworks'
/// packages, or [`own_native`].
pub fn own_frame(f: &Frame) -> bool {
    match f.kind {
        FrameKind::Python => f.file.as_deref().is_some_and(|p| !is_library_python(p)),
        _ => own_native(f),
    }
}

/// The `::`-separated parts of a demangled C++ or Rust name, without its parameters: `a::B<c::D>::f(int)` ->
/// `["a", "B<c::D>", "f"]`.
pub(crate) fn name_parts(name: &str) -> Vec<String> {
    let name = name.replace("(anonymous namespace)", "{anonymous}");
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth <= 0 => break,
            ':' if depth <= 0 && chars.peek() == Some(&':') => {
                chars.next();
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts
}

/// `MmBackward0`, `AddmmBackward1`: a generated node's class name.
pub(crate) fn numbered_backward(node: &str) -> bool {
    let digits = node.trim_end_matches(|c: char| c.is_ascii_digit());
    digits.len() < node.len()
        && digits.strip_suffix("Backward").is_some_and(|s| {
            !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// The PyTorch autograd node whose `apply` a native frame is, from its demangled name: any node of
/// `torch::autograd::generated::` (`MmBackward0`, `AddmmBackward0`), any `*Backward<N>::apply` elsewhere, and
/// the hand-written nodes of `torch::autograd::` ([`AUTOGRAD_NODES`]; a C++ custom function's `CppNode<F>`
/// gives `F`). `None` for anything else (`torch::autograd::Function<F>::apply` is the forward pass).
pub fn autograd_node(f: &Frame) -> Option<String> {
    if f.kind != FrameKind::Native {
        return None;
    }
    let parts = name_parts(f.function.as_deref()?);
    let [ns @ .., node, last] = parts.as_slice() else {
        return None;
    };
    if last != "apply" && last != "apply_with_saved" {
        return None;
    }
    let torch = ns.len() >= 2 && ns[0] == "torch" && ns[1] == "autograd";
    let generated = torch && ns.get(2).is_some_and(|n| n == "generated");
    if let Some(inner) = node
        .strip_prefix("CppNode<")
        .and_then(|n| n.strip_suffix('>'))
    {
        return torch.then(|| inner.to_string());
    }
    let known = torch && AUTOGRAD_NODES.contains(&node.as_str());
    (generated || known || numbered_backward(node)).then(|| node.clone())
}

/// Whether a native frame is PyTorch's autograd engine running a node.
pub(crate) fn autograd_engine(f: &Frame) -> bool {
    f.kind == FrameKind::Native
        && f.function
            .as_deref()
            .is_some_and(|n| AUTOGRAD_ENGINE.iter().any(|e| n.starts_with(e)))
}

/// Python packages whose frames are framework internals (in `site-packages` or `dist-packages`).
pub const FRAMEWORK_PACKAGES: &[&str] =
    &["torch", "jax", "jaxlib", "cupy", "cupyx", "cupy_backends"];

/// Directories whose native libraries are framework internals (PyTorch's, JAX's, CuPy's, NVIDIA's wheels).
pub const INTERNAL_DIRS: &[&str] = &[
    "/torch/lib/",
    "/jaxlib/",
    "/cupy_backends/",
    "/cupy/",
    "/nvidia/",
];

pub(crate) fn module_in(path: &str, list: &[&str], dirs: &[&str]) -> bool {
    let base = base_name(path);
    list.iter().any(|m| base.starts_with(m)) || dirs.iter().any(|d| path.contains(d))
}

/// A Python file of the standard library or of a framework's own package.
pub fn is_library_python(file: &str) -> bool {
    if file.starts_with('<') {
        return true; // <frozen importlib._bootstrap>, <string>...
    }
    for pkgs in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.find(pkgs) {
            let rest = &file[i + pkgs.len()..];
            let top = rest.split('/').next().unwrap_or("");
            let top = top.strip_suffix(".py").unwrap_or(top);
            return FRAMEWORK_PACKAGES.contains(&top);
        }
    }
    // The standard library: .../lib/python3.12/...
    file.contains("/lib/python")
}
