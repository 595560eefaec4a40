"""Realizing a lazy graph: schedule it, lower and compile each kernel once per structure, launch.

A training step builds the same graph every step. The structure of the whole unrealized graph
(keys.graph_key: realized inputs and numbers by position) keys the steps its first realize ran,
so a later realize of that structure costs one walk, a look-up and the launches (replay.py): no
scheduling, no per-kernel keys. Every cache here is emptied by `portkit.runtime.clear()`.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from portkit import runtime, settings
from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen.lower import check_dtypes, lower
from portkit.graph import GraphOp, Lazy, gc_paused
from portkit.schedule import limits, replay, search, stages
from portkit.schedule.fusion import ScheduleItem, device_limits, schedule, split_reduce
from portkit.schedule.keys import (
    Scalars,
    graph_key,
    kernel_name,
    moved,
    same_value,
    scalar_values,
    structure,
)
from portkit.schedule.replay import ARGS, MADE, Queue, Step, recording


@contextmanager
def _deep_recursion() -> Iterator[None]:
    """Lowering recurses three or four Python frames per node, and a kernel holds at most
    limits.MAX_FUSED_DEPTH (1,000) ops along a path, so the limit is raised to 20,000 while
    lowering only: C code that recurses (json, repr) keeps the usual limit."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _alloc(device_name: str, dtype: DType, size: int) -> runtime.Buffer:
    # A node of no elements still gets a buffer of one: a backend may refuse zero bytes.
    return runtime.get(device_name).alloc(dtype, max(size, 1))


def upload(array: np.ndarray, device_name: str, dtype: DType) -> runtime.Buffer:
    """A new buffer holding `array`'s elements (C order); graph.TooLarge past the device's
    Capabilities.max_buffer_bytes (WebGPU binds at most 128 MiB), before anything is
    allocated. Tensors split host data that large into blocks first (tensor/core.py)."""
    limits.check_bytes(array.shape, dtype, device_name,
                       runtime.get(device_name).capabilities.max_buffer_bytes)
    buffer = _alloc(device_name, dtype, array.size)
    if array.size:
        buffer.copyin(np.ascontiguousarray(array, dtype.np).reshape(-1))
    recorder = recording()
    if recorder is not None:
        recorder.upload(buffer)
    return buffer


# (device, kernel structure) -> [its ABI kernel, its program or None until compiled], and a
# graph's structure -> the steps of its first realize: the most recent
# runtime.kernel_cache_size() of each, so that many distinct shapes do not grow memory forever.
_kernels: runtime.LRU = runtime.LRU(runtime.kernel_cache_size())
_replays: runtime.LRU = runtime.LRU(runtime.kernel_cache_size())
runtime.on_clear(_kernels.clear)
runtime.on_clear(_replays.clear)


def _key(item: ScheduleItem, placed: dict[int, int] | None = None) -> tuple[tuple, Scalars]:
    key, scalars = structure(item.root, item.inputs,
                             runtime.get(item.root.device).capabilities.max_scalars, placed)
    return (item.root.device, key), scalars


def _entry(item: ScheduleItem, key: tuple, scalars: Scalars) -> list:
    entry = _kernels.get(key)
    if entry is None:
        rt = runtime.get(item.root.device)
        check_dtypes([item.root, *item.inputs], rt.capabilities, rt.name)
        with _deep_recursion():
            search.ensure(rt, item.root, item.inputs, scalars.nodes, scalars.slots)
            kernel = lower(item.root, item.inputs, rt.capabilities,
                           name=kernel_name(item.root, item.inputs), scalars=scalars.nodes,
                           slots=scalars.slots)
        entry = _kernels.setdefault(key, [kernel, None])
    return entry


def _compiled(item: ScheduleItem, key: tuple, scalars: Scalars) -> runtime.Compiled:
    entry = _entry(item, key, scalars)
    if entry[1] is None:
        entry[1] = runtime.get(item.root.device).compile(entry[0])
    return entry[1]


def lower_item(item: ScheduleItem) -> Kernel:
    """The ABI kernel of one schedule item on its device, lowered once per graph structure."""
    return _entry(item, *_key(item))[0]


def _launches(item: ScheduleItem) -> bool:
    # A copy moves data without a kernel, and a node of no elements needs no kernel.
    return not item.is_copy and item.root.size > 0


def kernels(outs: list[Lazy]) -> list[Kernel]:
    """The ABI kernels `realize(outs)` launches, in order, without running anything (the
    runtime may still decompose ops the device lacks before it compiles them)."""
    return [lower_item(item) for item in schedule(outs) if _launches(item)]


class _NodeArg:
    """Reads a scalar argument at a replay: the value of the constant node at `position`."""

    __slots__ = ("position",)

    def __init__(self, position: int):
        self.position = position

    def __call__(self, nodes: list[Lazy]) -> object:
        return nodes[self.position].arg


class _OffsetArg(_NodeArg):
    """Reads the offset of the view at `position` (its VAR: keys.structure) at a replay."""

    __slots__ = ()

    def __call__(self, nodes: list[Lazy]) -> object:
        return nodes[self.position].arg.views[0].offset


def _reader(node: Lazy, position: int) -> tuple[_NodeArg, DType]:
    """What reads the VAR `node` gives a kernel from a replayed graph, and the VAR's dtype."""
    if node.op is GraphOp.VIEW:
        return _OffsetArg(position), dtypes.int32
    return _NodeArg(position), node.dtype


class _Replay(NamedTuple):
    """A graph's first realize, as a replay runs it again: its steps, the positions of the
    graph's realized inputs they read (table ARGS, by index here) and the node each step
    realizes (None: one the scheduler made), and the Queue that runs them as one batch."""

    steps: list[Step]
    loads: list[int]
    roots: list[int | tuple[int, int] | None]    # (position, stage): a stage of a split reduce
    queue: Queue
    chunk: int = stages.CHUNK       # the longest reduce stage, as the first realize split them


def _run(items: list[ScheduleItem], keyed: list[tuple[tuple, Scalars] | None],
         nodes: list[Lazy], number: dict[int, int], split: frozenset[int] = frozenset()
         ) -> tuple[_Replay | None, list[int]]:
    """Runs the items, launching by their keys and scalars from `_compile_ahead` (`keyed`);
    returns what replays them on another graph of the same structure, whose walk finds
    `nodes` (numbered as `number`, id -> position, does; None if nothing can), and the
    positions of the numbers its steps hold as code. `split`: the ids of the graph's reduces
    the scheduler split (stages.split_reduce), each now a reshape of its last stage."""
    # a replay splits such a reduce of its own graph the same way and realizes its stages with
    # the buffers this realize stores for them: other tensors of the step (a loss beside its
    # gradients) read them, as they read this realize's
    parts = {id(stage): (number[id(n)], k) for n in nodes if id(n) in split
             for k, stage in enumerate(_stages(n))}
    flags, recorder = settings.launch(), recording()
    start = time.perf_counter()
    steps: list[Step] | None = []
    made: dict[int, int] = {}       # id(root) -> its step
    loads: dict[int, int] = {}      # position of a realized input -> its index in table ARGS
    roots: list[int | tuple[int, int] | None] = []
    code: list[int] = []
    launched = 0
    for item, found in zip(items, keyed):
        root = item.root
        if item.is_copy:
            src = root.src[0]
            rt, source = runtime.get(root.device), runtime.get(src.device)
            buffer = rt.copy_from(source, src.buffer, src.size)
            if recorder is not None:
                recorder.copy(rt, source, buffer, src.buffer)
            if steps is not None and (id(src) in made or id(src) in number):
                steps.append(Step(rt, None, root.dtype, src.size, (
                    (MADE, made[id(src)]) if id(src) in made else
                    (ARGS, loads.setdefault(number[id(src)], len(loads))),), copy_from=source))
                made[id(root)] = len(steps) - 1
                roots.append(number.get(id(root)))
            else:
                steps = None
            root.realize_as(buffer)
            continue
        rt = runtime.get(root.device)
        buffer = _alloc(root.device, root.dtype, root.size)
        compiled, scalars = None, Scalars([], {}, [])
        if found is not None:
            key, scalars = found
            compiled = _compiled(item, key, scalars)
            buffers = [buffer] + [x.buffer for x in item.inputs]
            values = scalar_values(scalars.nodes)
            rt.launch(compiled, buffers, values, flags=flags)
            if recorder is not None:
                recorder.launch(rt.name, compiled, buffers, scalars.nodes, scalars.code)
            launched += 1
        if steps is not None:
            # A replay reads every number from the graph, by position; it cannot read those
            # the scheduler made (a split reduce's padding). Those held as code past
            # MAX_SCALARS are part of the key the steps are kept under (see realize).
            if not all(k in number for k in scalars.slots) or not all(
                    id(x) in made or id(x) in number for x in item.inputs) or not all(
                    id(n) in number or n.op is GraphOp.VIEW for n in scalars.code):
                steps = None
            else:
                # a view the scheduler made holds its offset as code (structure's `placed`):
                # the steps are kept under the offsets of every view graph_key leaves out
                if not all(id(n) in number for n in scalars.code):
                    code += moved(nodes)
                code += [number[id(n)] for n in scalars.code if id(n) in number]
                steps.append(Step(
                    rt, compiled, root.dtype, buffer.size,
                    tuple((MADE, made[id(x)]) if id(x) in made else
                          (ARGS, loads.setdefault(number[id(x)], len(loads)))
                          for x in item.inputs),
                    fixed=(0,) * len(scalars.nodes),
                    traced=tuple((slot, *_reader(node, number[id(node)]))
                                 for slot, node in enumerate(scalars.nodes))))
                made[id(root)] = len(steps) - 1
                roots.append(number.get(id(root), parts.get(id(root))))
        root.realize_as(buffer)
    _report(flags.debug, start, launched, {item.root.device for item in items})
    if steps is None:
        return None, code
    for step in steps:
        step.prepare()
    chunk = stages.chunk(device_limits([item.root for item in items])[1])
    return _Replay(steps, list(loads), roots, Queue(), chunk), code


def _stages(node: Lazy) -> list[Lazy]:
    """The reduces a reduce split by the scheduler became, its last stage first: a reshape
    (and for a 16-bit sum a cast) of the last stage, which sums the first."""
    while node.op is GraphOp.VIEW or node.op is Op.CAST:
        node = node.src[0]
    found: list[Lazy] = []
    while node.op is GraphOp.REDUCE and len(found) < 2:
        found.append(node)
        node = node.src[0]
    return found


def _report(debug: int, start: float, launched: int, devices: set[str]) -> None:
    if debug >= 1 and devices:
        for name in devices:
            runtime.get(name).synchronize()
        print(f"portkit: realize ran {launched} kernels in "
              f"{(time.perf_counter() - start) * 1e3:.3f} ms", file=sys.stderr)


def _compile_ahead(items: list[ScheduleItem], number: dict[int, int]
                   ) -> list[tuple[tuple, Scalars] | None]:
    """Compiles the kernels of `items` that are not compiled yet, side by side (Runtime
    .compile_all), so a first step's kernels compile together; the first batches compile
    while the later kernels are lowered. Not while the tuner (PORTKIT_BEAM) times kernels on
    the device: a compile beside them would skew its timings. Returns each item's key and
    scalars (None where it launches nothing), for `_run` to launch by: a kernel's structure
    is walked once per realize, not twice. A view takes its offset as a VAR only if it is in
    the graph (`number`: id -> position), where a replay can read it."""
    keyed = [_key(item, number) if _launches(item) else None for item in items]
    todo: dict[tuple, tuple[ScheduleItem, Scalars]] = {}
    for item, found in zip(items, keyed):
        if found is not None:
            key, scalars = found
            entry = _kernels.get(key)
            if entry is None or entry[1] is None:
                todo.setdefault(key, (item, scalars))
    by_device: dict[str, list[tuple[tuple, ScheduleItem, Scalars]]] = {}
    for key, (item, scalars) in todo.items():
        by_device.setdefault(key[0], []).append((key, item, scalars))
    for device, pending in by_device.items():
        if len(pending) < 2:
            continue
        entries: list[list] = []

        def lowered(pending: list = pending, entries: list = entries) -> Iterator[Kernel]:
            for key, item, scalars in pending:
                entries.append(_entry(item, key, scalars))
                yield entries[-1][0]
        kernels = list(lowered()) if settings.read("PORTKIT_BEAM") else lowered()
        done = runtime.get(device).compile_all(kernels, count=len(pending))
        for entry, compiled in zip(entries, done):
            if not isinstance(compiled, Exception):     # the launch reports the error
                entry[1] = compiled
    return keyed


class _ByValue(NamedTuple):
    """Kept under a graph's structure when its kernels hold numbers as code (a training step's
    backward kernels do): its steps by the values at `positions`. A graph's key is hashed and
    compared once per realize (a training step's holds 20,000 entries), not again inside a
    key of the values."""

    positions: tuple[int, ...]
    steps: runtime.LRU


def _replay(found: _Replay, nodes: list[Lazy]) -> None:
    recorder, flags = recording(), settings.launch()
    debug = flags.debug
    start = time.perf_counter() if debug else 0.0
    report = None
    if recorder is not None:
        def report(step: Step, buffers: list) -> None:
            if step.copy_from is not None:
                recorder.copy(step.runtime, step.copy_from, *buffers)
                return
            scalars = [nodes[read.position] for _, read, _ in step.traced
                       if isinstance(read, _NodeArg)]
            recorder.launch(step.runtime.name, step.compiled, buffers, scalars, [])
    made = replay.run(found.steps, ([nodes[p].buffer for p in found.loads], (), None, ()), nodes,
                      report, flags, found.queue)
    resplit: set[int] = set()
    for root, buffer in zip(found.roots, made):
        if isinstance(root, tuple):
            position, stage = root
            node = nodes[position]
            if position not in resplit:
                resplit.add(position)
                split_reduce(node, found.chunk)
            found_stages = _stages(node)
            if stage < len(found_stages):
                found_stages[stage].realize_as(buffer)
        elif root is not None:
            nodes[root].realize_as(buffer)
    if debug:
        _report(debug, start, sum(s.compiled is not None for s in found.steps),
                {s.runtime.name for s in found.steps})


def realize(outs: list[Lazy]) -> None:
    """Computes every node in `outs` into its own buffer."""
    load = GraphOp.LOAD
    if not [o for o in outs if o.op is not load]:   # .realize() or .numpy() of computed ones
        return
    if runtime.profile.current is not None:
        with runtime.profile.current.span("realize", f"realize of {len(outs)}"):
            return _realize(outs)
    _realize(outs)


@gc_paused
def _realize(outs: list[Lazy]) -> None:
    structure_key, nodes = graph_key(outs)
    steps = by_value = _replays.get(structure_key)
    if isinstance(by_value, _ByValue):
        steps = by_value.steps.get(tuple([same_value(nodes[p]) for p in by_value.positions]))
    if steps is not None:
        _replay(steps, nodes)
        return
    reduces = [n for n in nodes if n.op is GraphOp.REDUCE]
    items = schedule(outs)
    limits.check_sizes([i.root for i in items],
                       lambda name: runtime.get(name).capabilities.max_buffer_bytes)
    number = {id(n): k for k, n in enumerate(nodes)}
    keyed = _compile_ahead(items, number)
    split = frozenset(id(n) for n in reduces if n.op is not GraphOp.REDUCE)
    steps, code = _run(items, keyed, nodes, number, split)
    if steps is not None and code:
        positions = tuple(dict.fromkeys(code))
        if not isinstance(by_value, _ByValue) or by_value.positions != positions:
            by_value = _ByValue(positions, runtime.LRU(runtime.kernel_cache_size()))
            _replays[structure_key] = by_value
        by_value.steps[tuple([same_value(nodes[p]) for p in positions])] = steps
    elif steps is not None:
        _replays[structure_key] = steps
