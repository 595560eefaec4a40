"""Matrix units: a matmul-shaped kernel as MMA nodes on a unit the device declares.

When a float contraction C[..., m, n] = sum_k A[..., m, k] * B[..., k, n] has factors of a
declared unit's input dtypes and sums in its accumulator dtype (Capabilities.matrix_units), each
workgroup is one group of the unit's threads and computes one M×N tile of the output:
- it walks K in steps of the unit's k; at each step every thread computes its own elements of
  the A and B tiles (rows and columns from the unit's layout table, as index expressions in the
  thread id), lowering the factors there, so a fused prologue (x * 2, x.T) is computed in place;
- one MMA node adds the tile product into the thread's C registers (ACCs);
- after the loop each thread stores its C elements, cast to the output dtype.
Elements past an edge of m, n or k are zeros (their loads gated), and outputs past it are not
stored, so any size works. A device that declares no unit never reaches this module's `emit`,
nor does one whose threads are loops (a CPU): a tile per workgroup would leave it a loop of one
thread a group, and its units run in packed panels instead (codegen/pack.py).

The layout's rows and columns become index expressions in the thread id: a sum of the id's bits
times weights where the table is linear in those bits (every layout NVIDIA, AMD and the
interpreter's `row_per_thread` use), else a chain of WHEREs over the thread id.
"""
from __future__ import annotations

from math import ceil, prod

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.kernel import Kernel
from portkit.abi.matrix import Fragment, MatrixUnit
from portkit.abi.ops import Op
from portkit.codegen import tiles
from portkit.codegen.plan import serial
from portkit.graph import Lazy
from portkit.symbolic import Bound, Lin, const, ravel, unravel


def find(root: Lazy, inputs: list[Lazy], caps: Capabilities
         ) -> tuple[tiles.Contraction, MatrixUnit] | None:
    """The contraction `root` computes and the declared unit that runs it, or None (always
    None on a device that declares no unit, or whose threads are loops)."""
    if not caps.matrix_units or serial(caps):
        return None
    found = tiles.match(root, inputs)
    if found is None or found.fold or found.k_fold:
        return None
    factors = (found.left.dtype, found.right.dtype)
    for unit in caps.matrix_units:
        if ((unit.a_dtype, unit.b_dtype) == factors and unit.acc_dtype == found.accumulate
                and unit.threads <= caps.max_block[0]):
            return found, unit
    return None


def emit(lowerer, root: Lazy, found: tiles.Contraction, unit: MatrixUnit, out: int) -> Kernel:
    """The kernel storing `root` into buffer `out` through MMA nodes on `unit`; `lowerer`
    (lower.py's) has its PARAMs and VARs set and lowers the factors at each thread's elements."""
    b = lowerer.b
    red = found.reduce
    shape = red.src[0].shape
    m_size, n_size, k_size = found.sizes
    batch = [a for a in range(len(shape)) if a not in (found.m, found.n, found.k)]
    grid_shape = tuple(shape[a] for a in batch) + (ceil(m_size / unit.m), ceil(n_size / unit.n))
    groups = prod(grid_shape)
    group = lowerer.new_var("g", 0, groups - 1, b.special("group", 0))
    lane = lowerer.new_var("l", 0, unit.threads - 1, b.special("local", 0))
    *batch_idx, tile_m, tile_n = unravel(group, grid_shape)

    def base() -> list[Lin]:
        idx = [const(0)] * len(shape)
        for axis, value in zip(batch, batch_idx):
            idx[axis] = value
        return idx

    a_at = _positions(lowerer, unit.a, lane, "a")
    b_at = _positions(lowerer, unit.b, lane, "b")
    c_at = _positions(lowerer, unit.c, lane, "c")
    accs = [b.acc(lowerer.const(0.0, unit.acc_dtype)) for _ in c_at]
    steps = ceil(k_size / unit.k)
    step_node = b.add(Op.RANGE, dtypes.int32, (lowerer.const(0), lowerer.const(steps)))
    lowerer.scopes.append({})
    step = lowerer.new_var("k", 0, steps - 1, step_node)
    operands = []
    for factor, axis, size, first, at in ((found.left, found.m, m_size, tile_m * unit.m, a_at),
                                          (found.right, found.n, n_size, tile_n * unit.n, b_at)):
        for row, column in at:
            along, k = (row, column) if factor is found.left else (column, row)
            idx = base()
            idx[axis], idx[found.k] = first + along, step * unit.k + k
            gate = lowerer.condition((Bound(idx[axis], 0, size), Bound(idx[found.k], 0, k_size)),
                                     None)
            value, = lowerer.lower(factor, [idx], [gate])
            if gate is not None:
                value = b.alu(Op.WHERE, gate, value, lowerer.const(0.0, b.dtype(value)))
            operands.append(value)
    b.add(Op.MMA, None, tuple(operands + accs), unit)
    b.add(Op.END, None, (step_node,))
    lowerer.scopes.pop()
    for acc, (row, column) in zip(accs, c_at):
        idx = base()
        idx[found.m], idx[found.n] = tile_m * unit.m + row, tile_n * unit.n + column
        gate = lowerer.condition((Bound(idx[found.m], 0, m_size), Bound(idx[found.n], 0, n_size)),
                                 None)
        value = acc if unit.acc_dtype == red.dtype else b.cast(acc, red.dtype)
        flat = ravel(idx, red.shape)
        b.store(out, lowerer.index(flat), value, gate)
    return b.build(grid=(groups, 1, 1), block=(unit.threads, 1, 1))


def _positions(lowerer, layout: Fragment, lane: Lin, name: str) -> list[tuple[Lin, Lin]]:
    """Each element's (row, col) of the tile as index expressions in the thread id `lane`."""
    threads = len(layout)
    bits = threads.bit_length() - 1
    lane_bits = unravel(lane, (2,) * bits)[::-1] if threads == 1 << bits else None   # low first
    found = []
    for e in range(len(layout[0])):
        pair = []
        for side in (0, 1):
            table = [layout[t][e][side] for t in range(threads)]
            weights = None if lane_bits is None else [
                table[1 << i] - table[0] for i in range(bits)]
            if lane_bits is not None and weights is not None and all(
                    table[t] == table[0] + sum(w for i, w in enumerate(weights) if t >> i & 1)
                    for t in range(threads)):
                pair.append(sum((bit * w for bit, w in zip(lane_bits, weights) if w),
                                const(table[0])))
            else:
                pair.append(_looked_up(lowerer, table, lane, f"{name}{e}{'rc'[side]}"))
        found.append((pair[0], pair[1]))
    return found


def _looked_up(lowerer, table: list[int], lane: Lin, name: str) -> Lin:
    """table[lane] as a WHERE chain over the thread id, bound as a new index variable."""
    b = lowerer.b
    at = lowerer.index(lane)
    value = lowerer.const(table[0])
    for t in range(1, len(table)):
        if table[t] != table[0]:
            value = b.alu(Op.WHERE, b.alu(Op.CMPNE, at, lowerer.const(t)), value,
                          lowerer.const(table[t]))
    return lowerer.new_var(name, min(table), max(table), value)
