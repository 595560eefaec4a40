"""Conformance of the MMA node: every matrix unit the device declares, on random tiles, edge
tiles and a tile that tells the accumulator's precision (tier 2), and in a loop over K across
several workgroups (tier 3), against spec.mma (with the inputs' denormals flushed for a unit
declared to flush them; the edge tiles hold denormals wherever the device's other ops keep
them, so the declaration is checked).

Each case is one kernel: groups of the unit's threads, each loading its fragments of A, B and C
from buffers that hold the tiles row-major, running MMA once per K step, and storing its C
fragment. The check is a per-element bound (spec.mma_bound), so any summation order passes.
"""
from __future__ import annotations

import numpy as np

from portkit.abi import dtypes, spec
from portkit.abi.kernel import Kernel, KernelBuilder
from portkit.abi.matrix import MatrixUnit
from portkit.abi.ops import Op
from portkit.conformance.case import Case, Check, Context, KernelCase, Outcome, Unsupported
from portkit.conformance.tier1_runtime import ESSENTIAL

TIER = 2
KINDS = ("random", "edges", "precision")


def mma_kernel(unit: MatrixUnit, tiles: int, steps: int = 1, groups: int = 1) -> Kernel:
    """`groups` workgroups of `tiles` tiles, each tile one group of `unit.threads` threads
    running `steps` MMAs in a loop. Tile g's C lies row-major at g·M·N of buffer 2, where D
    replaces it; its step s of A (of B) at (g·steps + s)·M·K of buffer 0 (·K·N of buffer 1).
    Buffer 3 is the unit's layout as offsets into a tile (`layout_table`)."""
    b = KernelBuilder(f"mma_{unit.name}")
    a_buf, b_buf, c_buf = b.param(unit.a_dtype), b.param(unit.b_dtype), b.param(unit.acc_dtype)
    table = b.param(dtypes.int32)
    lane = b.special("local", 0)
    threads = b.const(unit.threads)
    thread = b.alu(Op.MOD, lane, threads)
    tile = b.alu(Op.ADD, b.alu(Op.IDIV, lane, threads),
                 b.alu(Op.MUL, b.special("group", 0), b.const(tiles)))

    starts = np.cumsum([0, *(unit.threads * n for n in unit.operand_counts)])

    def indices(operand: int, first: int) -> list[int]:
        # element e of thread t is at first·(tile size) + its offset in the table
        count = unit.operand_counts[operand]
        size = (unit.m * unit.k, unit.k * unit.n, unit.m * unit.n)[operand]
        base = b.alu(Op.MUL, first, b.const(size))
        row = b.alu(Op.ADD, b.alu(Op.MUL, thread, b.const(count)), b.const(int(starts[operand])))
        return [b.alu(Op.ADD, base, b.load(table, b.alu(Op.ADD, row, b.const(e))))
                for e in range(count)]

    c_at = indices(2, tile)
    c = [b.acc(b.load(c_buf, i)) for i in c_at]
    with b.loop(b.const(0), b.const(steps)) as step:
        at = b.alu(Op.ADD, b.alu(Op.MUL, tile, b.const(steps)), step)
        a = [b.load(a_buf, i) for i in indices(0, at)]
        bb = [b.load(b_buf, i) for i in indices(1, at)]
        b.add(Op.MMA, None, tuple(a + bb + c), unit)
    for i, acc in zip(c_at, c):
        b.store(c_buf, i, acc)
    return b.build(grid=(groups, 1, 1), block=(unit.threads * tiles, 1, 1))


def layout_table(unit: MatrixUnit) -> np.ndarray:
    """The last buffer of `mma_kernel`: for A, then B, then C, each thread's elements as
    offsets into a row-major tile (row · columns + col)."""
    return np.array([r * cols + c
                     for layout, cols in ((unit.a, unit.k), (unit.b, unit.n), (unit.c, unit.n))
                     for row in layout for r, c in row], np.int32)


def tiles_of(unit: MatrixUnit, kind: str, rng: np.random.Generator, tiles: int,
             preserve_denormals: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A, B, C for `tiles` tiles: random values; edge values (zeros of both signs, the
    largest and smallest normal inputs, denormals where the device keeps them, a NaN); or
    "precision": A and B of ones and C = 2^(p/2) for an accumulator of p mantissa bits, so
    that each +1 is far above the accumulator's allowed error but lost in an accumulator of
    half its width (float16 or bfloat16 sums where float32 was declared)."""
    import ml_dtypes

    shapes = ((tiles, unit.m, unit.k), (tiles, unit.k, unit.n), (tiles, unit.m, unit.n))
    kinds = (unit.a_dtype, unit.b_dtype, unit.acc_dtype)
    if kind == "random":
        made = [rng.uniform(-2, 2, s) if d.is_float else rng.integers(-8, 8, s)
                for s, d in zip(shapes, kinds)]
    elif kind == "precision":
        top = 2.0 ** (ml_dtypes.finfo(unit.acc_dtype.np).nmant // 2) if (
            unit.acc_dtype.is_float) else 1.0
        made = [np.ones(shapes[0]), np.ones(shapes[1]), np.full(shapes[2], top)]
    else:
        made = []
        for s, d in zip(shapes, kinds):
            values = [0.0, -0.0, 1.0, -1.0]
            if d.is_float:
                info = ml_dtypes.finfo(d.np)
                values += [float(info.smallest_normal), -float(info.smallest_normal),
                           float(np.sqrt(float(info.max))) / 64]
                if preserve_denormals:
                    values.append(float(info.smallest_subnormal))
            made.append(rng.choice(values, s))
        if unit.a_dtype.is_float:
            made[0][0, 0, 0] = np.nan
    return tuple(x.astype(d.np) for x, d in zip(made, kinds))


def make(ctx: Context, unit: MatrixUnit, kind: str) -> KernelCase:
    """The kernel case of one unit on one kind of tile."""
    tiles = 2 if ctx.quick else 8
    a, b, c = tiles_of(unit, kind, ctx.rng(case_id(unit, kind)), tiles,
                       ctx.capabilities.denormals == "preserve")
    flush = unit.denormals == "flush"
    expected = spec.mma(a, b, c, unit.acc_dtype, flush).reshape(-1)
    bound = spec.mma_bound(a, b, c, unit.acc_dtype, flush).reshape(-1)
    check = Check(output=2, kind="bound", expected=(expected,), count=expected.size,
                  dtype=unit.acc_dtype.name, bound=bound)
    return KernelCase(mma_kernel(unit, tiles), [a.reshape(-1), b.reshape(-1), c.reshape(-1),
                                                layout_table(unit)], [check])


def looped(ctx: Context, unit: MatrixUnit) -> KernelCase:
    """Tier 3: two workgroups of two tiles, each summing three K steps into its registers."""
    groups, tiles, steps = 2, 2, 3
    rng = ctx.rng(f"kernels/mma/{unit.name}")
    a, b, c = tiles_of(unit, "random", rng, groups * tiles * steps, True)
    c = c[:groups * tiles]
    # the whole K of each tile, its steps side by side: (tile, M, steps·K) and (tile, steps·K, N)
    a_whole = a.reshape(-1, steps, unit.m, unit.k).transpose(0, 2, 1, 3).reshape(
        -1, unit.m, steps * unit.k)
    b_whole = b.reshape(-1, steps * unit.k, unit.n)
    flush = unit.denormals == "flush"
    expected = spec.mma(a_whole, b_whole, c, unit.acc_dtype, flush).reshape(-1)
    # each step rounds on its own: `steps` times one long dot product's bound covers them
    bound = steps * spec.mma_bound(a_whole, b_whole, c, unit.acc_dtype, flush).reshape(-1)
    check = Check(output=2, kind="bound", expected=(expected,), count=expected.size,
                  dtype=unit.acc_dtype.name, bound=bound)
    return KernelCase(mma_kernel(unit, tiles, steps, groups),
                      [a.reshape(-1), b.reshape(-1), c.reshape(-1), layout_table(unit)], [check])


def loop_cases(ctx: Context) -> list[Case]:
    """Tier 3's MMA cases: each declared unit in a loop, after its tier 2 cases pass."""
    return [Case(f"kernels/mma/{u.name}", 3, None, f"{u.a_dtype.name}->{u.acc_dtype.name}",
                 ESSENTIAL + (case_id(u, "random"),), make=lambda u=u: looped(ctx, u))
            for u in ctx.capabilities.matrix_units]


def case_id(unit: MatrixUnit, kind: str) -> str:
    """"ops/MMA/m16n8k16_float16_float32/random"."""
    return f"ops/MMA/{unit.name}/{kind}"


def _none_declared(target: object) -> Outcome:
    raise Unsupported("the device declares no matrix units (Capabilities.matrix_units is "
                      "empty), so codegen never writes MMA nodes for it")


def cases(ctx: Context) -> list[Case]:
    """Each declared unit on each kind of tile; one unsupported case when none is declared."""
    units = ctx.capabilities.matrix_units
    if not units:
        return [Case("ops/MMA/none", TIER, "MMA", None, ESSENTIAL, fn=_none_declared)]
    return [Case(case_id(u, kind), TIER, "MMA", f"{u.a_dtype.name}->{u.acc_dtype.name}",
                 ESSENTIAL,
                 make=lambda u=u, kind=kind: make(ctx, u, kind))
            for u in units for kind in KINDS]
