//! NVML under the cap, on the simulated driver and NVML (tests/fakenvml): `nvmlDeviceGetMemoryInfo` and `_v2`,
//! through `dlsym` (pynvml's way) and through a program linked with `-lnvidia-ml`, report the capped device as
//! `cuMemGetInfo_v2` does; without a cap, before the driver is initialised, or on an uncapped GPU they are
//! NVML's own; the cap lands on the GPU with the same UUID when NVML's order is not CUDA's.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vramtrace_e2e::*;

const CAP: u64 = 10 * MIB;
const ALLOC: u64 = 3 * MIB;
const GIB: u64 = 1 << 30;
const DEV: u64 = DEFAULT_DEVICE_BYTES;

/// v1 figures: rc, total, free, used.
type V1 = (u32, u64, u64, u64);
/// v2 figures: rc, total, reserved, free, used.
type V2 = (u32, u64, u64, u64, u64);

/// One device line of `nvml_probe` / `nvml_linked`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    phase: String,
    index: u32,
    uuid: String,
    v1: V1,
    v2: V2,
}

#[derive(Debug, Default)]
struct Out {
    lines: Vec<Line>,
    /// cuMemGetInfo_v2: rc, free, total
    cuda: Option<(u32, u64, u64)>,
    badversion: Option<u32>,
}

impl Out {
    fn at(&self, phase: &str, index: u32) -> &Line {
        self.lines
            .iter()
            .find(|l| l.phase == phase && l.index == index)
            .unwrap_or_else(|| panic!("no {phase} line for NVML device {index}: {self:?}"))
    }
}

fn parse(r: &RunResult, what: &str) -> Out {
    r.assert_success(what);
    assert!(
        r.stdout.lines().any(|l| l == "PASS"),
        "{what}: no PASS\n{}{}",
        r.stdout,
        r.stderr
    );
    let mut out = Out::default();
    for l in r.stdout.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let n = |i: usize| -> u64 {
            w[i].parse()
                .unwrap_or_else(|_| panic!("{what}: bad line {l:?}"))
        };
        match w.first() {
            Some(&"cuda") => out.cuda = Some((n(1) as u32, n(2), n(3))),
            Some(&"badversion") => out.badversion = Some(n(1) as u32),
            Some(_) if w.len() == 14 && w[3] == "v1" && w[8] == "v2" => out.lines.push(Line {
                phase: w[0].to_string(),
                index: n(1) as u32,
                uuid: w[2].to_string(),
                v1: (n(4) as u32, n(5), n(6), n(7)),
                v2: (n(9) as u32, n(10), n(11), n(12), n(13)),
            }),
            _ => {}
        }
    }
    out
}

/// The NVML UUID of simulated device `dev`: "GPU-" and the hex of the driver's bytes "fakecuda-gpu-NN\0".
fn uuid(dev: usize) -> String {
    let mut b = *b"fakecuda-gpu-\0\0\0";
    b[13] = b'0' + (dev / 10) as u8;
    b[14] = b'0' + (dev % 10) as u8;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// v1 and v2 figures of an uncapped device: (total, reserved, used apart from it).
fn plain(total: u64, reserved: u64, used: u64) -> (V1, V2) {
    let free = total - reserved - used;
    (
        (0, total, free, reserved + used),
        (0, total, reserved, free, used),
    )
}

/// v1 and v2 figures of a capped device holding `used` bytes of the job's (and nothing else).
fn capped(cap: u64, used: u64) -> (V1, V2) {
    ((0, cap, cap - used, used), (0, cap, 0, cap - used, used))
}

fn figures(l: &Line) -> (V1, V2) {
    (l.v1, l.v2)
}

fn probe_args(device: usize, before: bool) -> Vec<String> {
    let mut a = vec![
        "--device".to_string(),
        device.to_string(),
        "--alloc".to_string(),
        ALLOC.to_string(),
    ];
    if before {
        a.push("--before".into());
    }
    a
}

#[test]
fn through_dlsym_nvml_reports_the_cap_like_cuda() {
    let fc = FakeCuda::new().with_state();
    let (r, _) = fc.traced(
        "capped",
        &["--cap", "10MiB"],
        program("nvml_probe"),
        &probe_args(0, true),
    );
    let out = parse(&r, "nvml_probe under --cap 10MiB");
    // Before the driver is loaded NVML's figures stand: nothing says which CUDA device a GPU is yet.
    for i in 0..2 {
        let l = out.at("before", i);
        assert_eq!(l.uuid, uuid(i as usize));
        assert_eq!(figures(l), plain(DEV, 0, 0), "{l:?}");
    }
    // After: every device is capped at 10 MiB; device 0 holds the job's 3 MiB.
    let l0 = out.at("after", 0);
    assert_eq!(figures(l0), capped(CAP, ALLOC), "{l0:?}");
    let l1 = out.at("after", 1);
    assert_eq!(figures(l1), capped(CAP, 0), "{l1:?}");
    // NVML and the driver agree.
    assert_eq!(out.cuda, Some((0, l0.v1.2, l0.v1.1)));
    // A failing call is passed on unchanged.
    assert_eq!(out.badversion, Some(25));
}

#[test]
fn without_a_cap_the_figures_are_nvmls_own() {
    let traced_env = FakeCuda::new().with_state();
    let (r, _) = traced_env.traced(
        "uncapped",
        &[],
        program("nvml_probe"),
        &probe_args(0, false),
    );
    let traced = parse(&r, "nvml_probe under vramtrace run");
    let alone_env = FakeCuda::new().with_state();
    let alone = parse(
        &alone_env.run(program("nvml_probe"), &probe_args(0, false)),
        "nvml_probe alone",
    );
    assert_eq!(traced.lines, alone.lines);
    assert_eq!(figures(traced.at("after", 0)), plain(DEV, 0, ALLOC));
    assert_eq!(figures(traced.at("after", 1)), plain(DEV, 0, 0));

    // A cap on device 1 only leaves device 0 alone.
    let fc = FakeCuda::new().with_state();
    let (r, _) = fc.traced(
        "dev1",
        &["--cap", "1=10MiB"],
        program("nvml_probe"),
        &probe_args(0, false),
    );
    let out = parse(&r, "nvml_probe under --cap 1=10MiB");
    assert_eq!(figures(out.at("after", 0)), plain(DEV, 0, ALLOC));
    assert_eq!(figures(out.at("after", 1)), capped(CAP, 0));
}

#[test]
fn the_cap_lands_on_the_gpu_with_the_same_uuid() {
    // NVML lists the GPUs in the other order: NVML index 0 is CUDA device 1.
    let fc = FakeCuda::new().with_state().env("FAKENVML_REVERSE", "1");
    let (r, _) = fc.traced(
        "reversed",
        &["--cap", "1=10MiB"],
        program("nvml_probe"),
        &probe_args(1, false),
    );
    let out = parse(&r, "nvml_probe, NVML reversed, --cap 1=10MiB");
    let l0 = out.at("after", 0);
    assert_eq!(l0.uuid, uuid(1));
    assert_eq!(figures(l0), capped(CAP, ALLOC), "{l0:?}");
    let l1 = out.at("after", 1);
    assert_eq!(l1.uuid, uuid(0));
    assert_eq!(figures(l1), plain(DEV, 0, 0), "{l1:?}");
    assert_eq!(out.cuda, Some((0, CAP - ALLOC, CAP)));
}

#[test]
fn v2_keeps_the_reservation_apart() {
    let fc = FakeCuda::new().with_state().env("FAKENVML_RESERVED", "1G");
    // Capped: the capped device shows the job's bytes as used, no room left for the reservation.
    let (r, _) = fc.traced(
        "reserved",
        &["--cap", "10MiB"],
        program("nvml_probe"),
        &probe_args(0, false),
    );
    let out = parse(&r, "nvml_probe, 1 GiB reserved, --cap 10MiB");
    assert_eq!(figures(out.at("after", 0)), capped(CAP, ALLOC));
    // A cap above the device: NVML's figures come back as they were, the reservation included.
    let (r, _) = fc.traced(
        "above",
        &["--cap", "0=20GiB"],
        program("nvml_probe"),
        &probe_args(0, false),
    );
    let out = parse(&r, "nvml_probe, 1 GiB reserved, --cap 0=20GiB");
    assert_eq!(figures(out.at("after", 0)), plain(DEV, GIB, ALLOC));
}

/// `tests/programs/c/nvml_linked.c`, compiled with `cc ... -lnvidia-ml -lcuda` against the fakes.
fn nvml_linked() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../programs/c/nvml_linked.c");
        let out = scratch_dir().join("nvml_linked");
        compile_c(&src, &out, &["-O1", "-Wall"], &["-lnvidia-ml", "-lcuda"]);
        out
    })
    .clone()
}

#[test]
fn a_program_linked_with_nvml_sees_the_cap() {
    let fc = FakeCuda::new().with_state().env("FAKENVML_REVERSE", "1");
    let exe = nvml_linked();
    let args = ["0".to_string(), ALLOC.to_string()];
    let (r, _) = fc.traced("linked", &["--cap", "0=10MiB"], &exe, &args);
    let out = parse(&r, "nvml_linked under --cap 0=10MiB");
    let l = out.at("linked", 1);
    assert_eq!(l.uuid, uuid(0));
    assert_eq!(figures(l), capped(CAP, ALLOC), "{l:?}");
    assert_eq!(figures(out.at("linked", 0)), plain(DEV, 0, 0));
    // And without vramtrace, the same program sees the simulated NVML's figures.
    let alone = parse(
        &FakeCuda::new().with_state().run(&exe, &args),
        "nvml_linked alone",
    );
    assert_eq!(figures(alone.at("linked", 0)), plain(DEV, 0, ALLOC));
}
