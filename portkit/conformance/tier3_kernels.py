"""Tier 3, kernels: what real kernels combine, written by hand with KernelBuilder.

Fused elementwise chains, reductions of odd lengths, movement done with index math (pad,
shrink, permute, expand, flip), workgroup memory with barriers, scalar arguments, many buffers
and 3-D grids. Exact kernels are checked against the interpreter; float arithmetic against
float64 under an error bound derived from the op budgets and the magnitudes involved.
"""
from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from portkit.abi import Kernel, KernelBuilder, dtypes, interpreter, spec
from portkit.abi.dtypes import DType
from portkit.abi.kernel import scalar_words
from portkit.abi.ops import COMPUTE, Op
from portkit.conformance import matrix_cases
from portkit.conformance.case import Case, Check, Context, KernelCase
from portkit.conformance.tier1_runtime import ESSENTIAL
from portkit.conformance.tier2_ops import case_id

TIER = 3
NAME = "kernels"
BLOCK = 64


def ops_used(kernel: Kernel) -> tuple[str, ...]:
    """The tier 2 case ids of every (op, dtype) in `kernel`: what its result depends on."""
    nodes, ids = kernel.nodes, []
    for node in nodes:
        if node.op not in COMPUTE:
            continue
        operand = nodes[node.src[-1]].dtype
        target = node.dtype if node.op in (Op.CAST, Op.BITCAST) else None
        ids.append(case_id(node.op, operand, target))
    return tuple(dict.fromkeys(ids))


def _eps(dtype: DType) -> float:
    return float(ml_dtypes.finfo(dtype.np).eps)


def _lane(b: KernelBuilder) -> int:
    """group * BLOCK + local: the global thread index along axis 0."""
    return b.alu(Op.ADD, b.alu(Op.MUL, b.special("group"), b.const(BLOCK)), b.special("local"))


def _grid(n: int) -> dict:
    return {"grid": (max(1, -(-n // BLOCK)), 1, 1), "block": (BLOCK, 1, 1)}


def _exact(kernel: Kernel, inputs: list[np.ndarray], scalars: tuple[int, ...] = ()) -> KernelCase:
    """Checks every written buffer for equality with the interpreter's result."""
    outputs = [a.copy() for a in inputs]
    interpreter.run(kernel, outputs, scalars)
    checks = [Check(p, "exact", (outputs[p],), outputs[p].size) for p in sorted(kernel.written)]
    return KernelCase(kernel, inputs, checks, scalars)


def _values(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    if dtype.is_float:
        return rng.uniform(-4, 4, n).astype(dtype.np)
    return rng.integers(int(dtype.min), int(dtype.max), n, dtype=dtype.np, endpoint=True)


def fused(ctx: Context, dtype: DType, n: int) -> KernelCase:
    """out = sin(a) * b + exp2(-c), gated to n lanes."""
    rng = ctx.rng(f"fused/{dtype.name}")
    a, b_, c = (rng.uniform(-4, 4, n).astype(dtype.np) for _ in range(3))
    b = KernelBuilder(f"conform_fused_{dtype.name}")
    pa, pb, pc, out = (b.param(dtype) for _ in range(4))
    i = _lane(b)
    gate = b.alu(Op.CMPLT, i, b.const(n))
    term = b.alu(Op.MUL, b.alu(Op.SIN, b.load(pa, i, gate)), b.load(pb, i, gate))
    value = b.alu(Op.ADD, term, b.alu(Op.EXP2, b.alu(Op.NEG, b.load(pc, i, gate))))
    b.store(out, i, value, gate)
    kernel = b.build(**_grid(n))
    wa, wb, wc = (x.astype(np.float64) for x in (a, b_, c))
    exact = np.sin(wa) * wb + np.exp2(-wc)
    # Each op errs by its budget (+1 for rounding what it is given); scale by the magnitudes.
    units = spec.budget(Op.SIN, dtype) + spec.budget(Op.EXP2, dtype) + 4
    bound = _eps(dtype) * units * (np.abs(np.sin(wa) * wb) + np.exp2(-wc))
    check = Check(3, "bound", (exact,), n, bound=bound, operands=(0, 1, 2))
    return KernelCase(kernel, [a, b_, c, np.zeros(n, dtype.np)], [check])


def unfused_multiply_add(ctx: Context, dtype: DType, n: int) -> KernelCase:
    """out = a * b + c, with c = -(a * b rounded): exactly 0 when MUL and ADD round apart, as the
    ABI says, and the product's rounding error where a compiler contracts them into an FMA."""
    rng = ctx.rng(f"unfused-multiply-add/{dtype.name}")
    a, b_ = (rng.uniform(1, 2, n).astype(dtype.np) for _ in range(2))
    c = -(a * b_)                     # numpy rounds the product to dtype, as the ABI's MUL does
    b = KernelBuilder(f"conform_unfused_madd_{dtype.name}")
    pa, pb, pc, out = (b.param(dtype) for _ in range(4))
    i = _lane(b)
    gate = b.alu(Op.CMPLT, i, b.const(n))
    product = b.alu(Op.MUL, b.load(pa, i, gate), b.load(pb, i, gate))
    b.store(out, i, b.alu(Op.ADD, product, b.load(pc, i, gate)), gate)
    check = Check(3, "exact", (np.zeros(n, dtype.np),), n, operands=(0, 1, 2))
    return KernelCase(b.build(**_grid(n)), [a, b_, c, np.ones(n, dtype.np)], [check])


def fused_int(ctx: Context, n: int) -> KernelCase:
    """out = ((a * 3) ^ b) >> 2 + a % 7 - max(a, b), on int32: wrapping, exact."""
    rng = ctx.rng("fused/int32")
    a, c = _values(rng, dtypes.int32, n), _values(rng, dtypes.int32, n)
    b = KernelBuilder("conform_fused_int32")
    pa, pb, out = b.param(dtypes.int32), b.param(dtypes.int32), b.param(dtypes.int32)
    i = _lane(b)
    gate = b.alu(Op.CMPLT, i, b.const(n))
    x, y = b.load(pa, i, gate), b.load(pb, i, gate)
    mixed = b.alu(Op.SHR, b.alu(Op.XOR, b.alu(Op.MUL, x, b.const(3)), y), b.const(2))
    value = b.alu(Op.SUB, b.alu(Op.ADD, mixed, b.alu(Op.MOD, x, b.const(7))),
                  b.alu(Op.MAX, x, y))
    b.store(out, i, value, gate)
    return _exact(b.build(**_grid(n)), [a, c, np.zeros(n, np.int32)])


def reduce_sum(ctx: Context, dtype: DType, length: int, rows: int = 5) -> KernelCase:
    """One thread per row sums `length` elements; floats are bounded by gamma_n * sum|x|."""
    rng = ctx.rng(f"reduce-sum/{dtype.name}/{length}")
    x = _values(rng, dtype, rows * length)
    b = KernelBuilder(f"conform_sum_{dtype.name}_{length}")
    px, out = b.param(dtype), b.param(dtype)
    row = b.special("group")
    acc = b.acc(b.const(0, dtype))
    base = b.alu(Op.MUL, row, b.const(length))
    with b.loop(b.const(0), b.const(length)) as k:
        b.assign(acc, b.alu(Op.ADD, acc, b.load(px, b.alu(Op.ADD, base, k))))
    b.store(out, row, acc)
    kernel = b.build(grid=(rows, 1, 1))
    if not dtype.is_float:
        return _exact(kernel, [x, np.zeros(rows, dtype.np)])
    wide = x.astype(np.float64).reshape(rows, length)
    # Any summation order: |computed - exact| <= gamma_n * sum|x_i|, gamma_n = n*u / (1 - n*u).
    u = _eps(dtype) / 2
    gamma = length * u / (1 - length * u)
    bound = gamma * np.abs(wide).sum(axis=1) + u * np.abs(wide.sum(axis=1))
    check = Check(1, "bound", (wide.sum(axis=1),), rows, bound=bound)
    return KernelCase(kernel, [x, np.zeros(rows, dtype.np)], [check])


def reduce_max(ctx: Context, dtype: DType, length: int) -> KernelCase:
    """Row maxima from -inf; one row holds a NaN (result NaN), one is all -inf."""
    rng = ctx.rng(f"reduce-max/{dtype.name}/{length}")
    x = _values(rng, dtype, 4 * length).reshape(4, length)
    x[1, length // 2] = np.nan
    x[2, :] = -np.inf
    b = KernelBuilder(f"conform_max_{dtype.name}_{length}")
    px, out = b.param(dtype), b.param(dtype)
    row = b.special("group")
    acc = b.acc(b.const(-np.inf, dtype))
    base = b.alu(Op.MUL, row, b.const(length))
    with b.loop(b.const(0), b.const(length)) as k:
        b.assign(acc, b.alu(Op.MAX, acc, b.load(px, b.alu(Op.ADD, base, k))))
    b.store(out, row, acc)
    return _exact(b.build(grid=(4, 1, 1)), [x.reshape(-1), np.zeros(4, dtype.np)])


def _movement(name: str, dtype: DType, n_in: int, n_out: int,
              index: Callable[[KernelBuilder, int], tuple[int, int | None]],
              ctx: Context) -> KernelCase:
    """out[i] = x[index(i)] where the gate holds, else 0: every movement op is this."""
    rng = ctx.rng(f"movement/{name}/{dtype.name}")
    x = _values(rng, dtype, n_in)
    b = KernelBuilder(f"conform_{name}_{dtype.name}")
    px, out = b.param(dtype), b.param(dtype)
    i = _lane(b)
    inside = b.alu(Op.CMPLT, i, b.const(n_out))
    source, gate = index(b, i)
    gate = inside if gate is None else b.alu(Op.AND, inside, gate)
    b.store(out, i, b.load(px, source, gate), inside)
    return _exact(b.build(**_grid(n_out)), [x, np.full(n_out, 1, dtype.np)])


def movements(ctx: Context, dtype: DType) -> dict[str, Callable[[], KernelCase]]:
    """pad, shrink, permute, expand and flip of a small array, as index expressions."""
    rows, cols, n, pad = 7, 5, 35, 3

    def pad_index(b: KernelBuilder, i: int) -> tuple[int, int]:
        after_start = b.alu(Op.CMPLT, b.const(pad - 1), i)
        before_end = b.alu(Op.CMPLT, i, b.const(pad + n))
        return b.alu(Op.SUB, i, b.const(pad)), b.alu(Op.AND, after_start, before_end)

    def permute_index(b: KernelBuilder, i: int) -> tuple[int, None]:
        # out is x.T, shape (cols, rows): out[c, r] = x[r, c]
        c, r = b.alu(Op.IDIV, i, b.const(rows)), b.alu(Op.MOD, i, b.const(rows))
        return b.alu(Op.ADD, b.alu(Op.MUL, r, b.const(cols)), c), None

    return {
        "pad": lambda: _movement("pad", dtype, n, n + 2 * pad, pad_index, ctx),
        "shrink": lambda: _movement("shrink", dtype, n, n - 9,
                                    lambda b, i: (b.alu(Op.ADD, i, b.const(4)), None), ctx),
        "permute": lambda: _movement("permute", dtype, n, n, permute_index, ctx),
        "expand": lambda: _movement("expand", dtype, cols, n,
                                    lambda b, i: (b.alu(Op.MOD, i, b.const(cols)), None), ctx),
        "flip": lambda: _movement("flip", dtype, n, n,
                                  lambda b, i: (b.alu(Op.SUB, b.const(n - 1), i), None), ctx),
    }


def local_reverse(ctx: Context, block: int) -> KernelCase:
    """Each workgroup reverses its slice through LOCAL memory: wrong without the BARRIER."""
    groups = 3
    x = _values(ctx.rng("local/reverse"), dtypes.float32, groups * block)
    b = KernelBuilder("conform_local_reverse")
    px, out = b.param(dtypes.float32), b.param(dtypes.float32)
    shared = b.local(dtypes.float32, block)
    t = b.special("local")
    base = b.alu(Op.MUL, b.special("group"), b.const(block))
    b.store(shared, t, b.load(px, b.alu(Op.ADD, base, t)))
    b.barrier()
    mirrored = b.load(shared, b.alu(Op.SUB, b.const(block - 1), t))
    b.store(out, b.alu(Op.ADD, base, t), mirrored)
    kernel = b.build(grid=(groups, 1, 1), block=(block, 1, 1))
    return _exact(kernel, [x, np.zeros(groups * block, np.float32)])


def local_tree_sum(ctx: Context, block: int) -> KernelCase:
    """A workgroup tree reduction in LOCAL memory: a loop of halving strides with barriers."""
    groups, steps = 4, block.bit_length() - 1
    x = ctx.rng("local/tree-sum").integers(-1000, 1000, groups * block).astype(np.int32)
    b = KernelBuilder("conform_local_tree_sum")
    px, out = b.param(dtypes.int32), b.param(dtypes.int32)
    shared = b.local(dtypes.int32, block)
    t, group = b.special("local"), b.special("group")
    b.store(shared, t, b.load(px, b.alu(Op.ADD, b.alu(Op.MUL, group, b.const(block)), t)))
    b.barrier()
    with b.loop(b.const(0), b.const(steps)) as step:
        stride = b.alu(Op.SHR, b.const(block // 2), step)
        active = b.alu(Op.CMPLT, t, stride)
        total = b.alu(Op.ADD, b.load(shared, t),
                      b.load(shared, b.alu(Op.ADD, t, stride), active))
        b.barrier()
        b.store(shared, t, total, active)
        b.barrier()
    b.store(out, group, b.load(shared, b.const(0)), b.alu(Op.CMPLT, t, b.const(1)))
    kernel = b.build(grid=(groups, 1, 1), block=(block, 1, 1))
    return _exact(kernel, [x, np.zeros(groups, np.int32)])


def scalar_args(ctx: Context) -> KernelCase:
    """out[i] = x[i] * scale + offset for i < n (all three int32 VARs), in an IF; lanes past n
    must leave the output untouched."""
    n, launched = 50, 128
    x = ctx.rng("scalars").integers(-1000, 1000, launched).astype(np.int32)
    b = KernelBuilder("conform_scalar_args")
    px, out = b.param(dtypes.int32), b.param(dtypes.int32)
    count, scale, offset = b.var("n"), b.var("scale"), b.var("offset")
    i = _lane(b)
    with b.branch(b.alu(Op.CMPLT, i, count)):
        b.store(out, i, b.alu(Op.ADD, b.alu(Op.MUL, b.load(px, i), scale), offset))
    kernel = b.build(**_grid(launched))
    return _exact(kernel, [x, np.full(launched, -1, np.int32)], (n, -3, 2**31 - 7))


def word_scalar_args(ctx: Context) -> KernelCase:
    """out[i] = x[i] * scale + offset for i < n, with n a uint32 VAR and scale and offset float32
    VARs: each arrives as the 32-bit word of its bits and the kernel reinterprets it."""
    n, launched = 50, 128
    x = ctx.rng("word-scalars").standard_normal(launched).astype(np.float32)
    b = KernelBuilder("conform_word_scalar_args")
    px, out = b.param(dtypes.float32), b.param(dtypes.float32)
    count = b.var("n", dtypes.uint32)
    scale, offset = b.var("scale", dtypes.float32), b.var("offset", dtypes.float32)
    i = _lane(b)
    with b.branch(b.alu(Op.CMPLT, i, b.cast(count, dtypes.int32))):
        b.store(out, i, b.alu(Op.ADD, b.alu(Op.MUL, b.load(px, i), scale), offset))
    kernel = b.build(**_grid(launched))
    words = tuple(scalar_words(kernel.var_dtypes, (n, 0.37, -2.5)))
    return _exact(kernel, [x, np.full(launched, -1, np.float32)], words)


def many_buffers(ctx: Context, count: int) -> KernelCase:
    """`count` buffers in one kernel: out = sum of count - 1 inputs, each distinct."""
    n = 16
    inputs = [np.arange(n, dtype=np.int32) * (j + 1) + 1000 * j for j in range(count - 1)]
    b = KernelBuilder(f"conform_many_buffers_{count}")
    params = [b.param(dtypes.int32) for _ in range(count)]
    i = b.special("local")
    total = b.load(params[0], i)
    for p in params[1:-1]:
        total = b.alu(Op.ADD, total, b.load(p, i))
    b.store(params[-1], i, total)
    kernel = b.build(block=(n, 1, 1))
    return _exact(kernel, inputs + [np.zeros(n, np.int32)])


def grid_3d(ctx: Context) -> KernelCase:
    """Every axis of SPECIAL: each thread writes its six ids, encoded, at its linear index."""
    grid, block = (3, 2, 2), (4, 2, 2)
    threads = int(np.prod(grid) * np.prod(block))
    b = KernelBuilder("conform_grid_3d")
    out = b.param(dtypes.int32)
    ids = [b.special(kind, axis) for kind in ("group", "local") for axis in range(3)]
    code = b.const(0)
    for place, value in enumerate(ids):
        code = b.alu(Op.ADD, code, b.alu(Op.MUL, value, b.const(10 ** place)))
    gx, gy, gz, lx, ly, lz = ids
    group_linear = b.alu(Op.ADD, gx, b.alu(Op.MUL, b.alu(Op.ADD, gy, b.alu(
        Op.MUL, gz, b.const(grid[1]))), b.const(grid[0])))
    local_linear = b.alu(Op.ADD, lx, b.alu(Op.MUL, b.alu(Op.ADD, ly, b.alu(
        Op.MUL, lz, b.const(block[1]))), b.const(block[0])))
    linear = b.alu(Op.ADD, b.alu(Op.MUL, group_linear, b.const(int(np.prod(block)))),
                   local_linear)
    b.store(out, linear, code)
    return _exact(b.build(grid=grid, block=block), [np.full(threads, -1, np.int32)])


def _case(name: str, make: Callable[[], KernelCase], dtype: DType | None = None) -> Case:
    kc = make()     # built now: its kernel says which tier 2 cases it depends on
    return Case(f"kernels/{name}", TIER, None, dtype.name if dtype else None,
                ESSENTIAL + ops_used(kc.kernel), make=lambda: kc)


def cases(ctx: Context) -> list[Case]:
    """The kernel cases; the full run adds more lengths and dtypes."""
    caps = ctx.capabilities
    floats = [d for d in (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64)
              if not ctx.quick or d == dtypes.float32]
    lengths = (1, 7, 333) if ctx.quick else (1, 7, 333, 1025, 4097)
    found = [_case(f"fused-elementwise/{d.name}", lambda d=d: fused(ctx, d, 1000), d)
             for d in floats]
    found.append(_case("fused-elementwise/int32", lambda: fused_int(ctx, 1000), dtypes.int32))
    found += [_case(f"unfused-multiply-add/{d.name}", lambda d=d: unfused_multiply_add(ctx, d, 256),
                    d) for d in (dtypes.float32, dtypes.float64)[:1 if ctx.quick else 2]]
    for dtype in floats[:2] + [dtypes.int32]:
        for length in lengths:
            if dtype.is_float and length * _eps(dtype) >= 1:
                continue    # gamma_n needs n * u < 1: float16 cannot sum that many usefully
            found.append(_case(f"reduce-sum/{dtype.name}/{length}",
                               lambda d=dtype, n=length: reduce_sum(ctx, d, n), dtype))
    found += [_case(f"reduce-max/{d.name}/{n}", lambda d=d, n=n: reduce_max(ctx, d, n), d)
              for d in floats[:2] for n in lengths[1:3]]
    moved = [dtypes.float32] if ctx.quick else [dtypes.float32, dtypes.int8, dtypes.float16,
                                                  dtypes.int64]
    for dtype in moved:
        for name, make in movements(ctx, dtype).items():
            found.append(_case(f"movement/{name}/{dtype.name}", make, dtype))
    block = min(BLOCK, caps.max_block_threads, caps.max_block[0])
    block = 1 << (block.bit_length() - 1)    # the tree reduction halves: a power of two
    found += [
        _case("local/reverse", lambda: local_reverse(ctx, block), dtypes.float32),
        _case("local/tree-sum", lambda: local_tree_sum(ctx, block), dtypes.int32),
        _case("scalar-args", lambda: scalar_args(ctx), dtypes.int32),
        _case("scalar-args/words", lambda: word_scalar_args(ctx), dtypes.float32),
        _case("many-buffers", lambda: many_buffers(ctx, min(caps.max_buffers, 128)),
              dtypes.int32),
        _case("grid-3d", lambda: grid_3d(ctx), dtypes.int32),
    ]
    return found + matrix_cases.loop_cases(ctx)
