"""Threads as loops: a workgroup's threads run one after another, split at each BARRIER.

For a target without hardware threads (a CPU, a DSP, a scalar core), `threads_as_loops` turns
a kernel into an equivalent one with block (1, 1, 1) and no BARRIER: each stretch of the kernel
between barriers becomes a loop over the workgroup's threads, and `SPECIAL local` becomes that
loop's counter. A `RANGE` holding a barrier runs outside the thread loops (the ABI makes its
bounds the same for the whole workgroup, so thread 0's are used), with thread loops inside it.
A value (or `ACC`) made in one stretch and used in another is kept per thread in a `LOCAL`
array of one element per thread, stored where it is made and loaded where it is used.

The result is an ordinary ABI kernel, so any renderer (C, LLVM IR, ...) renders it as it is,
and the interpreter runs both to check one against the other.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel, Node, validate
from portkit.abi.ops import Op

# Nodes with no sources that mean the same for every thread of a workgroup: they go first.
_UNIFORM = (Op.PARAM, Op.VAR, Op.CONST, Op.LOCAL)


def threads_as_loops(kernel: Kernel) -> Kernel:
    """`kernel` as one thread per workgroup that loops over the original block's threads."""
    return validate(_Splitter(kernel).run())


class _Splitter:
    """One pass of the transform: `run` returns the new kernel (not yet validated)."""

    def __init__(self, kernel: Kernel):
        self.kernel, self.nodes = kernel, kernel.nodes
        self.threads = math.prod(kernel.block)
        self.out: list[Node] = []
        self.new: dict[int, int] = {}           # old position -> new position
        self.consts: dict[int, int] = {}
        self.segment = _segments(self.nodes)
        self.tid: int | None = None              # the counter of the open thread loop
        self.lids: tuple[int, ...] = ()          # the thread ids (x, y, z) in that loop
        self.spill = self._spilled()

    def add(self, op: Op, dtype: DType | None = None, src: Iterable[int] = (),
            arg: Any = None) -> int:
        self.out.append(Node(op, dtype, tuple(src), arg))
        return len(self.out) - 1

    def const(self, value: int) -> int:
        if value not in self.consts:
            self.consts[value] = self.add(Op.CONST, dtypes.int32, arg=value)
        return self.consts[value]

    def _spilled(self) -> set[int]:
        """The value and ACC nodes used outside the stretch that makes them."""
        spilled: set[int] = set()
        for i, node in enumerate(self.nodes):
            if node.op in (Op.END, Op.ENDIF):
                continue
            for s in node.src:
                made = self.segment[s]
                if made is not None and made != self.segment[i] and not _is_lid(self.nodes[s]):
                    spilled.add(s)
        return spilled

    def run(self) -> Kernel:
        uniform = [i for i, n in enumerate(self.nodes) if n.op in _UNIFORM
                   or (n.op is Op.SPECIAL and n.arg[0] == "group")]
        for i in uniform:
            self.new[i] = self.add(*_fields(self.nodes[i]))
        self.arrays = {i: self.add(Op.LOCAL, self.nodes[i].dtype, arg=self.threads)
                       for i in sorted(self.spill)}
        for value in (0, self.threads, *self.kernel.block[:2]):   # in scope everywhere after
            self.const(value)
        for i, node in enumerate(self.nodes):
            if i in self.new:
                continue
            if self.segment[i] is None:       # BARRIER, or a RANGE around one, or its END
                self.close()
                if node.op is Op.RANGE:
                    self.new[i] = self.add(Op.RANGE, dtypes.int32,
                                           [self.uniform_value(s) for s in node.src])
                elif node.op is Op.END:
                    self.add(Op.END, src=(self.new[node.src[0]],))
                continue
            self.open()
            self.thread_node(i, node)
        self.close()
        return Kernel(self.kernel.name, tuple(self.out), self.kernel.grid, (1, 1, 1))

    def open(self) -> None:
        """Starts a loop over the threads, unless one is open; the thread ids from its counter."""
        if self.tid is not None:
            return
        bx, by, _ = self.kernel.block
        if self.threads == 1:
            self.tid = self.const(0)
            self.lids = (self.tid,) * 3
            return
        self.tid = self.add(Op.RANGE, dtypes.int32, (self.const(0), self.const(self.threads)))
        x = self.alu(Op.MOD, self.tid, self.const(bx))
        row = self.alu(Op.IDIV, self.tid, self.const(bx))
        y = self.alu(Op.MOD, row, self.const(by))
        z = self.alu(Op.IDIV, row, self.const(by))
        self.lids = (x, y, z)

    def close(self) -> None:
        if self.tid is not None and self.threads > 1:
            self.add(Op.END, src=(self.tid,))
        self.tid = None

    def thread(self) -> int:
        """The counter of the open thread loop (`open` has run)."""
        if self.tid is None:
            raise RuntimeError("threads_as_loops: a per-thread node outside a thread loop")
        return self.tid

    def alu(self, op: Op, a: int, b: int) -> int:
        return self.add(op, dtypes.int32, (a, b))

    def uniform_value(self, s: int) -> int:
        """Old node `s` outside the thread loops: thread 0's value where it is per thread."""
        if s in self.spill:
            return self.add(Op.LOAD, self.nodes[s].dtype, (self.arrays[s], self.const(0)))
        if _is_lid(self.nodes[s]):
            return self.const(0)
        return self.new[s]

    def source(self, s: int, here: int) -> int:
        """Old node `s` as a source of old node `here`, inside the current thread loop."""
        node = self.nodes[s]
        if _is_lid(node):
            return self.lids[node.arg[1]]
        if s in self.spill and (node.op is Op.ACC or self.segment[s] != self.segment[here]):
            return self.add(Op.LOAD, node.dtype, (self.arrays[s], self.thread()))
        return self.new[s]

    def thread_node(self, i: int, node: Node) -> None:
        if _is_lid(node):
            return                              # each use reads its own loop's counter
        if node.op in (Op.END, Op.ENDIF):
            self.add(node.op, src=(self.new[node.src[0]],))
            return
        if node.op is Op.ACC and i in self.spill:
            self.add(Op.STORE, src=(self.arrays[i], self.thread(), self.source(node.src[0], i)))
            return
        acc = node.src[0] if node.op is Op.ASSIGN else None
        if acc in self.spill:
            self.add(Op.STORE, src=(self.arrays[acc], self.thread(), self.source(node.src[1], i)))
            return
        src = [self.new[acc] if acc is not None and k == 0 else self.source(s, i)
               for k, s in enumerate(node.src)]
        self.new[i] = self.add(node.op, node.dtype, src, node.arg)
        if i in self.spill:
            self.add(Op.STORE, src=(self.arrays[i], self.thread(), self.new[i]))


def _fields(node: Node) -> tuple:
    return node.op, node.dtype, node.src, node.arg


def _is_lid(node: Node) -> bool:
    return node.op is Op.SPECIAL and node.arg[0] == "local"


def _segments(nodes: tuple[Node, ...]) -> list[int | None]:
    """Per node, the number of the stretch between barriers that it runs in; None for the
    nodes that run once per workgroup (sourceless uniform nodes, BARRIERs, RANGEs holding a
    BARRIER and their ENDs)."""
    holds_barrier: set[int] = set()
    open_ranges: list[int] = []
    for i, node in enumerate(nodes):
        if node.op is Op.RANGE:
            open_ranges.append(i)
        elif node.op is Op.END:
            open_ranges.pop()
        elif node.op is Op.BARRIER:
            holds_barrier.update(open_ranges)
    segment: list[int | None] = []
    number, open_segment = 0, False
    for i, node in enumerate(nodes):
        uniform = (node.op in _UNIFORM or node.op is Op.BARRIER or i in holds_barrier
                   or (node.op is Op.SPECIAL and node.arg[0] == "group")
                   or (node.op is Op.END and node.src[0] in holds_barrier))
        if uniform:
            if node.op not in _UNIFORM and node.op is not Op.SPECIAL and open_segment:
                number, open_segment = number + 1, False
            segment.append(None)
        else:
            open_segment = True
            segment.append(number)
    return segment
