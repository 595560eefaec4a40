"""Straight lanes: a row written out as straight-line code, its outputs computed as the lanes
of one vector.

codegen/plan.py writes a short output row with weights (a depthwise conv's 5 x 5 window over
a row of 14) out term by term: per output its loads, products and tree of sums, then its
store. The stores are at consecutive positions, and the outputs' expressions are the same but
for where they load. clang's straight-line vectorizer made vectors of 8 and 4 of 12 such lanes,
with shuffles, and left two scalar: MobileNetV3's 240-channel 5 x 5 conv on 14 x 14 ran 50
scalar and 50 vector multiplies a row for 25 taps.

`find` names the `Strip`s a renderer writes as vectors instead: n stores (4 <= n <= the vector's
width) of one buffer at base + offset + lane, ungated, in one block, whose values match lane by
lane, node by node (`_match`): the same node in every lane (a weight: a scalar, which vector
arithmetic broadcasts), ungated LOADs of one buffer at consecutive positions or every other one
(a vector load of n lanes), or the same op (ADD, SUB, MUL, NEG) on matching operands. The
renderer writes the vector expression at the group's last store and nothing for its stores;
the scalar expressions it replaces are not written at all (`_unread`). Each lane computes the
same operations on the same operands in the same order, so the values are the scalar code's,
bit for bit.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel, Node
from portkit.abi.ops import COMPUTE, Op
from portkit.codegen.lanes import Spelling, named, readers

# Ops a vector of any C-like language spells as its scalar does: infix arithmetic.
_INFIX = {Op.ADD: "({} + {})", Op.SUB: "({} - {})", Op.MUL: "({} * {})", Op.NEG: "(-{})"}
# How far apart a vector load's lanes may be: consecutive, or every other element (a stride-2
# conv's row), which a renderer loads as 2n - 1 consecutive elements and keeps the even ones of.
_STEPS = (1, 2)
# Fewer stores than this stay scalar: a vector's loads and stores would cost what it saves.
MIN_LANES = 4
# Nodes whose only effect is their value (a LOAD reads, writes nothing)
_PURE = frozenset(COMPUTE) | {Op.LOAD, Op.CONST}
# Nodes that close a group: its stores must be in one block, with every value it reads in scope.
_FENCES = frozenset({Op.RANGE, Op.END, Op.IF, Op.ENDIF, Op.BARRIER})


@dataclass(frozen=True)
class Load:
    """A vector of n lanes loaded from buffer[base + offset + step * lane], step 1 or 2."""

    buffer: int
    base: int
    offset: int
    step: int = 1


@dataclass(frozen=True)
class Apply:
    """`op` lane by lane on its operands: a vector (an int, the position of an earlier step)
    or a scalar every lane shares (a `Node` position wrapped in a one-tuple)."""

    op: Op
    operands: tuple[int | tuple[int], ...]


@dataclass(frozen=True)
class Strip:
    """Stores of consecutive positions of one buffer (lane order), and the vector steps that
    compute their values; the last step is stored."""

    stores: tuple[int, ...]
    buffer: int
    base: int
    offset: int
    steps: tuple[Load | Apply, ...]


def find(kernel: Kernel, widths: dict[DType, int]) -> list[Strip]:
    """The strips of `kernel` whose buffers' dtypes have a vector of widths[dtype] lanes."""
    nodes = kernel.nodes
    strips: list[list[int]] = []
    group: list[int] = []
    for i, node in enumerate(nodes):
        if node.op in _FENCES or node.op is Op.LOAD and group and \
                node.src[0] == nodes[group[0]].src[0]:
            strips.append(group)
            group = []
        elif node.op is Op.STORE:
            width = widths.get(nodes[node.src[0]].value_dtype, 0)
            if group and (len(group) == width or not _next(nodes, group[-1], i)):
                strips.append(group)
                group = []
            if len(node.src) == 3 and width:
                group.append(i)
    strips.append(group)
    found = (_strip(nodes, stores) for stores in strips if len(stores) >= MIN_LANES)
    return [strip for strip in found if strip is not None]


def _next(nodes: tuple[Node, ...], store: int, following: int) -> bool:
    """Whether STORE `following` writes the element after STORE `store`'s, in one buffer."""
    a, b = nodes[store], nodes[following]
    if a.src[0] != b.src[0]:
        return False
    base, offset = place(nodes, a.src[1])
    return place(nodes, b.src[1]) == (base, offset + 1)


def place(nodes: tuple[Node, ...], index: int) -> tuple[int, int]:
    """(node, constant) with index = node + constant, the constant gathered through a chain
    of ADDs of constants; (index, 0) where there is none."""
    offset = 0
    while nodes[index].op is Op.ADD:
        a, b = nodes[index].src
        if nodes[b].op is Op.CONST:
            index, offset = a, offset + nodes[b].arg
        elif nodes[a].op is Op.CONST:
            index, offset = b, offset + nodes[a].arg
        else:
            break
    return index, offset


def _strip(nodes: tuple[Node, ...], stores: list[int]) -> Strip | None:
    buffer = nodes[stores[0]].src[0]
    dtype = nodes[buffer].value_dtype
    values = tuple(nodes[s].src[2] for s in stores)
    steps: list[Load | Apply] = []
    top = _match(nodes, values, dtype, steps, {})
    if not isinstance(top, int):
        return None
    loaded = {step.buffer for step in steps if isinstance(step, Load)}
    first = min(x for x in _reads(nodes, values) if nodes[x].op is Op.LOAD)
    if buffer in loaded or any(nodes[i].op is Op.STORE and nodes[i].src[0] in loaded
                               for i in range(first, stores[-1]) if i not in stores):
        return None     # the vector loads, made at the last store, would read other values
    return Strip(tuple(stores), buffer, *place(nodes, nodes[stores[0]].src[1]), tuple(steps))


def _reads(nodes: tuple[Node, ...], values: tuple[int, ...]) -> set[int]:
    """Every node the lanes' values are computed from, themselves included."""
    seen, todo = set(), list(values)
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x)
            todo.extend(nodes[x].src)
    return seen


def _match(nodes: tuple[Node, ...], lanes: tuple[int, ...], dtype: DType,
           steps: list[Load | Apply], memo: dict) -> int | tuple[int] | None:
    """The lanes' values as a vector step (its position in `steps`, which this appends to) or
    a scalar every lane shares (a one-tuple of its node); None where they do not match."""
    if lanes in memo:
        return memo[lanes]
    first = nodes[lanes[0]]
    same = [nodes[x] for x in lanes]
    found: int | tuple[int] | None = None
    if first.dtype != dtype:
        found = None
    elif all(x == lanes[0] for x in lanes) or (
            first.op is Op.CONST and all(n == first for n in same)):
        found = (lanes[0],)
    elif first.op is Op.LOAD and all(n.op is Op.LOAD and len(n.src) == 2 and
                                     n.src[0] == first.src[0] for n in same):
        base, offset = place(nodes, first.src[1])
        places = [place(nodes, n.src[1]) for n in same]
        step = next((step for step in _STEPS if places == [
            (base, offset + step * k) for k in range(len(lanes))]), None)
        if step is not None:
            steps.append(Load(first.src[0], base, offset, step))
            found = len(steps) - 1
    elif first.op in _INFIX and all(n.op is first.op for n in same):
        operands: list = [_match(nodes, tuple(nodes[x].src[k] for x in lanes), dtype, steps,
                                 memo) for k in range(len(first.src))]
        if all(isinstance(o, tuple) for o in operands):
            found = (lanes[0],)     # one op on shared scalars: the same value in every lane
        elif None not in operands:
            steps.append(Apply(first.op, tuple(operands)))
            found = len(steps) - 1
    memo[lanes] = found
    return found


def spelled(kernel: Kernel, types: dict[DType, str], vector_bytes: int,
            spelling: Callable[[str, int], Spelling], taken: set[int]) -> dict:
    """A renderer's name-and-line functions for every strip of `kernel` whose stores are not
    in `taken` (rendered together already): in the vector of `vector_bytes` that
    types[dtype] names, written as spelling(that name, its lanes) says (its `load_lanes`,
    `store_lanes` and `constant`; none where it lacks one)."""
    widths = {d: vector_bytes // d.itemsize for d in types}
    own: dict = {}
    strips = []
    for strip in find(kernel, widths):
        dtype = kernel.nodes[strip.buffer].value_dtype
        spelled_as = spelling(types[dtype], widths[dtype])
        if taken & set(strip.stores) or None in (spelled_as.load_lanes, spelled_as.store_lanes,
                                                 spelled_as.constant):
            continue
        strips.append(strip)
        for node in strip.stores:
            own[node] = named("")
        own[strip.stores[-1]] = _written(strip, spelled_as)
    for node in _unread(kernel.nodes, strips):
        own[node] = named("")
    return own


def _unread(nodes: tuple[Node, ...], strips: list[Strip]) -> set[int]:
    """The value nodes that only the strips' stores read, through others such: no renderer
    needs to write them (written, a 28-wide row's scalar terms took clang a second to drop).
    The nodes the vector steps name (shared scalars, load positions) are kept."""
    kept = {x for strip in strips for step in strip.steps for x in (
        (step.buffer, step.base) if isinstance(step, Load) else
        (o[0] for o in step.operands if isinstance(o, tuple)))}
    kept |= {x for strip in strips for x in (strip.buffer, strip.base)}
    stores = {store for strip in strips for store in strip.stores}
    gone = set(stores)
    users = readers(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        if nodes[i].op in _PURE and i not in kept and users[i] and all(
                u in gone for u in users[i]):
            gone.add(i)
    return gone - stores


def _written(strip: Strip, spelling: Spelling) -> Callable[[dict], tuple]:
    """The name-and-line function of a strip's last store: its steps, then its store."""
    n, last = len(strip.stores), strip.stores[-1]
    load, store, constant = spelling.load_lanes, spelling.store_lanes, spelling.constant
    assert load is not None and store is not None and constant is not None   # `spelled` asked

    def at(names: dict, buffer: int, base: int, offset: int) -> str:
        return f"{names[buffer]}[{names[base]} + {offset}]"

    def line(names: dict) -> tuple:
        def operand(o: int | tuple[int]) -> str:
            return names[o[0]] if isinstance(o, tuple) else f"strip{last}_{o}"
        code = []
        for k, step in enumerate(strip.steps):
            value = (load(at(names, step.buffer, step.base, step.offset), n, step.step)
                     if isinstance(step, Load) else
                     _INFIX[step.op].format(*map(operand, step.operands)))
            code.append(constant(f"strip{last}_{k}", value))
        code.append(store(at(names, strip.buffer, strip.base, strip.offset),
                          f"strip{last}_{len(strip.steps) - 1}", n))
        return "", "\n".join(code)
    return line
