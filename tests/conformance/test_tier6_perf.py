"""Tier 6 is honest: the CPU reference's best kernel for the work, and noisy figures flagged."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from portkit.conformance import tier6_perf
from portkit.conformance.case import Context, Status
from portkit.conformance.target import Target


@pytest.fixture(scope="module")
def cpu() -> Target:
    return Target.load("cpu")


def test_the_codegen_matmul_is_right_on_the_reference(cpu):
    workload = tier6_perf.lowered_matmul(64, np.random.default_rng(0), cpu.capabilities)
    tier6_perf._verify(cpu, workload)        # raises CaseFailed on a wrong element
    assert workload.kernel.block == (1, 1, 1)   # the CPU's threads-as-loops lowering


def test_the_codegen_matmul_of_a_device_with_workgroup_memory_is_local_tiled_and_right():
    vendor = Target.load("interpreter")
    workload = tier6_perf.lowered_matmul(64, np.random.default_rng(0), vendor.capabilities)
    tier6_perf._verify(vendor, workload)
    assert "BARRIER" in {n.op.name for n in workload.kernel.nodes}


def test_tier6_times_the_codegen_matmul_of_the_target():
    vendor = Target.load("interpreter")
    names = [c.id for c in tier6_perf.cases(Context(vendor.capabilities, quick=True))]
    assert "perf/matmul-codegen" in names


def test_the_reference_keeps_its_fastest_kernel_for_the_work(cpu, monkeypatch):
    # A barrier-tiled matmul runs as coroutines on the CPU; the ratio must not be taken to it.
    seconds = {"perf_matmul_tiled": 1.0, "perf_matmul": 0.5, "perf_matmul_codegen": 0.01}
    monkeypatch.setattr(tier6_perf, "_times", lambda target, workload, repeats: [
        seconds[workload.kernel.name] * (2 if target is not cpu else 1)] * repeats)
    vendor = Target.load("interpreter")
    ctx = Context(cpu.capabilities, quick=True, reference=cpu)
    rng = np.random.default_rng(1)
    case = tier6_perf._throughput(
        ctx, "matmul", lambda target: tier6_perf.matmul(16, rng, True), 3,
        (lambda ref: tier6_perf.matmul(16, rng, False),
         lambda ref: tier6_perf.lowered_matmul(16, rng, ref.capabilities)))
    outcome = case(vendor)
    assert outcome.perf["reference_seconds"] == 0.01
    assert outcome.perf["ratio"] == pytest.approx(0.005)


@pytest.mark.parametrize("times, reference, noisy", [
    ([1.0, 1.1, 1.2], [1.0, 1.0, 1.1], False),
    ([1.0, 1.2, 3.0], [1.0, 1.0, 1.1], True),
    ([1.0, 1.1, 1.2], [0.5, 1.0, 9.0], True),     # the reference's repeats were disturbed
])
def test_a_wide_spread_is_flagged_noisy(cpu, times, reference, noisy):
    ctx = Context(cpu.capabilities, reference=cpu)
    outcome = tier6_perf._report(ctx, Target.load("interpreter"), "copy", times, reference,
                                 1.0, "GB/s")
    assert outcome.status is Status.PASSED and outcome.perf["noisy"] is noisy
    assert ("noisy" in (outcome.perf["warning"] or "")) is noisy


def test_the_handwritten_matmul_is_compared_with_the_same_kernel_on_the_reference(cpu,
                                                                                  monkeypatch):
    """A fixed kernel rates the device's compiler: its reference runs that kernel, not the
    CPU's packed matmul (against which every emulated device read 0.00x)."""
    ran = []
    monkeypatch.setattr(tier6_perf, "_times", lambda target, workload, repeats: ran.append(
        (target is cpu, workload.kernel.name)) or [1.0] * repeats)
    vendor = Target.load("interpreter")
    ctx = Context(vendor.capabilities, quick=True, reference=cpu)
    case, = [c for c in tier6_perf.cases(ctx) if c.id == "perf/matmul-handwritten"]
    outcome = case.fn(vendor)
    assert ran == [(False, "perf_matmul_tiled"), (True, "perf_matmul_tiled")]
    assert outcome.perf["ratio"] == 1.0


def _declaring(**peaks) -> tier6_perf._Described:
    caps = Target.load("interpreter").capabilities
    return tier6_perf._Described(dataclasses.replace(caps, **peaks))


@pytest.mark.parametrize("name, value, unit, status", [
    ("copy", 60.0, "GB/s", Status.PASSED),            # 60 % of 100 GB/s, band 50 %
    ("copy", 40.0, "GB/s", Status.FAILED),
    ("reduce", 45.0, "GB/s", Status.PASSED),          # band 40 %
    ("matmul-codegen", 300.0, "GFLOP/s", Status.PASSED),   # 30 % of 1000 GFLOP/s, band 25 %
    ("conv", 200.0, "GFLOP/s", Status.FAILED),
    ("launch-latency", 1e6, "us", Status.PASSED),     # reported only
])
def test_a_declared_peak_is_the_band_a_figure_is_judged_by(name, value, unit, status):
    target = _declaring(peak_bandwidth_gbs=100.0, peak_gflops=1000.0)
    ctx = Context(target.capabilities)
    outcome = tier6_perf._report(ctx, target, name, [1.0] * 3, None, value, unit)
    assert outcome.status is status, outcome.message
    if name != "launch-latency":
        assert outcome.perf["peak_fraction"] == pytest.approx(value / (
            100.0 if unit == "GB/s" else 1000.0))
        assert "of the declared peak" in outcome.message
    if status is Status.FAILED:
        assert f"band of {tier6_perf.PEAK_BANDS[name]:.0%}" in outcome.message


def test_quick_sizes_below_the_band_warn_and_the_full_run_fails():
    """--quick's 4 MiB kernels are launch-bound on a GPU: an H200 copied 622 GB/s, 13 % of its
    peak, which says nothing of its bandwidth. Quick reports it; the full sizes judge it."""
    target = _declaring(peak_bandwidth_gbs=100.0)
    quick = tier6_perf._report(Context(target.capabilities, quick=True), target, "copy",
                               [1.0] * 3, None, 13.0, "GB/s")
    assert quick.status is Status.PASSED
    assert "too small to judge a peak" in quick.message and quick.perf["peak_fraction"] == 0.13
    full = tier6_perf._report(Context(target.capabilities), target, "copy", [1.0] * 3, None,
                              13.0, "GB/s")
    assert full.status is Status.FAILED


def test_the_reduce_workload_fills_a_gpu_at_full_size():
    """One thread per output: the full size has 65,536 of them (an H100 ran the old 4,096 at
    9 % of its bandwidth), each summing a leading axis that neighbouring threads read
    together."""
    rng = np.random.default_rng(0)
    workloads = tier6_perf._workloads(False, rng, True)
    kernel = workloads["reduce"](None).kernel
    assert kernel.grid[0] * kernel.block[0] == 65536


def test_a_device_without_a_declared_peak_is_reported_never_failed():
    target = _declaring(peak_bandwidth_gbs=None, peak_gflops=None)
    outcome = tier6_perf._report(Context(target.capabilities), target, "copy", [1.0] * 3,
                                 None, 0.001, "GB/s")
    assert outcome.status is Status.PASSED
    assert outcome.perf["peak_fraction"] is None and outcome.perf["peak_band"] is None
    assert "no declared peak" in outcome.message


def test_the_batched_launch_latency_is_a_batch_replay_divided_by_its_launches(cpu, monkeypatch):
    """One batch of 20 launches (--quick), replayed once to warm up and 5 times timed; each
    figure is a replay's seconds over its launches."""
    made, replays = [], []
    runtime = type(cpu.runtime)
    real = runtime.batch
    monkeypatch.setattr(runtime, "batch", lambda self, launches: made.append(len(launches))
                        or real(self, launches))
    monkeypatch.setattr(runtime, "run_batch", lambda self, batch, buffers, scalars, kernels:
                        replays.append(len(kernels)) or time.sleep(0.02))
    ctx = Context(cpu.capabilities, quick=True, reference=cpu)
    case, = [c for c in tier6_perf.cases(ctx) if c.id == "perf/launch-latency-batched"]
    assert "runtime/batch" in case.requires
    outcome = case.fn(cpu)
    assert made == [20] and replays == [20] * 6
    assert outcome.status is Status.PASSED and outcome.perf["unit"] == "us"
    assert 1e-3 <= outcome.perf["min_seconds"] < 2e-3      # 20 ms a replay, over 20 launches
