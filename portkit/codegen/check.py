"""A bounds-checked build of any ABI kernel: the kernel PORTKIT_CHECK=1 launches instead.

    checked = bounds_checked(kernel)
    # launch checked.kernel with the kernel's buffers, then a zeroed int32 buffer of
    # checked.fault_words elements; scalars: each buffer's element count, then the kernel's own
    fault = checked.fault(fault_buffer, sizes)   # None, or which access went out of bounds

The pass is kernel to kernel, so every backend, a vendor's too, runs it with its own renderer
and compiler at native speed. Each LOAD and STORE gets a gate that is false outside its buffer,
so an out-of-range access is never performed; instead its lanes store 1 and the index into the
access's two words of the fault buffer. Buffer sizes arrive as int32 VARs (one per PARAM), so a
checked kernel compiles once for every size; a LOCAL's size is its own `arg`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from portkit.abi import dtypes
from portkit.abi.kernel import Kernel, KernelBuilder
from portkit.abi.ops import Op

_WORDS = 2      # per access: a flag (1 once a lane went out of bounds), then its index


@dataclass(frozen=True)
class Fault:
    """An access that went out of bounds: the node (in the unchecked kernel), its buffer (the
    PARAM's position, or None for a LOCAL), an index it used and the buffer's size."""

    node: int
    op: Op
    buffer: int | None
    index: int
    size: int
    others: int     # further accesses of the kernel that went out of bounds too

    def message(self, kernel: Kernel) -> str:
        """One line naming the kernel, the access, the index and the size."""
        memory = "LOCAL" if self.buffer is None else f"PARAM (buffer {self.buffer})"
        also = f"; {self.others} other accesses went out of bounds too" if self.others else ""
        return (f"kernel {kernel.name!r}: node {self.node} ({self.op.name}) accesses element "
                f"{self.index} of a {self.size}-element {memory}{also}")


@dataclass(frozen=True)
class Checked:
    """A kernel's bounds-checked build: `kernel` takes the original buffers, then the fault
    buffer (int32, `fault_words` elements, zeroed before each launch); its scalars are the
    element count of each original buffer, then the original scalars."""

    kernel: Kernel
    accesses: tuple[int, ...]     # the checked LOAD/STORE nodes, by position in the original
    original: Kernel

    @property
    def fault_words(self) -> int:
        """Elements of the fault buffer."""
        return _WORDS * len(self.accesses)

    def fault(self, words: np.ndarray, sizes: list[int]) -> Fault | None:
        """The first access (in kernel order) that the fault buffer `words` says went out of
        bounds, given the launch's buffer sizes; None if every access stayed inside."""
        flags = np.flatnonzero(words[0::_WORDS])
        if not flags.size:
            return None
        slot = int(flags[0])
        node = self.original.nodes[self.accesses[slot]]
        memory = self.original.nodes[node.src[0]]
        param = memory.op is Op.PARAM
        return Fault(self.accesses[slot], node.op, memory.arg if param else None,
                     int(words[_WORDS * slot + 1]), sizes[memory.arg] if param else memory.arg,
                     int(flags.size) - 1)


def bounds_checked(kernel: Kernel) -> Checked:
    """`kernel` with every LOAD and STORE gated to its buffer, recording out-of-range ones."""
    out = KernelBuilder(kernel.name)
    params = kernel.params
    fault = out.add(Op.PARAM, dtypes.int32, arg=len(params))
    taken = set(kernel.vars)
    size_of = {}
    for p in params:
        size_of[p.arg] = out.add(Op.VAR, dtypes.int32, arg=_unused(f"pk_size{p.arg}", taken))
    zero, one, true = out.const(0), out.const(1), out.const(True, dtypes.bool_)
    moved: dict[int, int] = {}      # position in `kernel` -> position in the checked kernel
    accesses: list[int] = []
    for i, node in enumerate(kernel.nodes):
        src = [moved[s] for s in node.src]
        if node.op in (Op.LOAD, Op.STORE):
            memory = kernel.nodes[node.src[0]]
            size = (size_of[memory.arg] if memory.op is Op.PARAM
                    else out.const(memory.arg))
            index = src[1]
            below = out.alu(Op.CMPLT, index, zero)
            inside = out.alu(Op.AND, out.alu(Op.CMPLT, index, size),
                             out.alu(Op.XOR, below, true))
            outside = out.alu(Op.XOR, inside, true)
            gate_at = 2 if node.op is Op.LOAD else 3
            if len(src) > gate_at:      # an access under a false gate is no access at all
                outside = out.alu(Op.AND, outside, src[gate_at])
                inside = out.alu(Op.AND, inside, src[gate_at])
            slot = _WORDS * len(accesses)
            accesses.append(i)
            out.store(fault, out.const(slot), one, outside)
            out.store(fault, out.const(slot + 1), index, outside)
            src = src[:gate_at] + [inside]
        moved[i] = out.add(node.op, node.dtype, tuple(src), node.arg)
    return Checked(out.build(kernel.grid, kernel.block), tuple(accesses), kernel)


def _unused(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name
