# Sourced by the scripts that build for the glibc 2.17 baseline (manylinux2014): puts cargo-zigbuild and zig
# (both from PyPI: cargo-zigbuild, ziglang) on PATH, installed into a virtual environment under the target folder
# if they are not there already. Expects $target (the cargo target folder).
if ! command -v cargo-zigbuild >/dev/null 2>&1 || ! python3 -m ziglang version >/dev/null 2>&1; then
    env="$target/zigenv"
    if [ ! -x "$env/bin/cargo-zigbuild" ]; then
        echo "zigenv.sh: installing ziglang and cargo-zigbuild (PyPI) into $env" >&2
        if python3 -m venv "$env" 2>/dev/null; then
            "$env/bin/python3" -m pip install -q --disable-pip-version-check ziglang cargo-zigbuild
        else
            # No venv module (Debian's python3 without python3-venv): a user install.
            python3 -m pip install -q --user --disable-pip-version-check ziglang cargo-zigbuild 2>/dev/null \
                || python3 -m pip install -q --user --break-system-packages --disable-pip-version-check \
                    ziglang cargo-zigbuild
            mkdir -p "$env/bin"
            ln -sf "$(python3 -m site --user-base)/bin/cargo-zigbuild" "$env/bin/cargo-zigbuild"
        fi
    fi
    export PATH="$env/bin:$PATH"
fi
