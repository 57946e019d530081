#!/usr/bin/env python3
"""Checks vramtrace's release wheel (scripts/build-wheel.sh) against the manylinux2014 policy (PEP 599), as
auditwheel would, for every binary in it (maturin checks the one it builds; the shim, the simulated driver and
the workload are data to it): no glibc symbol version newer than 2.17, no libgcc symbol newer than GCC 4.8, and
no shared library beyond the policy's list. Also that the wheel holds what `vramtrace` looks for where it looks:
`vramtrace` in the wheel's `scripts` (the environment's bin), the other three in its `data` under
`lib/vramtrace/` (`<env>/lib/vramtrace/`, `../lib/vramtrace/` from `vramtrace`'s folder).

Usage: wheel.py WHEEL      exit 1 with the reasons on stderr when it breaks the policy or lacks a piece
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

NAME = "vramtrace"
BIN = "vramtrace"
LIBS = ["libvramtrace.so", "libfakecuda.so", "vramtrace-workload"]
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


def main():
    if len(sys.argv) != 2:
        print("usage: wheel.py WHEEL", file=sys.stderr)
        sys.exit(2)
    whl = sys.argv[1]
    tag = os.path.basename(whl)
    why = []
    # name-version-python-abi-platforms.whl; maturin writes the platforms in either order.
    parts = tag[:-len(".whl")].split("-")
    tags = {"-".join([parts[2], parts[3], p]) for p in parts[4].split(".")} if len(parts) == 5 else set()
    if not set(TAGS) <= tags:
        why.append("%s: not tagged %s" % (tag, " and ".join(TAGS)))
    tmp = tempfile.mkdtemp(prefix="vramtrace-wheel-check-")
    try:
        with zipfile.ZipFile(whl) as z:
            names = z.namelist()
            want = [n for n in names if re.fullmatch(r"[^/]+\.data/scripts/" + re.escape(BIN), n)]
            want += [n for n in names if re.fullmatch(r"[^/]+\.data/data/lib/vramtrace/[^/]+", n)
                     and n.rsplit("/", 1)[1] in LIBS]
            got = sorted(n.rsplit("/", 1)[1] for n in want)
            if got != sorted([BIN] + LIBS):
                why.append("holds %s where %s were expected" % (got, sorted([BIN] + LIBS)))
            for n in want:
                path = z.extract(n, tmp)
                if not z.getinfo(n).external_attr >> 16 & 0o111:
                    why.append("%s: not executable" % n)
                why += ["%s: %s" % (n, w) for w in check(path)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if why:
        for w in why:
            print("wheel.py: " + w, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
