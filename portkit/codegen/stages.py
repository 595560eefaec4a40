"""Staged vectors: a matrix-vector product x @ W.T on a device whose threads are loops, where x
is more than a load (hardswish(h + b) in MobileNetV3's classifier, a fused LayerNorm or GELU in
GPT-2 decode), evaluates x once per workgroup into workgroup memory (LOCAL) before the thread's
loop over rows of W, and the multiply-add loop reads it from there.

The untiled lowering (codegen/plan.py's partial sums along k, `Plan.unroll`) multiplies a
vector of x by a vector of each row of W, and codegen/lanes.py writes those as vector
multiply-adds when both are loads at consecutive addresses. Lowered in place, x was an
expression per lane, recomputed for every block of rows and every chunk of k: the lanes did
not match and the kernel stayed scalar, 128 scalar accumulators (MobileNetV3-small's
1024 -> 1000 classifier took 1.0 ms at one thread, a plain matvec of its shape 70 us). Staged,
x is K values computed in one loop that vectorizes, and its loads are the same as a plain
matvec's. The pass shows at PORTKIT_DEBUG=3 as a LOCAL of K elements stored by the kernel's
first loop.
"""
from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.ops import Op
from portkit.codegen.plan import Plan, gates, hot_bytes, load_steps, serial
from portkit.graph import GraphOp, Lazy, walk
from portkit.symbolic import const, unravel, var

if TYPE_CHECKING:
    from portkit.codegen.lower import Lowerer


def find(root: Lazy, inputs: list[Lazy], tiling: Plan, caps: Capabilities
         ) -> tuple[Lazy, Lazy] | None:
    """(the reduce, its factor to stage) where `tiling` sums a product along k in partial sums
    on a serial device and one factor is more than a load, the same for every output (no
    load, gate or position of it depends on an output axis), and fits the device's LOCAL
    memory; else None. A factor that loads nothing (x * 2's 2) stays a scalar."""
    if not serial(caps) or tiling.unroll is None or tiling.reduce is None:
        return None
    params = {id(x) for x in inputs}
    found = [n for n in walk([root], stop=lambda n: id(n) in params).order
             if id(n) == tiling.reduce]
    if (not found or found[0].arg[0] is not Op.ADD or found[0].src[0].op is not Op.MUL
            or id(found[0].src[0]) in params):
        return None
    reduce = found[0]
    axes, src = reduce.arg[1], reduce.src[0]
    outputs = [a for a, n in enumerate(src.shape) if a not in axes and n > 1]
    size = prod(src.shape[a] for a in axes)
    index = [var(f"o{a}", 0, n - 1) for a, n in enumerate(src.shape)]
    for factor in src.src:
        if (size * factor.dtype.itemsize <= hot_bytes(caps) and _costly(factor, params)
                and not gates(factor, inputs, index) and all(
                    step == 0 for a in outputs for step in load_steps(factor, inputs, f"o{a}"))):
            return reduce, factor
    return None


def _costly(factor: Lazy, params: set[int]) -> bool:
    """Whether `factor` is a float32 (or wider) expression of loads, more than a load, with
    no reduce, gather or position of its own."""
    if id(factor) in params or (factor.op is GraphOp.VIEW and id(factor.src[0]) in params):
        return False
    inside = walk([factor], stop=lambda n: id(n) in params)
    return (bool(inside.stopped) and factor.dtype.is_float and factor.dtype.itemsize >= 4
            and not any(n.op in (GraphOp.REDUCE, GraphOp.GATHER, GraphOp.ITER)
                        for n in inside.order))


def emit(lowerer: Lowerer, reduce: Lazy, factor: Lazy) -> None:
    """Stores `factor` at every position of the reduce's axes into a LOCAL, in one loop, and
    has the lowerer read it from there (`Lowerer.staged`)."""
    b = lowerer.b
    axes = reduce.arg[1]
    sizes = tuple(factor.shape[a] for a in axes)
    staged = b.local(factor.dtype, prod(sizes))
    counter = b.add(Op.RANGE, dtypes.int32, (lowerer.const(0), lowerer.const(prod(sizes))))
    lowerer.scopes.append({})
    position = lowerer.new_var("k", 0, prod(sizes) - 1, counter)
    idx = [const(0)] * len(factor.shape)
    for axis, at in zip(axes, unravel(position, sizes)):
        idx[axis] = at
    value, = lowerer.lower(factor, [idx], [None])
    b.store(staged, lowerer.index(position), value)
    b.add(Op.END, None, (counter,))
    lowerer.scopes.pop()
    lowerer.staged[id(factor)] = (staged, axes, sizes)
