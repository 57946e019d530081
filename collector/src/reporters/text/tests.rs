use super::layout::glue_units;
use super::*;

#[test]
fn a_size_and_its_unit_are_glued() {
    assert_eq!(
        glue_units("of 8.00 GiB cap, 3 B"),
        "of 8.00\u{e000}GiB cap, 3\u{e000}B"
    );
    assert_eq!(glue_units("3 processes"), "3 processes");
}

#[test]
fn a_cut_label_keeps_what_tells_it_apart() {
    // Two lines of one file, cut to 40: the file and line stay, the function's name loses its start.
    let a = "cudarc::driver::safe::core::CudaStream::alloc_zeros at driver/safe/core.rs:1629";
    let b = "cudarc::driver::safe::core::CudaStream::alloc_zeros at driver/safe/core.rs:1656";
    let (fa, fb) = (fit_label(a, 40), fit_label(b, 40));
    assert_eq!(fa, "…alloc_zeros at driver/safe/core.rs:1629");
    assert_ne!(fa, fb);
    assert!(
        fb.ends_with("core.rs:1656") && fb.chars().count() <= 40,
        "{fb}"
    );
    // Too narrow for the directory: it goes first; `(inlined)` stays.
    let c = "vramtrace_workload::training at workload/src/main.rs:332 (inlined)";
    assert_eq!(fit_label(c, 30), "…ing at …main.rs:332 (inlined)");
    assert_eq!(fit_label(c, 30).chars().count(), 30);
    // C++ parameters go before the name is cut; the relation before a caller stays.
    let d = "<- at::native::structured_mm_out_cuda::impl(at::Tensor const&, at::Tensor const&) in libtorch_cuda.so";
    let fd = fit_label(d, 60);
    assert_eq!(
        fd,
        "<- …ive::structured_mm_out_cuda::impl(…) in libtorch_cuda.so"
    );
    // Python: the file and line stay, the function's end goes.
    let e = "proj/models/transformer.py:1234 in forward_with_a_very_long_name_indeed_and_more";
    assert_eq!(
        fit_label(e, 48),
        "proj/models/transformer.py:1234 in forward_with…"
    );
    // Short enough: unchanged; anything else keeps both ends.
    assert_eq!(fit_label("libfoo.so+0x10", 40), "libfoo.so+0x10");
    assert_eq!(
        fit_label("stack 12345 (frames not recorded)", 20),
        "stack 123… recorded)"
    );
}

#[test]
fn wraps_at_width() {
    let mut o = String::new();
    wrap(&mut o, "aaa bbb ccc ddd", "  ", 8);
    assert_eq!(o, "aaa bbb\n  ccc\n  ddd\n");
    assert_eq!(
        short_command(&["/usr/bin/python3".into(), "t.py".into()]),
        "python3 t.py"
    );
}

/// The process table's commands take the room a wide terminal has, and keep the fixed width otherwise.
#[test]
fn commands_take_the_room_a_terminal_has() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let a =
        crate::whatif::trace_file::analyze(&dir.join("tests/fixtures/gpu/keep.vtrace")).unwrap();
    let full = super::short_command(&a.processes[0].cmdline);
    assert!(
        full.chars().count() > 30,
        "the test needs a long command: {full}"
    );
    let row = |text: String| {
        let pid = a.processes[0].pid.to_string();
        text.lines()
            .find(|l| l.trim_start().starts_with(&pid))
            .unwrap()
            .to_string()
    };
    let narrow = row(super::render(&a, None));
    let wide = row(super::render_in(&a, None, 160));
    assert!(
        !narrow.contains(&full) && narrow.chars().count() <= WIDTH,
        "{narrow}"
    );
    assert!(wide.contains(&full), "{wide}");
    // Prose stays within the fixed width, and a terminal narrower than it changes nothing.
    assert_eq!(super::render_in(&a, None, 40), super::render(&a, None));
}
