"""Group reduces: on a device whose threads are hardware lanes, a kernel whose one reduce has
few outputs of many terms each gives every output a workgroup of its own.

The group's threads add interleaved terms (thread l adds terms l, l + T, l + 2T, ... of T
threads, so that neighbouring threads read neighbouring elements of a contiguous row), store
their partial values in workgroup memory (LOCAL) and combine them in log2(T) halving steps
between barriers; thread 0 then computes the kernel's elementwise epilogue at its output and
stores it. With one thread per output instead, each thread walked its own row alone: BERT's
LayerNorm means (128 rows of 768) ran as one group of 32 threads, 0.21 ms a launch on an H200,
and a GPT-2 decode step's (one row of 768) as a single thread. The terms are reordered as a
pairwise tree of interleaved partial sums, within the gamma_n * sum|x| bound reductions are
tested against. The pass shows at PORTKIT_DEBUG=3 as a LOCAL of T elements and BARRIERs.
"""
from __future__ import annotations

from math import ceil, prod
from typing import TYPE_CHECKING

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen.plan import reduce_identity, serial, under_epilogue
from portkit.graph import GraphOp, Lazy, walk
from portkit.symbolic import unravel

if TYPE_CHECKING:
    from portkit.codegen.lower import Lowerer

# A reduce of at least LEAST_TERMS terms per output into fewer outputs than UNIT_THREADS per
# compute unit the device states (Capabilities.compute_units): more outputs fill the device with
# a thread each. A thread walking 129 terms alone (attention's softmax sums over a GPT-2 decode
# step's keys, 12 outputs in one group of 3 threads) took 63 us on an H200.
LEAST_TERMS = 64
UNIT_THREADS = 128
# Threads per group: a power of two, about a quarter of the terms, from a warp of 32 to this.
MOST_THREADS = 256


def find(root: Lazy, inputs: list[Lazy], caps: Capabilities) -> Lazy | None:
    """The one reduce of the kernel storing `root` where it takes a group per output: a device
    whose threads are lanes, with workgroup memory, that states its compute units; the reduce
    the only one in the kernel, `root` an elementwise function of it (plan.under_epilogue), no
    gather's fault flag, LEAST_TERMS terms or more per output and fewer outputs than
    UNIT_THREADS per unit. Else None."""
    if (serial(caps) or caps.compute_units is None or caps.max_block_threads < 32
            or caps.local_memory_bytes < MOST_THREADS * 4):
        return None
    params = {id(x) for x in inputs}
    nodes = walk([root], stop=lambda n: id(n) in params).order
    reduces = [n for n in nodes if n.op is GraphOp.REDUCE]
    reduce = under_epilogue(root, params)
    if (len(reduces) != 1 or reduce is not reduces[0]
            or any(n.op is GraphOp.GATHER and n.arg.code for n in nodes)
            or prod(reduce.src[0].shape[a] for a in reduce.arg[1]) < LEAST_TERMS
            or prod(root.shape) >= caps.compute_units * UNIT_THREADS):
        return None
    return reduce


def emit(lowerer: Lowerer, root: Lazy, reduce: Lazy, caps: Capabilities, out: int) -> Kernel:
    """The kernel storing `root` into buffer `out`, one workgroup per output (see above)."""
    b = lowerer.b
    op, axes = reduce.arg
    src = reduce.src[0]
    sizes = tuple(src.shape[a] for a in axes)
    terms, outputs = prod(sizes), prod(root.shape)
    threads = min(MOST_THREADS, caps.max_block_threads, caps.max_block[0],
                  max(32, 1 << ((terms // 4).bit_length() - 1)))
    wide = dtypes.float32 if reduce.dtype.is_float and reduce.dtype.itemsize == 2 else None
    dtype = wide or reduce.dtype
    group = lowerer.new_var("g", 0, outputs - 1, b.special("group", 0))
    lane_node = b.special("local", 0)
    lane = lowerer.new_var("l", 0, threads - 1, lane_node)
    acc = b.acc(lowerer.const(reduce_identity(op, dtype), dtype))
    trips = ceil(terms / threads)
    counter = b.add(Op.RANGE, dtypes.int32, (lowerer.const(0), lowerer.const(trips)))
    lowerer.scopes.append({})
    position = lowerer.new_var("r", 0, trips - 1, counter) * threads + lane
    inside = None
    if trips * threads != terms:
        inside = b.add(Op.IF, None, (b.alu(Op.CMPLT, lowerer.index(position),
                                           lowerer.const(terms)),))
        lowerer.scopes.append({})
    at = unravel(group, reduce.shape)
    for axis, along in zip(axes, unravel(position, sizes)):
        at[axis] = along
    term, = (lowerer.terms(src, [at], [None], op is Op.ADD) if wide
             else lowerer.lower(src, [at], [None]))
    b.assign(acc, b.alu(op, acc, term))
    if inside is not None:
        b.add(Op.ENDIF, None, (inside,))
        lowerer.scopes.pop()
    b.add(Op.END, None, (counter,))
    lowerer.scopes.pop()
    partial = b.local(dtype, threads)
    b.store(partial, lane_node, acc)
    b.barrier()
    half = threads // 2
    while half:
        with b.branch(b.alu(Op.CMPLT, lane_node, lowerer.const(half))):
            other = b.load(partial, b.alu(Op.ADD, lane_node, lowerer.const(half)))
            b.store(partial, lane_node, b.alu(op, b.load(partial, lane_node), other))
        b.barrier()
        half //= 2
    with b.branch(b.alu(Op.CMPLT, lane_node, lowerer.const(1))):
        lowerer.scopes.append({})
        total = b.load(partial, lowerer.const(0))
        lowerer.fixed[id(reduce)] = b.cast(total, reduce.dtype) if wide else total
        value, = lowerer.lower(root, [unravel(group, root.shape)], [None])
        b.store(out, lowerer.index(group), value)
        lowerer.scopes.pop()
    return b.build(grid=(outputs, 1, 1), block=(threads, 1, 1))
