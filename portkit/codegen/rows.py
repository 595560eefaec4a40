"""Per-row decoding: on a device whose threads are loops, an elementwise kernel's thread loops
over rows of its output with an inner loop along the last axis.

A flat loop over elements decodes every element's position with a div and a mod per axis
(`t % 58`, `t / 58 % 64`), and clang keeps such a loop scalar: a padded or permuted copy then
runs at a fraction of the memory's speed. Looping over rows decodes a row's position once, and
the inner loop's indices are plain strides, which vectorize (tests/codegen/test_conv_tiles.py
checks that no div or mod is left inside the inner loop). `lower` decodes the row and `emit`
writes its inner loops: a join's one plain copy loop per piece (codegen/cases.py), or loops
split where the row's padding starts and ends, so that the columns inside it load ungated and
the row's own gates are tested once around them (`pieces`).

Short rows whose every load runs on from one row into the next (an elementwise kernel on a 7 x 7
or 14 x 14 map, whose per-channel loads ignore both axes) are one row of their product
(`merged`): rows of 7 and 14 columns vectorized badly, and as a flat loop each element paid a
division for its channel's loads (a SiLU times a squeeze-excite gate on 672 x 7 x 7 ran at a
sixth of the speed of the same on 672 x 49).

Short trailing axes (a pool's window (..., W / k, k), the unit axis of a sum over one element,
an (re, im) pair) are unrolled into each step of the inner loop, which then runs along the axis
before them: as the inner loop they would be too short, and as part of a flat loop each element
would pay a div and a mod.
"""
from __future__ import annotations

from functools import partial
from itertools import pairwise, product
from math import prod
from typing import TYPE_CHECKING, cast

from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen import cases as joined
from portkit.codegen.plan import gates, load_steps, under_epilogue
from portkit.graph import GraphOp, Lazy, walk
from portkit.symbolic import Bound, Lin, Var, const, ravel, unravel, var

if TYPE_CHECKING:
    from portkit.codegen.lower import Lowerer

# Shorter rows keep the flat loop: an inner loop of a few iterations vectorizes badly.
MIN_ROW = 8
# A padded row keeps a loop down to this many columns: its loop splits where the padding starts
# and ends (`pieces`), and as a flat loop each element paid two divs, two mods and a gated
# load (a 4 x 4 map's padded copy, 32 x 512 x 6 x 6, ran 7x slower: 1.5 ms against 0.21,
# AVX-512, one thread).
GATED_ROW = 4
# The most elements of short trailing axes that one step of the inner loop computes.
MAX_TAIL = 8


# Trailing axes shorter than this merge into one row where their loads allow (`merged`), up to
# MERGED_ROW elements: the rows left are shared among the cores.
SHORT_ROW = 32
MERGED_ROW = 1024
# loops a row splits into, at most, where gates mark pieces side by side along it (`pieces`)
MAX_PIECES = 16


def merged(root: Lazy, inputs: list[Lazy]) -> Lazy:
    """`root` reshaped so that its short trailing axes are one, where every load of it steps
    along each of them as a continuation of the next (ungated, no gather), and no reduce
    feeds it; else `root` itself. The kernel's output is stored in the same order either way."""
    shape, params = root.shape, {id(x) for x in inputs}
    # a fill has nothing to load, and a view of a CONST is a new CONST (graph.Lazy.view),
    # which the kernel would then read as code, not as the VAR its value travels in
    if root.base.op is GraphOp.CONST:
        return root
    if len(shape) < 2 or shape[-1] >= SHORT_ROW or any(
            node.op in (GraphOp.REDUCE, GraphOp.GATHER)
            for node in walk([root], stop=lambda node: id(node) in params).order):
        return root
    index = [var(f"o{a}", 0, size - 1) for a, size in enumerate(shape)]
    if gates(root, inputs, index):
        return root
    steps = load_steps(root, inputs, f"o{len(shape) - 1}")
    if None in steps:
        return root
    along = cast("list[int]", steps)
    first, span = len(shape) - 1, shape[-1]
    while first > 0 and span < SHORT_ROW:
        steps = load_steps(root, inputs, f"o{first - 1}")
        if any(step != each * span for step, each in zip(steps, along)):
            break
        first -= 1
        span *= shape[first]
    if first == len(shape) - 1:
        return root
    if span <= MERGED_ROW:
        return root.view("reshape", (*shape[:first], span))
    # past MERGED_ROW, the merged axes are cut into rows of a divisor of their size (a conv
    # weight's 512 x 3 x 3 into 8 rows of 576: its optimizer update ran in rows of 9)
    inner = prod(shape[first + 1:])     # a row holds whole runs of the inner axes
    row = max((d for d in range(SHORT_ROW, MERGED_ROW + 1)
               if span % d == 0 and d % inner == 0), default=0)
    if row:
        return root.view("reshape", (*shape[:first], span // row, row))
    first += 1
    return root.view("reshape", (*shape[:first], prod(shape[first:]))) \
        if first < len(shape) - 1 else root


def row_length(tile_shape: tuple[int, ...], elementwise_on_loops: bool,
               padded: bool = False) -> tuple[int, int]:
    """(the inner loop's length, how many short trailing axes each of its steps unrolls) when a
    thread decodes its tiles' positions once per row (given a kernel without a tiled reduce on
    a device whose threads are loops), else (1, 0). `padded`: the kernel's loads are gated by
    padding (`is_padded`), and rows down to GATED_ROW columns loop."""
    if not elementwise_on_loops:
        return 1, 0
    shortest = GATED_ROW if padded else MIN_ROW
    tail = 0
    while (tail < len(tile_shape) - 1 and tile_shape[-1 - tail] < shortest
           and prod(tile_shape[len(tile_shape) - 1 - tail:]) <= MAX_TAIL):
        tail += 1
    axis = len(tile_shape) - 1 - tail
    if axis >= 1 and prod(tile_shape[:axis]) > 1 and tile_shape[axis] >= shortest:
        return tile_shape[axis], tail
    return 1, 0


def is_padded(root: Lazy, inputs: list[Lazy]) -> bool:
    """Whether some load of `root` is gated by padding at some of its positions."""
    index = [var(f"o{a}", 0, size - 1) for a, size in enumerate(root.shape)]
    return bool(gates(root, inputs, index))


def pieces(conds: list[Bound], column: Lin, outer: set[str]
           ) -> tuple[list[tuple[int, int]], tuple[Bound, ...]]:
    """Where a padded row's inner loop splits: its column ranges [first, end), of which one
    (when there are two or more) no gate linear in `column` (a Var) can fail in, and the gates
    that depend on nothing but variables in `outer` (the row's position), which hold or fail
    for the whole row.

    A padded copy's row reads its source through a gate per element (`c - 1 < 112`), and clang
    leaves a loop of gated loads scalar: a loop over the columns inside the padding loads with
    no gate, which vectorizes, and the gate of the row's position, tested once outside it,
    drops the gate of the whole row.

    Where no column passes every gate, the gates mark pieces side by side along the row (the
    gradient of `chunk` along the last axis: an LSTM's four gates, each a padded piece of a
    sum), and the row splits at every span's edge, up to `MAX_PIECES` loops: each loop's
    columns lie inside or outside each piece, so it computes only its own piece, ungated.
    Unsplit, every column computed all four gates' gradients behind gated loads."""
    (atom, _), = column.terms
    assert isinstance(atom, Var)
    first, end = atom.min, atom.max + 1
    hoisted: list[Bound] = []
    edges: set[int] = set()
    for cond in conds:
        names = _names(cond.expr)
        if atom.name not in names:
            if names <= outer:
                hoisted.append(cond)
            continue
        coef = dict(cond.expr.terms).get(atom, 0)
        rest = cond.expr + column * -coef
        if not coef or atom.name in _names(rest):
            continue                    # inside a div or a mod: the gate stays
        if coef > 0:    # lo <= coef * c + rest < hi for every rest in [rest.min, rest.max]
            span = -((rest.min - cond.lo) // coef), (cond.hi - 1 - rest.max) // coef + 1
        else:
            span = -((cond.hi - 1 - rest.max) // -coef), (cond.lo - rest.min) // coef + 1
        first, end = max(first, span[0]), min(end, span[1])
        edges.update(span)
    low, high = atom.min, atom.max + 1
    if first >= end:
        cuts = sorted({low, high} | {e for e in edges if low < e < high})
        if len(cuts) - 1 > MAX_PIECES:
            return [(low, high)], tuple(hoisted)
        return list(pairwise(cuts)), tuple(hoisted)
    if (first, end) == (low, high):
        return [(low, high)], tuple(hoisted)
    spans = [(low, first), (first, end), (end, high)]
    return [(a, b) for a, b in spans if a < b], tuple(hoisted)


def _names(expr: Lin) -> set[str]:
    out: set[str] = set()
    for atom, _ in expr.terms:
        out |= {atom.name} if isinstance(atom, Var) else _names(atom.expr)
    return out


def emit(lowerer: Lowerer, root: Lazy, inputs: list[Lazy], tile: list[Lin], t_var: Lin,
         shape: tuple[int, int], amounts: list[int], out: int, shifted: int | None) -> None:
    """The rows of a thread's tiles at `tile` (the row's position, decoded once; `shape` is
    the row's length and its short trailing axes): a join's one copy loop per piece
    (codegen/cases.py), or loops split where the row's padding starts and ends."""
    b = lowerer.b
    row, tail = shape
    column = var("c", 0, row - 1)
    full = tile + [column] + [const(0)] * tail
    found = None
    if prod(amounts) == 1:
        column_var = lowerer.new_var("c", 0, row - 1, -1)    # its node: the loop
        (atom, _), = column_var.terms
        assert isinstance(atom, Var)
        idx, = indices(tile + [column_var] + [const(0)] * tail, amounts)
        found = joined.cases(root, idx, set(lowerer.params), atom.name)
    if found:       # a concatenation: each row runs the loop of the one piece it lies in
        joined.emit(lowerer, found, column_var, row, out, ravel(idx, root.shape))
    else:
        spans: list[tuple[int, int]] = [(0, row)]
        hoisted: tuple[Bound, ...] = ()
        if shifted is None:
            spans, hoisted = pieces([cond for idx in indices(full, amounts)
                                     for cond in gates(root, inputs, idx)],
                                    column, {a.name for a, _ in t_var.terms
                                             if isinstance(a, Var)})
        loop = partial(_row_loop, lowerer, root, tile, tail=tail, amounts=amounts, out=out,
                       shifted=shifted)
        if hoisted:
            # the row's own gates, tested once: its loop inside the padding loads ungated
            whole = lowerer.condition(hoisted, None)
            assert whole is not None
            _branch(lowerer, whole, hoisted, (), lambda: [loop(span) for span in spans])
            # where one gate fails, it fails for every load it gates (a row of padding)
            _branch(lowerer, b.alu(Op.XOR, whole, lowerer.const(True, dtypes.bool_)), (),
                    hoisted if len(hoisted) == 1 else (), lambda: loop((0, row)))
        else:
            for span in spans:
                loop(span)


def indices(tile: list[Lin], amounts: list[int]) -> list[list[Lin]]:
    """The multi-index of every output of a thread's tile."""
    return [[t * n + k for t, n, k in zip(tile, amounts, offsets)]
            for offsets in product(*(range(n) for n in amounts))]


def store(lowerer: Lowerer, root: Lazy, tile: list[Lin], amounts: list[int], out: int,
           shifted: int | None = None) -> None:
    """Computes and stores every output of one tile. Along axis `shifted`, the last tile
    starts early enough to end at the axis's end, and stores only the outputs that the tile
    before it did not. Where the outputs are an epilogue of a reduce (and the Lowerer's
    `epilogue_loop` is set) the epilogue runs in a loop over the tile (`_epilogue_loop`)."""
    b = lowerer.b
    starts = [t * n for t, n in zip(tile, amounts)]
    lanes = list(product(*(range(n) for n in amounts)))
    stored: list[int | None] = [None] * len(lanes)
    edge: tuple[Lin, int] | None = None
    if shifted is not None:
        size = root.shape[shifted]
        first, last = lowerer.index(starts[shifted]), lowerer.const(size - amounts[shifted])
        start = b.alu(Op.WHERE, b.alu(Op.CMPLT, first, last), first, last)
        edge = (starts[shifted], start)
        starts[shifted] = lowerer.new_var("s", 0, size - amounts[shifted], start)
        stored = [b.alu(Op.CMPLT, b.alu(Op.ADD, first, lowerer.const(-offsets[shifted] - 1)),
                        start) for offsets in lanes]
    idxs = [[t + k for t, k in zip(starts, offsets)] for offsets in lanes]
    reduce = under_epilogue(root, set(lowerer.params)) if lowerer.epilogue_loop else None
    if (reduce is not None and len(lanes) > 1 and reduce is not root
            and id(reduce) != lowerer.plan.inline
            and not (root.op is GraphOp.VIEW and root.src[0] is reduce)):
        _epilogue_loop(lowerer, root, reduce, idxs, starts, amounts, out, edge, shifted)
        return
    values = lowerer.lower(root, idxs, [None] * len(idxs))
    for idx, value, gate in zip(idxs, values, stored):
        b.store(out, lowerer.index(ravel(idx, root.shape)), value, gate)


def _epilogue_loop(lowerer: Lowerer, root: Lazy, reduce: Lazy, idxs: list[list[Lin]],
                   starts: list[Lin], amounts: list[int], out: int,
                   edge: tuple[Lin, int] | None, shifted: int | None) -> None:
    """A tile whose outputs are an epilogue (a bias, an activation, a residual add) of a reduce
    held in registers: the reduce's values go to a LOCAL array, from which a loop over the tile
    computes the epilogue and stores, once in the code. Unrolled, a block of 8 x 16 outputs
    wrote 128 copies of the epilogue, and clang compiled them all; the loop along the tile's
    last axis vectorizes as the straight-line lanes did. `edge`: the shifted tile's unshifted
    start and its start (see `store`)."""
    b = lowerer.b
    at_reduce = [idx if reduce.shape == root.shape else unravel(ravel(idx, root.shape),
                                                                  reduce.shape) for idx in idxs]
    values = lowerer.lower(reduce, at_reduce, [None] * len(idxs))
    # a 16-bit float goes through float32, which every LOCAL holds (exactly)
    held = dtypes.float32 if reduce.dtype.is_float and reduce.dtype.itemsize == 2 else None
    sums = b.local(held or reduce.dtype, len(idxs))
    for k, value in enumerate(values):
        b.store(sums, lowerer.const(k), b.cast(value, held) if held else value)
    axes = [a for a, n in enumerate(amounts) if n > 1]
    offsets: dict[int, Lin] = {}
    counters = []
    for a in axes:          # the last axis innermost: the root is contiguous along it
        counters.append(b.add(Op.RANGE, dtypes.int32, (lowerer.const(0),
                                                       lowerer.const(amounts[a]))))
        lowerer.scopes.append({})
        offsets[a] = lowerer.new_var("e", 0, amounts[a] - 1, counters[-1])
    idx = [t + offsets.get(a, const(0)) for a, t in enumerate(starts)]
    lane = ravel([offsets[a] for a in axes], tuple(amounts[a] for a in axes))
    value = b.load(sums, lowerer.index(lane))
    lowerer.fixed[id(reduce)] = b.cast(value, reduce.dtype) if held else value
    result, = lowerer.lower(root, [idx], [None])
    del lowerer.fixed[id(reduce)]
    gate = None
    if edge is not None and shifted is not None:     # as in `store`
        origin, start = edge
        first = lowerer.index(origin + offsets.get(shifted, const(0)) * -1 + (-1))
        gate = b.alu(Op.CMPLT, first, start)
    b.store(out, lowerer.index(ravel(idx, root.shape)), result, gate)
    for counter in reversed(counters):
        b.add(Op.END, None, (counter,))
        lowerer.scopes.pop()


def _row_loop(lowerer: Lowerer, root: Lazy, tile: list[Lin], span: tuple[int, int], tail: int,
              amounts: list[int], out: int, shifted: int | None = None) -> None:
    """The inner loop over columns [first, end) of a row, whose variable's range lets range
    analysis drop the gates that hold across the span."""
    first, end = span
    b = lowerer.b
    steps = load_steps(root, lowerer.inputs, f"o{len(tile)}")
    if 0 in steps and any(steps) and lowerer.plan.work == 1 and lowerer.plan.inline is None:
        # the loads of an elementwise row that stay put along it (a BatchNorm gradient's
        # per-channel mean, variance and weight) are made before its loop, where the inner loop
        # finds them; the rest of this copy is dead code the C compiler drops. In the loop they
        # were loaded again per column (the compiler cannot hoist a load past a store that may
        # alias it): BatchNorm's input gradient on 32 x 64 x 32 x 32 ran 10.6 ms, 1.0 with them
        # outside. A window written out along the row keeps its weights in the loop: hoisted,
        # MobileNetV3's 5x5 depthwise conv on 14 x 14 ran at 0.7x the speed
        lowerer.lower(root, [tile + [const(first)] + [const(0)] * tail], [None])
    column = b.add(Op.RANGE, dtypes.int32, (lowerer.const(first), lowerer.const(end)))
    lowerer.scopes.append({})
    store(lowerer, root, tile + [lowerer.new_var("c", first, end - 1, column)]
           + [const(0)] * tail, amounts, out, shifted)
    b.add(Op.END, None, (column,))
    lowerer.scopes.pop()


def _branch(lowerer: Lowerer, cond: int, assumed: tuple[Bound, ...],
            refuted: tuple[Bound, ...], body) -> None:
    """`body()` inside IF(cond), lowered with the gates that cond implies true (`assumed`) or
    false (`refuted`) decided."""
    b = lowerer.b
    opener = b.add(Op.IF, None, (cond,))
    lowerer.scopes.append({})
    lowerer.assumed, lowerer.refuted = assumed, refuted
    body()
    lowerer.assumed, lowerer.refuted = (), ()
    lowerer.scopes.pop()
    b.add(Op.ENDIF, None, (opener,))
