"""portkit.profile, PORTKIT_PROFILE and `portkit profile`: a Chrome trace of launches, compiles,
realizes and read-backs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portkit
from portkit.cli import main
from portkit.tensor import Tensor

ROOT = Path(__file__).resolve().parents[1]


def _events(trace: dict, category: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == category]


def test_a_profile_records_each_launch_compile_realize_and_read_back(tmp_path):
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="cpu")
    with portkit.profile(tmp_path / "trace.json") as found:
        (x * 2).sum(1).numpy()
        (x * 2).sum(1).numpy()          # a replay: launches again, compiles nothing
    trace = json.loads((tmp_path / "trace.json").read_text())
    kernels = _events(trace, "kernel")
    assert len(kernels) == 2 and kernels[0]["name"] == kernels[1]["name"]
    assert all(k["dur"] >= 0 and k["args"]["grid"] and k["ph"] == "X" for k in kernels)
    # the read-backs of the values (a device's fault flag may be read back too)
    reads = [e for e in _events(trace, "read-back") if e["name"] == "3 x float32"]
    assert len(_events(trace, "realize")) == 2 and len(reads) == 2
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {"host (Python)", "device cpu"}
    assert found.totals()[0][:2] == (kernels[0]["name"], 2)
    (x + 1).numpy()                     # after the block: nothing more recorded
    assert len(found.totals()) == 1


def test_profiles_do_not_nest():
    with portkit.profile(), pytest.raises(RuntimeError, match="open already"), \
            portkit.profile():
        pass


def test_the_setting_profiles_a_whole_process(tmp_path):
    out = tmp_path / "whole.json"
    script = "import portkit; portkit.Tensor([1.0, 2.0], device='cpu').exp().numpy()"
    env = {**os.environ, "PORTKIT_PROFILE": str(out)}
    subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, check=True)
    assert [e["name"] for e in _events(json.loads(out.read_text()), "kernel")]


def test_the_command_runs_a_script_and_lists_its_kernels(tmp_path, capsys, monkeypatch):
    script = tmp_path / "work.py"
    script.write_text("import sys\nimport portkit\n"
                      "portkit.Tensor([1.0, 2.0], device='cpu').exp().sum().numpy()\n"
                      "sys.exit(3 if sys.argv[1:] == ['--flag'] else 0)\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "t.json"
    assert main(["profile", "-o", str(out), str(script), "--flag"]) == 3
    shown = capsys.readouterr().out
    assert "launches" in shown and str(out) in shown
    assert _events(json.loads(out.read_text()), "kernel")
