"""The scheduler: splits a lazy graph into kernels, and runs them.

Which nodes get their own buffer (a kernel each):
- the nodes being realized, and every REDUCE, except a reduce whose only consumer is a chain of
  elementwise ops ending in a realized node: it fuses into that kernel (reduce + its elementwise
  inputs and outputs = one kernel);
- the source of a COPY (data must exist to be moved).
Everything else (elementwise ops, views, constants) is computed inside the kernel that needs it,
so elementwise chains fuse into their consumer and movement ops cost nothing. A kernel that
would read more buffers than the device allows is split by realizing its sources first.

A reduce of many elements into few outputs is split in two (partial results per slice, then
a short reduce of those) so that many workgroups share the long part.

Lowered kernels are cached by the graph's structure (ops, shapes, views, constants), never by
its buffers, so a training step lowers and compiles once. Freed buffers go to a pool keyed by
device, dtype and size, and the next kernel of that size reuses them.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from portkit import graph, runtime
from portkit.abi.errors import CapabilityError
from portkit.abi.ops import Op
from portkit.codegen.lower import check_dtypes, lower
from portkit.graph import GraphOp, Lazy

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


@dataclass
class ScheduleItem:
    """One kernel (or one device-to-device copy): realizes `root`, reading `inputs`."""

    root: Lazy
    inputs: list[Lazy]
    kernel: Any = None          # the ABI kernel, filled in by `kernels()` or at run time

    @property
    def is_copy(self) -> bool:
        return self.root.op is GraphOp.COPY


def _elementwise(node: Lazy) -> bool:
    return isinstance(node.op, Op)


def _toposort(outs: list[Lazy]) -> list[Lazy]:
    """Unrealized nodes reachable from `outs`, sources first (iterative: graphs get deep)."""
    order, seen = [], set()
    stack = [(o, False) for o in outs]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen or node.realized:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((s, False) for s in node.src)
    return order


def create_schedule(outs: list[Lazy], max_buffers: int | None = None) -> list[ScheduleItem]:
    """The kernels that realize `outs`, in the order they must run."""
    order = _toposort(outs)
    # every reduce is split first, then the graph is sorted again
    if [n for n in order if n.op is GraphOp.REDUCE and _split_reduce(n)]:
        order = _toposort(outs)
    if not order:
        return []
    consumers: dict[int, set[int]] = defaultdict(set)
    by_id = {id(n): n for n in order}
    for node in order:
        for s in node.src:
            consumers[id(s)].add(id(node))
    wanted = {id(o) for o in outs if not o.realized}
    realize = set(wanted)
    for node in order:
        if node.op is GraphOp.REDUCE:
            realize.add(id(node))
        elif node.op is GraphOp.COPY:
            realize.add(id(node))
            if not node.src[0].realized:
                realize.add(id(node.src[0]))
    for node in order:
        if node.op is GraphOp.REDUCE and id(node) not in wanted and _fuses_down(
                node, consumers, by_id, realize):
            realize.discard(id(node))
    while True:
        items = [ScheduleItem(n, _inputs(n, realize)) for n in order if id(n) in realize]
        too_big = [it for it in items if max_buffers and len(it.inputs) + 1 > max_buffers]
        if not too_big:
            return items
        grown = len(realize)
        for item in too_big:
            for s in item.root.src:
                if not s.base.realized:
                    realize.add(id(s.base))
        if len(realize) == grown:
            raise CapabilityError(
                f"{too_big[0].root} reads {len(too_big[0].inputs)} buffers at once but the "
                f"device allows {max_buffers} per kernel; use a device with more buffers")


# A reduce of at least _SPLIT_FROM elements per output, into fewer than _SPLIT_OUTPUTS outputs,
# becomes up to _SPLIT_PARTS partial reduces of at least _SPLIT_LEAST elements each.
_SPLIT_FROM = 1 << 16
_SPLIT_OUTPUTS = 256
_SPLIT_PARTS = 256
_SPLIT_LEAST = 4096


def _split_reduce(node: Lazy) -> bool:
    """Rewrites a long reduce with few outputs as two reduces, in place; True if it did."""
    op, axes = node.arg
    src = node.src[0]
    if prod(src.shape[a] for a in axes) < _SPLIT_FROM or node.size >= _SPLIT_OUTPUTS:
        return False
    axis = max(axes, key=lambda a: src.shape[a])
    size, parts = src.shape[axis], 1
    while (parts * 2 <= _SPLIT_PARTS and size % (parts * 2) == 0
           and size // (parts * 2) >= _SPLIT_LEAST):
        parts *= 2
    if parts < 4:
        return False
    # axis becomes (parts, size // parts): the first reduce keeps `parts`, the second sums it
    split = src.view("reshape", src.shape[:axis] + (parts, size // parts) + src.shape[axis + 1:])
    inner = tuple(sorted(a + (a > axis) for a in axes if a != axis)) + (axis + 1,)
    whole = split.reduce(op, tuple(sorted(inner))).reduce(op, (axis,)).view("reshape",
                                                                          node.shape)
    node.op, node.src, node.arg = whole.op, whole.src, whole.arg
    return True


def _reads_once(node: Lazy) -> bool:
    """Elementwise ops and views that read each source element at most once (no expand)."""
    if _elementwise(node):
        return True
    return node.op is GraphOp.VIEW and all(st != 0 or size == 1 for view in node.arg.views
                                     for size, st in zip(view.shape, view.strides))


def _fuses_down(node: Lazy, consumers, by_id, realize) -> bool:
    chain = node
    while len(consumers[id(chain)]) == 1:
        nxt = by_id[next(iter(consumers[id(chain)]))]
        if not _reads_once(nxt):
            return False
        chain = nxt
        if id(chain) in realize:
            return True
    return False


def _inputs(root: Lazy, realize: set[int]) -> list[Lazy]:
    """The buffers a kernel for `root` reads, in first-use order."""
    found, seen = [], set()
    stack = list(reversed(root.src))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.realized or id(node) in realize:
            found.append(node)
        else:
            stack.extend(reversed(node.src))
    return found


def structure_key(root: Lazy, inputs: list[Lazy]) -> tuple:
    """What the kernel computes, with buffers replaced by their positions (a cache key)."""
    number: dict[int, int] = {id(x): k for k, x in enumerate(inputs)}
    entries: list[tuple] = [("in", x.dtype, x.shape) for x in inputs]
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in number:
            continue
        if done:
            number[id(node)] = len(entries)
            entries.append((node.op, node.dtype, node.shape, node.arg,
                            tuple(number[id(s)] for s in node.src)))
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in node.src if id(s) not in number)
    return tuple(entries)


# -- devices, buffers, running ------------------------------------------------------------------


def device(name: str) -> runtime.Runtime:
    """The runtime of device `name` (portkit.runtime.get)."""
    return runtime.get(name)


def default_device() -> str:
    return os.environ.get("PORTKIT_DEVICE", "cpu")


_pool: dict[tuple, list] = defaultdict(list)
_POOL_PER_SIZE = 8


def _release(device_name: str, buffer: Any) -> None:
    # When the garbage collector frees a cycle holding a Lazy node, it may finalize the node's
    # buffer too (its device memory is then freed) before or after the node hands it here.
    key = (device_name, buffer.dtype, buffer.size)
    if len(_pool[key]) < _POOL_PER_SIZE and not gc.is_finalized(buffer):
        _pool[key].append(buffer)


graph._release = _release


def alloc(device_name: str, dtype, size: int):
    """A buffer of `size` elements, from the pool when one of that size is free."""
    size = max(size, 1)
    free = _pool.get((device_name, dtype, size), [])
    while free:
        buffer = free.pop()
        if not gc.is_finalized(buffer):     # see _release
            return buffer
    return device(device_name).alloc(dtype, size)


def upload(array: np.ndarray, device_name: str, dtype) -> Any:
    """A new buffer holding `array`'s elements (C order)."""
    buffer = alloc(device_name, dtype, array.size)
    if array.size:
        buffer.copyin(np.ascontiguousarray(array, dtype.np).reshape(-1))
    return buffer


_lowered: dict[tuple, Any] = {}     # (device, structure) -> (kernel, compiled)


def _serial(runtime) -> bool:
    # A CPU runs one thread per workgroup best: long contiguous chunks per group.
    return runtime.name == "cpu" or runtime.capabilities.max_block_threads == 1


def compiled_kernel(item: ScheduleItem):
    """(ABI kernel, compiled program) for an item, lowered and compiled once per structure."""
    key = (item.root.device, structure_key(item.root, item.inputs))
    found = _lowered.get(key)
    if found is None:
        runtime = device(item.root.device)
        check_dtypes([item.root, *item.inputs], runtime.capabilities, runtime.name)
        kernel = lower(item.root, item.inputs, runtime.capabilities, _serial(runtime),
                       name=_name(item.root))
        found = _lowered[key] = (kernel, runtime.compile(kernel))
    return found


def _name(root: Lazy) -> str:
    kind = "r" if _has_reduce(root) else "e"
    return kind + "_" + "_".join(str(s) for s in root.shape) if root.shape else kind


def _has_reduce(root: Lazy) -> bool:
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node.op is GraphOp.REDUCE:
            return True
        if id(node) not in seen and (node is root or not node.realized):
            seen.add(id(node))
            stack.extend(node.src)
    return False


def run_schedule(items: list[ScheduleItem]) -> None:
    """Runs the items in order; each root becomes a LOAD of its new buffer."""
    debug = int(os.environ.get("PORTKIT_DEBUG", "0") or 0)
    start = time.perf_counter()
    launched = 0
    for item in items:
        root = item.root
        if item.is_copy:
            src = root.src[0]
            data = src.buffer.numpy()[:src.size]
            root.realize_as(upload(data, root.device, root.dtype))
            continue
        buffer = alloc(root.device, root.dtype, root.size)
        if root.size:
            kernel, program = compiled_kernel(item)
            item.kernel = kernel
            device(root.device).launch(program, [buffer] + [x.buffer for x in item.inputs])
            launched += 1
        root.realize_as(buffer)
    if debug >= 1 and items:
        for name in {item.root.device for item in items}:
            device(name).synchronize()
        print(f"portkit: realize ran {launched} kernels in "
              f"{(time.perf_counter() - start) * 1e3:.3f} ms", file=sys.stderr)


def realize(outs: list[Lazy]) -> None:
    """Computes every node in `outs` into its own buffer."""
    max_buffers = None
    devices = {o.device for o in outs}
    if devices:
        max_buffers = min(device(d).capabilities.max_buffers for d in devices)
    run_schedule(create_schedule(outs, max_buffers))
