"""Tier 7, stress: the ordinary work that gave silently wrong answers or crashed (issue 11).

Every case here failed or crashed on a reference backend before its fix, and a vendor's chip
with the same fault fails it too:
- reductions past 2**16 elements (lavapipe stops every shader after 65,535 loop iterations in
  all; 1,100,003 stays past it for a kernel that sums in 16 partial accumulators) and past
  2**24 (a float32 lane stops growing there): sum, sum over an axis, max, argmax, a matmul
  with K = 70,001, five sums of 16,000 that fuse into one kernel, through the Tensor stack,
  which must keep every thread's loops within the device's budget;
- division by a constant and by a dynamic zero on every float dtype the backend declares
  (IEEE: ±inf and NaN; lavapipe dropped the store of `x / 0.0`), and integer division by zero,
  which the ABI says must not trap (result unspecified), nor disturb the other elements;
- launches from 4 threads at once, on distinct shapes (OpenCL's set-arguments-then-enqueue
  interleaved; wgpu-core panicked);
- a kernel named by 10,000 characters (PoCL aborted) and grids of many workgroups;
- the limits a backend declares are true: a loop of `max_loop_trips` iterations (2**17 where
  none is declared) counts every one, and a kernel named by `max_name_length` characters runs.
"""
from __future__ import annotations

import threading

import numpy as np

from portkit.abi import KernelBuilder, Op, dtypes
from portkit.conformance.case import Case, CaseFailed, Context, Outcome, Status, Unsupported
from portkit.conformance.target import Target
from portkit.conformance.tier1_runtime import ESSENTIAL
from portkit.conformance.tier4_tensor import stack_device

TIER = 7
NAME = "stress"
THREADS = 4


def _expect(what: str, actual, expected) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    same = (actual == expected) | (np.isnan(actual.astype(np.float64))
                                   & np.isnan(expected.astype(np.float64)))
    if actual.shape != expected.shape or not same.all():
        raise CaseFailed(f"{what}: expected {expected.tolist()}, got {actual.tolist()}")


def _tensor():
    from portkit.tensor import Tensor

    return Tensor


def _sum_long(target: Target, n: int) -> Outcome:
    tensor, device = _tensor(), stack_device(target)
    _expect(f"ones({n}).sum()", tensor.ones(n, device=device).sum().numpy(), np.float32(n))
    _expect(f"full(({n},), 0.5).mean()",
            tensor.full((n,), 0.5, device=device).mean().numpy(), np.float32(0.5))
    return Outcome(Status.PASSED)


def _reduce_axis(target: Target) -> Outcome:
    tensor, device = _tensor(), stack_device(target)
    _expect("ones((3, 65537)).sum(1)", tensor.ones(3, 65537, device=device).sum(1).numpy(),
            np.full(3, 65537, np.float32))
    values = -np.arange(70001, dtype=np.float32)[::-1] - 1     # the largest is the last
    _expect("max over 70001", tensor(values, device=device).max().numpy(), np.float32(-1))
    _expect("argmax over 70001", tensor(values, device=device).argmax().numpy(), 70000)
    # each sum is one short loop, but fused into one kernel they loop 80,000 times in all
    five = sum((tensor.ones(16000, device=device).sum() for _ in range(5)),
               tensor.zeros((), device=device))
    _expect("five fused sums of 16000", five.numpy(), np.float32(80000))
    a, b = np.ones((2, 70001), np.float32), np.ones((70001, 3), np.float32)
    _expect("matmul with K = 70001", (tensor(a, device=device) @ tensor(b, device=device))
            .numpy(), np.full((2, 3), 70001, np.float32))
    return Outcome(Status.PASSED)


def _divide_float(target: Target, name: str) -> Outcome:
    dtype = dtypes.by_name(name)
    if dtype not in target.capabilities.dtypes:
        raise Unsupported(f"backend declares no support for {name}")
    tensor, device = _tensor(), stack_device(target)
    x = tensor(np.array([1.0, -1.0, 0.0, 3.0]), device=device, dtype=name)
    inf = np.inf
    for label, divisor, expected in (
            ("x / 0.0", 0.0, [inf, -inf, np.nan, inf]),
            ("x / -0.0", -0.0, [-inf, inf, np.nan, -inf]),
            ("x / zeros", tensor(np.array([0.0, -0.0, 0.0, 0.0]), device=device, dtype=name),
             [inf, inf, np.nan, inf])):
        _expect(f"{label} in {name}", (x / divisor).numpy().astype(np.float64), expected)
    return Outcome(Status.PASSED)


def _divide_int(target: Target, name: str) -> Outcome:
    dtype = dtypes.by_name(name)
    if dtype not in target.capabilities.dtypes:
        raise Unsupported(f"backend declares no support for {name}")
    b = KernelBuilder(f"stress_idiv_{name}")
    out, x, y = b.param(dtype), b.param(dtype), b.param(dtype)
    i = b.special("group", 0)
    b.store(out, i, b.alu(Op.IDIV, b.load(x, i), b.load(y, i)))
    kernel = target.prepare(b.build(grid=(6, 1, 1), block=(1, 1, 1)))
    xs = np.array([7, 100, 0, 9, 5, 8], dtype.np)
    ys = np.array([0, 0, 0, 3, 0, 2], dtype.np)      # by zero: undefined, but no crash
    got = target.run(kernel, [np.zeros(6, dtype.np), xs, ys])[0]
    _expect(f"IDIV of {name} beside divisions by zero", got[[3, 5]], np.array([3, 4], dtype.np))
    return Outcome(Status.PASSED)


def _threads(target: Target) -> Outcome:
    tensor, device = _tensor(), stack_device(target)
    wrong: list[str] = []

    def work(thread: int) -> None:
        try:
            for i in range(8):
                x = np.arange(40 + 11 * thread + i, dtype=np.float32) + thread
                got = (tensor(x, device=device) * 2 + 1).sum().numpy()
                if got != (x * 2 + 1).sum():
                    wrong.append(f"thread {thread} shape {x.size}: {got} != {(x * 2 + 1).sum()}")
        except Exception as error:  # noqa: BLE001 - a raise in a thread would vanish
            wrong.append(f"thread {thread}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if wrong:
        raise CaseFailed(f"{len(wrong)} of {THREADS * 8} realizes from {THREADS} threads went "
                         f"wrong, first: {wrong[0]}; make launches, copies and the buffer pool "
                         "safe under threads")
    return Outcome(Status.PASSED)


def _group_ids(target: Target, name: str, groups: int) -> Outcome:
    b = KernelBuilder(name)
    out = b.param(dtypes.int32)
    i = b.special("group", 0)
    b.store(out, i, i)
    kernel = target.prepare(b.build(grid=(groups, 1, 1), block=(1, 1, 1)))
    got = target.run(kernel, [np.full(groups, -1, np.int32)])[0]
    bad = np.flatnonzero(got != np.arange(groups))
    if bad.size:
        raise CaseFailed(f"kernel of {groups} workgroups named by {len(name)} characters: "
                         f"{bad.size} elements wrong, first [{bad[0]}] = {got[bad[0]]}")
    return Outcome(Status.PASSED)


def _loop(target: Target, trips: int) -> Outcome:
    b = KernelBuilder("stress_loop")
    out = b.param(dtypes.int32)
    count = b.acc(b.const(0))
    with b.loop(b.const(0), b.const(trips)):
        b.assign(count, b.alu(Op.ADD, count, b.const(1)))
    b.store(out, b.const(0), count)
    got = target.run(target.prepare(b.build()), [np.zeros(1, np.int32)])[0][0]
    if got != trips:
        declared = target.capabilities.max_loop_trips
        raise CaseFailed(f"a loop of {trips} iterations ran {got} times; declare the device's "
                         f"real budget in Capabilities.max_loop_trips (now {declared})")
    return Outcome(Status.PASSED)


def cases(ctx: Context) -> list[Case]:
    """The stress cases; `--quick` leaves out the sums past 2**24."""
    caps = ctx.capabilities
    floats = [d.name for d in (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)]
    ints = [d.name for d in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
                             dtypes.uint8, dtypes.uint32)]
    sizes = [65537, 70001, 1_100_003] + ([] if ctx.quick else [(1 << 24) + 3, 20_000_001])
    found = [Case(f"stress/sum/{n}", TIER, requires=ESSENTIAL, fn=lambda t, n=n: _sum_long(t, n))
             for n in sizes]
    found.append(Case("stress/reduce-past-65535", TIER, requires=ESSENTIAL, fn=_reduce_axis))
    found += [Case(f"stress/divide-by-zero/{name}", TIER, dtype=name, requires=ESSENTIAL,
                   fn=lambda t, name=name: _divide_float(t, name)) for name in floats]
    found += [Case(f"stress/integer-divide-by-zero/{name}", TIER, dtype=name, requires=ESSENTIAL,
                   fn=lambda t, name=name: _divide_int(t, name)) for name in ints]
    found.append(Case("stress/threads", TIER, requires=ESSENTIAL, fn=_threads))
    found.append(Case("stress/long-name", TIER, requires=ESSENTIAL,
                      fn=lambda t: _group_ids(t, "k" * 10_000, 64)))
    trips = caps.max_loop_trips or 1 << 17
    found.append(Case(f"stress/loop/{trips}", TIER, requires=ESSENTIAL,
                      fn=lambda t: _loop(t, trips)))
    if caps.max_name_length is not None:
        length = caps.max_name_length
        found.append(Case(f"stress/name-of/{length}", TIER, requires=ESSENTIAL,
                          fn=lambda t: _group_ids(t, "k" * length, 64)))
    groups = min(caps.max_grid[0], 1 << 17)
    found.append(Case(f"stress/grid/{groups}", TIER, requires=ESSENTIAL,
                      fn=lambda t: _group_ids(t, "stress_grid", groups)))
    return found
