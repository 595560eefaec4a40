"""Limits a device declares shape its kernels (issue 11, 1): a loop budget
(Capabilities.max_loop_trips) bounds every thread's loop iterations, and a name length
(Capabilities.max_name_length) every kernel's name."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from portkit import backends, runtime, schedule
from portkit.abi import CapabilityError, Kernel, KernelBuilder, Op, dtypes
from portkit.abi.interpreter import run as interpret
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.schedule import stages
from portkit.tensor import Tensor

CAPABILITIES = capabilities()

SMALL = "interpreter-small-limits"
BUDGET, LONGEST = 256, 24


def _counted(kernel: Kernel) -> Kernel:
    """`kernel` plus a last int32 buffer where each thread stores how many loop iterations
    it ran, all loops together (a register that every RANGE's body increments)."""
    b = KernelBuilder(kernel.name)
    counts = b.add(Op.PARAM, dtypes.int32, arg=len(kernel.params))
    one = b.const(1)
    counter = b.acc(b.const(0))
    moved: dict[int, int] = {}
    for i, node in enumerate(kernel.nodes):
        moved[i] = b.add(node.op, node.dtype, tuple(moved[s] for s in node.src), node.arg)
        if node.op is Op.RANGE:
            b.assign(counter, b.alu(Op.ADD, counter, one))
    thread = b.alu(Op.ADD, b.alu(Op.MUL, b.special("group", 0), b.const(kernel.block[0])),
                   b.special("local", 0))
    b.store(counts, thread, counter)
    return b.build(kernel.grid, kernel.block)


class _CountingProgram:
    """Runs a kernel in the interpreter, first once with its loop iterations counted."""

    def __init__(self, seen: list, name: str, binary: bytes):
        self.kernel, self.seen = Kernel.from_json(binary.decode()), seen

    def __call__(self, buffers, scalars, grid, block, wait=False):
        kernel = self.kernel
        typed = [b.view(p.dtype.np) for b, p in zip(buffers, kernel.params)]
        counts = np.zeros(kernel.grid[0] * kernel.block[0], np.int32)
        interpret(_counted(kernel), [t.copy() for t in typed] + [counts], scalars)
        self.seen.append((kernel.name, int(counts.max())))
        interpret(kernel, typed, scalars)
        return 0.0 if wait else None


@pytest.fixture(scope="module")
def small():
    """The interpreter, declaring a budget of 256 loop iterations and names of 24 characters;
    every launch records (kernel name, most iterations a thread ran)."""
    caps = dataclasses.replace(CAPABILITIES, max_loop_trips=BUDGET, max_name_length=LONGEST)
    seen: list[tuple[str, int]] = []
    device = dataclasses.replace(backends.load("interpreter"), name=SMALL, capabilities=caps,
                                 program=functools.partial(_CountingProgram, seen))
    try:
        rt = runtime.register(runtime.Runtime(SMALL, device))
    except ValueError:      # registered by an earlier run in this process
        rt = runtime.get(SMALL)
    return rt, rt.device.program.args[0]


def _values(n: int) -> np.ndarray:
    return -np.arange(n, dtype=np.float32)[::-1] - 1     # the max is the last element


@pytest.mark.parametrize("what, compute, expected", [
    ("sum of 5000 ones", lambda d: Tensor.ones(5000, device=d).sum(), 5000),
    ("sum over an axis", lambda d: Tensor.ones(3, 1000, device=d).sum(1), [1000] * 3),
    ("max", lambda d: Tensor(_values(3001), device=d).max(), -1),
    ("argmax", lambda d: Tensor(_values(3001), device=d).argmax(), 3000),
    ("matmul with K = 700", lambda d: Tensor.ones(2, 700, device=d) @ Tensor.ones(
        700, 3, device=d), np.full((2, 3), 700)),
    ("two sums, each split", lambda d: Tensor.ones(200, device=d).sum()
     + Tensor.ones(180, device=d).sum(), 380),
    ("three sums, each within a stage", lambda d: Tensor.ones(120, device=d).sum()
     + Tensor.ones(120, device=d).sum() + Tensor.ones(120, device=d).sum(), 360),
])
def test_every_thread_stays_within_the_loop_budget(small, what, compute, expected):
    _, seen = small
    seen.clear()
    np.testing.assert_array_equal(compute(SMALL).numpy(), expected)
    assert seen, "nothing ran"
    over = [(name, trips) for name, trips in seen if trips > BUDGET]
    assert over == [], f"{what}: kernels looping more than {BUDGET} times per thread"


def test_the_stage_length_follows_the_declared_budget():
    assert stages.chunk(None) == stages.CHUNK
    assert stages.chunk(65535) == 1 << 14       # lavapipe: stages as before
    assert stages.chunk(BUDGET) == 128
    x = Tensor.ones(5000, device="interpreter")
    assert len(schedule.create_schedule([x.sum().lazy], max_loop_trips=BUDGET)) > len(
        schedule.create_schedule([x.sum().lazy]))


def _named(name: str) -> Kernel:
    b = KernelBuilder(name)
    out = b.param(dtypes.int32)
    b.store(out, b.special("group", 0), b.const(5))
    return b.build(grid=(3, 1, 1))


def test_names_longer_than_declared_are_shortened(small):
    rt, seen = small
    long_a, long_b = "a" * 40 + "_x", "a" * 40 + "_y"
    names = [rt.compile(_named(n)).kernel.name for n in (long_a, long_b, "short")]
    assert all(len(n) <= LONGEST for n in names) and names[0].startswith("a" * 10)
    assert names[0] != names[1] and names[2] == "short"
    (got,) = rt.run(_named(long_a), np.zeros(3, np.int32))
    np.testing.assert_array_equal(got, [5, 5, 5])
    seen.clear()
    Tensor.ones(*[1] * 20, 2, device=SMALL).exp().numpy()     # "e_1_1_..._2": 43 characters
    assert seen and all(len(name) <= LONGEST for name, _ in seen)


@pytest.mark.parametrize("field, value", [("max_loop_trips", 10), ("max_name_length", 5),
                                          ("max_loop_trips", 100.0)])
def test_implausible_limits_are_refused_when_the_backend_loads(field, value):
    with pytest.raises(CapabilityError, match=field):
        dataclasses.replace(CAPABILITIES, **{field: value}).validate("small")


def test_a_name_over_the_limit_cannot_launch():
    caps = dataclasses.replace(CAPABILITIES, max_name_length=LONGEST)
    with pytest.raises(CapabilityError, match="name of 30 characters exceeds 24"):
        caps.check_launch(_named("n" * 30))
