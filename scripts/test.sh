#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this): formatting, lints, a build of every artifact the
# end-to-end tests run (the shim, the collector, the simulated driver, the door programs, the workload),
# then every test. No GPU needed: the tests run against the simulated driver (tests/fakecuda).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The tests compile one C door program (cc) and check JSON with python3; install them if this machine lacks them.
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# The wheel's test installs it into a fresh virtual environment (Debian splits venv/ensurepip out of python3).
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
    echo "test.sh: installing ${need[*]}"
    apt-get update -qq && apt-get install -y -qq "${need[@]}"
fi
# The HTML export's page is loaded in a real headless browser (collector/tests/export_html.rs): Debian's
# chromium. Installed when missing; if it cannot be, say so loudly (the test then skips, saying so too).
if ! command -v chromium >/dev/null 2>&1 && [ -z "${VRAMTRACE_CHROMIUM:-}" ]; then
    echo "test.sh: installing chromium (the HTML export's browser test)"
    { apt-get update -qq && apt-get install -y -qq chromium; } || true
fi
if command -v chromium >/dev/null 2>&1 || [ -n "${VRAMTRACE_CHROMIUM:-}" ]; then
    export VRAMTRACE_REQUIRE_BROWSER=1
else
    echo "test.sh: WARNING: chromium could not be installed: the HTML export's browser test will be SKIPPED" >&2
fi
# `vramtrace run --metrics` is scraped by a real Prometheus server and linted by promtool
# (tests/e2e/tests/metrics.rs), and `vramtrace top` is driven in a tmux pseudo-terminal (tests/e2e/tests/top.rs):
# Debian's prometheus (it provides both) and tmux, installed when missing.
need=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
if [ ${#need[@]} -gt 0 ]; then
    echo "test.sh: installing ${need[*]}"
    { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } || true
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    echo "test.sh: WARNING: prometheus could not be installed: the metrics scrape test will be SKIPPED" >&2
    export VRAMTRACE_ALLOW_NO_PROMETHEUS=1
fi
if ! command -v tmux >/dev/null 2>&1; then
    echo "test.sh: WARNING: tmux could not be installed: the top terminal test will be SKIPPED" >&2
    export VRAMTRACE_ALLOW_NO_TMUX=1
fi
if [ "$(id -u)" != 0 ]; then
    echo "test.sh: WARNING: not root: the tests that run a process as another user will be SKIPPED" >&2
    export VRAMTRACE_ALLOW_NO_ROOT=1
fi
for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" 2>/dev/null || true
done

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The Python code's lint and types (pyproject.toml's [tool.ruff] and [tool.mypy]): ruff and mypy from PyPI, pinned,
# in an environment of their own under target/, made once and reused.
lint="${CARGO_TARGET_DIR:-target}/python-lint-venv"
if ! "$lint/bin/ruff" --version 2>/dev/null | grep -qx 'ruff 0.17.6' ||
    ! "$lint/bin/mypy" --version 2>/dev/null | grep -q '^mypy 2.4.1 '; then
    echo "test.sh: installing ruff and mypy (PyPI) into $lint"
    python3 -m venv --clear "$lint"
    "$lint/bin/python" -m pip install -q --disable-pip-version-check 'ruff==0.17.6' 'mypy==2.4.1'
fi
lint="$(cd "$lint" && pwd)"
"$lint/bin/ruff" check bridge python
(cd python && "$lint/bin/mypy" --config-file ../pyproject.toml -p vramtrace)
(cd bridge && "$lint/bin/mypy" --config-file ../pyproject.toml -p vramtrace_bridge)
cargo build --workspace --locked
# The shim as it ships (glibc 2.17 baseline): tests/e2e/tests/shim_glibc.rs checks what it needs and runs it.
VRAMTRACE_COMPAT_SHIM="$(scripts/build-compat-shim.sh)"
export VRAMTRACE_COMPAT_SHIM
# The wheel as it ships (`pip install`): tests/e2e/tests/wheel.rs installs it into a fresh environment and runs it.
VRAMTRACE_WHEEL="$(scripts/build-wheel.sh | tail -n1)"
export VRAMTRACE_WHEEL
# `pip install .` from the checkout into a fresh environment, and the demo from it (the wheel's build reused).
scripts/test-pip-install.sh
# A traced Jupyter kernel is started by jupyter_client (tests/e2e/tests/kernel.rs): jupyter_client and ipykernel
# from PyPI, in an environment of their own under target/, made once and reused.
jupyter="${CARGO_TARGET_DIR:-target}/jupyter-venv"
# The majors tested (ipykernel 7 changed its parent check and interrupts); --clear mends one a new python3 broke.
if ! "$jupyter/bin/python" -c 'import jupyter_client, ipykernel' >/dev/null 2>&1; then
    echo "test.sh: installing jupyter_client and ipykernel (PyPI) into $jupyter"
    python3 -m venv --clear "$jupyter"
    "$jupyter/bin/python" -m pip install -q --disable-pip-version-check 'jupyter_client>=8,<9' 'ipykernel>=7,<8'
fi
VRAMTRACE_JUPYTER_PYTHON="$(cd "$jupyter" && pwd)/bin/python"
export VRAMTRACE_JUPYTER_PYTHON
cargo test --workspace --locked
# The Python bridge's own tests (standard library only; the end-to-end ones are in tests/e2e/tests/bridge.rs).
python3 -m unittest discover -s bridge/tests
# The `vramtrace` Python package's (the API and the magics; a real kernel: tests/e2e/tests/kernel.rs).
python3 -m unittest discover -s python/tests
