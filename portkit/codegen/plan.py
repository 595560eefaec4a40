"""Tiling plans: how a kernel's outputs are shared among groups and threads (`launch_shape`)
and, for a kernel with one reduce, which block of outputs each thread computes and how many
partial sums its reduce keeps (`plan`), chosen from the strides of its loads. portkit/codegen/
lower.py emits the kernel a plan describes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, isqrt, prod

from portkit.abi.backend import Capabilities
from portkit.abi.dtypes import DType
from portkit.abi.ops import Op
from portkit.graph import GraphOp, Lazy, walk
from portkit.symbolic import Bound, Div, Lin, Mod, Var, bounds, const, ravel, unravel, var

# A serial device (one thread per workgroup) gets at least this much work per group: loads
# times reduce length. More groups than cores lets OpenMP-style runtimes balance them.
_MIN_WORK = 16384
_MAX_GROUPS = 1 << 16
# Tiling limits for a device that runs one thread per group (a CPU): outputs per thread along
# the contiguous axis (two 512-bit vectors of float32), along an axis where an input is
# broadcast (its loads are reused), partial sums of a contiguous reduce, and the most
# accumulators one thread keeps (16 AVX-512 registers of float32). Measured on a 2-core
# AVX-512 machine, one thread, the kernel alone: 8 x 32 matmul tiles run matmul 1024 at 1.5x
# and 2048 at 1.2x the speed of 4 x 32 (512: 0.93x); 4 x 16 runs at half speed. `gather`:
# outputs along a strided axis when no output axis is contiguous (x @ W.T, both operands
# contiguous along the reduce): 16 x 16 such tiles vectorize with gathers at 6x the speed of
# 16 partial sums per output, which clang leaves scalar (0 = never). SERIAL assumes AVX-512;
# `register_block` sizes the packed matmul's block to the device's own registers (3 x 32
# with AVX2's sixteen 256-bit ones). A device with many threads per group gets small tiles:
# its registers are shared by the group's threads (PoCL runs out of resources with 128
# accumulators per thread in 256-thread groups).
@dataclass(frozen=True)
class Limits:
    """Largest tile sizes one thread may take."""

    vector: int
    reuse: int
    unroll: int
    accumulators: int
    gather: int = 0
    compiler_lanes: bool = False    # a C compiler makes the lanes vectors (and a gate stops it)
    # floats the device's vector registers hold as accumulators (`register_block`'s block);
    # 0: `accumulators`. Bounds a contiguous reduce's partial sums times its reused outputs
    registers: int = 0


SERIAL = Limits(vector=32, reuse=8, unroll=16, accumulators=256, gather=16, compiler_lanes=True)
THREADED = Limits(vector=4, reuse=4, unroll=4, accumulators=16)
# A lowering on a device whose threads are loops (a CPU) keeps the blocks it stages in LOCAL
# (packed panels, a staged operand, running sums; codegen/pack.py and stages.py) within this
# many bytes, about an L1 data cache, whatever more the device allows (`hot_bytes`); only the
# running sums of the several panels a staged A's group spans take more (an L2's worth).
HOT_BYTES = 64 * 1024
# A packed matmul's register block (codegen/pack.py) takes all of a device's vector registers
# but these: B's vectors and A's broadcast value use the rest (an x86 FMA also reads one
# operand from memory) ...
_OPERAND_REGISTERS = 4
# ... and at most this many, SERIAL's 8 x 32 float32 in 512-bit registers (of AVX-512's 32).
# Measured on a 2-core AVX2 EPYC (16 ymm registers of 8 float32), one thread, the kernel
# alone, against 8 x 32 (32 registers' worth, which spills): 3 x 32 (12 registers) ran matmul
# 512 and 1024 at 1.5-1.6x and ResNet's 3x3 64->64 conv on 56 x 56 at 1.2x; 2 x 32 and 4 x 16
# (8 registers) matmul at 1.5-1.85x but the conv at 0.75-0.8x (its A operand's position costs
# a division per k, paid per block); 4 x 32 and 8 x 16 (16 registers) 1.0-1.3x.
_ACCUMULATOR_REGISTERS = 16


def register_block(caps: Capabilities) -> Limits:
    """SERIAL with its register block (`reuse` rows of `vector` float32, and `accumulators`)
    sized to the device's vector registers (`Capabilities.vector_registers`); SERIAL where the
    device does not state them."""
    if caps.vector_registers is None:
        return SERIAL
    count, size = caps.vector_registers
    floats = max(1, min(count - _OPERAND_REGISTERS, _ACCUMULATOR_REGISTERS)) * size // 4
    vector = SERIAL.vector
    while vector > 1 and floats < 2 * vector:    # at least two rows: each B vector is reused
        vector //= 2
    reuse = max(1, min(SERIAL.reuse, floats // vector))
    return replace(SERIAL, vector=vector, reuse=reuse, accumulators=reuse * vector)

_MIN_REDUCE = 8
# A contiguous reduce axis shorter than two unrolls keeps partial sums where its length is a
# multiple of this (as many as divide it, up to `unroll`): with one sum, every add waited on the
# one before, and a BatchNorm statistic over 32 x 128 x 16 x 16 (rows of 16) took 0.75 ms,
# 8 x 8 maps 0.44 ms for half as many terms; with 16 and 8 sums 0.068 and 0.083 ms (one thread).
_SHORT_SUM = 8
# A reduce of at most this many terms per output, read along the output row at constant steps
# (a depthwise conv's k x k window, a pool's), is written out term by term inside a loop along
# the row, as an elementwise kernel is: the row becomes vector lanes and the window's weights
# stay in registers. As a reduce loop of its own it ran ConvNeXt's 7x7 depthwise conv at 0.3
# GFLOP/s, scalar (8 x 8 tiles of separate multiplies and adds that clang left unvectorized).
_INLINE = 64
# A written-out row shorter than this is one straight run of code per row instead of a loop:
# clang declines to vectorize a loop of 14 trips (a 14x14 map) whose store may alias its loads
# (a runtime check per row costs more than it gains), and left the row scalar; written out,
# every load comes before the first store and the lanes are one block of code. Not a row of
# windows read at a stride and no weights held across it (a max pool's, a bias beside it): the
# written-out lanes of a stride-2 window stayed scalar, and as a loop clang vectorizes them
# with interleaved loads (a 2x2 max pool of 32x128x16x16, one thread: 1.1 -> 0.21 ms; of
# 32x64x24x24 1.3 -> 0.26; a stride-2 depthwise conv, 28x28 -> 14x14, stays written out: 0.96
# as such, 1.35 as a loop).
_SHORT_ROW = 16
# Fewer lanes than this along a row's vector axis (as many as divide the row's length) give
# way to full-width tiles, the last one shifted back to end at the row's end (`Plan.shifted`).
_FEW_LANES = 8
# Terms written out at most where a short row holds no weights (work x row): a column sum of
# 64 rows x 10 columns (an MLP's last bias gradient) was 640 terms in straight-line C, 52 kB
# that took clang 0.25 s of a first training step's 1.1; as a reduce loop it is 41 ABI nodes,
# as fast. A window with weights (a depthwise conv's 7 x 7 over a row of 14) stays written out.
_WRITTEN = 128
# A row of windows with weights up to this long, and of at most _WEIGHTED terms in all, is
# written out too: its lanes are then vectors of the device's width (codegen/straight.py).
# As a loop, clang vectorized 16 of a 28-wide row's outputs and computed the other 12 one by
# one, after a run-time overlap check of each of its 25 loads: EfficientNet's 5 x 5 conv of
# 240 x 28 x 28, one thread, 0.40 ms as a loop, 0.19 written out; 144 x 56 x 56 at 3 x 3
# 0.20 -> 0.15. Each kernel compiles in ~0.2 s more.
_WEIGHTED_ROW = 64
_WEIGHTED = 1536


def reduce_identity(op: Op, dtype: DType) -> float | int | bool:
    """The value a reduction starts from: 0 for sums, 1 for products, the minimum for max."""
    if op in (Op.ADD, Op.MUL):
        return int(op is Op.MUL)
    return float("-inf") if dtype.is_float else dtype.min


def serial(caps: Capabilities) -> bool:
    """True for a device that runs one thread per workgroup best: its threads are loops."""
    return caps.threads_are_loops or caps.max_block_threads == 1


def launch_shape(size: int, caps: Capabilities, work: int = 1) -> tuple[int, int, int]:
    """(groups, threads per group, items per thread) covering `size` items of `work` each."""
    if serial(caps):
        groups = max(1, min(size, size * work // _MIN_WORK, _MAX_GROUPS, caps.max_grid[0]))
        per_thread = ceil(size / groups)
        return ceil(size / per_thread), 1, per_thread
    block = max(1, min(256, caps.max_block_threads, caps.max_block[0], size))
    groups = max(1, min(ceil(size / block), caps.max_grid[0]))
    return groups, block, ceil(size / (groups * block))


@dataclass(frozen=True)
class Plan:
    """How a kernel is tiled: outputs per thread along root axes, partial sums of its reduce."""

    upcast: tuple[tuple[int, int], ...] = ()     # (root axis, outputs per thread along it)
    unroll: tuple[int, int] | None = None        # (reduce source axis, partial accumulators)
    reduce: int | None = None                    # id() of the reduce the unroll applies to
    work: int = 1                                # reduce length per output
    inline: int | None = None                    # id() of a reduce written out term by term
    shifted: int | None = None                   # root axis whose last tile ends at its end

    def amount(self, axis: int) -> int:
        """Outputs per thread along root axis `axis` (1 where the plan does not upcast it)."""
        return dict(self.upcast).get(axis, 1)


def hot_bytes(caps: Capabilities) -> int:
    """The LOCAL bytes a block a lowering stages may take: HOT_BYTES, or less where the device
    has less."""
    return min(caps.local_memory_bytes, HOT_BYTES)


def plan(root: Lazy, inputs: list[Lazy], limits: Limits = SERIAL) -> Plan:
    """The tiling of a kernel with exactly one reduce, chosen from the strides of its loads."""
    params = {id(x) for x in inputs}
    loads: list[Lin] = []
    reduces: list[Lazy] = []
    gated: set[str] = set()
    _accesses(root, [var(f"o{a}", 0, s - 1) for a, s in enumerate(root.shape)], params, loads,
              reduces, set(), gated)
    if len(reduces) != 1:
        return Plan()
    node = reduces[0]
    axes, src = node.arg[1], node.src[0]
    work = prod(src.shape[a] for a in axes)
    if limits.compiler_lanes and 0 < work <= _INLINE and _window(root, loads, gated):
        row = [a for a, s in enumerate(root.shape) if s > 1][-1]
        steps = [_step(flat, f"o{row}") for flat in loads]
        weights = any(step == 0 and _reach(flat) for flat, step in zip(loads, steps))
        short = root.shape[row] < _SHORT_ROW and (weights or
                                                 all(abs(step or 0) <= 1 for step in steps))
        short = short or weights and root.shape[row] < _WEIGHTED_ROW and \
            root.shape[row] * work <= _WEIGHTED
        if weights or not short or work * root.shape[row] <= _WRITTEN:
            return Plan(upcast=((row, root.shape[row]),) if short else (), work=work,
                        inline=id(node))
    if work < _MIN_REDUCE:
        return Plan(work=work)

    # a C compiler leaves lanes scalar (with branches) where a padding gate differs between
    # them, so a vectorizing device upcasts no output axis that a gate depends on (partial
    # sums along a gated reduce axis, a split reduce's padding, still keep a sum accurate)
    def vectorizes(name: str) -> bool:     # every load steps by 0 or 1 along it, one by 1
        return _contiguous([_step(flat, name) for flat in loads]) and not lanes_gated(name)

    def reused(name: str) -> bool:
        # every step is known, and some load that moves along the reduce ignores the axis (a
        # load once per output, a BatchNorm variance's per-channel mean, is reused by nothing:
        # upcast for it, the variance's two split halves doubled the partial sums and ran at a
        # tenth of a plain sum's speed)
        steps = [_step(flat, name) for flat in loads]
        return None not in steps and not lanes_gated(name) and any(
            step == 0 and any(_step(flat, f"r{a}") != 0 for a in axes)
            for flat, step in zip(loads, steps))

    def lanes_gated(name: str) -> bool:
        return limits.compiler_lanes and name in gated and name.startswith("o")

    outputs = [a for a, s in enumerate(root.shape) if s > 1]
    upcast: dict[int, int] = {}
    unroll = None
    vector = [a for a in outputs if vectorizes(f"o{a}")]
    # a contraction whose every output axis is ignored by some load (x @ W.T): no contiguous
    # output axis, but a strided one still makes independent lanes
    shared = [a for a in outputs if reused(f"o{a}")]
    wide = [a for a in shared if divisor(root.shape[a], limits.gather) == limits.gather > 0]
    shifted = None
    if vector:
        size = root.shape[vector[-1]]
        upcast[vector[-1]] = divisor(size, limits.vector)
        if limits.compiler_lanes and upcast[vector[-1]] < _FEW_LANES <= limits.vector <= size:
            # a row with few lanes dividing it (GPT-2's 50257 logits: one) takes full tiles,
            # the last one moved back to end at the row's end (it recomputes a few outputs
            # and stores only the others), where tiles of one lane left the row scalar
            upcast[vector[-1]], shifted = limits.vector, vector[-1]
    elif len(shared) >= 2 and wide:
        upcast[wide[-1]] = limits.gather
        other = [a for a in shared if a != wide[-1]][-1]
        upcast[other] = divisor(root.shape[other], limits.accumulators // limits.gather)
    else:
        contiguous = [a for a in axes if vectorizes(f"r{a}") and (
            src.shape[a] >= 2 * limits.unroll or src.shape[a] % _SHORT_SUM == 0)]
        if contiguous:
            # any length: `reduce` sums the last size % unroll terms in a tail loop
            size = src.shape[contiguous[-1]]
            unroll = (contiguous[-1], limits.unroll if size >= 2 * limits.unroll else
                      divisor(size, limits.unroll))
    # reuse first the axes that the vector loads ignore, where one vector load then feeds
    # several accumulators: a convolution's output channels (which may take every accumulator
    # left, like a matmul's rows), not its rows, along which only the broadcast weight repeats
    moving = [flat for flat in loads if vector and _step(flat, f"o{vector[-1]}") == 1]
    score = {a: sum(_step(flat, f"o{a}") == 0 for flat in moving) for a in outputs}
    ignored = {a: {k for k, flat in enumerate(moving) if _step(flat, f"o{a}") == 0}
               for a in outputs}
    order = sorted(outputs, key=lambda a: (-score[a], -a))   # ties: innermost first
    # `accumulators` counts full vector registers (limits.vector is two of them): lanes along
    # a shorter row (8 of a convolution's 56 columns) fill half a register each, so the same
    # registers hold fewer accumulators (256 of them in 8-lane vectors spilled a third)
    room = limits.accumulators
    if vector and 1 < upcast[vector[-1]] < limits.vector // 2:
        room = limits.accumulators * upcast[vector[-1]] // (limits.vector // 2)
    for k, axis in enumerate(order):
        used = prod(upcast.values()) * (unroll[1] if unroll else 1)
        most = room // used if score[axis] else limits.reuse
        if unroll and limits.registers:
            # x @ W.T's rows of W, each with its partial sums in registers beside x's vectors:
            # 8 rows of 16 float32 filled AVX2's 16 registers, and 4 rows ran (1, 768) x
            # (2304, 768) at 1.25x their speed (one thread, the kernel alone)
            most = min(most, max(1, limits.registers // used))
        if score[axis] and any(score[b] and ignored[b] != ignored[axis] and reused(f"o{b}")
                               and root.shape[b] % 2 == 0 for b in order[k + 1:]):
            # two vector loads, each reused along its own axis (a convolution's weight
            # gradient): an a x b block loads a + b vectors for a * b sums, not 1 + a * b
            most = 1 << (isqrt(most).bit_length() - 1)
        if axis not in upcast and reused(f"o{axis}") and used * 2 <= room:
            upcast[axis] = divisor(root.shape[axis], min(most, room // used))
    upcast = {a: n for a, n in upcast.items() if n > 1}
    if unroll is not None and unroll[1] == 1:
        unroll = None
    return Plan(tuple(sorted(upcast.items())), unroll, id(node), work,
                shifted=shifted if shifted in upcast else None)


def split(root: Lazy, inputs: list[Lazy]) -> Lazy:
    """`root` with one output axis split in two, (n,) -> (n / q, q), where its loads divide
    that axis by q and the outer part then steps every load by 0 or 1 (one by 1), so that
    `plan` runs vector lanes along it; else `root` itself. The outputs are stored in the same
    order either way. A detection head's max over 80 classes of a channel-major map, permuted
    to (pixels x 3 anchors, 80), reads its terms 4096 floats apart: unsplit, no output axis
    stepped by a constant, and each output reduced alone over strided scalar loads."""
    loads: list[Lin] = []
    reduces: list[Lazy] = []
    shape = root.shape
    _accesses(root, [var(f"o{a}", 0, s - 1) for a, s in enumerate(shape)],
              {id(x) for x in inputs}, loads, reduces, set(), set())
    if len(reduces) != 1 or any(_contiguous([_step(flat, f"o{a}") for flat in loads])
                                for a in range(len(shape))):
        return root
    for a in reversed(range(len(shape))):
        name = f"o{a}"
        for q in sorted({atom.divisor for flat in loads for atom in _divisions(flat)
                         if _names(atom.expr) == {name}}):
            if not 1 < q < shape[a] or shape[a] % q:
                continue
            parted = root.view("reshape", (*shape[:a], shape[a] // q, q, *shape[a + 1:]))
            if _contiguous(load_steps(parted, inputs, name)):
                return parted
    return root


def _contiguous(steps: list[int | None]) -> bool:
    """Whether loads moving by `steps` along an axis make vector lanes: 0 or 1, one by 1."""
    return set(steps) <= {0, 1} and 1 in steps


def _divisions(flat: Lin) -> list[Div | Mod]:
    """Every division and modulo in `flat`, nested ones included."""
    out: list[Div | Mod] = []
    for atom, _ in flat.terms:
        if not isinstance(atom, Var):
            out += [atom, *_divisions(atom.expr)]
    return out


def _window(root: Lazy, loads: list[Lin], gated: set[str]) -> bool:
    """Whether a short reduce is better written out along the output row: every load steps by
    a constant along the row, one that reads terms moves, the row is not gated, each load
    that moves reads a window that reaches past the next output's first term (a conv's or a
    pool's, not a plain sum's, whose rows of terms follow one another), and no other output
    axis is ignored by a load that moves along the row (where one is, as in a conv's weight
    gradient or a conv with many channels, `plan`'s register blocks reuse that load's
    vectors). A load of one value per output (the window's maximum that a max pool's gradient
    compares its window with) moves along the row as an elementwise kernel's loads do."""
    outputs = [a for a, s in enumerate(root.shape) if s > 1]
    if not outputs or f"o{outputs[-1]}" in gated:
        return False
    row = f"o{outputs[-1]}"
    steps = [_step(flat, row) for flat in loads]
    if None in steps or not any(steps):
        return False
    windowed = [(flat, step) for flat, step in zip(loads, steps) if step and _reach(flat)]
    if not windowed or any(abs(step) > _reach(flat) for flat, step in windowed):
        return False
    moving = [flat for flat, _ in windowed]
    return not any(_step(flat, f"o{a}") == 0 for flat in moving for a in outputs[:-1])


def _reach(flat: Lin) -> int:
    """How far apart the reduce's terms of one output lie in a load (variables r<axis>)."""
    return sum(abs(coef) * (atom.max - atom.min) for atom, coef in flat.terms
               if isinstance(atom, Var) and atom.name.startswith("r"))


def load_steps(node: Lazy, inputs: list[Lazy], name: str) -> list[int | None]:
    """How far each load of `node` (indexed by variables o<axis>, r<axis>) moves when `name`
    grows by 1; None where that is not a constant."""
    loads: list[Lin] = []
    _accesses(node, [var(f"o{a}", 0, s - 1) for a, s in enumerate(node.shape)],
              {id(x) for x in inputs}, loads, [], set(), set())
    return [_step(flat, name) for flat in loads]


def gates(node: Lazy, inputs: list[Lazy], idx: list[Lin]) -> list[Bound]:
    """The padding conditions that gate the loads of `node` at multi-index `idx`, those that
    range analysis cannot decide."""
    conds: list[Bound] = []
    _accesses(node, idx, {id(x) for x in inputs}, [], [], set(), set(), conds)
    return conds


def divides(node: Lazy, inputs: list[Lazy], idx: list[Lin], names: set[str]) -> bool:
    """Whether a load of `node` at multi-index `idx`, or its padding gate, divides or takes a
    modulo of an expression in the variables `names`."""
    loads: list[Lin] = []
    conds: list[Bound] = []
    _accesses(node, idx, {id(x) for x in inputs}, loads, [], set(), set(), conds)
    return any(_divided(expr, names) for expr in (*loads, *(c.expr for c in conds)))


def divisor(size: int, most: int) -> int:
    """The largest power of two <= most that divides size."""
    amount = 1
    while amount * 2 <= most and size % (amount * 2) == 0:
        amount *= 2
    return amount


def _step(flat: Lin, name: str) -> int | None:
    """How far `flat` moves when variable `name` grows by 1; None if not a constant."""
    step = 0
    for atom, coef in flat.terms:
        if isinstance(atom, Var):
            step = coef if atom.name == name else step
        elif name in _names(atom.expr):
            return None
    return step


def _divided(expr: Lin, names: set[str]) -> bool:
    """Whether `expr` holds a division or modulo of an expression in `names`."""
    return any(not isinstance(atom, Var) and bool(names & _names(atom.expr))
               for atom, _ in expr.terms)


def _names(expr: Lin) -> set[str]:
    out: set[str] = set()
    for atom, _ in expr.terms:
        out |= {atom.name} if isinstance(atom, Var) else _names(atom.expr)
    return out


def _accesses(root: Lazy, idx: list[Lin], params: set[int], loads: list[Lin],
              reduces: list[Lazy], seen: set, gated: set[str],
              conds: list[Bound] | None = None) -> None:
    """Collects the flat index of every load (over variables o<axis>, r<axis>), the reduces,
    into `gated` the variables that a load's padding gate depends on, and into `conds` the
    gates themselves. Depth first, left
    source first, with a stack of its own: a user's chain of ops may be 100,000 deep."""
    stack = [(root, idx)]
    while stack:
        node, idx = stack.pop()
        key = (id(node), tuple(idx))
        if key in seen:
            continue
        seen.add(key)
        if id(node) in params:
            loads.append(ravel(idx, node.shape))
        elif node.op is GraphOp.VIEW:
            flat, found = node.arg.index(idx)
            for cond in bounds(found) or ():
                gated |= _names(cond.expr)
                if conds is not None and cond not in conds:
                    conds.append(cond)
            src = node.src[0]
            if id(src) in params:
                loads.append(flat)
            else:
                stack.append((src, unravel(flat, src.shape)))
        elif node.op is GraphOp.REDUCE:
            if node not in reduces:
                reduces.append(node)
            inner = list(idx)
            for axis in node.arg[1]:
                inner[axis] = var(f"r{axis}", 0, node.src[0].shape[axis] - 1)
            stack.append((node.src[0], inner))
        elif node.op is GraphOp.GATHER:
            src, index, _ = node.src      # the fault flag is only stored to
            inner = list(idx)
            inner[node.arg.axis] = var(f"g{node.arg.axis}", 0, src.shape[node.arg.axis] - 1)
            stack.append((src, inner))    # the index first, as the stack pops it
            stack.append((index, [const(0) if n == 1 else i for i, n in zip(idx, index.shape)]))
        elif node.op not in (GraphOp.CONST, GraphOp.ITER):
            stack.extend((s, idx) for s in reversed(node.src))


def under_epilogue(root: Lazy, params: set[int]) -> Lazy | None:
    """The REDUCE that `root` is an elementwise function of (through reshapes that keep the
    element order), if there is exactly one on that path; else None."""
    node = root
    while node.op is not GraphOp.REDUCE:
        if id(node) in params:
            return None
        if node.op is GraphOp.VIEW and node.arg.is_contiguous and (
                prod(node.shape) == prod(node.src[0].shape)):
            node = node.src[0]
            continue
        if not isinstance(node.op, Op) or node.shape != root.shape:
            return None
        holding = [s for s in node.src if _holds_reduce(s, params)]
        if len(holding) != 1:
            return None
        node = holding[0]
    return node if id(node) not in params else None


def _holds_reduce(node: Lazy, params: set[int]) -> bool:
    """Whether a REDUCE feeds `node` (or is it) without passing through a kernel parameter."""
    found = walk([node], stop=lambda n: id(n) in params or n.op is GraphOp.REDUCE).stopped
    return any(n.op is GraphOp.REDUCE and id(n) not in params for n in found)
