//! The choice of a stack's call site and its label, on hand-made frames.

use super::*;

fn py(file: &str) -> Frame {
    Frame {
        kind: FrameKind::Python,
        function: Some("f".into()),
        file: Some(file.into()),
        line: Some(3),
        module: None,
        offset: None,
        address: None,
        inlined: false,
        note: None,
    }
}

fn native(module: &str) -> Frame {
    Frame {
        kind: FrameKind::Native,
        function: None,
        file: None,
        line: None,
        module: Some(module.into()),
        offset: Some(0x10),
        address: Some(0x1010),
        inlined: false,
        note: None,
    }
}

#[test]
fn the_site_skips_library_and_internal_frames() {
    let f = vec![
        py("/usr/lib/python3.12/site-packages/torch/nn/modules/module.py"),
        py("/usr/lib/python3.12/functools.py"),
        py("/home/u/train.py"),
        py("/home/u/main.py"),
    ];
    assert_eq!(choose_site(&f), Some(2));
    let f = vec![py("/x/site-packages/torch/a.py"), py("<frozen runpy>")];
    assert_eq!(choose_site(&f), Some(0));
    let f = vec![
        native("/usr/lib/x86_64-linux-gnu/libcudart.so.12"),
        native("/opt/conda/lib/python3.11/site-packages/torch/lib/libc10_cuda.so"),
        native("/home/u/app"),
    ];
    assert_eq!(choose_site(&f), Some(2));
    let f = vec![
        native("/usr/lib/libcudart.so.12"),
        native("/x/libtorch_cuda.so"),
    ];
    assert_eq!(choose_site(&f), Some(1));
    assert_eq!(choose_site(&[]), None);
    // nvcc's default: the runtime is inside the program itself; its frames are known by their names.
    let named = |path: &str, function: &str| Frame {
        function: Some(function.to_string()),
        ..native(path)
    };
    let f = vec![
        native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        named("/home/u/allocs", "libcudart_static_3130888"),
        named("/home/u/allocs", "cudaMalloc"),
        named("/home/u/allocs", "main"),
    ];
    assert_eq!(choose_site(&f), Some(3));
    assert!(!is_library_python(
        "/x/site-packages/transformers/models/llama.py"
    ));
    assert!(is_library_python("/x/dist-packages/jax/_src/api.py"));
}

/// A symbolised native frame.
fn sym(module: &str, function: &str, file: Option<&str>, line: u32) -> Frame {
    Frame {
        function: Some(function.to_string()),
        file: file.map(str::to_string),
        line: (line > 0).then_some(line),
        ..native(module)
    }
}

/// A site over `frames`, its site chosen as a report chooses it.
fn site(pid: u32, stack: u32, frames: Vec<Frame>) -> Site {
    Site {
        pid,
        stack,
        site: choose_site(&frames),
        frames,
        missing: false,
        allocations: 1,
        allocated_bytes: 1,
        live_bytes_at_end: 0,
        per_device: Vec::new(),
        extra: Vec::new(),
    }
}

const TORCH_LIB: &str = "/opt/env/lib/python3.12/site-packages/torch/lib/";

/// The native stack of an allocation on PyTorch's backward thread (no Python frames): the caching
/// allocator, an ATen op, the node's helper, the node's `apply`, the engine, the C++ runtime's thread.
fn backward_stack(node: &str, line: u32) -> Vec<Frame> {
    let lib = |l: &str| format!("{TORCH_LIB}{l}");
    vec![
        native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        sym(
            &lib("libc10_cuda.so"),
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
            None,
            0,
        ),
        sym(
            &lib("libc10_cuda.so"),
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
            None,
            0,
        ),
        sym(
            &lib("libtorch_cuda.so"),
            "at::native::structured_mm_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&)",
            None,
            0,
        ),
        sym(
            &lib("libtorch_cpu.so"),
            "torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, c10::Layout, c10::Scalar const&)",
            None,
            0,
        ),
        sym(
            &lib("libtorch_cpu.so"),
            &format!("torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
            Some("/pytorch/torch/csrc/autograd/generated/Functions.cpp"),
            line,
        ),
        sym(
            &lib("libtorch_cpu.so"),
            "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
            None,
            0,
        ),
        sym(
            &lib("libtorch_cpu.so"),
            "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
            None,
            0,
        ),
        sym(
            &lib("libtorch_cpu.so"),
            "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
            None,
            0,
        ),
        sym(
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            "execute_native_thread_routine",
            None,
            0,
        ),
        sym("/usr/lib/x86_64-linux-gnu/libc.so.6", "start_thread", None, 0),
    ]
}

#[test]
fn a_backward_thread_is_named_by_its_autograd_node() {
    let f = backward_stack("MmBackward0", 1234);
    assert_eq!(choose_site(&f), Some(5));
    let s = site(1, 1, f);
    assert_eq!(s.label(), "autograd MmBackward0 (backward pass)");
    let s = site(1, 2, backward_stack("AddmmBackward0", 77));
    assert_eq!(s.label(), "autograd AddmmBackward0 (backward pass)");
    // The hand-written nodes, by their names; a C++ custom function by its own.
    let node = |name: &str| autograd_node(&sym("/x/libtorch_cpu.so", name, None, 0));
    assert_eq!(
        node("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")
            .as_deref(),
        Some("AccumulateGrad")
    );
    assert_eq!(
        node("torch::autograd::CppNode<MyLinearFunction>::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")
            .as_deref(),
        Some("MyLinearFunction")
    );
    assert_eq!(
        node("torch::autograd::PyNode::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")
            .as_deref(),
        Some("PyNode")
    );
    assert_eq!(
        node("torch_npu::autograd::generated::NpuFusedAttentionBackward1::apply").as_deref(),
        Some("NpuFusedAttentionBackward1")
    );
    // Not nodes: the forward pass of a custom function, the engine, the base class, other `apply`s.
    for name in [
        "torch::autograd::Function<MyLinearFunction>::apply<at::Tensor&>(at::Tensor&)",
        "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
        "torch::autograd::Node::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
        "myproj::Backward::apply(int)",
        "at::native::(anonymous namespace)::apply(int)",
        "mm_backward",
    ] {
        assert_eq!(node(name), None, "{name}");
    }
    // A frame of the program's own inside the node (a C++ extension's backward) is the site.
    let mut f = backward_stack("MmBackward0", 1234);
    f.insert(
        4,
        sym(
            "/home/u/ext/my_ext.so",
            "my_ext::fused_backward(at::Tensor const&)",
            Some("/home/u/ext/fused.cu"),
            40,
        ),
    );
    assert_eq!(choose_site(&f), Some(4));
    // With Python frames, the Python rule holds.
    let mut f = backward_stack("MmBackward0", 1234);
    f.insert(0, py("/home/u/train.py"));
    assert_eq!(choose_site(&f), Some(0));
    // The engine without a named node: the innermost frame outside the allocator, marked as the backward
    // pass.
    let mut f = backward_stack("MmBackward0", 1234);
    f.remove(5);
    f.remove(4);
    let s = site(1, 3, f);
    assert_eq!(s.site, Some(3));
    assert!(
        s.label()
            .starts_with("at::native::structured_mm_out_cuda::impl(")
            && s.label().ends_with(" (backward pass)"),
        "{}",
        s.label()
    );
}

/// The demo's stack: cudarc's allocation over the workload's own functions, over Rust's std and libc.
fn cudarc_stack(caller_line: u32) -> Vec<Frame> {
    let exe = "/work/target/release/vramtrace-workload";
    let reg =
        "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/cudarc-0.19.10/src/driver";
    let std = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
    let mut inlined = sym(
        exe,
        "cudarc::driver::sys::cuMemAllocAsync",
        Some(&format!("{reg}/sys/mod.rs")),
        13214,
    );
    inlined.inlined = true;
    let mut training = sym(
        exe,
        "vramtrace_workload::training",
        Some("/work/workload/src/main.rs"),
        caller_line,
    );
    training.inlined = true;
    vec![
        native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        inlined,
        sym(
            exe,
            "cudarc::driver::result::malloc_async",
            Some(&format!("{reg}/result.rs")),
            831,
        ),
        sym(
            exe,
            "cudarc::driver::safe::core::CudaStream::alloc",
            Some(&format!("{reg}/safe/core.rs")),
            1629,
        ),
        sym(
            exe,
            "cudarc::driver::safe::core::CudaStream::alloc_zeros",
            Some(&format!("{reg}/safe/core.rs")),
            1656,
        ),
        sym(
            exe,
            "vramtrace_workload::Gpu::alloc",
            Some("/work/workload/src/main.rs"),
            218,
        ),
        training,
        sym(
            exe,
            "vramtrace_workload::main",
            Some("/work/workload/src/main.rs"),
            83,
        ),
        sym(
            exe,
            "core::ops::function::FnOnce::call_once",
            Some(&format!("{std}/core/src/ops/function.rs")),
            250,
        ),
        sym(
            exe,
            "std::sys::backtrace::__rust_begin_short_backtrace",
            Some(&format!("{std}/std/src/sys/backtrace.rs")),
            166,
        ),
        sym(exe, "main", None, 0),
        sym(
            "/lib/x86_64-linux-gnu/libc.so.6",
            "__libc_start_call_main",
            None,
            0,
        ),
        sym(exe, "_start", None, 0),
    ]
}

#[test]
fn rust_crates_and_std_are_library_code() {
    let f = cudarc_stack(332);
    assert_eq!(
        choose_site(&f),
        Some(5),
        "the workload's own frame, under cudarc's"
    );
    // By the source file alone (a crate not named in the lists), or by the name alone (no debug info).
    let exe = "/work/target/release/app";
    let f = vec![
        sym(
            exe,
            "some_gpu_crate::pool::Pool::get",
            Some("/home/u/.cargo/registry/src/x/some_gpu_crate-1.0/src/pool.rs"),
            10,
        ),
        sym(
            exe,
            "some_git_crate::alloc",
            Some("/home/u/.cargo/git/checkouts/some_git_crate-1/abc/src/lib.rs"),
            3,
        ),
        sym(
            exe,
            "<cudarc::driver::safe::core::CudaStream as core::clone::Clone>::clone",
            None,
            0,
        ),
        sym(
            exe,
            "<&mut alloc::vec::Vec<u8> as core::fmt::Write>::write_str",
            None,
            0,
        ),
        sym(
            exe,
            "std::vector<float, std::allocator<float> >::_M_realloc_insert",
            Some("/usr/include/c++/12/bits/vector.tcc"),
            9,
        ),
        sym(
            exe,
            "app::model::Linear::new",
            Some("/home/u/app/src/model.rs"),
            12,
        ),
    ];
    assert_eq!(choose_site(&f), Some(5));
    // Nothing of the program's own: the innermost frame outside the allocators and the runtime.
    let f = vec![
        native("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        sym(&format!("{TORCH_LIB}libc10_cuda.so"), "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", None, 0),
        sym(&format!("{TORCH_LIB}libtorch_cuda.so"), "at::native::cudnn_convolution(at::Tensor const&)", None, 0),
        sym("/usr/lib/x86_64-linux-gnu/libc.so.6", "start_thread", None, 0),
    ];
    assert_eq!(choose_site(&f), Some(2));
}

#[test]
fn equal_labels_are_told_apart_by_what_differs() {
    // The demo's two sites: the same frame, called from two lines of `training`: a wrapper, so its
    // caller is the site and the wrapper what it came through.
    let mut sites = vec![site(1, 1, cudarc_stack(332)), site(1, 2, cudarc_stack(335))];
    assert_eq!(sites[0].label(), sites[1].label());
    distinguish(&mut sites);
    assert_eq!(
        sites[0].label(),
        "vramtrace_workload::training at src/main.rs:332 (inlined) via vramtrace_workload::Gpu::alloc \
         at src/main.rs:218"
    );
    assert!(
        sites[1]
            .label()
            .starts_with("vramtrace_workload::training at src/main.rs:335 (inlined) via"),
        "{}",
        sites[1].label()
    );
    // In text: the site, its callers, then the wrapper it came through.
    let short = sites[1].short(1);
    assert_eq!(
        short.first().map(String::as_str),
        Some("vramtrace_workload::training at src/main.rs:335 (inlined)")
    );
    assert_eq!(
        short.get(1).map(String::as_str),
        Some("<- vramtrace_workload::main at src/main.rs:83")
    );
    assert_eq!(
        short.last().map(String::as_str),
        Some("via vramtrace_workload::Gpu::alloc at src/main.rs:218"),
        "{short:?}"
    );
    // A caller further out: the skipped ones are marked; the text shows the first two, then `<- …`.
    let mut a = cudarc_stack(332);
    let mut b = cudarc_stack(332);
    a[10].line = Some(7);
    a[10].file = Some("/work/workload/src/start.rs".into());
    b[10].line = Some(8);
    b[10].file = Some("/work/workload/src/start.rs".into());
    let mut sites = vec![site(1, 1, a), site(1, 2, b)];
    distinguish(&mut sites);
    assert_eq!(
        sites[0].label(),
        "vramtrace_workload::Gpu::alloc at src/main.rs:218 <- … <- main at src/start.rs:7"
    );
    let lines = sites[1].short(2);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert_eq!(lines[3], "<- …");
    assert_eq!(lines[4], "<- main at src/start.rs:8");
    // Two MmBackward0 allocations: the node's line tells them apart.
    let mut sites = vec![
        site(1, 1, backward_stack("MmBackward0", 1234)),
        site(1, 2, backward_stack("MmBackward0", 1240)),
        site(1, 3, backward_stack("AddmmBackward0", 1234)),
    ];
    distinguish(&mut sites);
    let labels: Vec<String> = sites.iter().map(Site::label).collect();
    assert_eq!(
        labels,
        vec![
            "autograd MmBackward0 (backward pass) at generated/Functions.cpp:1234",
            "autograd MmBackward0 (backward pass) at generated/Functions.cpp:1240",
            "autograd AddmmBackward0 (backward pass)",
        ]
    );
    // One Python line, two ops under it (native frames recorded too): the first native frame that differs
    // outside the allocator.
    let op = |name: &str| {
        let mut f = backward_stack("MmBackward0", 1);
        f.truncate(3);
        f.push(sym(&format!("{TORCH_LIB}libtorch_cuda.so"), name, None, 0));
        f.insert(0, py("/home/u/train.py"));
        f
    };
    let mut sites = vec![
        site(1, 1, op("at::native::mm_out_cuda(at::Tensor const&)")),
        site(1, 2, op("at::native::add_out_cuda(at::Tensor const&)")),
    ];
    distinguish(&mut sites);
    assert_eq!(
        sites[1].label(),
        "u/train.py:3 in f via at::native::add_out_cuda(at::Tensor const&) in libtorch_cuda.so"
    );
    // Nothing differs (two processes, one program): the process and the stack say which.
    let mut sites = vec![site(7, 1, cudarc_stack(332)), site(8, 1, cudarc_stack(332))];
    distinguish(&mut sites);
    assert!(
        sites[0].label().ends_with(" (pid 7, stack 1)"),
        "{}",
        sites[0].label()
    );
    assert_ne!(sites[0].label(), sites[1].label());
    // Different labels are left as they are.
    let mut sites = vec![
        site(1, 1, cudarc_stack(332)),
        site(1, 2, backward_stack("MmBackward0", 1)),
    ];
    distinguish(&mut sites);
    assert!(sites.iter().all(|s| s.extra.is_empty()));
}

#[test]
fn labels() {
    let mut f = py("/home/u/proj/train.py");
    f.function = Some("build_model".into());
    assert_eq!(f.label(), "proj/train.py:3 in build_model");
    let mut n = native("/usr/lib/libfoo.so");
    assert_eq!(n.label(), "libfoo.so+0x10");
    n.function = Some("foo".into());
    assert_eq!(n.label(), "foo in libfoo.so");
    n.file = Some("/src/foo.c".into());
    n.line = Some(9);
    assert_eq!(n.label(), "foo at src/foo.c:9");
    let mut a = native("x");
    a.module = None;
    assert_eq!(a.label(), "0x1010");
    assert_eq!(short_path("train.py"), "train.py");
    assert_eq!(short_path("/train.py"), "train.py");
}

/// A device's rows at its peak add up to the peak however the PyTorch process's reserve compares with its call
/// sites' bytes; its sites give way to its tensor lines, another process's stay.
#[test]
fn the_rows_at_a_peak_add_up_to_it_with_tensor_lines_in_place_of_the_cache_sites() {
    let sites = vec![
        site(1, 1, vec![py("/w/train.py")]),
        site(1, 2, vec![py("/w/train.py")]),
        site(2, 3, vec![py("/w/other.py")]),
    ];
    let lines = |allocated: u64, reserved: u64| TensorLines {
        pid: 1,
        taken_at: "exit".into(),
        lines: vec![TensorLine {
            line: "train.py:9 in step".into(),
            bytes: allocated - 10,
            tensors: 3,
        }],
        no_line_bytes: 10,
        allocated_bytes: allocated,
        reserved_bytes: reserved,
        ..TensorLines::default()
    };
    // pid 1: 600 in two sites listed and 100 unlisted; pid 2: 200 listed and 50 unlisted; 40 without a site.
    let device = |t: TensorLines| DeviceSites {
        device: Some(0),
        on_host: false,
        peak_bytes: 990,
        sites: vec![
            SiteBytes {
                site: 0,
                count: 0,
                bytes: 400,
            },
            SiteBytes {
                site: 2,
                count: 0,
                bytes: 200,
            },
            SiteBytes {
                site: 1,
                count: 0,
                bytes: 200,
            },
        ],
        unlisted_bytes: 150,
        no_site_bytes: 40,
        by_process: vec![(1, 700), (2, 250)],
        tensor_lines: vec![t],
    };
    for (allocated, reserved, outside) in [(500, 650, 50), (500, 720, 0), (500, 780, 0)] {
        let d = device(lines(allocated, reserved));
        let rows = d.rows(&sites);
        let sum: u64 = rows.iter().map(PeakRow::bytes).sum();
        assert_eq!(sum, 990, "{reserved}: {rows:?}");
        assert!(
            rows.contains(&PeakRow::Site {
                site: 2,
                bytes: 200
            }),
            "{rows:?}"
        );
        assert!(!rows
            .iter()
            .any(|r| matches!(r, PeakRow::Site { site: 0 | 1, .. })));
        assert!(rows.contains(&PeakRow::CacheFree {
            pid: 1,
            bytes: reserved - allocated
        }));
        assert_eq!(d.outside_cache(1), outside);
        let unlisted = rows
            .iter()
            .find(|r| matches!(r, PeakRow::Unlisted { .. }))
            .map_or(0, PeakRow::bytes);
        // pid 2's 50 unlisted bytes stay; a reserve past pid 1's sites takes the unsited bytes first.
        assert_eq!(unlisted, 50 - reserved.saturating_sub(700 + 40).min(50));
    }
}
