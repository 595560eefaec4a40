"""Elementwise compositions built once and copied: exp is 31 ABI ops, and building them through
Tensor ops (promotion, broadcasting, autograd bookkeeping per op) cost a fifth of an eager MLP
step's forward Python. The first call per dtype and device records the graph the Tensor ops
build; later calls copy it node by node onto the new operand, the same graph without the
dispatch.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from portkit.graph import GraphOp, Lazy, shared_const, shared_evictions, walk

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

# Nodes a recording may not hold: it keeps elementwise ones and constants, whose shape is the
# operand's whatever that is
_NOT_ELEMENTWISE = {GraphOp.LOAD, GraphOp.VIEW, GraphOp.REDUCE, GraphOp.COPY, GraphOp.ITER,
                    GraphOp.GATHER}

# shapes whose constants a composition keeps; all are dropped when there are more
_MAX_SHAPES = 64

# A recording: its constants (dtype, value), its ops (op, dtype, arg, sources) and its outputs,
# a source or an output by its index among the operand (0), the constants and the ops
Recording = tuple[tuple[tuple, ...], tuple[tuple, ...], tuple[int, ...]]


class Composition:
    """`build`, a function of one tensor with no gradient made of elementwise ops and
    constants only, returning a tensor (call the composition) or a tuple of them (`parts`),
    recorded once per dtype and device and then copied onto each operand."""

    def __init__(self, build: Callable[[Tensor], Any]):
        self.build = build
        self._recordings: dict[tuple, Recording | None] = {}   # None: not elementwise
        # (dtype, device, shape) -> the recording's constants at that shape (shared_const)
        self._constants: dict[tuple, list[Lazy]] = {}
        self._evictions = 0     # shared_const's when they were looked up

    def __call__(self, x: Tensor) -> Tensor:
        return self.parts(x, single=True)[0]

    def parts(self, x: Tensor, single: bool = False) -> tuple[Tensor, ...]:
        """The tensors `build` returns as a tuple (`single`: it returns one tensor)."""
        lazy = x.lazy
        if 0 in lazy.shape:       # empty tensors take their own path through the ops
            return self._built(x, single)
        key = (lazy.dtype.name, lazy.device)
        recording = self._recordings.get(key)
        if recording is not None:
            made = _copy(recording, lazy, self._shared(key, recording, lazy))
            return tuple([x._wrap(made[k]) for k in recording[2]])
        if key in self._recordings:        # not elementwise
            return self._built(x, single)
        outs = self._built(x, single)
        self._recordings[key] = _record([out.lazy for out in outs], lazy)
        return outs

    def _built(self, x: Tensor, single: bool) -> tuple[Tensor, ...]:
        out = self.build(x)
        return (out,) if single else tuple(out)

    def _shared(self, key: tuple, recording: Recording, operand: Lazy) -> list[Lazy]:
        """The recording's constants at the operand's shape: one look-up per copy."""
        at = (*key, operand.shape)
        found = self._constants.get(at)
        evictions = shared_evictions()
        if found is None or self._evictions != evictions:
            if len(self._constants) >= _MAX_SHAPES or self._evictions != evictions:
                self._evictions = evictions
                self._constants.clear()
            found = self._constants[at] = [
                shared_const(value, dtype, operand.shape, operand.device)
                for dtype, value in recording[0]]
        return found


def _record(outs: list[Lazy], operand: Lazy) -> Recording | None:
    """The nodes between `operand` and `outs`, constants first, then the ops in an order where
    sources come first; None where one is not elementwise at the operand's shape, or where an
    output is a constant (a copy would hand out a shared node, which a realize may not take)."""
    def ends(node: Lazy) -> bool:
        return (node is operand or node.op in _NOT_ELEMENTWISE or node.shape != operand.shape
                or node.device != operand.device)
    found = walk(outs, stop=ends)
    if any(node is not operand for node in found.stopped) or any(
            out.op is GraphOp.CONST for out in outs):
        return None
    constants = [node for node in found.order if node.op is GraphOp.CONST]
    ops = [node for node in found.order if node.op is not GraphOp.CONST]
    index = {id(operand): 0} | {id(node): k for k, node in enumerate(constants + ops, 1)}
    return (tuple((node.dtype, node.arg) for node in constants),
            tuple((node.op, node.dtype, node.arg, tuple(index[id(s)] for s in node.src))
                  for node in ops),
            tuple(index[id(out)] for out in outs))


def _copy(recording: Recording, operand: Lazy, constants: list[Lazy]) -> list[Lazy]:
    """The recorded graph over `operand` (all its nodes, by index): new nodes, shared where
    the recording shares, and `constants` the nodes of its constants."""
    shape, device = operand.shape, operand.device
    made = [operand, *constants]
    for op, dtype, arg, sources in recording[1]:
        if len(sources) == 2:       # spelled out: most nodes have one or two sources
            src: tuple[Lazy, ...] = (made[sources[0]], made[sources[1]])
        elif len(sources) == 1:
            src = (made[sources[0]],)
        else:
            src = tuple([made[k] for k in sources])
        made.append(Lazy(op, dtype, shape, src, arg, device))
    return made
