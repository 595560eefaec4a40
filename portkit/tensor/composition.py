"""Elementwise compositions built once and copied: exp is 31 ABI ops, and building them through
Tensor ops (promotion, broadcasting, autograd bookkeeping per op) cost a fifth of an eager MLP
step's forward Python. The first call per dtype and device records the graph the Tensor ops
build; later calls copy it node by node onto the new operand, the same graph without the
dispatch.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from portkit.graph import GraphOp, Lazy, shared_const, walk

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

# Nodes a recording may not hold: it keeps elementwise ones and constants, whose shape is the
# operand's whatever that is
_NOT_ELEMENTWISE = {GraphOp.LOAD, GraphOp.VIEW, GraphOp.REDUCE, GraphOp.COPY, GraphOp.ITER,
                    GraphOp.GATHER}

# One recorded node: (op, dtype, arg, sources), a source by its index in the recording and
# the operand as -1
Recording = tuple[tuple, ...]


class Composition:
    """`build`, a function of one tensor with no gradient made of elementwise ops and
    constants only, recorded once per dtype and device and then copied onto each operand."""

    def __init__(self, build: Callable[[Tensor], Tensor]):
        self.build = build
        self._recordings: dict[tuple, Recording | None] = {}   # None: not elementwise

    def __call__(self, x: Tensor) -> Tensor:
        lazy = x.lazy
        if 0 in lazy.shape:       # empty tensors take their own path through the ops
            return self.build(x)
        key = (lazy.dtype, lazy.device)
        if key in self._recordings:
            recording = self._recordings[key]
            return self.build(x) if recording is None else x._wrap(_copy(recording, lazy))
        out = self.build(x)
        self._recordings[key] = _record(out.lazy, lazy)
        return out


def _record(out: Lazy, operand: Lazy) -> Recording | None:
    """The nodes between `operand` and `out` in an order where sources come first, or None
    where one is not elementwise at the operand's shape."""
    def ends(node: Lazy) -> bool:
        return (node is operand or node.op in _NOT_ELEMENTWISE or node.shape != operand.shape
                or node.device != operand.device)
    found = walk([out], stop=ends)
    if any(node is not operand for node in found.stopped):
        return None
    index = {id(operand): -1} | {id(node): k for k, node in enumerate(found.order)}
    return tuple((node.op, node.dtype, node.arg, tuple(index[id(s)] for s in node.src))
                 for node in found.order)


def _copy(recording: Recording, operand: Lazy) -> Lazy:
    """The recorded graph over `operand`: new nodes, shared where the recording shares, and
    its constants the nodes every copy at this shape shares (graph.shared_const)."""
    shape, device = operand.shape, operand.device
    made: list[Lazy] = []
    for op, dtype, arg, sources in recording:
        if op is GraphOp.CONST:
            made.append(shared_const(arg, dtype, shape, device))
            continue
        src = tuple(operand if k < 0 else made[k] for k in sources)
        made.append(Lazy(op, dtype, shape, src, arg, device))
    return made[-1] if made else operand
