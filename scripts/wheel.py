#!/usr/bin/env python3
"""Assembles vramtrace's wheel from binaries built for the glibc 2.17 baseline (scripts/build-wheel.sh), after
checking them against the manylinux2014 policy (PEP 599), as auditwheel would: no glibc symbol version newer than
2.17, no libgcc symbol newer than GCC 4.8, and no shared library beyond the policy's list.

The wheel holds no Python: `vramtrace` goes into the environment's bin (the wheel's `scripts`), the shim, the
simulated driver and the demo's workload into `<env>/lib/vramtrace/` (the wheel's `data`), where `vramtrace`
looks for them from its own folder (`../lib/vramtrace/`), as an install under a prefix (scripts/install.sh).

Usage: wheel.py --out DIR --version V --bin PATH --lib PATH [--lib PATH...]    prints the wheel's path last
"""

import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile

NAME = "vramtrace"
TAGS = ["py3-none-manylinux_2_17_x86_64", "py3-none-manylinux2014_x86_64"]
GLIBC_MAX = (2, 17)
GCC_MAX = (4, 8, 0)
# PEP 599's libraries a manylinux2014 wheel may need from the system (the graphics ones are of no use here).
ALLOWED = {
    "libgcc_s.so.1", "libstdc++.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libc.so.6",
    "libnsl.so.1", "libutil.so.1", "libpthread.so.0", "libresolv.so.2", "libcrypt.so.1",
    "ld-linux-x86-64.so.2",
}


def versions(text, prefix):
    out = []
    for m in re.finditer(re.escape(prefix) + r"([0-9][0-9.]*)", text):
        out.append(tuple(int(x) for x in m.group(1).split(".") if x))
    return out


def check(path):
    """Why `path` breaks the policy, or []."""
    why = []
    syms = subprocess.run(["objdump", "-T", path], capture_output=True, text=True, check=True).stdout
    glibc = versions(syms, "GLIBC_")
    if not glibc:
        why.append("no GLIBC symbol versions read")
    elif max(glibc) > GLIBC_MAX:
        why.append("needs GLIBC_%s" % ".".join(map(str, max(glibc))))
    gcc = versions(syms, "GCC_")
    if gcc and max(gcc) > GCC_MAX:
        why.append("needs GCC_%s" % ".".join(map(str, max(gcc))))
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic):
        if lib not in ALLOWED:
            why.append("needs %s, not in manylinux2014's list" % lib)
    return why


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--lib", action="append", default=[])
    a = ap.parse_args()

    bad = {p: check(p) for p in [a.bin] + a.lib}
    bad = {p: w for p, w in bad.items() if w}
    if bad:
        for p, w in bad.items():
            print("wheel.py: %s: %s" % (p, "; ".join(w)), file=sys.stderr)
        sys.exit(1)

    data = "%s-%s.data" % (NAME, a.version)
    info = "%s-%s.dist-info" % (NAME, a.version)
    files = [("%s/scripts/%s" % (data, os.path.basename(a.bin)), a.bin)]
    files += [("%s/data/lib/vramtrace/%s" % (data, os.path.basename(p)), p) for p in a.lib]
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: " + NAME,
        "Version: " + a.version,
        "Summary: See, cap and explain the GPU memory of any CUDA program on Linux, with no change to it",
        "License: MIT OR Apache-2.0",
        "Classifier: Environment :: GPU :: NVIDIA CUDA",
        "Classifier: Operating System :: POSIX :: Linux",
        "",
        "`vramtrace run -- CMD` traces every CUDA memory call of a job; `vramtrace report`, `oom` and `export` read",
        "the trace. This wheel puts `vramtrace` on the environment's PATH, with its preloaded shim beside it.",
        "",
    ])
    wheel = "\n".join(["Wheel-Version: 1.0", "Generator: vramtrace scripts/wheel.py", "Root-Is-Purelib: false"]
                      + ["Tag: " + t for t in TAGS]) + "\n"

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "%s-%s-py3-none-%s.whl" % (NAME, a.version,
                                                           ".".join(t.split("-", 2)[2] for t in TAGS)))
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        def put(name, content, mode):
            zi = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, content)
            record.append("%s,%s,%d" % (name, digest(content), len(content)))

        for name, src in files:
            with open(src, "rb") as f:
                put(name, f.read(), 0o755)
        put(info + "/METADATA", metadata.encode(), 0o644)
        put(info + "/WHEEL", wheel.encode(), 0o644)
        record.append(info + "/RECORD,,")
        zi = zipfile.ZipInfo(info + "/RECORD", date_time=(2026, 1, 1, 0, 0, 0))
        zi.external_attr = 0o100644 << 16
        z.writestr(zi, "\n".join(record) + "\n", zipfile.ZIP_DEFLATED)
    print(path)


if __name__ == "__main__":
    main()
