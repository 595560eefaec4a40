"""Lowering: one scheduled kernel (a root Lazy node and its fused sources) -> one ABI kernel.

Every output element has a multi-index; `lower(node, idxs, gates)` emits the ABI nodes computing
`node` at each multi-index of `idxs` (symbolic expressions, portkit/symbolic.py) at once:
- a realized input loads from its buffer at the flat index (equal loads are emitted once),
- a VIEW maps an index through its ShapeTracker (strides, offset, mask) to the source's index,
  gating loads where the mask says the element is padding; a view whose offset is a VAR
  (schedule/keys.py `structure`) adds the VAR to the position instead (`Lowerer.moved`),
- an ALU op lowers its sources at the same indices,
- a GATHER loads its index tensor, wraps a negative index if its op does, notes its op's nonzero
  code for an index outside the axis (the largest noted is stored into the fault flag after the
  thread's loops), clamps it there (so no load leaves the buffer) and lowers its source with
  that axis's index replaced by the loaded value,
- a REDUCE opens one loop per reduced axis around one accumulator per index (and per unrolled
  copy, see below), so all the indices share the loop and each load of it.
Threads take contiguous chunks of output tiles: one tile per thread on devices with many
threads, long chunks (loops a C compiler vectorizes) on devices that run one thread per group,
where a kernel without a tiled reduce loops over rows, decoding each once (codegen/rows.py).

A kernel with one reduce is tiled (`plan`): each thread computes a small block of outputs
("upcast", e.g. 4 rows x 16 columns of a matmul) so that a value loaded once feeds several
accumulators and the contiguous axis becomes independent lanes a C compiler turns into vector
instructions; a reduce over a contiguous axis keeps several partial accumulators ("unroll"),
combined pairwise at the end, which breaks the chain of dependent additions. Both reorder a
float sum, within the gamma_n * sum|x| bound reductions are tested against.

Accuracy: a long float sum is blocked (each block of about sqrt(n) terms sums into fresh
registers, then into the total), and a float16/bfloat16 sum accumulates in float32 (a product
inside it, a matmul's, is formed in float32 too), as torch does; the result is rounded once.
Both show in the ABI kernel at PORTKIT_DEBUG=3: a RANGE around the reduce loop, float32 ACCs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import product
from math import ceil, isqrt, prod

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.dtypes import DType
from portkit.abi.errors import CapabilityError, UnsupportedDType
from portkit.abi.kernel import Kernel, KernelBuilder
from portkit.abi.ops import Op
from portkit.codegen import rows, stages
from portkit.codegen.plan import (
    SERIAL,
    THREADED,
    Plan,
    launch_shape,
    plan,
    reduce_identity,
    register_block,
    serial,
    split,
)
from portkit.codegen.positions import OFFSET_VAR
from portkit.codegen.rows import row_length
from portkit.graph import GraphOp, Lazy, Traced, toposort
from portkit.symbolic import (
    Bound,
    Div,
    Lin,
    Mod,
    Var,
    bounds,
    const,
    ravel,
    recombine,
    unravel,
    var,
)
from portkit.view import strides_for

# A long float sum adds about sqrt(n), at most _BLOCK, terms into fresh registers before they
# join the running total (blocked summation): the error of 10**6 additions of 0.1 in float32
# falls from 6e-5 to 3e-7 of the result, for one extra add per block.
_BLOCK = 64


# A graph constant reaches its kernel as a scalar argument (VAR) of this dtype: numbers that
# enter the graph (x * 0.37, a learning rate) are data, so a kernel's source depends only on
# the graph's structure. Narrow types travel widened (their value is exact there) and are cast
# in the kernel; bool and 64-bit constants stay code. Numbers codegen makes itself (reduce
# identities, padding zeros, index arithmetic, loop bounds) are always code.
SCALAR_VAR_DTYPES: dict[DType, DType] = {
    dtypes.float32: dtypes.float32, dtypes.float16: dtypes.float32,
    dtypes.bfloat16: dtypes.float32, dtypes.int32: dtypes.int32, dtypes.uint32: dtypes.uint32,
    dtypes.int8: dtypes.int32, dtypes.int16: dtypes.int32, dtypes.uint8: dtypes.int32,
    dtypes.uint16: dtypes.int32}
MAX_SCALARS = 16    # VARs per kernel; constants past these stay code


class Lowerer:
    def __init__(self, name: str, inputs: list[Lazy], tiling: Plan):
        self.b = KernelBuilder(name)
        self.params: dict[int, int] = {}       # id(input Lazy) -> PARAM node
        self.inputs = inputs
        self.plan = tiling
        self.scopes: list[dict] = [{}]          # memo per open loop/branch; closed ones drop
        self.vars: dict[str, int] = {}          # symbolic Var name -> node
        self.scalars: dict[int, int] = {}       # id(graph CONST or VIEW) -> its VAR (cast) node
        self.offsets: dict[int, Lin] = {}       # id(VIEW) -> its VAR offset, as an index
        self.counter = 0
        self.fixed: dict[int, int] = {}         # id(Lazy) -> the node holding its value here
        self.ranges = False                     # a two-sided bound as one uint32 compare
        self.fault: int | None = None           # the ACC of the largest fault code met
        self.assumed: tuple[Bound, ...] = ()    # gates tested once around the code lowered:
        self.refuted: tuple[Bound, ...] = ()    # true there, and false there
        self.epilogue_loop = False              # a tile's epilogue as a loop over LOCAL sums
        # id(Lazy) -> (LOCAL, reduce axes, their sizes): a factor stored once per workgroup
        # along the reduce's axes, read at those axes' position (codegen/stages.py)
        self.staged: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}

    # -- memo with scopes: a value computed inside a loop is not visible after it ---------------

    def cached(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key, value):
        self.scopes[-1][key] = value
        return value

    def const(self, value, dtype: DType = dtypes.int32) -> int:
        if isinstance(value, Traced):     # a number written as code is plain from here on
            value = float.__float__(value)
        key = ("const", dtype, value)
        found = self.cached(key)
        return found if found is not None else self.remember(key, self.b.const(value, dtype))

    def load(self, buffer: int, index: int, gate: int | None) -> int:
        key = ("load", buffer, index, gate)
        found = self.cached(key)
        return found if found is not None else self.remember(key, self.b.load(buffer, index,
                                                                               gate))

    # -- index expressions ---------------------------------------------------------------------

    def index(self, expr: Lin) -> int:
        key = ("lin", expr)
        found = self.cached(key)
        if found is not None:
            return found
        b, out = self.b, None
        if expr.terms and expr.const:
            # base + constant: neighbouring elements share the base, so loads stay adjacent
            out = b.alu(Op.ADD, self.index(Lin(expr.terms)), self.const(expr.const))
            return self.remember(key, out)
        for atom, coef in expr.terms:
            node = self.atom(atom)
            if coef != 1:
                node = b.alu(Op.MUL, node, self.const(coef))
            out = node if out is None else b.alu(Op.ADD, out, node)
        return self.remember(key, self.const(expr.const) if out is None else out)

    def atom(self, atom) -> int:
        if isinstance(atom, Var):
            return self.vars[atom.name]
        found = self.cached(("atom", atom))
        return found if found is not None else self.remember(("atom", atom),
                                                             self._divide(atom))

    def _divide(self, atom: Div | Mod) -> int:
        # IDIV and MOD truncate toward zero; shift negative operands up to get floor semantics
        shift = ceil(-atom.expr.min / atom.divisor) if atom.expr.min < 0 else 0
        inner = self.index(atom.expr + shift * atom.divisor)
        op = Op.IDIV if isinstance(atom, Div) else Op.MOD
        node = self.b.alu(op, inner, self.const(atom.divisor))
        if shift and isinstance(atom, Div):
            node = self.b.alu(Op.ADD, node, self.const(-shift))
        return node

    def condition(self, conds: tuple[Bound, ...], gate: int | None) -> int | None:
        # one gate node per condition, so that equal gated loads are one load (a convolution
        # reads each padded input once for all its output channels)
        key = ("gate", conds, gate)
        found = self.cached(key)
        return found if found is not None else self.remember(key, self._condition(conds, gate))

    def _condition(self, conds: tuple[Bound, ...], gate: int | None) -> int | None:
        b = self.b
        for c in conds:
            parts = []
            below, above = c.expr.min < c.lo, c.expr.max >= c.hi
            if self.ranges and below and above:
                # lo <= x < hi as one unsigned compare, (uint32)(x - lo) < hi - lo: clang
                # turns the two signed ones along a padded row into a switch (x == 0, x == 57)
                # and then leaves the row's loop scalar (a padded copy ran at half speed)
                offset = b.cast(self.index(c.expr + (-c.lo)), dtypes.uint32)
                parts.append(b.alu(Op.CMPLT, offset, self.const(c.hi - c.lo, dtypes.uint32)))
            else:
                if below:
                    parts.append(b.alu(Op.CMPLT, self.const(c.lo - 1), self.index(c.expr)))
                if above:
                    parts.append(b.alu(Op.CMPLT, self.index(c.expr), self.const(c.hi)))
            for p in parts:
                gate = p if gate is None else b.alu(Op.AND, gate, p)
        return gate

    def new_var(self, prefix: str, lo: int, hi: int, node: int) -> Lin:
        self.counter += 1
        name = f"{prefix}{self.counter}"
        self.vars[name] = node
        return var(name, lo, hi)

    # -- graph nodes ---------------------------------------------------------------------------

    def lower(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None]) -> list[int]:
        """The value of `node` at each multi-index of `idxs` (loads gated by `gates`)."""
        key = (id(node), tuple(tuple(idx) for idx in idxs), tuple(gates))
        found = self.cached(key)
        if found is not None:
            return found
        return self.remember(key, self._lower(node, idxs, gates))

    def _lower(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None]) -> list[int]:
        b = self.b
        if id(node) in self.fixed:       # computed by a pass, for the one element it lowers
            return [self.fixed[id(node)]] * len(idxs)
        if id(node) in self.staged:
            local, axes, sizes = self.staged[id(node)]
            return [self.load(local, self.index(ravel([idx[a] for a in axes], sizes)), None)
                    for idx in idxs]
        if id(node) in self.params:
            strides = strides_for(node.shape)
            return [self.load(self.params[id(node)], self.index(recombine(
                sum((i * st for i, st in zip(idx, strides) if st), Lin()))), gate)
                for idx, gate in zip(idxs, gates)]
        op = node.op
        if op is GraphOp.CONST:
            found = self.scalars.get(id(node))
            return [self.const(node.arg, node.dtype) if found is None else found] * len(idxs)
        if op is GraphOp.ITER:
            return [self.index(idx[node.arg]) for idx in idxs]
        if op is GraphOp.VIEW:
            return self.view(node, idxs, gates)
        if op is GraphOp.GATHER:
            return self.gather(node, idxs, gates)
        if op is GraphOp.REDUCE:
            return self.reduce(node, idxs, gates)
        if op is GraphOp.LOAD or op is GraphOp.COPY:     # inputs: read above, as PARAMs
            raise RuntimeError(f"{op.name} node {node} is not an input of kernel {self.b.name!r}")
        srcs = [self.lower(s, idxs, gates) for s in node.src]
        if op in (Op.CAST, Op.BITCAST):
            return [b.cast(x, node.dtype, bitcast=op is Op.BITCAST) for x in srcs[0]]
        return [b.alu(op, *operands) for operands in zip(*srcs)]

    def view(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None]) -> list[int]:
        src, zero = node.src[0], self.const(0, node.dtype)
        out = [zero] * len(idxs)
        inner: list[tuple[int, list[Lin], int | None]] = []   # (element, source index, gate)
        for e, (idx, gate) in enumerate(zip(idxs, gates)):
            flat, conds = node.arg.index(idx)
            kept = bounds(conds)
            if kept is None:
                continue                           # padding everywhere: reads zero
            if any(c in self.refuted for c in kept):
                continue
            kept = tuple(c for c in kept if c not in self.assumed)
            inner_gate = self.condition(kept, gate)
            if id(node) in self.scalars:
                flat, split = self.moved(node, idx, flat)
            else:
                views = node.arg.views
                split = views[0].split(idx, src.shape) if len(views) == 1 else None
            if id(src) in self.params:
                out[e] = self.load(self.params[id(src)], self.index(flat), inner_gate)
            else:
                inner.append((e, unravel(flat, src.shape) if split is None else split,
                              inner_gate))
        if inner:
            values = self.lower(src, [i for _, i, _ in inner], [g for _, _, g in inner])
            for (e, _, inner_gate), value in zip(inner, values):
                if inner_gate is not None and inner_gate is not gates[e]:
                    value = self.b.alu(Op.WHERE, inner_gate, value, zero)
                out[e] = value
        return out

    def moved(self, node: Lazy, idx: list[Lin], flat: Lin) -> tuple[Lin, list[Lin] | None]:
        """The flat position and the multi-index (None: unravel the position) that a view
        whose offset is a VAR reads at `idx`, given `flat`, the position at its own offset.
        Kernels of views that differ only in their offsets are then one kernel
        (schedule/keys.py `structure`): a view of an input adds the VAR less its own offset to
        the position; a view of a value the kernel computes adds the VAR's part along the
        source axes it does not step along (view.View.free) to those axes."""
        view, shape = node.arg.views[0], node.src[0].shape
        free = None if id(node.src[0]) in self.params else view.free(shape)
        rows = strides_for(shape)
        at = self.offsets.get(id(node))
        if at is None:
            lo, hi = (0, max(prod(shape) - 1, 0)) if free is None else (free[1], free[1] + sum(
                (shape[j] - 1) * rows[j] for j in free[0]))
            at = self.offsets[id(node)] = self.new_var("v", lo, hi, self.scalars[id(node)])
        if free is None:
            return flat + at + -view.offset, None
        axes, rest = free
        split = view._replace(offset=rest).split(idx, shape)
        assert split is not None        # View.free places it
        for j in axes:      # the outermost one's position needs no modulo
            position = (at + -rest) // rows[j]
            split[j] = split[j] + (position if j == axes[0] else position % shape[j])
        return flat, split

    def gather(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None]) -> list[int]:
        """The source at the positions the index holds along the gathered axis: a LOAD whose
        address is data. The index, clamped into the axis, becomes an index variable."""
        b = self.b
        src, index, fault = node.src
        axis, wrap, code = node.arg
        size = src.shape[axis]
        at_index = [[const(0) if n == 1 else i for i, n in zip(idx, index.shape)] for idx in idxs]
        inner = []
        for idx, position in zip(idxs, self.lower(index, at_index, gates)):
            negative = b.alu(Op.CMPLT, position, self.const(0))
            if wrap:
                position = b.alu(Op.WHERE, negative, b.alu(Op.ADD, position, self.const(size)),
                                 position)
                negative = b.alu(Op.CMPLT, position, self.const(0))
            above = b.alu(Op.CMPLT, self.const(size - 1), position)
            outside = b.alu(Op.OR, negative, above)
            if code and self.fault is not None:
                # a max over the thread's indices, stored once after its loops: a store
                # inside them would keep a C compiler from vectorizing the row
                b.assign(self.fault, b.alu(Op.MAX, self.fault, b.alu(
                    Op.WHERE, outside, self.const(code), self.const(0))))
            elif code:
                # a plain store of the op's code: any thread may set it, none reads it here
                b.store(self.params[id(fault)], self.const(0), self.const(code), outside)
            clamped = b.alu(Op.WHERE, negative, self.const(0),
                            b.alu(Op.WHERE, above, self.const(size - 1), position))
            at = list(idx)
            at[axis] = self.new_var("g", 0, size - 1, clamped)
            inner.append(at)
        return self.lower(src, inner, gates)

    def reduce(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None]) -> list[int]:
        b = self.b
        op, axes = node.arg
        src = node.src[0]
        if self.plan.inline == id(node):
            return self.written_out(node, idxs, gates)
        unrolled, copies = (self.plan.unroll if self.plan.reduce == id(node) else None) or (
            None, 1)
        wide = dtypes.float32 if node.dtype.is_float and node.dtype.itemsize == 2 else None
        dtype = wide or node.dtype
        identity = self.const(reduce_identity(op, dtype), dtype)
        accs = [[b.acc(identity) for _ in range(copies)] for _ in idxs]
        # (first, end, step) of each reduced axis: the unrolled one steps by `copies`
        spans = [(0, src.shape[a] // copies, copies) if a == unrolled else (0, src.shape[a], 1)
                 for a in axes]
        trips = [end for _, end, _ in spans]
        block = _block(trips) if op is Op.ADD and dtype.is_float else None
        if block is None:
            self.accumulate(node, idxs, gates, spans, accs, wide)
        else:
            # blocked summation: each block of the first axis sums into fresh registers, then
            # into the running total, so no register adds more than about _BLOCK terms
            outer = b.add(Op.RANGE, dtypes.int32, (self.const(0),
                                                   self.const(ceil(trips[0] / block))))
            self.scopes.append({})
            sums = [[b.acc(identity) for _ in row] for row in accs]
            self.accumulate(node, idxs, gates, spans, sums, wide, (outer, block))
            for row, partial in zip(accs, sums):
                for acc, part in zip(row, partial):
                    b.assign(acc, b.alu(op, acc, part))
            b.add(Op.END, None, (outer,))
            self.scopes.pop()
        if unrolled is not None and src.shape[unrolled] % copies:
            tail = src.shape[unrolled] - src.shape[unrolled] % copies
            spans = [(tail, src.shape[a], 1) if a == unrolled else (0, src.shape[a], 1)
                     for a in axes]
            self.accumulate(node, idxs, gates, spans, [row[:1] for row in accs], wide)
        out = []
        for row in accs:            # pairwise, so the partial sums stay balanced
            while len(row) > 1:
                row = [b.alu(op, row[k], row[k + 1]) for k in range(0, len(row), 2)]
            out.append(b.cast(row[0], node.dtype) if wide else row[0])
        return out

    def written_out(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None]
                    ) -> list[int]:
        """A short reduce (plan's `inline`) as one expression per output: every term at its
        constant position in the window, combined pairwise (16-bit floats in float32)."""
        b = self.b
        op, axes = node.arg
        src = node.src[0]
        wide = dtypes.float32 if node.dtype.is_float and node.dtype.itemsize == 2 else None
        taps = list(product(*(range(src.shape[a]) for a in axes)))
        inner = []
        for idx in idxs:
            for tap in taps:
                at = list(idx)
                for axis, value in zip(axes, tap):
                    at[axis] = const(value)
                inner.append(at)
        inner_gates = [gate for gate in gates for _ in taps]
        values = (self.terms(src, inner, inner_gates, op is Op.ADD) if wide
                  else self.lower(src, inner, inner_gates))
        out = []
        for k in range(len(idxs)):
            row = values[k * len(taps):(k + 1) * len(taps)]
            while len(row) > 1:
                row = [b.alu(op, row[j], row[j + 1]) if j + 1 < len(row) else row[j]
                       for j in range(0, len(row), 2)]
            out.append(b.cast(row[0], node.dtype) if wide else row[0])
        return out

    def accumulate(self, node: Lazy, idxs: list[list[Lin]], gates: list[int | None],
                   spans: list[tuple[int, int, int]], accs: list[list[int]],
                   wide: DType | None, block: tuple[int, int] | None = None) -> None:
        """One loop per reduced axis over `spans` (first, end, step), adding the terms into
        `accs` (per index, one register per unrolled copy). With `block` (outer counter,
        iterations), the first axis runs only that block of its iterations."""
        b = self.b
        op, axes = node.arg
        counters, inner = [], {}
        for k, (axis, (first, end, step)) in enumerate(zip(axes, spans)):
            bounds = (self.const(first), self.const(end))
            if k == 0 and block is not None:
                outer, size = block
                start = b.alu(Op.MUL, outer, self.const(size))
                stop = b.alu(Op.ADD, start, self.const(size))
                if end % size:
                    stop = b.alu(Op.WHERE, b.alu(Op.CMPLT, stop, self.const(end)), stop,
                                 self.const(end))
                bounds = (start, stop)
            counters.append(b.add(Op.RANGE, dtypes.int32, bounds))
            self.scopes.append({})
            inner[axis] = self.new_var("r", first, max(end - 1, first), counters[-1]) * step
        inner_idxs, inner_gates = [], []
        for idx, gate in zip(idxs, gates):
            for copy in range(len(accs[0])):
                at = [inner.get(a, i) for a, i in enumerate(idx)]
                at = [i + copy if a in inner and spans[axes.index(a)][2] > 1 else i
                      for a, i in enumerate(at)]
                inner_idxs.append(at)
                inner_gates.append(gate)
        src = node.src[0]
        values = iter(self.terms(src, inner_idxs, inner_gates, op is Op.ADD) if wide
                      else self.lower(src, inner_idxs, inner_gates))
        for row in accs:
            for acc in row:
                b.assign(acc, b.alu(op, acc, next(values)))
        for counter in reversed(counters):
            b.add(Op.END, None, (counter,))
            self.scopes.pop()

    def terms(self, src: Lazy, idxs: list[list[Lin]], gates: list[int | None], products: bool
              ) -> list[int]:
        """The terms of a 16-bit float reduce in float32, as torch accumulates them: with
        `products`, a product's factors are widened before they multiply (a matmul)."""
        b, wide = self.b, dtypes.float32
        if products and src.op is Op.MUL:
            factors = [self.lower(s, idxs, gates) for s in src.src]
            return [b.alu(Op.MUL, b.cast(x, wide), b.cast(y, wide)) for x, y in zip(*factors)]
        return [b.cast(x, wide) for x in self.lower(src, idxs, gates)]


def _block(trips: list[int]) -> int | None:
    """Iterations of the first reduce axis per block of a blocked float sum; None: no blocks."""
    rest = prod(trips[1:])
    # about sqrt(trips) terms per block balances the error of the blocks and of the total
    block = max(1, min(_BLOCK, max(8, isqrt(prod(trips)))) // max(rest, 1))
    return block if prod(trips) > _BLOCK and trips[0] >= 2 * block else None


def check_dtypes(nodes: list[Lazy], caps: Capabilities, device: str) -> None:
    """Raises UnsupportedDType naming the first dtype the device lacks."""
    for node in nodes:
        if node.dtype not in caps.dtypes:
            raise UnsupportedDType(
                f"device {device!r} does not support {node.dtype.name}; cast with "
                f".cast(portkit.float32) or pick a device that has it")


def lower(root: Lazy, inputs: list[Lazy], caps: Capabilities, name: str = "kernel",
          scalars: Sequence[Lazy] = (), slots: dict[int, int] | None = None, local=None) -> Kernel:
    """The ABI kernel storing `root` contiguously into PARAM 0, reading `inputs` as PARAM 1...,
    and the graph constants `scalars` as VARs s0, s1... (see SCALAR_VAR_DTYPES); `slots` maps
    id() of every constant read through a VAR to its index (default: `scalars` in order).
    A matmul on a device with workgroup memory is LOCAL-tiled (codegen/tiles.py) as `local`
    says (a tiles.Tiling), else as the tuner stored, else by default; on one whose threads are
    loops it copies B into panels (codegen/pack.py); on a matrix unit it declares, MMA nodes
    (codegen/mma.py). A short reduce of long rows takes a group per row (codegen/groups.py)."""
    if len(inputs) + 1 > caps.max_buffers:
        raise CapabilityError(f"kernel {name!r} needs {len(inputs) + 1} buffers but the device "
                              f"allows {caps.max_buffers}; the scheduler splits kernels to fit")
    from portkit.codegen import groups as grouping
    from portkit.codegen import mma as matrix  # these build on this module
    from portkit.codegen import pack as packing
    from portkit.codegen import tiles as staging
    from portkit.codegen import tune
    on_unit = matrix.find(root, inputs, caps)
    contraction = None if on_unit else tune.contraction(root, inputs, caps)
    chosen = None if contraction is None else staging.choose(
        contraction, caps, local or tune.stored(caps, contraction))
    packed = None if chosen or on_unit else packing.find(root, inputs, caps)
    grouped = None if chosen or packed or on_unit else grouping.find(root, inputs, caps)
    limits, given = THREADED, root
    if serial(caps):
        limits = replace(SERIAL, registers=register_block(caps).accumulators
                         if caps.vector_registers else 0)
        if not (chosen or packed or on_unit):
            root = split(rows.merged(root, inputs), inputs)
    tiling = Plan() if chosen or packed or on_unit or grouped else plan(root, inputs, limits)
    lowerer = Lowerer(name, inputs, tiling)
    lowerer.ranges = dtypes.uint32 in caps.dtypes
    lowerer.epilogue_loop = serial(caps) and caps.local_memory_bytes > 0
    b = lowerer.b
    out = b.param(root.dtype)
    for node in inputs:
        lowerer.params[id(node)] = b.param(node.dtype)
    values = []
    for k, node in enumerate(scalars):
        if node.op is GraphOp.VIEW:         # an offset (schedule/keys.py, `structure`)
            values.append(b.var(f"{OFFSET_VAR}{k}", dtypes.int32))
            continue
        value = b.var(f"s{k}", SCALAR_VAR_DTYPES[node.dtype])
        values.append(value if b.dtype(value) == node.dtype else b.cast(value, node.dtype))
    if slots is None:
        slots = {id(node): k for k, node in enumerate(scalars)}
    lowerer.scalars = {node: values[k] for node, k in slots.items()}
    if root is not given and id(given) in slots:
        # a view reshaped for its rows reads the buffer at the offset of the view it reshaped
        lowerer.scalars[id(root)] = values[slots[id(given)]]
    if on_unit:
        return matrix.emit(lowerer, root, *on_unit, out)
    if contraction is not None and chosen is not None:
        return staging.emit(lowerer, root, contraction, chosen, out)
    if packed:
        return packing.emit(lowerer, root, *packed, caps, out)
    if grouped:
        return grouping.emit(lowerer, root, grouped, caps, out)
    flags = [n.src[2] for n in toposort([root], stop=lambda n: id(n) in lowerer.params)
             if n.op is GraphOp.GATHER and n.arg.code]
    if flags:
        lowerer.fault = b.acc(lowerer.const(0))
    vector = stages.find(root, inputs, tiling, caps)
    if vector is not None:
        stages.emit(lowerer, *vector)
    amounts = [tiling.amount(a) for a in range(len(root.shape))]
    tile_shape = tuple(ceil(s / n) for s, n in zip(root.shape, amounts))
    row, tail = row_length(tile_shape, serial(caps) and (
        tiling.work == 1 or tiling.inline is not None), rows.is_padded(root, inputs))
    if tail:        # each step of the row computes the short trailing axes whole
        amounts[-tail:] = [n * t for n, t in zip(amounts[-tail:], tile_shape[-tail:])]
        tile_shape = tile_shape[:-tail] + (1,) * tail
    items = prod(tile_shape) // row     # what a thread's loop counts: tiles, or rows of tiles
    groups, block, per_thread = launch_shape(items, caps, row * prod(amounts) * tiling.work)
    thread = b.special("group", 0)
    if block == 1:
        # A no-op for the grid it runs on, but it tells a C compiler the range of every index,
        # so that it can prove neighbouring loads adjacent and vectorize them.
        thread = b.alu(Op.MOD, thread, lowerer.const(groups))
    else:
        thread = b.alu(Op.ADD, b.alu(Op.MUL, thread, lowerer.const(block)),
                       b.special("local", 0))
    opener = None
    if per_thread == 1:
        t_node = thread
        if groups * block != items:
            opener = b.add(Op.IF, None, (b.alu(Op.CMPLT, thread, lowerer.const(items)),))
            lowerer.scopes.append({})
    else:
        start = b.alu(Op.MUL, thread, lowerer.const(per_thread))
        end = b.alu(Op.ADD, start, lowerer.const(per_thread))
        end = b.alu(Op.WHERE, b.alu(Op.CMPLT, end, lowerer.const(items)), end,
                    lowerer.const(items))
        t_node = b.add(Op.RANGE, dtypes.int32, (start, end))
        lowerer.scopes.append({})
    t_var = lowerer.new_var("t", 0, items - 1, t_node)
    if row > 1:
        # per-row decoding: the row's position is decoded once, the inner loop runs along the
        # last axis with plain strided indices (no div or mod per element)
        tile = unravel(t_var, tile_shape[:len(tile_shape) - 1 - tail])
        for atom, _ in (term for i in tile for term in i.terms):
            lowerer.atom(atom)
        rows.emit(lowerer, root, inputs, tile, t_var, (row, tail), amounts, out, tiling.shifted)
    else:
        rows.store(lowerer, root, unravel(t_var, tile_shape), amounts, out, tiling.shifted)
    if opener is not None:
        b.add(Op.ENDIF, None, (opener,))
    elif per_thread > 1:
        b.add(Op.END, None, (t_node,))
    fault = lowerer.fault
    if flags and fault is not None:
        b.store(lowerer.params[id(flags[0])], lowerer.const(0), fault,
                b.alu(Op.CMPLT, lowerer.const(0), fault))
    return b.build(grid=(groups, 1, 1), block=(block, 1, 1))
