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
a short reduce of those) so that many workgroups share the long part, and no reduce loops
longer than a stage (portkit/stages.py).

Lowered kernels are cached by the graph's structure (ops, shapes, views), never by its buffers
nor by the values of its constants, which the kernel takes as scalar arguments (see
portkit/codegen/lower.py, SCALAR_VAR_DTYPES), so a training step lowers and compiles once even
when its learning rate changes every step. `kernels(outs)` returns the kernels
`realize(outs)` launches, through the same schedule and the same lowering, so fusion is testable.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from math import prod
from typing import NamedTuple

import numpy as np

from portkit import graph, kernel_limits, runtime, stages
from portkit.abi.dtypes import DType
from portkit.abi.errors import CapabilityError
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen import tune
from portkit.codegen.lower import (
    MAX_SCALARS,
    SCALAR_VAR_DTYPES,
    check_dtypes,
    lower,
)
from portkit.codegen.pads import pad_apart
from portkit.codegen.plan import serial
from portkit.graph import GraphOp, Lazy

# Lowering (portkit/codegen/lower.py) recurses through a kernel's nodes, and fused chains get long.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


@contextmanager
def _deep_recursion():
    """Lowering recurses three Python frames per node (a chain of 6,600 lazy ops is 13,200
    nodes). Python 3.11+ keeps Python-to-Python calls off the C stack, so the limit is raised
    while lowering only: C code that recurses (json, repr) keeps the usual limit."""
    limit = sys.getrecursionlimit()
    if sys.version_info >= (3, 11):
        sys.setrecursionlimit(max(limit, 200_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@dataclass
class ScheduleItem:
    """One kernel (or one device-to-device copy): realizes `root`, reading `inputs`."""

    root: Lazy
    inputs: list[Lazy]

    @property
    def is_copy(self) -> bool:
        """True for a copy between devices, which runs no kernel."""
        return self.root.op is GraphOp.COPY


def _elementwise(node: Lazy) -> bool:
    return isinstance(node.op, Op)


def _unrealized(outs: list[Lazy]) -> list[Lazy]:
    """Unrealized nodes reachable from `outs`, sources first."""
    return graph.toposort(outs, stop=lambda node: node.realized)


def create_schedule(outs: list[Lazy], max_buffers: int | None = None,
                    max_loop_trips: int | None = None) -> list[ScheduleItem]:
    """The kernels that realize `outs`, in the order they must run, on devices that allow
    `max_buffers` per kernel and `max_loop_trips` loop iterations per thread (None: any)."""
    order = _unrealized(outs)
    chunk = stages.chunk(max_loop_trips)
    # every long reduce is split first (its parts may split again), then the graph is sorted
    while [n for n in order if n.op is GraphOp.REDUCE and stages.split_reduce(n, chunk)]:
        order = _unrealized(outs)
    # on a device whose threads are loops, a convolution reads a padded copy (codegen/pads.py)
    copies = {id(p) for n in order if n.op is GraphOp.VIEW and serial(
        device(n.device).capabilities) and (p := pad_apart(n)) is not None}
    order = _unrealized(outs) if copies else order
    if not order:
        return []
    consumers: dict[int, set[int]] = defaultdict(set)
    by_id = {id(n): n for n in order}
    for node in order:
        for s in node.src:
            consumers[id(s)].add(id(node))
    wanted = {id(o) for o in outs if not o.realized}
    realize = wanted | copies
    for node in order:
        if node.op is GraphOp.REDUCE:
            realize.add(id(node))
        elif node.op is GraphOp.COPY:
            realize.add(id(node))
            if not node.src[0].realized:
                realize.add(id(node.src[0]))
    # With a loop budget, the reduces fused into one kernel share it: x.sum() + y.sum() + ...
    # of 16,000 each, fused, ran 80,000 iterations, and lavapipe summed 63,546 of them.
    fused: dict[int, int] = defaultdict(int)      # id(kernel root) -> reduced elements in it
    for node in order:
        if node.op is not GraphOp.REDUCE or id(node) in wanted:
            continue
        into = _fuses_down(node, consumers, by_id, realize)
        length = prod(node.src[0].shape[a] for a in node.arg[1])
        if into is not None and (max_loop_trips is None or fused[into] + length <= chunk):
            fused[into] += length
            realize.discard(id(node))
    kernel_limits.cut_deep(order, realize)
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


def _reads_once(node: Lazy) -> bool:
    """Elementwise ops and views that read each source element at most once (no expand)."""
    if _elementwise(node):
        return True
    return node.op is GraphOp.VIEW and all(st != 0 or size == 1 for view in node.arg.views
                                     for size, st in zip(view.shape, view.strides))


def _fuses_down(node: Lazy, consumers, by_id, realize) -> int | None:
    """The id of the realized node whose kernel `node` fuses into, or None."""
    chain = node
    while len(consumers[id(chain)]) == 1:
        nxt = by_id[next(iter(consumers[id(chain)]))]
        if not _reads_once(nxt):
            return None
        chain = nxt
        if id(chain) in realize:
            return id(chain)
    return None


def _inputs(root: Lazy, realize: set[int]) -> list[Lazy]:
    """The buffers a kernel for `root` reads, in first-use order."""
    return graph.walk(root.src, stop=lambda n: n.realized or id(n) in realize).stopped


class Scalars(NamedTuple):
    """The constants a kernel takes as VARs: one node per VAR (in VAR order), the VAR of every
    constant node that reads one (by id), and the constant nodes left as code."""

    nodes: list[Lazy]
    slots: dict[int, int]
    code: list[Lazy]


def _same_value(node: Lazy) -> tuple:
    # A float by its bits: -0.0 == 0.0 would share a VAR or a kernel, NaN != NaN miss one. A
    # number portkit.jit traces is itself: equal to another today, it may differ at a replay.
    value, dtype = node.arg, node.dtype.name      # by name: a str caches its hash
    if isinstance(value, float):
        return dtype, value.hex() if type(value) is float else ("traced", id(value))
    return dtype, value


def structure(root: Lazy, inputs: list[Lazy]) -> tuple[tuple, Scalars]:
    """What the kernel computes, with buffers replaced by their positions and constants by the
    VAR they read (a cache key), and those VARs. Equal constants share a VAR, so a kernel with
    many copies of 0 and 1 stays within MAX_SCALARS; which constants are equal is part of the
    key. Constants past MAX_SCALARS distinct values stay code: their value is in the key."""
    number: dict[int, int] = {id(x): k for k, x in enumerate(inputs)}
    entries: list[tuple] = [("in", x.dtype, x.shape) for x in inputs]
    scalars = Scalars([], {}, [])
    by_value: dict[tuple, int] = {}

    def slot_of(node: Lazy) -> int | None:
        value = _same_value(node)
        slot = by_value.get(value)
        if slot is None and len(scalars.nodes) < MAX_SCALARS:
            slot = by_value[value] = len(scalars.nodes)
            scalars.nodes.append(node)
        return slot

    order = graph.toposort([root], stop=lambda n: id(n) in number)
    # numbers portkit.jit traces take VARs first: written as code, a replay could not change them
    for node in order:
        if isinstance(node.arg, graph.Traced) and node.dtype in SCALAR_VAR_DTYPES:
            slot_of(node)
    for node in order:
        number[id(node)] = len(entries)
        arg = node.arg
        if node.op is GraphOp.CONST and node.dtype in SCALAR_VAR_DTYPES:
            slot = slot_of(node)
            if slot is None:
                scalars.code.append(node)
                arg = _same_value(node)
            else:
                scalars.slots[id(node)] = slot
                arg = ("scalar", slot)
        elif isinstance(arg, float):
            arg = arg.hex()
        entries.append((node.op, node.dtype, node.shape, arg,
                        tuple(number[id(s)] for s in node.src)))
    return tuple(entries), scalars


def structure_key(root: Lazy, inputs: list[Lazy]) -> tuple:
    """The cache key part of `structure`."""
    return structure(root, inputs)[0]


def scalar_values(scalars: list[Lazy]) -> tuple:
    """The values of constants as their VARs take them (narrow types rounded to their own dtype
    first, so that widening them is exact)."""
    return tuple([var_value(node.arg, node.dtype) for node in scalars])


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


def device(name: str) -> runtime.Runtime:
    """The runtime of device `name` (portkit.runtime.get)."""
    return runtime.get(name)


default_device = runtime.default_device


def _alloc(device_name: str, dtype: DType, size: int) -> runtime.Buffer:
    # A node of no elements still gets a buffer of one: a backend may refuse zero bytes.
    return device(device_name).alloc(dtype, max(size, 1))


def upload(array: np.ndarray, device_name: str, dtype: DType) -> runtime.Buffer:
    """A new buffer holding `array`'s elements (C order)."""
    buffer = _alloc(device_name, dtype, array.size)
    if array.size:
        buffer.copyin(np.ascontiguousarray(array, dtype.np).reshape(-1))
    recorder = recording()
    if recorder is not None:
        recorder.upload(buffer)
    return buffer


# -- capture (portkit.jit) ------------------------------------------------------------------
# While a recorder is set (in this thread), every launch, upload, copy between devices and read
# back to the host is reported to it: portkit/jit.py records a function's launches this way.
class _Capture(threading.local):
    # a class default, so that a thread that never recorded reads None without the
    # AttributeError a getattr default costs (0.4 us; a launch asks at every replay)
    recorder = None


_capture = _Capture()


def recording():
    """The recorder of this thread's capture (portkit/jit.py), or None."""
    return _capture.recorder


@contextmanager
def record(recorder):
    """Reports this thread's launches to `recorder` inside the block."""
    previous, _capture.recorder = recording(), recorder
    try:
        yield recorder
    finally:
        _capture.recorder = previous


def _launch(rt: runtime.Runtime, compiled: runtime.Compiled, buffers: list, scalars: list[Lazy],
            settings: runtime.Settings, recorder, code: list[Lazy] = (),
            again: bool = False) -> None:
    # settings and recorder: the realize's, read once for all its launches; code: constants
    # held as code (past MAX_SCALARS); again: a replay (buffers checked before)
    values = scalar_values(scalars) if scalars else ()
    if again:
        rt.launch_again(compiled, buffers, values, settings=settings)
    else:
        rt.launch(compiled, buffers, values, settings=settings)
    if recorder is not None:
        recorder.launch(rt.name, compiled, buffers, scalars, code)


# (device, structure) -> the ABI kernel, and the program compiled from it: the most recent
# runtime.kernel_cache_size() of each, so that many distinct shapes do not grow memory forever.
_lowered: runtime.LRU = runtime.LRU(runtime.kernel_cache_size())
_compiled: runtime.LRU = runtime.LRU(runtime.kernel_cache_size())


def _forget() -> None:
    _lowered.clear()
    _compiled.clear()


runtime.on_clear(_forget)


def _key(item: ScheduleItem) -> tuple[tuple, Scalars]:
    key, scalars = structure(item.root, item.inputs)
    return (item.root.device, key), scalars


def _lower(item: ScheduleItem, key: tuple, scalars: Scalars) -> Kernel:
    kernel = _lowered.get(key)
    if kernel is None:
        rt = device(item.root.device)
        check_dtypes([item.root, *item.inputs], rt.capabilities, rt.name)
        with _deep_recursion():
            tune.ensure(rt, item.root, item.inputs, scalars.nodes, scalars.slots)  # PORTKIT_BEAM
            kernel = lower(item.root, item.inputs, rt.capabilities,
                           name=_name(item.root, item.inputs), scalars=scalars.nodes,
                           slots=scalars.slots)
        _lowered[key] = kernel
    return kernel


def lower_item(item: ScheduleItem) -> Kernel:
    """The ABI kernel of one schedule item on its device, lowered once per graph structure."""
    return _lower(item, *_key(item))


def _name(root: Lazy, inputs: list[Lazy] = ()) -> str:
    """"r_" (a reduce inside) or "e_" (elementwise only), then the output's shape."""
    # The kernel's own nodes end at its inputs, realized yet or not, so that `kernels` (before
    # anything runs) and `realize` name a kernel alike.
    ends = {id(x) for x in inputs}
    own = graph.toposort([root], stop=lambda n: n is not root and (n.realized or id(n) in ends))
    kind = "r" if any(node.op is GraphOp.REDUCE for node in own) else "e"
    return kind + "_" + "_".join(str(s) for s in root.shape) if root.shape else kind


def _launches(item: ScheduleItem) -> bool:
    # A copy moves data without a kernel, and a node of no elements needs no kernel.
    return not item.is_copy and item.root.size > 0


def _limits(outs: list[Lazy]) -> tuple[int | None, int | None]:
    """The fewest buffers per kernel and loop iterations per thread of `outs`' devices."""
    caps = [device(d).capabilities for d in {o.device for o in outs}]
    trips = [c.max_loop_trips for c in caps if c.max_loop_trips is not None]
    return (min(c.max_buffers for c in caps) if caps else None), (min(trips) if trips else None)


def schedule(outs: list[Lazy]) -> list[ScheduleItem]:
    """The items that realize `outs` on their devices, as `realize` runs them."""
    return create_schedule(outs, *_limits(outs))


def kernels(outs: list[Lazy]) -> list[Kernel]:
    """The ABI kernels `realize(outs)` launches, in order, without running anything (the
    runtime may still decompose ops the device lacks before it compiles them)."""
    return [lower_item(item) for item in schedule(outs) if _launches(item)]


def run_schedule(items: list[ScheduleItem]) -> None:
    """Runs the items in order; each root becomes a LOAD of its new buffer."""
    _run(items, None)


@dataclass
class _Step:
    """One kernel of a Replay; every node is named by its position in the graph's walk."""

    compiled: runtime.Compiled | None   # None: a node of no elements, which needs no kernel
    runtime: runtime.Runtime            # its device's
    dtype: DType
    size: int                           # of its buffer: at least 1 (see _alloc)
    root: int | None                    # the node it realizes; None: one the scheduler made
    inputs: tuple[tuple[int | None, int], ...]   # (position, or None and an earlier step)
    scalars: tuple[int, ...]            # the position of each VAR's constant


def _run(items: list[ScheduleItem], number: dict[int, int] | None
         ) -> tuple[list[_Step] | None, list[int]]:
    """Runs the items; given the graph's walk `number` (id -> position), also returns the
    steps that replay them on another graph of the same structure (None if they cannot), and
    the positions of the constants those steps hold as code."""
    settings, recorder = runtime.launch_settings(), recording()
    start = time.perf_counter()
    steps: list[_Step] | None = [] if number is not None else None
    made: dict[int, int] = {}       # id(root) -> its step
    code: list[int] = []
    launched = 0
    for item in items:
        root = item.root
        if item.is_copy:
            steps = None
            src = root.src[0]
            if recorder is not None:
                recorder.copy(root)
            data = src.buffer.numpy((src.size,))
            root.realize_as(upload(data, root.device, root.dtype))
            continue
        buffer = _alloc(root.device, root.dtype, root.size)
        compiled, scalars = None, Scalars([], {}, [])
        if _launches(item):
            key, scalars = _key(item)
            compiled = _compiled.get(key)
            if compiled is None:
                compiled = _compiled[key] = device(root.device).compile(
                    _lower(item, key, scalars))
            _launch(device(root.device), compiled, [buffer] + [x.buffer for x in item.inputs],
                    scalars.nodes, settings, recorder, scalars.code)
            launched += 1
        if steps is not None:
            # A replay reads every number from the graph, by position; it cannot read those
            # the scheduler made (a split reduce's padding). Those held as code past
            # MAX_SCALARS are part of the key the steps are kept under (see realize).
            if not all(k in number for k in scalars.slots) or not all(
                    id(x) in number or id(x) in made for x in item.inputs) or not all(
                    id(n) in number for n in scalars.code):
                steps = None
            else:
                code += [number[id(n)] for n in scalars.code]
                made[id(root)] = len(steps)
                steps.append(_Step(
                    compiled, device(root.device), root.dtype, buffer.size, number.get(id(root)),
                    tuple((number[id(x)], 0) if id(x) in number else (None, made[id(x)])
                          for x in item.inputs),
                    tuple(number[id(n)] for n in scalars.nodes)))
        root.realize_as(buffer)
    _report(settings.debug, start, launched, {item.root.device for item in items})
    return steps, code


def _report(debug: int, start: float, launched: int, devices: set[str]) -> None:
    if debug >= 1 and devices:
        for name in devices:
            device(name).synchronize()
        print(f"portkit: realize ran {launched} kernels in "
              f"{(time.perf_counter() - start) * 1e3:.3f} ms", file=sys.stderr)


# -- realizing a graph seen before --------------------------------------------------------------
# A training step builds the same graph every step. The structure of the whole unrealized graph
# (realized inputs and numbers by position) keys the steps its first realize ran, so a later
# realize of that structure costs one walk, a look-up and the launches: no scheduling, no
# per-kernel keys.
_replays: runtime.LRU = runtime.LRU(runtime.kernel_cache_size())
runtime.on_clear(_replays.clear)


def _graph_key(outs: list[Lazy]) -> tuple[tuple, list[Lazy]]:
    """The structure of everything `realize(outs)` computes, and its nodes by position.

    One loop over the nodes in the order they are first seen (breadth first from `outs`: any
    order works that is the same for graphs of the same structure). Seeing a node numbers its
    sources, so its entry names them by number at once. Ops and dtypes go in by value and
    name: a str caches its hash where an Enum or a DType computes it in Python at every
    look-up (and an Enum's `_value_` skips the descriptor behind `.value`)."""
    number: dict[Lazy, int] = {}     # a Lazy hashes by identity, in C: no call per node
    nodes: list[Lazy] = []
    for node in outs:
        if node not in number:
            number[node] = len(nodes)
            nodes.append(node)
    entries: list[tuple] = []
    first: dict[tuple, int] = {}     # which constants are equal decides which share a VAR
    load, const, reduce, var_dtypes = GraphOp.LOAD, GraphOp.CONST, GraphOp.REDUCE, _VAR_DTYPE_NAMES
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
            arg = ("scalar", first.setdefault(_same_value(node), len(first)))
        elif isinstance(arg, float):
            arg = arg.hex()
        elif op is reduce:
            arg = (arg[0]._value_, arg[1])      # (Op, axes), the Op by value
        if len(src) == 1:
            src = (number[src[0]],)
        elif len(src) == 2:
            src = (number[src[0]], number[src[1]])
        elif src:
            src = tuple([number[s] for s in src])
        entries.append((op._value_, dtype, node.shape, node.device, arg, src))
    entries.append(tuple([number[o] for o in outs]))
    return tuple(entries), nodes


def _compile_ahead(items: list[ScheduleItem]) -> None:
    """Compiles the kernels of `items` that are not compiled yet on a pool of threads (compilers
    run as processes or release the GIL), so a first step's kernels compile side by side."""
    todo: dict[tuple, tuple[str, Kernel]] = {}
    for item in items:
        if _launches(item):
            key, scalars = _key(item)
            if key not in todo and _compiled.get(key) is None:
                todo[key] = item.root.device, _lower(item, key, scalars)
    if len(todo) < 2:
        return
    with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
        done = pool.map(lambda work: device(work[0]).compile(work[1]), todo.values())
        for key, compiled in zip(todo, done):
            _compiled[key] = compiled


def _replay(steps: list[_Step], nodes: list[Lazy]) -> None:
    settings, recorder = runtime.launch_settings(), recording()
    start = time.perf_counter() if settings.debug else 0.0
    made: list[runtime.Buffer] = []
    for step in steps:
        buffer = step.runtime.alloc(step.dtype, step.size)
        if step.compiled is not None:
            buffers = [buffer] + [made[k] if p is None else nodes[p].buffer
                                  for p, k in step.inputs]
            _launch(step.runtime, step.compiled, buffers, [nodes[p] for p in step.scalars],
                    settings, recorder, again=True)
        made.append(buffer)
        if step.root is not None:
            nodes[step.root].realize_as(buffer)
    if settings.debug:
        _report(settings.debug, start, sum(s.compiled is not None for s in steps),
                {s.runtime.name for s in steps})


class _ByValue(NamedTuple):
    """Kept under a graph's structure when its kernels hold numbers as code (a training step's
    backward kernels do): its steps are under the structure and the values at `positions`."""

    positions: tuple[int, ...]


def realize(outs: list[Lazy]) -> None:
    """Computes every node in `outs` into its own buffer."""
    load = GraphOp.LOAD
    if not [o for o in outs if o.op is not load]:   # .realize() or .numpy() of computed ones
        return
    structure_key, nodes = _graph_key(outs)
    steps = _replays.get(structure_key)
    if isinstance(steps, _ByValue):
        steps = _replays.get((structure_key, tuple(_same_value(nodes[p]) for p in steps.positions)))
    if steps is not None:
        _replay(steps, nodes)
        return
    items = schedule(outs)
    kernel_limits.check_sizes([i.root for i in items],
                              lambda name: device(name).capabilities.max_buffer_bytes)
    _compile_ahead(items)
    steps, code = _run(items, {id(n): k for k, n in enumerate(nodes)})
    if steps is not None and code:
        _replays[structure_key] = _ByValue(tuple(code))
        _replays[structure_key, tuple(_same_value(nodes[p]) for p in code)] = steps
    elif steps is not None:
        _replays[structure_key] = steps
