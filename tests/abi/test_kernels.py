"""Runtime and kernel-level conformance (tiers 1 and 3) on every available backend: memory
round trips, fused chains, odd reductions, movement index math, LOCAL + BARRIER, scalars,
many buffers, 3-D grids."""
import numpy as np
import pytest

from portkit.abi import dtypes
from portkit.conformance import Status, suite, target, tier1_runtime, tier3_kernels
from portkit.conformance.case import Context
from portkit.reference_backends.interpreter.capabilities import (
    capabilities as interpreter_capabilities,
)

BACKENDS = target.available()
CTX = Context(interpreter_capabilities(), quick=True)
RUNTIME = {c.id: c for c in tier1_runtime.cases(CTX)}
KERNELS = {c.id: c for c in tier3_kernels.cases(CTX)}


@pytest.fixture(scope="module")
def targets():
    """Per backend: its Target and the kernel cases built for its declared limits."""
    cache = {}

    def get(name):
        if name not in cache:
            device = target.Target.load(name)
            ctx = Context(device.capabilities, quick=True)
            cache[name] = device, {c.id: c for c in tier3_kernels.cases(ctx)}
        return cache[name]
    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", list(RUNTIME))
def test_runtime(targets, backend, case_id):
    outcome = suite.execute(targets(backend)[0], RUNTIME[case_id])
    assert outcome.status is Status.PASSED, outcome.message


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", list(KERNELS))
def test_kernel(targets, backend, case_id):
    device, cases = targets(backend)
    outcome = suite.execute(device, cases[case_id])
    assert outcome.status is Status.PASSED, outcome.message


def test_requirements_name_the_tier2_cases_a_kernel_uses():
    fused = KERNELS["kernels/fused-elementwise/float32"]
    assert "ops/SIN/float32" in fused.requires and "ops/EXP2/float32" in fused.requires
    assert set(tier1_runtime.ESSENTIAL) <= set(fused.requires)
    assert "ops/MAX/float32" in KERNELS["kernels/reduce-max/float32/7"].requires


def test_reduction_bound_is_gamma_n_times_the_sum_of_magnitudes():
    kc = tier3_kernels.reduce_sum(CTX, dtypes.float32, 333)
    [check] = kc.checks
    x = kc.inputs[0].astype(np.float64).reshape(5, 333)
    u = 2.0 ** -24
    gamma = 333 * u / (1 - 333 * u)
    assert np.allclose(check.bound, gamma * np.abs(x).sum(1) + u * np.abs(x.sum(1)))


def test_a_kernel_that_skips_the_barrier_would_be_caught():
    # local/reverse reads what other threads wrote; the interpreter's lockstep run is the
    # oracle, and any other order of those reads gives different values.
    kc = tier3_kernels.local_reverse(CTX, 8)
    expected = kc.checks[0].expected[0].reshape(3, 8)
    assert (expected == kc.inputs[0].reshape(3, 8)[:, ::-1]).all()
