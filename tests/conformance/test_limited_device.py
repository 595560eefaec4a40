"""A device declaring Vulkan-like limits (4 scalar arguments a launch, 1,024 workgroups an axis)
passes conformance: the scheduler and the runtime keep every kernel within them. Tiers 1 and 3
whole and a representative part of tier 4 (CI's time is short); tiers 1, 3, 4 and 5 (quick)
passed when run by hand."""
from __future__ import annotations

import dataclasses

import pytest

from portkit import backends, runtime
from portkit.conformance import suite
from portkit.conformance.case import Status
from portkit.conformance.suite import Options
from portkit.conformance.target import Target

NAME = "cpu-vulkan-limits"
TIER4 = ("tensor/sum-axis/float32/fwd", "tensor/softmax/float32/bwd")


@pytest.fixture(scope="module")
def limited() -> Target:
    """The cpu backend lowered as for a GPU, declaring 4 scalars and 1,024 groups an axis."""
    base = backends.load("cpu")
    caps = dataclasses.replace(base.capabilities, max_scalars=4, threads_are_loops=False,
                               max_grid=(1024, 65535, 65535))
    try:
        rt = runtime.register(runtime.Runtime(NAME, dataclasses.replace(
            base, name=NAME, capabilities=caps)))
    except ValueError:      # registered by an earlier run in this process
        rt = runtime.get(NAME)
    return Target(rt.device, rt.name, rt)


@pytest.mark.parametrize("tier, chosen", [(1, None), (3, None), (4, TIER4)])
def test_a_device_with_vulkan_like_limits_passes(limited, tier, chosen):
    options = Options(tiers=(tier,), quick=True, reference=None)
    cases, _ = suite.collect(suite.context(limited, options), options)
    cases = [c for c in cases if chosen is None or c.id in chosen]
    assert len(cases) == len(chosen) if chosen else cases
    made = suite.InProcess(limited, options).precompile(cases)    # one clang process a batch
    outcomes = {c.id: suite.execute(limited, c, made.get(c.id)) for c in cases}
    bad = {k: f"{o.status.value}: {o.message}" for k, o in outcomes.items()
           if o.status is not Status.PASSED}
    assert bad == {}
