"""Tier 8 (devices) passes on the cpu backend's two logical devices, is unsupported with the
reason on a one-device backend, and fails a second device whose copies lose data."""
from __future__ import annotations

from importlib import metadata

import numpy as np

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
        "devices/data-parallel-step": Status.PASSED}, {k: o.message for k, o in outcomes.items()}


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
