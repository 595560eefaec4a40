"""Backends broken on purpose, built by wrapping the interpreter's Device parts.

Each has one realistic bug; tests check that conformance pins it on the right case, with the
right message, blocks what depends on it, and that the replay file reproduces it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from portkit.abi import (
    ABI_VERSION,
    Backend,
    Device,
    Kernel,
    Node,
    Op,
    Renderer,
    dtypes,
)
from portkit.reference_backends.interpreter import backend as interpreter_backend
from portkit.reference_backends.interpreter.capabilities import (
    capabilities as interpreter_capabilities,
)
from portkit.reference_backends.interpreter.runtime import InterpreterProgram


def _rewrite(kernel: Kernel, op: Op, emit) -> Kernel:
    """Replaces every `op` node on float operands by what `emit(nodes, node)` appends
    (returning its position)."""
    nodes: list[Node] = []
    moved: list[int] = []
    for node in kernel.nodes:
        node = dataclasses.replace(node, src=tuple(moved[s] for s in node.src))
        if node.op is op and nodes[node.src[0]].dtype.is_float:   # float operands
            moved.append(emit(nodes, node))
        else:
            nodes.append(node)
            moved.append(len(nodes) - 1)
    return dataclasses.replace(kernel, nodes=tuple(nodes))


def _sin_off(nodes: list[Node], node: Node) -> int:
    # sin(x) + 1e-3: a polynomial with a wrong coefficient, say.
    nodes.append(node)
    nodes.append(Node(Op.CONST, node.dtype, (), 1e-3))
    nodes.append(Node(Op.ADD, node.dtype, (len(nodes) - 2, len(nodes) - 1)))
    return len(nodes) - 1


def _quotient_high(nodes: list[Node], node: Node) -> int:
    # (a / b) * 1.002: a division by a reciprocal estimate, one refinement short.
    nodes.append(node)
    nodes.append(Node(Op.CONST, node.dtype, (), 1.002))
    nodes.append(Node(Op.MUL, node.dtype, (len(nodes) - 2, len(nodes) - 1)))
    return len(nodes) - 1


def _max_ignores_nan(nodes: list[Node], node: Node) -> int:
    # a < b ? b : a, the classic MAX that returns a when b is NaN.
    a, b = node.src
    nodes.append(Node(Op.CMPLT, dtypes.bool_, (a, b)))
    nodes.append(Node(Op.WHERE, node.dtype, (len(nodes) - 1, b, a)))
    return len(nodes) - 1


def _contracted(nodes: list[Node], node: Node) -> int:
    # a * b + c as one fma: what C compilers do with -ffp-contract=fast, LLVM with `contract`.
    product = nodes[node.src[0]]
    if product.op is not Op.MUL:
        nodes.append(node)
        return len(nodes) - 1
    nodes.append(Node(Op.MULACC, node.dtype, (*product.src, node.src[1])))
    return len(nodes) - 1


@dataclasses.dataclass
class RewritingRenderer(Renderer):
    """The interpreter's renderer, after a buggy rewrite of one op."""

    op: Op
    emit: object

    def render(self, kernel: Kernel) -> str:
        return _rewrite(kernel, self.op, self.emit).to_json()


class DropsLastByte:
    """An allocator whose copyout forgets the final byte (an off-by-one in a DMA length)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def copyout(self, destination: memoryview, buffer) -> None:
        out = np.frombuffer(destination, np.uint8)
        if out.size:
            scratch = np.empty(out.size, np.uint8)
            self.inner.copyout(memoryview(scratch), buffer)
            out[:-1] = scratch[:-1]


def _device(name: str, **parts) -> Device:
    return dataclasses.replace(interpreter_backend.load(), name=name, **parts)


def sin_off() -> Device:
    """SIN is off by 1e-3."""
    return _device("broken-sin", renderer=RewritingRenderer(Op.SIN, _sin_off))


def division_high() -> Device:
    """Float division is 0.2 % high."""
    return _device("broken-division", renderer=RewritingRenderer(Op.FDIV, _quotient_high))


def max_nan() -> Device:
    """MAX on floats returns a when b is NaN."""
    return _device("broken-max", renderer=RewritingRenderer(Op.MAX, _max_ignores_nan))


def contracts() -> Device:
    """Fuses every float a * b + c into an FMA, which the ABI forbids."""
    return _device("contracts-fma", renderer=RewritingRenderer(Op.ADD, _contracted))


def _cmpne_misses_nan(nodes: list[Node], node: Node) -> int:
    # a != b computed as !(a == b) with an ordered ==: NaN != NaN comes out false.
    a, b = node.src
    nodes.append(Node(Op.CMPLT, dtypes.bool_, (a, b)))
    nodes.append(Node(Op.CMPLT, dtypes.bool_, (b, a)))
    nodes.append(Node(Op.OR, dtypes.bool_, (len(nodes) - 2, len(nodes) - 1)))
    return len(nodes) - 1


def cmpne_nan_without_max() -> Device:
    """CMPNE is false when an operand is NaN, and MAX is left to the decomposition (which
    detects NaN with CMPNE), so MAX fails too."""
    caps = interpreter_capabilities()
    return _device("cmpne-nan", renderer=RewritingRenderer(Op.CMPNE, _cmpne_misses_nan),
                   capabilities=dataclasses.replace(caps, ops=frozenset(caps.ops - {Op.MAX})))


def copyout_short() -> Device:
    """copyout leaves the last byte of every read untouched."""
    device = interpreter_backend.load()
    return _device("broken-copyout", allocator=DropsLastByte(device.allocator))


def no_float16() -> Device:
    """A correct device that declares it lacks float16 (and float64)."""
    caps = interpreter_capabilities()
    lacking = {dtypes.float16, dtypes.float64}
    return _device("no-fp16", capabilities=dataclasses.replace(
        caps, dtypes=frozenset(caps.dtypes - lacking)))


sin_backend = Backend("broken-sin", sin_off, abi_version=ABI_VERSION)
max_backend = Backend("broken-max", max_nan, abi_version=ABI_VERSION)
copyout_backend = Backend("broken-copyout", copyout_short, abi_version=ABI_VERSION)


class CrashingProgram(InterpreterProgram):
    """A program that, on float32 kernels using SIN, EXP2 or LOG2, segfaults, aborts or spins
    forever: the three ways new hardware's native code takes a process down."""

    def __call__(self, buffers, scalars, grid, block, wait=False):
        ops = {node.op for node in self.kernel.nodes if node.dtype is dtypes.float32}
        if Op.SIN in ops:
            import ctypes
            ctypes.string_at(0)
        if Op.EXP2 in ops:
            import os
            os.abort()
        while Op.LOG2 in ops:
            pass
        return super().__call__(buffers, scalars, grid, block, wait)


def crashing() -> Device:
    """Segfaults on float32 SIN, aborts on float32 EXP2, hangs on float32 LOG2."""
    return _device("crashy", program=CrashingProgram)


crashing_backend = Backend("crashy", crashing, abi_version=ABI_VERSION)
cmpne_backend = Backend("cmpne-nan", cmpne_nan_without_max, abi_version=ABI_VERSION)
