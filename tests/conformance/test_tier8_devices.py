"""Tier 8 (devices) passes on the cpu backend's two logical devices and on PoCL's two OpenCL
devices, is unsupported with the reason on a one-device backend, and fails a second device
whose copies lose data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from portkit import backends, runtime
from portkit.conformance import tier8_devices
from portkit.conformance.case import Context, Status
from portkit.conformance.suite import TIERS, Tier, execute
from portkit.conformance.target import Target


def _outcomes(target: Target) -> dict:
    return {case.id: execute(target, case)
            for case in tier8_devices.cases(Context(target.capabilities, quick=True))}


def test_the_tier_is_registered_and_passes_on_two_cpu_devices():
    assert isinstance(tier8_devices, Tier) and TIERS[8] == tier8_devices.__name__
    outcomes = _outcomes(Target.load("cpu"))
    assert {k: o.status for k, o in outcomes.items()} == {
        "devices/copies": Status.PASSED, "devices/all-reduce": Status.PASSED,
        "devices/data-parallel-step": Status.PASSED, "devices/tensor-parallel": Status.PASSED
    }, {k: o.message for k, o in outcomes.items()}


def test_a_one_device_backend_is_unsupported_with_the_reason():
    outcomes = _outcomes(Target.load("interpreter"))
    assert {o.status for o in outcomes.values()} == {Status.UNSUPPORTED}
    assert "has one device here" in outcomes["devices/copies"].message


def test_a_second_device_whose_copies_lose_data_fails(monkeypatch):
    def lossy(destination, source_device, source, nbytes):
        destination[:nbytes] = np.zeros(nbytes, np.uint8)
        return True

    monkeypatch.setattr(runtime.get("cpu:1").device, "peer_copy", lossy)
    outcome = _outcomes(Target.load("cpu"))["devices/copies"]
    assert outcome.status is Status.FAILED and "changed bits" in outcome.message


def test_a_worker_s_target_loaded_from_its_entry_point_finds_the_second_device():
    """A conformance worker loads its own Device from the entry point, not the registry's."""
    origin = backends.entry_point("cpu").value
    fresh = backends.load_point(metadata.EntryPoint("cpu", origin, backends.GROUP))
    assert fresh is not runtime.get("cpu").device
    outcome = _outcomes(Target(fresh, "cpu", origin=origin))["devices/copies"]
    assert outcome.status is Status.PASSED, outcome.message


def _conform_opencl(tmp_path: Path, pocl_devices: str) -> tuple[dict, str]:
    """`portkit conform --backend opencl --tier 8` in a process whose PoCL makes the given
    devices: the JSON report's cases by id, and the output."""
    report = tmp_path / "report.json"
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "POCL_DEVICES": pocl_devices,
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "portkit", "conform", "--backend", "opencl",
                           "--tier", "8", "--json", str(report)], env=env, check=False,
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return {c["id"]: c for c in json.loads(report.read_text())["cases"]}, output


@pytest.mark.slow
def test_the_tier_passes_on_two_opencl_devices(tmp_path):
    """POCL_DEVICES="pthread pthread": copies through the host between two contexts. 11 s
    with compiled kernels on disk, 45 s without (2 cores, load 8)."""
    cases, output = _conform_opencl(tmp_path, "pthread pthread")
    assert {k: c["status"] for k, c in cases.items()} == {
        "devices/copies": "passed", "devices/all-reduce": "passed",
        "devices/data-parallel-step": "passed", "devices/tensor-parallel": "passed"}, output


def test_the_tier_on_one_opencl_device_is_unsupported_with_the_reason(tmp_path):
    cases, output = _conform_opencl(tmp_path, "pthread")
    assert {c["status"] for c in cases.values()} == {"unsupported"}, output
    reason = ("backend 'opencl' has one device here; tier 8 needs two (a backend with several "
              "declares Backend.devices)")
    assert {c["message"] for c in cases.values()} == {reason}
