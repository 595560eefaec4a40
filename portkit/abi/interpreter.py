"""Runs any ABI kernel with numpy: the executable definition of the IR.

Every thread of the launch is a lane of one numpy vector, and all lanes step through the node
list together. Branches and loops mask lanes off instead of skipping them, so a BARRIER needs no
work: no lane can run ahead of another. Each compute op is `spec.evaluate`, so the interpreter
and the spec cannot disagree. It is slow and obviously right; the "interpreter" reference backend
(reference_backends/interpreter/) runs every launch with it, so the whole stack can run without
a compiler.
"""
from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from portkit.abi import spec
from portkit.abi.kernel import Dim3, Kernel, word_value
from portkit.abi.matrix import Fragment, MatrixUnit
from portkit.abi.ops import COMPUTE, Op


class OutOfBounds(IndexError):
    """A LOAD or STORE touched memory outside its buffer: undefined on a device, an error here."""


def run(kernel: Kernel, buffers: Sequence[np.ndarray], scalars: Sequence[int] = (),
        grid: Dim3 | None = None, block: Dim3 | None = None) -> None:
    """Runs `kernel` on 1-D numpy `buffers` (one per PARAM, in order), writing them in place;
    `scalars` are the VARs' 32-bit words (portkit.abi.kernel.scalar_words)."""
    grid, block = grid or kernel.grid, block or kernel.block
    nodes = kernel.nodes
    lanes = np.arange(prod(grid) * prod(block), dtype=np.int64)
    group, local = lanes // prod(block), lanes % prod(block)
    ids = {"group": _split(group, grid), "local": _split(local, block)}
    closer = _matching_closers(nodes)
    scalar_of = dict(zip(kernel.vars, scalars))
    locals_: dict[int, np.ndarray] = {}
    values: list = [None] * len(nodes)
    mask = np.ones(len(lanes), bool)
    saved: list[np.ndarray] = []          # masks to restore at END / ENDIF
    loops: dict[int, tuple[int, int]] = {}  # RANGE position -> (counter, last value + 1)

    def memory(ref: int, index: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, tuple]:
        node = nodes[ref]
        target = buffers[node.arg] if node.op is Op.PARAM else locals_[ref]
        size = target.shape[-1]
        bad = active & ((index < 0) | (index >= size))
        if bad.any():
            lane = int(np.argmax(bad))
            raise OutOfBounds(f"kernel {kernel.name!r}: lane {lane} accesses element "
                              f"{int(index[lane])} of a {size}-element {node.op.name} "
                              f"(node {ref})")
        where = index[active]
        return target, (group[active], where) if node.op is Op.LOCAL else (where,)

    pc = 0
    while pc < len(nodes):
        node, src = nodes[pc], nodes[pc].src
        args = [values[s] for s in src]
        op = node.op
        if op is Op.PARAM:
            buffer = buffers[node.arg]
            if buffer.dtype != node.value_dtype.np:
                raise TypeError(f"kernel {kernel.name!r}: buffer {node.arg} holds "
                                f"{buffer.dtype}, the kernel reads it as {node.dtype}")
        elif op is Op.VAR:
            values[pc] = word_value(scalar_of[node.arg], node.value_dtype)
        elif op is Op.CONST:
            values[pc] = np.array(node.arg, node.value_dtype.np)
        elif op is Op.SPECIAL:
            kind, axis = node.arg
            values[pc] = ids[kind][axis]
        elif op is Op.LOCAL:
            locals_[pc] = np.zeros((prod(grid), node.arg), node.value_dtype.np)
        elif op in COMPUTE:
            args = [np.broadcast_to(a, lanes.shape) for a in args]
            values[pc] = spec.evaluate(op, *args, dtype=node.dtype)[0]
        elif op is Op.LOAD:
            active = mask & (args[2] if len(args) == 3 else True)
            index = np.broadcast_to(args[1], lanes.shape)
            target, where = memory(src[0], index, active)
            out = np.zeros(lanes.shape, node.value_dtype.np)
            out[active] = target[where]
            values[pc] = out
        elif op is Op.STORE:
            active = mask & (args[3] if len(args) == 4 else True)
            index = np.broadcast_to(args[1], lanes.shape)
            target, where = memory(src[0], index, active)
            target[where] = np.broadcast_to(args[2], lanes.shape)[active]
        elif op is Op.ACC:
            values[pc] = np.broadcast_to(args[0], lanes.shape).copy()
        elif op is Op.ASSIGN:
            values[src[0]] = np.where(mask, args[1], values[src[0]])
        elif op is Op.MMA:
            counts = node.arg.operand_counts
            fragments = [np.broadcast_to(a, lanes.shape) for a in args]
            for acc, new in zip(src[counts[0] + counts[1]:], mma(node.arg, fragments)):
                values[acc] = np.where(mask, new, values[acc])
        elif op is Op.IF:
            saved.append(mask)
            mask = mask & args[0]
        elif op is Op.ENDIF:
            mask = saved.pop()
        elif op is Op.RANGE:
            start, end = (np.broadcast_to(a, lanes.shape) for a in args)
            if not mask.any():
                pc = closer[pc] + 1
                continue
            first, stop = int(start[mask].min()), int(end[mask].max())
            if first >= stop:
                pc = closer[pc] + 1
                continue
            saved.append(mask)
            loops[pc] = (first, stop)
            values[pc] = np.int32(first)
            mask = saved[-1] & (start <= first) & (first < end)
        elif op is Op.END:
            opener = src[0]
            counter, stop = loops[opener]
            counter += 1
            if counter < stop:
                loops[opener] = (counter, stop)
                start, end = (np.broadcast_to(values[s], lanes.shape) for s in nodes[opener].src)
                values[opener] = np.int32(counter)
                mask = saved[-1] & (start <= counter) & (counter < end)
                pc = opener + 1
                continue
            mask = saved.pop()
        # BARRIER: lanes run in lockstep, so every lane has already arrived.
        pc += 1


def mma(unit: MatrixUnit, fragments: list[np.ndarray]) -> list[np.ndarray]:
    """The new C fragment of an MMA node: `fragments` are its operands' per-lane values (A's,
    B's, then C's elements), every `unit.threads` consecutive lanes one tile; the result is
    C's elements per lane, computed by spec.mma (with its denormals flushed, for a unit that
    flushes them)."""
    na, nb, _ = unit.operand_counts
    tiles = fragments[0].size // unit.threads

    def gather(layout: Fragment, values: list[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
        rows, cols = np.array(layout).transpose(2, 0, 1)       # each [thread, element]
        per_thread = np.stack(values, axis=-1).reshape(tiles, unit.threads, len(values))
        tile = np.zeros((tiles, *shape), per_thread.dtype)
        tile[:, rows, cols] = per_thread
        return tile

    a = gather(unit.a, fragments[:na], (unit.m, unit.k))
    b = gather(unit.b, fragments[na:na + nb], (unit.k, unit.n))
    c = gather(unit.c, fragments[na + nb:], (unit.m, unit.n))
    d = spec.mma(a, b, c, unit.acc_dtype, unit.denormals == "flush")
    rows, cols = np.array(unit.c).transpose(2, 0, 1)
    owned = d[:, rows, cols]                                    # [tile, thread, element]
    return [owned[:, :, e].reshape(-1) for e in range(owned.shape[-1])]


def _split(linear: np.ndarray, dims: Dim3) -> tuple[np.ndarray, ...]:
    x, y = linear % dims[0], (linear // dims[0]) % dims[1]
    return (x.astype(np.int32), y.astype(np.int32),
            (linear // (dims[0] * dims[1])).astype(np.int32))


def _matching_closers(nodes) -> dict[int, int]:
    return {n.src[0]: i for i, n in enumerate(nodes) if n.op in (Op.END, Op.ENDIF)}


# The interpreter as a backend: the smallest complete Device, and a readable one.
