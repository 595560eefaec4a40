"""Tier 1, runtime: memory round trips, many buffers, a first launch, scalar arguments, a batch.

Every later tier moves data with these parts, so they are checked byte by byte first; a fault
here blocks the rest instead of surfacing as thousands of wrong op results.
"""
from __future__ import annotations

import numpy as np

from portkit.abi import KernelBuilder, Op, dtypes
from portkit.conformance.case import Case, CaseFailed, Context, Outcome, Status
from portkit.conformance.target import Target

TIER = 1
NAME = "runtime"
# What the kernel tiers need from this one (alloc of size 0 is checked, but nothing needs it).
ESSENTIAL = ("runtime/roundtrip/*", "runtime/many-buffers", "runtime/launch", "runtime/scalars")


def _pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _compare_bytes(what: str, wrote: np.ndarray, read: np.ndarray) -> None:
    bad = np.flatnonzero(wrote != read)
    if bad.size:
        first = int(bad[0])
        raise CaseFailed(f"{what}: {bad.size} of {wrote.size} bytes differ, first at byte "
                         f"{first}: wrote 0x{wrote[first]:02x}, read 0x{read[first]:02x}")


def _roundtrip(target: Target, nbytes: int) -> Outcome:
    allocator = target.device.allocator
    data = _pattern(nbytes, nbytes)
    handle = allocator.alloc(nbytes)
    try:
        allocator.copyin(handle, memoryview(data))
        host = ~data     # every byte differs from what was written, so a skipped byte shows
        allocator.copyout(memoryview(host), handle)
    finally:
        allocator.free(handle, nbytes)
    _compare_bytes(f"copyin then copyout of a {nbytes}-byte buffer", data, host)
    return Outcome(Status.PASSED)


def _partial(target: Target) -> Outcome:
    allocator = target.device.allocator
    handle = allocator.alloc(64)
    try:
        allocator.copyin(handle, memoryview(np.zeros(64, np.uint8)))
        allocator.copyin(handle, memoryview(_pattern(10, 1)))
        host = np.full(64, 0xFF, np.uint8)
        allocator.copyout(memoryview(host), handle)
    finally:
        allocator.free(handle, 64)
    wrote = np.concatenate([_pattern(10, 1), np.zeros(54, np.uint8)])
    _compare_bytes("a 10-byte copyin into a 64-byte buffer must change only its first 10 bytes",
                   wrote, host)
    return Outcome(Status.PASSED)


def _many(target: Target) -> Outcome:
    count = min(target.capabilities.max_buffers, 256)
    arrays = [np.full(257, i, np.int32) for i in range(count)]
    with target.buffers(arrays) as handles:
        for i, handle in enumerate(handles):
            read = target.read(handle, np.dtype(np.int32), 257)
            if not (read == i).all():
                raise CaseFailed(f"buffer {i} of {count} live buffers reads back "
                                 f"{int(read[read != i][0])}, not {i}: buffers overlap or "
                                 "copies go to the wrong buffer")
    return Outcome(Status.PASSED)


def _launch(target: Target) -> Outcome:
    b = KernelBuilder("conform_launch")
    out = b.param(dtypes.int32)
    b.store(out, b.const(0), b.const(42))
    compiled = target.runtime.compile(target.prepare(b.build()))
    source = compiled.source
    with target.buffers([np.zeros(4, np.int32)]) as handles:
        seconds = target.runtime.run_program(compiled, handles, [], wait=True)
        target.runtime.synchronize()
        read = target.read(handles[0], np.dtype(np.int32), 4)
    if not (seconds is None or isinstance(seconds, float)):
        raise CaseFailed(f"Program(..., wait=True) returned {seconds!r}; return the kernel's "
                         "seconds as a float, or None")
    if list(read) != [42, 0, 0, 0]:
        raise CaseFailed(f"a kernel storing 42 to element 0 left the buffer as {list(read)}")
    return Outcome(Status.PASSED, source=source)


def _scalars(target: Target) -> Outcome:
    b = KernelBuilder("conform_scalars")
    out = b.param(dtypes.int32)
    for i, name in enumerate(("first", "second", "third")):
        b.store(out, b.const(i), b.var(name))
    kernel = target.prepare(b.build())
    values = (-5, 2**31 - 1, -2**31)
    read = target.run(kernel, [np.zeros(3, np.int32)], values)[0]
    if tuple(read) != values:
        raise CaseFailed(f"int32 scalars {values} arrived as {tuple(int(v) for v in read)}; "
                         "pass VARs in node order after the buffers")
    return Outcome(Status.PASSED, source=target.compile(kernel)[1])


def _batch(target: Target) -> Outcome:
    """Device.batch (ABI 0.7): out = x * a + b twice in one batch, the second launch reading
    what the first wrote; a read-back, then a replay with a replaced buffer and scalars."""
    b = KernelBuilder("conform_batch")
    out, x = b.param(dtypes.int32), b.param(dtypes.int32)
    i = b.special("group", 0)
    b.store(out, i, b.alu(Op.ADD, b.alu(Op.MUL, b.load(x, i), b.var("a")), b.var("b")))
    compiled = target.runtime.compile(target.prepare(b.build(grid=(4, 1, 1))))
    x0 = np.array([1, -2, 3, 40], np.int32)
    with target.buffers([x0, *(np.zeros(4, np.int32),) * 3]) as (h0, h1, h2, h3):
        batch = target.runtime.batch([(compiled, [h1, h0], [3, 1]), (compiled, [h2, h1], [-2, 5])])
        kernels = [compiled.kernel] * 2
        target.runtime.run_batch(batch, [], [], kernels)
        first = target.read(h2, np.dtype(np.int32), 4)
        target.runtime.run_batch(batch, [(1, 0, h3)], [(1, [7, 0])], kernels)
        second = target.read(h3, np.dtype(np.int32), 4)
    for what, got, want in (("the first replay", first, (x0 * 3 + 1) * -2 + 5),
                            ("a replay with launch 1 writing another buffer, a = 7, b = 0",
                             second, (x0 * 3 + 1) * 7)):
        if list(got) != list(want):
            raise CaseFailed(f"{what} gave {list(got)}, not {list(want)}: a batch's launches "
                             "run in order, each seeing the writes before it, with the buffers "
                             "and scalars last replaced")
    return Outcome(Status.PASSED, source=compiled.source)


def cases(ctx: Context) -> list[Case]:
    """The runtime cases; the full run adds a 64 MiB round trip."""
    sizes = [1, 3, 1000, 4099, 1 << 20] + ([] if ctx.quick else [64 << 20])
    found = [Case(f"runtime/roundtrip/{n}", TIER, fn=lambda t, n=n: _roundtrip(t, n))
             for n in sizes]
    found += [
        Case("runtime/alloc-zero", TIER, fn=lambda t: _roundtrip(t, 0)),
        Case("runtime/partial-copyin", TIER, fn=_partial),
        Case("runtime/many-buffers", TIER, fn=_many),
        Case("runtime/launch", TIER, fn=_launch),
        Case("runtime/scalars", TIER, fn=_scalars),
        Case("runtime/batch", TIER, fn=_batch),
    ]
    return found
