"""What a C compiler needs to vectorize a kernel's loops on the CPU: short loops asked for,
and sums of costly terms split in two loops.

At -O2, clang keeps a loop of under 16 known trips scalar (as if optimizing for size), and a
row of 14 columns computing a SiLU paid its exponential once per element. `short_loops` names
the innermost loops that a pragma may ask it to vectorize with a masked tail (the renderer's
`short_loop_pragma`): those that carry nothing from trip to trip, since under the pragma a
float sum would be reordered, which the ABI's rounding forbids, and whose loads and stores
step one element at a time (else gathers). Loops with a tail that 16 lanes leave (17 to 255
trips) are asked too. `strided_loops` names the rows whose loads step two elements (a stride-2
depthwise conv's), which the renderer's `strided_loop_pragma` asks for without a mask: masked,
such loads are gathers. It names too the loops that make more loads from buffers than clang
checks for overlap with their stores before it vectorizes (ALIAS_CHECKS).

For the same reason a loop that adds each trip's term to a float accumulator (a mean over the
14 or 28 columns of a SiLU's row, as in a squeeze-excite pool) stays scalar at any length.
`split_sums` rewrites it as one loop that stores every term into a LOCAL array, which carries
nothing and vectorizes, and one that adds them in the original order: the same ops on the
same values, so the same result. A term without a COSTLY op is left as it is: its round trip
through memory would cost what vectors save.
"""
from __future__ import annotations

from dataclasses import replace

from portkit.abi import dtypes
from portkit.abi.kernel import Kernel, Node, validate
from portkit.abi.ops import Op

# Loops of fewer trips than this (LLVM's tiny trip count) stay scalar at -O2 unless asked.
SHORT_LOOP = 16
# Loops of fewer trips than this that SHORT_LOOP does not divide are asked too, for their masked
# tail: a depthwise conv's 28-wide row with its SiLU ran one 16-lane step and 12 scalar trips
# (an exponential each), or, where clang's cost model weighed its alias checks against two
# steps, 28 scalar ones.
TAILED_LOOP = 256
# clang checks at most this many pointers against a loop's stores at run time (LLVM's
# runtime-memory-check-threshold) and otherwise leaves the loop scalar, unless asked: an
# LSTM's gate gradients read 9 buffers a row and ran at 17 cycles an element; a bias
# gradient's unrolled column sum makes 128 loads of 2 buffers.
ALIAS_CHECKS = 8
# The longest loop split: its terms' LOCAL array is 4 KiB of float32.
MOST_TERMS = 1024
# Ops of a term that cost enough per element for vectors of them to pay for the LOCAL array.
COSTLY = (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP, Op.FDIV)


def split_sums(kernel: Kernel) -> Kernel:
    """`kernel` with each innermost loop of constant bounds and at most MOST_TERMS trips whose
    one effect is `acc = acc + term`, a COSTLY term, on a float ACC (`_sum_of`) split in two."""
    nodes = kernel.nodes
    found = {}
    for i, node in enumerate(nodes):
        sum_of = _sum_of(nodes, i) if node.op is Op.RANGE else None
        if sum_of is not None:
            found[i] = sum_of
    if not found:
        return kernel
    out: list[Node] = []
    new: dict[int, int] = {}

    def add(op: Op, dtype=None, src=(), arg=None) -> int:
        out.append(Node(op, dtype, tuple(src), arg))
        return len(out) - 1

    i = 0
    while i < len(nodes):
        if i not in found:
            node = nodes[i]
            new[i] = add(node.op, node.dtype, (new[s] for s in node.src), node.arg)
            i += 1
            continue
        end, total, assign = found[i]
        acc = nodes[assign].src[0]
        start, stop = (nodes[s].arg for s in nodes[i].src)
        dtype = nodes[acc].value_dtype
        terms = add(Op.LOCAL, dtype, arg=stop - start)
        offset = add(Op.CONST, dtypes.int32, arg=-start)
        bounds = [new[s] for s in nodes[i].src]
        new[i] = add(Op.RANGE, dtypes.int32, bounds)
        for k in range(i + 1, end):
            if k not in (total, assign):
                node = nodes[k]
                new[k] = add(node.op, node.dtype, (new[s] for s in node.src), node.arg)
        term = next(s for s in nodes[total].src if s != acc)
        add(Op.STORE, None, (terms, add(Op.ADD, dtypes.int32, (new[i], offset)), new[term]))
        add(Op.END, None, (new[i],))
        again = add(Op.RANGE, dtypes.int32, bounds)
        value = add(Op.LOAD, dtype, (terms, add(Op.ADD, dtypes.int32, (again, offset))))
        summed = add(Op.ADD, dtype, (new[acc], value) if nodes[total].src[0] == acc
                     else (value, new[acc]))
        add(Op.ASSIGN, None, (new[acc], summed))
        new[end] = add(Op.END, None, (again,))
        i = end + 1
    return validate(replace(kernel, nodes=tuple(out)))


def short_loops(kernel: Kernel) -> set[int]:
    """The RANGE nodes of innermost loops with constant bounds, 1 < trips < SHORT_LOOP (or
    under TAILED_LOOP, not a multiple of SHORT_LOOP), no ASSIGN inside, and loads and stores
    that each step 0 or 1 element per trip (`_steps`)."""
    found = set()
    for i, trips, loads, stores in _plain_loops(kernel):
        assert trips is not None            # constant bounds
        tailed = SHORT_LOOP <= trips < TAILED_LOOP and trips % SHORT_LOOP != 0
        if (1 < trips < SHORT_LOOP or tailed) and loads | stores <= {0, 1}:
            found.add(i)
    return found


def strided_loops(kernel: Kernel) -> set[int]:
    """The RANGE nodes of innermost loops with no ASSIGN inside and stores that step 0 or 1
    element per trip whose loads, with constant bounds and SHORT_LOOP trips or more, step 0,
    1 or 2, some 2 (a stride-2 depthwise conv's row, which clang's cost model may leave
    scalar); or, with any bounds but not known to be short, step 0 or 1 from more than
    ALIAS_CHECKS places in buffers (`_streams`), which clang leaves scalar rather than check
    that many for overlap with the stores."""
    return {i for i, trips, loads, stores in _plain_loops(kernel, bounded=False)
            if stores <= {0, 1} and (trips is None or trips >= SHORT_LOOP) and (
                trips is not None and 2 in loads and loads <= {0, 1, 2}
                or loads <= {0, 1} and _streams(kernel.nodes, i) > ALIAS_CHECKS)}


def _streams(nodes: tuple[Node, ...], i: int) -> int:
    """How many loads from kernel buffers (PARAMs) loop `i` makes: 9 buffers read by an
    LSTM's gate gradients, or the 64 rows of a bias gradient's column sum unrolled (128
    loads of 2 buffers a column, scalar at 28x the vector loop's time)."""
    return sum(nodes[k].op is Op.LOAD and nodes[nodes[k].src[0]].op is Op.PARAM
               for k in range(i + 1, _end(nodes, i)))


def _plain_loops(kernel: Kernel, bounded: bool = True
                 ) -> list[tuple[int, int | None, set[int | None], set[int | None]]]:
    """(RANGE node, trips, load steps, store steps: `_steps`) of each innermost loop with no
    ASSIGN inside and constant bounds; with `bounded` False, any bounds too (trips None)."""
    nodes, found = kernel.nodes, []
    for i, node in enumerate(nodes):
        if node.op is not Op.RANGE:
            continue
        start, stop = (nodes[s] for s in node.src)
        constant = start.op is Op.CONST and stop.op is Op.CONST
        if bounded and not constant:
            continue
        end = _end(nodes, i)
        if not any(n.op in (Op.RANGE, Op.ASSIGN) for n in nodes[i + 1:end]):
            found.append((i, stop.arg - start.arg if constant else None,
                          *_steps(nodes, i, end)))
    return found


def _steps(nodes: tuple[Node, ...], i: int, end: int
           ) -> tuple[set[int | None], set[int | None]]:
    """How far the loads and the stores in loop `i` step per trip, in elements (None: not a
    constant). A loop of rows (a depthwise convolution's, 18 floats apart) vectorized as
    gathers, at twice the time of the scalar loop; one of stride-2 loads as pairs of loads
    and a shuffle."""
    step: dict[int, int | None] = {i: 1}     # per node: how much it grows per trip
    loads: set[int | None] = set()
    stores: set[int | None] = set()
    for k in range(i + 1, end):
        node = nodes[k]
        steps = [step.get(s, 0) for s in node.src]
        known = [n for n in steps if n is not None]
        if node.op in (Op.LOAD, Op.STORE):
            (loads if node.op is Op.LOAD else stores).add(steps[1])
        elif not any(steps):
            continue
        elif len(known) < len(steps):
            step[k] = None
        elif node.op in (Op.ADD, Op.SUB):
            step[k] = known[0] + known[1] if node.op is Op.ADD else known[0] - known[1]
        elif node.op is Op.MUL and 0 in known:
            other = nodes[node.src[known.index(0)]]
            step[k] = sum(known) * other.arg if other.op is Op.CONST else None
        else:
            step[k] = None
    return loads, stores


def _end(nodes: tuple[Node, ...], i: int) -> int:
    """The END of loop `i`."""
    return next(j for j in range(i + 1, len(nodes))
                if nodes[j].op is Op.END and nodes[j].src[0] == i)


def _sum_of(nodes: tuple[Node, ...], i: int) -> tuple[int, int, int] | None:
    """(its END, the ADD, the ASSIGN) of loop `i` where it is a sum to split: constant bounds,
    1 < trips <= MOST_TERMS, a COSTLY op, no loop, branch, store or barrier inside, and one
    ASSIGN of `acc + term` to a float32 or float64 ACC made before the loop, which nothing
    else inside reads."""
    start, stop = (nodes[s] for s in nodes[i].src)
    if (start.op is not Op.CONST or stop.op is not Op.CONST
            or not 1 < stop.arg - start.arg <= MOST_TERMS):
        return None
    end = _end(nodes, i)
    body = range(i + 1, end)
    if any(nodes[k].op in (Op.RANGE, Op.IF, Op.STORE, Op.BARRIER, Op.MMA) for k in body):
        return None
    if not any(nodes[k].op in COSTLY for k in body):
        return None
    assigns = [k for k in body if nodes[k].op is Op.ASSIGN]
    if len(assigns) != 1:
        return None
    acc, total = nodes[assigns[0]].src
    # a 16-bit float's ACC is held in a float, which a LOCAL of its dtype would round
    if (nodes[acc].op is not Op.ACC or acc > i
            or nodes[acc].value_dtype not in (dtypes.float32, dtypes.float64)
            or nodes[total].op is not Op.ADD or acc not in nodes[total].src
            or nodes[total].src[0] == nodes[total].src[1]):
        return None
    readers = [k for k in body if acc in nodes[k].src]
    return (end, total, assigns[0]) if readers == [total, assigns[0]] else None
