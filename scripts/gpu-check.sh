#!/usr/bin/env bash
# The GPU check: run from the repository root on a machine with an NVIDIA GPU. It installs what it
# needs, then runs `portkit backends`, the full CUDA conformance (JSON, JUnit, HTML), the CUDA tests
# and the benchmarks against torch on the GPU, each step's output in one folder:
#
#   bash scripts/gpu-check.sh [OUTPUT-FOLDER [CONFORM-OPTIONS...]]   # default: reports/gpu-<date>
#
# CONFORM-OPTIONS go to `portkit conform` (e.g. --quick, or --tier 6 alone).
# Then real models' shapes (benchmarks/gpu_shapes.py) and the inference zoo (benchmarks/models.py)
# run on cuda beside torch on the GPU.
# It installs into .venv-gpu (PORTKIT_VENV names another), seeing the machine's own packages, so
# a torch with CUDA already there is used; a venv where portkit already imports is used as it is.
# Offline machines: point pip at a folder of wheels (PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR), as pip
# reads both from the environment. Exit codes: 0 every step passed, 1 a step failed (summary.txt
# lists each step's exit code), 2 no usable NVIDIA GPU here (the reason and fix are printed).
# OpenCL and WebGPU are checked too where they see a device.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PORTKIT_VENV:-$ROOT/.venv-gpu}"
OUT="${1:-$ROOT/reports/gpu-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)" || exit 1
shift || true
SUMMARY="$OUT/summary.txt"
failed=0
: > "$SUMMARY"

# step NAME COMMAND...: runs the command with its output in NAME.log and on the terminal.
step() {
    local name="$1"; shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$OUT/$name.log"
    local status="${PIPESTATUS[0]}"
    printf '%-12s exit %s\n' "$name" "$status" >> "$SUMMARY"
    [ "$status" = 0 ] || failed=1
    return "$status"
}

install() {
    if "$VENV/bin/python" -c "import portkit, sys; sys.exit(portkit.__file__.find('$ROOT') != 0)" \
            2>/dev/null; then
        echo "portkit from $ROOT is installed in $VENV"
        return
    fi
    # The machine's own packages (torch with CUDA, CUDA wheels) stay visible in the venv, also
    # when python3 is itself a venv's, whose packages --system-site-packages alone would miss.
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv --system-site-packages "$VENV" || return
        local purelib
        purelib="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        python3 -c 'import site; print("\n".join(site.getsitepackages()))' > "$purelib/machine.pth"
    fi
    # Offline, the test extra's tools (ruff, mypy, ...) may be missing: the checks below need
    # only the core and cuda, with pytest and hypothesis from the machine.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
        --editable "$ROOT[cuda,test]" \
        || "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
            --no-build-isolation --editable "$ROOT[cuda]" || return
    # The OpenCL and WebGPU backends also run on an NVIDIA GPU where its ICD or Vulkan driver is.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
        --editable "$ROOT[opencl,webgpu]" || echo "pyopencl or wgpu could not be installed"
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
            2>/dev/null; then
        echo "no torch with CUDA here; trying pip (the benchmarks compare with it)"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch \
            || echo "torch with CUDA could not be installed: benchmarks show '-' for torch"
    fi
}

available() {
    "$VENV/bin/python" - "$1" <<'EOF'
import sys
from portkit import backends
try:
    backends.load(sys.argv[1])
except Exception as error:
    print(f"{sys.argv[1]}: not available here ({error})")
    sys.exit(1)
EOF
}

cd "$ROOT"
step install install || { echo "install failed; see $OUT/install.log" >&2; exit 1; }
export PATH="$VENV/bin:$PATH"
step nvidia-smi nvidia-smi
step backends portkit backends
if ! available cuda; then
    echo "gpu-check: nothing run on a GPU; run this on a machine with an NVIDIA GPU" >&2
    exit 2
fi
step conform-cuda portkit conform --backend cuda --json "$OUT/cuda.json" \
    --junit "$OUT/cuda.xml" --html "$OUT/cuda.html" --repro-dir "$OUT/repro" "$@"
step tests-cuda python -m pytest -q -p no:cacheprovider tests/reference_backends/test_cuda.py \
    tests/reference_backends/test_cuda_gpu.py
step bench-cuda python benchmarks/bench.py --device cuda --repeat 7 --json "$OUT/bench-cuda.json"
# Real models' matmul and convolution shapes one by one, and the zoo's kernels by time
step shapes-cuda python benchmarks/gpu_shapes.py --device cuda
# The inference zoo beside torch on the same GPU (and onnxruntime on the host); GPU_ZOO names
# a subset of its models.
step zoo-cuda python benchmarks/models.py --backend cuda --repeat 5 --timeout 300 \
    ${GPU_ZOO:+--models $GPU_ZOO} --json "$OUT/zoo-cuda.json"
for other in opencl webgpu; do
    if available "$other" >> "$OUT/other-backends.log" 2>&1; then
        step "conform-$other" portkit conform --backend "$other" --json "$OUT/$other.json" \
            --junit "$OUT/$other.xml" --html "$OUT/$other.html" --repro-dir "$OUT/repro" "$@"
    fi
done
echo "== summary ($OUT)"
cat "$SUMMARY"
exit "$failed"
