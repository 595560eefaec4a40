"""Keys: what a kernel or a whole graph computes, with buffers and numbers replaced by positions.

A kernel's structure (`structure`) keys its lowering and its program; a whole unrealized
graph's (`graph_key`) keys the steps its first realize ran, so that a later realize of the same
structure replays them. Neither holds a buffer nor the value of a constant the kernel takes as
a scalar argument (portkit/codegen/lower.py, SCALAR_VAR_DTYPES): a training step lowers and
compiles once even when its learning rate changes every step. Nor, where it can travel as a
scalar argument too, the offset of a view: of a buffer (`moves`), or along the axes of a value
its kernel computes that the view does not step along (`through`). The steps of a loop over
`x[:, t]` are then one kernel, and, where x is a buffer, one replayed plan.
"""
from __future__ import annotations

from collections.abc import Container, Sequence
from typing import NamedTuple

import numpy as np

from portkit import graph
from portkit.abi.dtypes import DType
from portkit.codegen.lower import MAX_SCALARS, SCALAR_VAR_DTYPES
from portkit.graph import GraphOp, Lazy


class Scalars(NamedTuple):
    """The numbers a kernel takes as VARs: one node per VAR (in VAR order: a constant, or a
    view whose offset the VAR holds), the VAR of every node that reads one (by id), and the
    constants and such views whose numbers are left as code."""

    nodes: list[Lazy]
    slots: dict[int, int]
    code: list[Lazy]


def same_value(node: Lazy) -> tuple:
    # A float by its bits: -0.0 == 0.0 would share a VAR or a kernel, NaN != NaN miss one. A
    # number portkit.jit traces is itself: equal to another today, it may differ at a replay.
    value, dtype = node.arg, node.dtype.name      # by name: a str caches its hash
    if isinstance(value, float):
        return dtype, value.hex() if type(value) is float else ("traced", id(value))
    return dtype, value


def moves(node: Lazy) -> bool:
    """Whether `node` is a view whose offset a kernel takes as a VAR when its source is a
    kernel input: one view, no mask, so that the offset is only added to a load's position
    and no lowering decision reads it (portkit/codegen/lower.py, `Lowerer.moved`), and one
    that spans less than its source, so that another offset could read it (a transposed or
    broadcast weight has one offset only, and keeps it as code)."""
    if node.op is not GraphOp.VIEW:
        return False
    views = node.arg.views
    if len(views) != 1 or views[0].mask is not None:
        return False
    view = views[0]
    span = sum((size - 1) * abs(step) for size, step in zip(view.shape, view.strides))
    return span + 1 < node.src[0].size


def through(node: Lazy) -> tuple[tuple[int, ...], int] | None:
    """For a view of a value its kernel computes, one view with no mask: the axes of that
    value its offset moves along as a VAR, and the part of the offset that stays code
    (view.View.free: x[:, t] of an (n, steps, k) value moves along axis 1, with no rest);
    None where its offset is code."""
    views = node.arg.views
    if len(views) != 1 or views[0].mask is not None:
        return None
    return views[0].free(node.src[0].shape)


def scalar_value(node: Lazy):
    """The value of the VAR `node` gives a kernel: a view's offset, or a constant's value."""
    if node.op is GraphOp.VIEW:
        return node.arg.views[0].offset
    return var_value(node.arg, node.dtype)


def structure(root: Lazy, inputs: list[Lazy], max_scalars: int | None = None,
              placed: Container[int] | None = None) -> tuple[tuple, Scalars]:
    """What the kernel computes, with buffers replaced by their positions and constants by the
    VAR they read (a cache key), and those VARs. Equal constants share a VAR, so a kernel with
    many copies of 0 and 1 stays within MAX_SCALARS, or `max_scalars` (the device's
    Capabilities.max_scalars) where that is less; which constants are equal is part of the key.
    Constants past that many distinct values stay code: their value is in the key. Views take
    the VARs left, one each, holding their offset: those of the kernel's inputs that `moves`
    (the offset out of the key) and those of values it computes that `through` places (the
    offset's part along the axes they step along stays in the key). Past the limit their offset
    is code, and so is that of a view whose id is not in `placed` (a replay reads a VAR from a
    node of the graph: a view the scheduler made is none); such views of the kernel's inputs
    are in `Scalars.code`."""
    limit = MAX_SCALARS if max_scalars is None else min(max_scalars, MAX_SCALARS)
    number: dict[int, int] = {id(x): k for k, x in enumerate(inputs)}
    entries: list[tuple] = [("in", x.dtype, x.shape) for x in inputs]
    scalars = Scalars([], {}, [])
    by_value: dict[tuple, int] = {}

    def slot_of(node: Lazy) -> int | None:
        value = same_value(node)
        slot = by_value.get(value)
        if slot is None and len(scalars.nodes) < limit:
            slot = by_value[value] = len(scalars.nodes)
            scalars.nodes.append(node)
        return slot

    order = graph.toposort([root], stop=lambda n: id(n) in number)
    # numbers portkit.jit traces take VARs first: written as code, a replay could not change them
    for node in order:
        if isinstance(node.arg, graph.Traced) and node.dtype in SCALAR_VAR_DTYPES:
            slot_of(node)
    moving: list[tuple[int, Lazy, tuple]] = []     # (entry, node, ...): views that may take a VAR
    for node in order:
        number[id(node)] = len(entries)
        arg = node.arg
        if node.op is GraphOp.VIEW and (placed is None or id(node) in placed):
            if number[id(node.src[0])] >= len(inputs):
                free = through(node)
                if free is not None:
                    moving.append((len(entries), node, free))
            elif moves(node):
                moving.append((len(entries), node, ()))
        elif node.op is GraphOp.VIEW and number[id(node.src[0])] < len(inputs):
            # one the scheduler made (a split reduce's pad of a slice): its offset may come
            # from a view that graph_key keys without its offset, so a replay keys it by value
            scalars.code.append(node)
        elif node.op is GraphOp.CONST and node.dtype in SCALAR_VAR_DTYPES:
            slot = slot_of(node)
            if slot is None:
                scalars.code.append(node)
                arg = same_value(node)
            else:
                scalars.slots[id(node)] = slot
                arg = ("scalar", slot)
        elif isinstance(arg, float):
            arg = arg.hex()
        entries.append((node.op, node.dtype, node.shape, arg,
                        tuple(number[id(s)] for s in node.src)))
    # after the constants, so that a view never costs one of them its VAR
    for at, node, free in moving:
        if len(scalars.nodes) < limit:
            scalars.slots[id(node)] = len(scalars.nodes)
            view = node.arg.views[0]
            entries[at] = entries[at][:3] + (("offset", view.shape, view.strides,
                                              len(scalars.nodes), *free),) + entries[at][4:]
            scalars.nodes.append(node)
        elif not free:      # of a buffer: graph_key has left it out
            scalars.code.append(node)
    return tuple(entries), scalars


def structure_key(root: Lazy, inputs: list[Lazy]) -> tuple:
    """The cache key part of `structure`."""
    return structure(root, inputs)[0]


def scalar_values(scalars: list[Lazy]) -> tuple:
    """The values of `Scalars.nodes` as their VARs take them (narrow types rounded to their own
    dtype first, so that widening them is exact; a view's offset)."""
    return tuple([scalar_value(node) for node in scalars])


def var_value(value, dtype: DType):
    """`value`, a constant of `dtype`, as its VAR takes it."""
    return value if dtype.name in _EXACT_AS_VAR else _rounded(value, dtype)


# by name: a str caches its hash, a DType (a dataclass) computes it in Python at every look-up
_EXACT_AS_VAR = frozenset({"float32", "int32", "uint32"})
_VAR_DTYPE_NAMES = frozenset(d.name for d in SCALAR_VAR_DTYPES)


def _rounded(value, dtype: DType):
    with np.errstate(over="ignore"):     # a float too large for its dtype is inf, as a cast
        converted = np.array(value).astype(dtype.np)
    return float(converted) if dtype.is_float else int(converted)


# -- devices, buffers, running ------------------------------------------------------------------



def kernel_name(root: Lazy, inputs: Sequence[Lazy] = ()) -> str:
    """"r_" (a reduce inside) or "e_" (elementwise only), then the output's shape."""
    # The kernel's own nodes end at its inputs, realized yet or not, so that `kernels` (before
    # anything runs) and `realize` name a kernel alike.
    ends = {id(x) for x in inputs}
    own = graph.toposort([root], stop=lambda n: n is not root and (n.realized or id(n) in ends))
    kind = "r" if any(node.op is GraphOp.REDUCE for node in own) else "e"
    return kind + "_" + "_".join(str(s) for s in root.shape) if root.shape else kind



def graph_key(outs: list[Lazy]) -> tuple[tuple, list[Lazy]]:
    """The structure of everything `realize(outs)` computes, and its nodes by position.

    One loop over the nodes in the order they are first seen (breadth first from `outs`: any
    order works that is the same for graphs of the same structure). Seeing a node numbers its
    sources, so its entry names them by number at once. Ops and dtypes go in by value and
    name: a str caches its hash where an Enum or a DType computes it in Python at every
    look-up (and an Enum's `_value_` skips the descriptor behind `.value`). A view of a
    realized buffer that `moves` goes in without its offset: its kernel reads the offset as a
    VAR (see `structure`), which a replay reads from the node (see `moved`)."""
    number: dict[Lazy, int] = {}     # a Lazy hashes by identity, in C: no call per node
    nodes: list[Lazy] = []
    for node in outs:
        if node not in number:
            number[node] = len(nodes)
            nodes.append(node)
    entries: list[tuple] = []
    first: dict[tuple, int] = {}     # which constants are equal decides which share a VAR
    load, const, reduce, view = GraphOp.LOAD, GraphOp.CONST, GraphOp.REDUCE, GraphOp.VIEW
    var_dtypes = _VAR_DTYPE_NAMES
    for node in nodes:               # grows as the loop sees new sources
        op, arg, dtype, src = node.op, node.arg, node.dtype.name, node.src
        if op is load:
            entries.append(("in", dtype, node.shape, node.device))
            continue
        for source in src:
            if source not in number:
                number[source] = len(nodes)
                nodes.append(source)
        if arg is None:
            pass
        elif op is const and dtype in var_dtypes:
            arg = ("scalar", first.setdefault(same_value(node), len(first)))
        elif isinstance(arg, float):
            arg = arg.hex()
        elif op is reduce:
            arg = (arg[0]._value_, arg[1])      # (Op, axes), the Op by value
        elif op is view and src[0].op is load and len(arg.views) == 1 and (
                arg.views[0].mask is None):
            arg = ("offset", arg.views[0].strides)      # `moved`
        sources: tuple[int, ...] = ()
        if len(src) == 1:
            sources = (number[src[0]],)
        elif len(src) == 2:
            sources = (number[src[0]], number[src[1]])
        elif src:
            sources = tuple([number[s] for s in src])
        entries.append((op._value_, dtype, node.shape, node.device, arg, sources))
    entries.append(tuple([number[o] for o in outs]))
    return tuple(entries), nodes



def moved(nodes: list[Lazy]) -> list[int]:
    """The positions among `graph_key`'s nodes of the views it keys without their offset."""
    return [k for k, node in enumerate(nodes) if moves(node) and node.src[0].op is GraphOp.LOAD]
