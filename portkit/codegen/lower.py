"""Lowering: one scheduled kernel (a root Lazy node and its fused sources) -> one ABI kernel.

Every output element gets a flat index i; `lower_node(node, idx)` emits the ABI nodes computing
`node` at multi-index `idx` (symbolic expressions, portkit/symbolic.py):
- a realized input loads from its buffer at the flat index of idx,
- a VIEW maps idx through its ShapeTracker (strides, offset, mask) to the source's index,
  gating loads where the mask says the element is padding,
- an ALU op lowers its sources at the same idx,
- a REDUCE opens one loop per reduced axis around an accumulator.
Threads take contiguous chunks of i: one element per thread on devices with many threads, long
chunks (loops a C compiler vectorizes) on devices that run one thread per workgroup.
"""
from __future__ import annotations

from math import ceil, prod

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.dtypes import DType
from portkit.abi.errors import CapabilityError, UnsupportedDType
from portkit.abi.kernel import Kernel, KernelBuilder
from portkit.abi.ops import Op
from portkit.graph import G, Lazy
from portkit.symbolic import Bound, Div, Lin, Var, bounds, recombine, unravel, var
from portkit.view import strides_for

# A serial device (one thread per workgroup) gets chunks of at least this many elements.
_MIN_CHUNK = 16384
_MAX_GROUPS = 64


def reduce_identity(op: Op, dtype: DType) -> float | int | bool:
    """The value a reduction starts from: 0 for sums, 1 for products, the minimum for max."""
    if op in (Op.ADD, Op.MUL):
        return int(op is Op.MUL)
    return float("-inf") if dtype.is_float else dtype.min


def launch_shape(size: int, caps: Capabilities, serial: bool) -> tuple[int, int, int]:
    """(groups, threads per group, elements per thread) covering `size` elements."""
    if serial or caps.max_block_threads == 1:
        groups = max(1, min(_MAX_GROUPS, size // _MIN_CHUNK, caps.max_grid[0]))
        return groups, 1, ceil(size / groups)
    block = max(1, min(256, caps.max_block_threads, caps.max_block[0], size))
    groups = max(1, min(ceil(size / block), caps.max_grid[0]))
    return groups, block, ceil(size / (groups * block))


class _Lowerer:
    def __init__(self, name: str, inputs: list[Lazy]):
        self.b = KernelBuilder(name)
        self.params: dict[int, int] = {}       # id(input Lazy) -> PARAM node
        self.inputs = inputs
        self.scopes: list[dict] = [{}]          # memo per open loop/branch; closed ones drop
        self.vars: dict[str, int] = {}          # symbolic Var name -> node
        self.counter = 0

    # -- memo with scopes: a value computed inside a loop is not visible after it ---------------

    def cached(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key, value: int) -> int:
        self.scopes[-1][key] = value
        return value

    def const(self, value, dtype: DType = dtypes.int32) -> int:
        key = ("const", dtype, value)
        found = self.cached(key)
        return found if found is not None else self.remember(key, self.b.const(value, dtype))

    # -- index expressions ---------------------------------------------------------------------

    def index(self, expr: Lin) -> int:
        key = ("lin", expr)
        found = self.cached(key)
        if found is not None:
            return found
        b, out = self.b, None
        for atom, coef in expr.terms:
            node = self.atom(atom)
            if coef != 1:
                node = b.alu(Op.MUL, node, self.const(coef))
            out = node if out is None else b.alu(Op.ADD, out, node)
        if out is None:
            out = self.const(expr.const)
        elif expr.const:
            out = b.alu(Op.ADD, out, self.const(expr.const))
        return self.remember(key, out)

    def atom(self, atom) -> int:
        if isinstance(atom, Var):
            return self.vars[atom.name]
        # IDIV and MOD truncate toward zero; shift negative operands up to get floor semantics
        shift = ceil(-atom.expr.min / atom.divisor) if atom.expr.min < 0 else 0
        inner = self.index(atom.expr + shift * atom.divisor)
        op = Op.IDIV if isinstance(atom, Div) else Op.MOD
        node = self.b.alu(op, inner, self.const(atom.divisor))
        if shift and isinstance(atom, Div):
            node = self.b.alu(Op.ADD, node, self.const(-shift))
        return node

    def condition(self, conds: tuple[Bound, ...], gate: int | None) -> int | None:
        b = self.b
        for c in conds:
            parts = []
            if c.expr.min < c.lo:
                parts.append(b.alu(Op.CMPLT, self.const(c.lo - 1), self.index(c.expr)))
            if c.expr.max >= c.hi:
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

    def param(self, node: Lazy) -> int:
        return self.params[id(node)]

    def lower(self, node: Lazy, idx: list[Lin], gate: int | None) -> int:
        key = (id(node), tuple(idx), gate)
        found = self.cached(key)
        if found is not None:
            return found
        return self.remember(key, self._lower(node, idx, gate))

    def _lower(self, node: Lazy, idx: list[Lin], gate: int | None) -> int:
        b = self.b
        if id(node) in self.params:
            flat = recombine(sum((i * st for i, st in zip(idx, strides_for(node.shape)) if st),
                                 Lin()))
            return b.load(self.param(node), self.index(flat), gate)
        op = node.op
        if op is G.CONST:
            return self.const(node.arg, node.dtype)
        if op is G.ITER:
            return self.index(idx[node.arg])
        if op is G.VIEW:
            flat, conds = node.arg.index(idx)
            kept = bounds(conds)
            if kept is None:
                return self.const(_zero(node.dtype), node.dtype)
            inner_gate = self.condition(kept, gate)
            src = node.src[0]
            if id(src) in self.params:
                return b.load(self.param(src), self.index(flat), inner_gate)
            value = self.lower(src, unravel(flat, src.shape), inner_gate)
            if inner_gate is not gate:
                value = b.alu(Op.WHERE, inner_gate, value, self.const(_zero(node.dtype),
                                                                      node.dtype))
            return value
        if op is G.REDUCE:
            return self.reduce(node, idx, gate)
        srcs = [self.lower(s, idx, gate) for s in node.src]
        if op in (Op.CAST, Op.BITCAST):
            return b.cast(srcs[0], node.dtype, bitcast=op is Op.BITCAST)
        return b.alu(op, *srcs)

    def reduce(self, node: Lazy, idx: list[Lin], gate: int | None) -> int:
        b = self.b
        op, axes = node.arg
        src = node.src[0]
        acc = b.acc(self.const(reduce_identity(op, node.dtype), node.dtype))
        inner = list(idx)
        opened = []
        for axis in axes:
            size = src.shape[axis]
            counter = b.add(Op.RANGE, dtypes.int32, (self.const(0), self.const(size)))
            self.scopes.append({})
            opened.append(counter)
            inner[axis] = self.new_var("r", 0, max(size - 1, 0), counter)
        value = self.lower(src, inner, gate)
        b.assign(acc, b.alu(op, acc, value))
        for counter in reversed(opened):
            b.add(Op.END, None, (counter,))
            self.scopes.pop()
        return acc


def _zero(dtype: DType):
    return False if dtype == dtypes.bool_ else (0.0 if dtype.is_float else 0)


def check_dtypes(nodes: list[Lazy], caps: Capabilities, device: str) -> None:
    """Raises UnsupportedDType naming the first dtype the device lacks."""
    for node in nodes:
        if node.dtype not in caps.dtypes:
            raise UnsupportedDType(
                f"device {device!r} does not support {node.dtype.name}; cast with "
                f".cast(portkit.float32) or pick a device that has it")


def lower(root: Lazy, inputs: list[Lazy], caps: Capabilities, serial: bool,
          name: str = "kernel") -> Kernel:
    """The ABI kernel storing `root` contiguously into PARAM 0, reading `inputs` as PARAM 1...."""
    if len(inputs) + 1 > caps.max_buffers:
        raise CapabilityError(f"kernel {name!r} needs {len(inputs) + 1} buffers but the device "
                              f"allows {caps.max_buffers}; the scheduler splits kernels to fit")
    lowerer = _Lowerer(name, inputs)
    b = lowerer.b
    out = b.param(root.dtype)
    for node in inputs:
        lowerer.params[id(node)] = b.param(node.dtype)
    size = prod(root.shape)
    groups, block, per_thread = launch_shape(size, caps, serial)
    thread = b.special("group", 0)
    if block > 1:
        thread = b.alu(Op.ADD, b.alu(Op.MUL, thread, lowerer.const(block)),
                       b.special("local", 0))
    opener = None
    if per_thread == 1:
        i_node = thread
        if groups * block != size:
            opener = b.add(Op.IF, None, (b.alu(Op.CMPLT, thread, lowerer.const(size)),))
            lowerer.scopes.append({})
    else:
        start = b.alu(Op.MUL, thread, lowerer.const(per_thread))
        end = b.alu(Op.ADD, start, lowerer.const(per_thread))
        end = b.alu(Op.WHERE, b.alu(Op.CMPLT, end, lowerer.const(size)), end,
                    lowerer.const(size))
        i_node = b.add(Op.RANGE, dtypes.int32, (start, end))
        lowerer.scopes.append({})
    i = lowerer.new_var("i", 0, size - 1, i_node)
    value = lowerer.lower(root, unravel(i, root.shape), None)
    b.store(out, i_node, value)
    if opener is not None:
        b.add(Op.ENDIF, None, (opener,))
    elif per_thread > 1:
        b.add(Op.END, None, (i_node,))
    return b.build(grid=(groups, 1, 1), block=(block, 1, 1))
