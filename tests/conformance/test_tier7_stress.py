"""Tier 7 (stress) passes on the reference backends and fails a backend with the faults it was
written for (issue 11, "What to build" 2). Called directly: its registration in suite.TIERS is a
one-line change in suite.py."""
from __future__ import annotations

import dataclasses

import pytest

from portkit import runtime
from portkit.abi import BackendUnavailable
from portkit.conformance import tier7_stress
from portkit.conformance.case import Context, Status
from portkit.conformance.suite import Tier, execute
from portkit.conformance.target import Target
from portkit.schedule import stages


def _target(name: str) -> Target:
    try:
        return Target.load(name)
    except BackendUnavailable as error:
        pytest.skip(f"{name} is not available here: {error}")


def test_the_tier_is_a_tier():
    assert isinstance(tier7_stress, Tier) and tier7_stress.TIER == 7
    ids = [c.id for c in tier7_stress.cases(Context(_target("cpu").capabilities))]
    assert len(ids) == len(set(ids)) and "stress/sum/20000001" in ids


@pytest.mark.parametrize("backend", ["cpu", "webgpu", "opencl", "interpreter"])
def test_the_quick_stress_tier_passes(backend):
    target = _target(backend)
    outcomes = {case.id: execute(target, case)
                for case in tier7_stress.cases(Context(target.capabilities, quick=True))}
    failed = {k: o.message for k, o in outcomes.items()
              if o.status not in (Status.PASSED, Status.UNSUPPORTED)}
    assert failed == {}
    assert outcomes["stress/threads"].status is Status.PASSED


def _sum_1100003(target: Target):
    runtime.clear()   # kernels and recorded steps lowered with other stages
    (case,) = [c for c in tier7_stress.cases(Context(target.capabilities, quick=True))
               if c.id == "stress/sum/1100003"]
    outcome = execute(target, case)
    runtime.clear()   # and none lowered with them stays behind
    return outcome


def test_a_device_that_stops_long_loops_without_declaring_it_fails_it(monkeypatch):
    # Before the scheduler cut reduces into short stages, lavapipe returned 65535 for a sum
    # of 70001 ones. Sums now run in partial accumulators, so a kernel loops a quarter as
    # often, and lavapipe's limit counts every iteration of the shader: with the stages made
    # long again and no budget declared, the 1,100,003-element sum must still show it.
    device = _target("webgpu").device
    monkeypatch.setattr(device, "capabilities",
                        dataclasses.replace(device.capabilities, max_loop_trips=None))
    monkeypatch.setattr(stages, "CHUNK", 1 << 30)
    monkeypatch.setattr(stages, "_SPLIT_FROM", 1 << 30)
    monkeypatch.setattr(stages, "_LANES_FROM", 1 << 30)
    outcome = _sum_1100003(Target(device, "webgpu"))
    assert outcome.status is Status.FAILED and "ones(1100003).sum()" in outcome.message


def test_the_declared_loop_budget_alone_keeps_long_sums_right(monkeypatch):
    target = _target("webgpu")
    assert target.capabilities.max_loop_trips == 65535      # lavapipe's, declared
    monkeypatch.setattr(stages, "CHUNK", 1 << 30)
    monkeypatch.setattr(stages, "_SPLIT_FROM", 1 << 30)
    monkeypatch.setattr(stages, "_LANES_FROM", 1 << 30)
    outcome = _sum_1100003(target)
    assert outcome.status is Status.PASSED, outcome.message


def test_a_declared_loop_budget_that_is_too_large_fails_it(monkeypatch):
    device = _target("webgpu").device
    monkeypatch.setattr(device, "capabilities",
                        dataclasses.replace(device.capabilities, max_loop_trips=1 << 17))
    target = Target(device, "webgpu")
    (case,) = [c for c in tier7_stress.cases(Context(target.capabilities, quick=True))
               if c.id.startswith("stress/loop/")]
    outcome = execute(target, case)
    assert outcome.status is Status.FAILED and "ran 65535 times" in outcome.message
