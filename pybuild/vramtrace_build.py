"""vramtrace's PEP 517 backend: maturin's, with the wheel's other artifacts built first.

maturin (`bindings = "bin"`, pyproject.toml) builds one crate's binary, `vramtrace`. What `vramtrace` runs beside
it comes from three other crates of the workspace: the shim `libvramtrace.so` (preloaded into the traced job),
the simulated driver `libfakecuda.so` and the demo's workload `vramtrace-workload`. This backend builds those
three with cargo, for the same target as maturin's build, stages them in maturin's `data` folder
(`target/wheel-data/data/lib/vramtrace/`, installed into `<env>/lib/vramtrace/`), then calls maturin's backend
unchanged. Everything else (metadata, the sdist, the editable build) is maturin's.

Settings go through maturin's own: `--config-settings build-args="..."` or `MATURIN_PEP517_ARGS`. With `--zig`
(scripts/build-wheel.sh: `--zig --compatibility manylinux2014 --target x86_64-unknown-linux-gnu`) the three are
built with cargo-zigbuild against glibc 2.17 too, and the build's tools (ziglang, cargo-zigbuild) are asked of the
build environment. The wheel's binaries carry no debug information (a quarter of the size; their symbol tables
stay, for backtraces), but for the workload's line tables (the demo's call sites), and are built in
`<target>/wheel`, apart from `cargo build --release`'s.
"""

import os
import shutil
import subprocess
import sys

import maturin
from maturin import (  # noqa: F401  (the rest of the backend is maturin's)
    build_sdist,
    get_requires_for_build_sdist,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# pyproject.toml's `[tool.maturin] data`.
DATA = os.path.join(ROOT, "target", "wheel-data")
# (cargo package, file it builds) for `<env>/lib/vramtrace/`.
COMPANIONS = [
    ("vramtrace-shim", "libvramtrace.so"),
    ("fakecuda", "libfakecuda.so"),
    ("vramtrace-workload", "vramtrace-workload"),
]
# The companion whose line tables stay: the demo names its call sites by them (`training at src/main.rs:341`;
# from its symbol table alone both sites read `Gpu::alloc in vramtrace-workload`, one site). Built with the
# release profile's own debug information (`debug = "limited"` for that crate alone: line tables alone drop the
# functions' module paths, `training` for `vramtrace_workload::training`); its debug sections, std's with them,
# are compressed rather than stripped: about 1.2 MB more in the wheel and installed (docs/PACKAGING.md).
LINE_TABLES = "vramtrace-workload"
ZIG_TOOLS = ["ziglang", "cargo-zigbuild"]
GLIBC_BASELINE = "2.17"


def _say(msg):
    print("vramtrace build: " + msg, file=sys.stderr, flush=True)


def _fail(msg):
    _say(msg)
    raise SystemExit(1)


def _args(config_settings):
    return maturin.get_maturin_pep517_args(config_settings)


def _value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _target_dir():
    """Where the wheel's build goes: `<CARGO_TARGET_DIR or ./target>/wheel`, shared by maturin and the three."""
    base = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(base, "wheel")


def _env():
    """The build's environment, set in this process too so that maturin's cargo sees the same."""
    os.environ["CARGO_TARGET_DIR"] = _target_dir()
    # No debug information of our own in the wheel's binaries (the release profile keeps line tables, `debug =
    # 1`), but their symbol tables kept: the shim tells its own frames from its callers' by them, and call sites
    # in the demo's workload are named by them. No stripping by the linker: zig's strips the symbol tables too
    # when asked to strip debug information; std's debug information is taken out by objcopy instead, below.
    os.environ.setdefault("CARGO_PROFILE_RELEASE_DEBUG", "0")
    os.environ.setdefault("CARGO_PROFILE_RELEASE_STRIP", "none")
    # The tools pip installed into the build environment (cargo-zigbuild, ziglang's python) come first.
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    return os.environ


def _build_companions(args):
    if shutil.which("cargo") is None:
        _fail(
            "building vramtrace from source needs Rust's cargo (https://rustup.rs), not found on PATH; "
            "or install a released wheel, which needs no Rust"
        )
    env = _env()
    zig = "--zig" in args
    target = _value(args, "--target")
    if zig and not target:
        _fail("--zig needs --target (e.g. x86_64-unknown-linux-gnu), as scripts/build-wheel.sh passes")
    cmd = ["cargo", "zigbuild" if zig else "build", "--release", "--locked"]
    for pkg, _ in COMPANIONS:
        cmd += ["-p", pkg]
    cmd += ["--features", "vramtrace-workload/glibc217"]
    # One token (`--config=...`): cargo-zigbuild passes it on to cargo whole.
    cmd += ['--config=profile.release.package.%s.debug="limited"' % LINE_TABLES]
    if target:
        cmd += ["--target", target + ("." + GLIBC_BASELINE if zig else "")]
    _say("building the shim, the simulated driver and the workload: " + " ".join(cmd))
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=sys.stderr)
    built = os.path.join(env["CARGO_TARGET_DIR"], target or "", "release")
    lib = os.path.join(DATA, "data", "lib", "vramtrace")
    shutil.rmtree(DATA, ignore_errors=True)
    os.makedirs(lib)
    for pkg, name in COMPANIONS:
        src = os.path.join(built, name)
        if not os.path.isfile(src):
            _fail("%s was not built" % src)
        dst = os.path.join(lib, name)
        if shutil.which("objcopy"):
            keep = "--compress-debug-sections=zlib" if pkg == LINE_TABLES else "--strip-debug"
            subprocess.run(["objcopy", keep, src, dst], check=True)
            shutil.copymode(src, dst)
        else:
            shutil.copy2(src, dst)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    # maturin checks that the `data` folder exists before anything is built.
    os.makedirs(DATA, exist_ok=True)
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def get_requires_for_build_wheel(config_settings=None):
    req = list(maturin.get_requires_for_build_wheel(config_settings))
    if "--zig" in _args(config_settings):
        req += ZIG_TOOLS
    return req


get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_companions(_args(config_settings))
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_companions(_args(config_settings))
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
