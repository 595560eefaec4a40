# Installs what portkit needs, once; sourced by conform.sh and test.sh. A second run is quick:
# apt is skipped when every package is installed, pip when .venv records this pyproject.toml.
#   system packages (apt, as root): compilers and drivers the reference backends run on
#   .venv: portkit, editable, with the extras that work on Linux
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
APT_PACKAGES=(clang pocl-opencl-icd ocl-icd-opencl-dev clinfo mesa-vulkan-drivers libvulkan1
              libegl1 libgl1-mesa-dri glslang-tools)
EXTRAS="opencl,cuda,webgpu,onnx,test,examples,bench"

missing_apt_packages() {
    local package
    for package in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
            || echo "$package"
    done
}

install_system_packages() {
    if ! command -v dpkg-query >/dev/null; then
        echo "portkit setup: no dpkg here; install the equivalents of: ${APT_PACKAGES[*]}" >&2
        return
    fi
    # python3 -m venv needs ensurepip, which Debian ships separately as python3-venv.
    if command -v python3 >/dev/null && ! python3 -c "import ensurepip" 2>/dev/null; then
        APT_PACKAGES+=(python3-venv)
    fi
    command -v python3 >/dev/null || APT_PACKAGES+=(python3 python3-venv)
    local missing
    missing="$(missing_apt_packages | paste -sd ' ')"
    [ -z "$missing" ] && return
    local line="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $missing"
    if [ "$(id -u)" != 0 ]; then
        echo "portkit setup: missing system packages: $missing" >&2
        echo "  the backends that need them will report themselves unavailable; to install:" >&2
        echo "  sudo sh -c '$line'" >&2
        return
    fi
    echo "portkit setup: installing system packages: $missing"
    sh -c "$line" >/dev/null || echo "portkit setup: apt-get failed; continuing without" >&2
}

install_python_packages() {
    local stamp="$ROOT/.venv/portkit-installed"
    local want
    want="$(sha256sum < "$ROOT/pyproject.toml" | cut -d' ' -f1) $EXTRAS"
    if [ -x "$ROOT/.venv/bin/portkit" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return
    fi
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { echo "portkit needs Python >= 3.10; found $(python3 --version)" >&2; return 1; }
    echo "portkit setup: installing portkit[$EXTRAS] into .venv"
    [ -x "$ROOT/.venv/bin/python" ] || python3 -m venv "$ROOT/.venv"
    # pip's log is long; show it only when the install fails.
    "$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check \
        --editable "$ROOT[$EXTRAS]" > "$ROOT/.venv/pip.log" 2>&1 \
        || { cat "$ROOT/.venv/pip.log" >&2; return 1; }
    # PyTorch CPU is only a yardstick (tests compare with it where installed): take the CPU
    # build from a local wheel when the machine has one (PyPI has no '+cpu' build, so this never
    # starts a multi-GB download of the CUDA build).
    "$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check \
        "torch==2.13.0+cpu" >> "$ROOT/.venv/pip.log" 2>&1 \
        || echo "portkit setup: no local torch 2.13.0 wheel; tests compare with numpy only"
    echo "$want" > "$stamp"
}

install_system_packages
install_python_packages
# Mesa's Vulkan driver (the WebGPU backend's adapter here) warns without a runtime directory.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/portkit-runtime-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
export PATH="$ROOT/.venv/bin:$PATH"
cd "$ROOT"
