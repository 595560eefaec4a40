"""scripts/gpu-check.sh on a machine without an NVIDIA GPU: it stops cleanly, exit code 2,
with the driver's reason and fix, after recording the steps it ran. (On a GPU it runs the
whole CUDA check, minutes long; scripts/gpu-check.sh is run there by hand.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from portkit import backends

ROOT = Path(__file__).resolve().parent.parent


def test_without_a_gpu_it_stops_with_the_reason(tmp_path):
    reason = backends.available()["cuda"]
    if reason is None:
        pytest.skip("this machine has a GPU: run `bash scripts/gpu-check.sh` by hand")
    env = dict(os.environ, PORTKIT_VENV=sys.prefix, PATH=f"{Path(sys.executable).parent}:"
               f"{os.environ['PATH']}")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(tmp_path)],
                          capture_output=True, text=True, env=env, check=False, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nothing run on a GPU" in done.stderr
    assert f"cuda: not available here ({reason}" in done.stdout + done.stderr
    steps = (tmp_path / "summary.txt").read_text().split("\n")
    assert [line.split()[0] for line in steps if line] == ["install", "nvidia-smi", "backends"]
    assert "backends     exit 0" in steps
