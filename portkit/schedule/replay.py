"""The one replay engine: launches recorded once, run again on new buffers and new numbers.

Two callers record steps and replay them: `realize`, which keeps the steps a graph's first
realize ran under the graph's structure (runner.py), and `portkit.jit`, which keeps a whole
function's launches (portkit/jit.py). Both describe a launch as a `Step` and run it with `run`:
each input buffer is named by where a replay finds it (a table and a position in it), each
scalar argument is either fixed or read afresh from the call's numbers.

A caller that replays the same steps again and again hands `run` a `Queue` kept with them:
the steps' launches then become one device batch (`Runtime.batch`, ABI 0.7), made at the first
replay, and each later replay hands it only what changed (the new buffers and scalars) and
submits it whole (`Runtime.run_batch`). PORTKIT_DEBUG and PORTKIT_CHECK, a recorder, steps on
several devices or with copies between devices, and a queue busy in another thread launch one
by one instead. A copy between devices is a step too (`Step.copy_from`): a replay copies again,
in the steps' order, after the launches that wrote its source.

While a recorder is set (in this thread), every launch, upload, copy between devices and read
back to the host is reported to it: portkit.jit records a function's launches this way.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from portkit import settings
from portkit.abi.backend import Batch
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.runtime import Buffer, Compiled, Runtime
from portkit.schedule.keys import var_value

ARGS, STATE, MADE, KEPT = range(4)      # the tables a step's input buffers come from


@dataclass(eq=False)
class Step:
    """One launch of a replay: it writes a buffer of `size` elements of `dtype` and reads
    `sources`, each as (table, position) in the tables `run` is given."""

    runtime: Runtime
    compiled: Compiled | None   # None: a node of no elements, which needs no kernel
    dtype: DType
    size: int
    sources: tuple[tuple[int, int], ...]
    fixed: tuple = ()                   # the scalars' values as recorded
    # the scalars read afresh at every replay: (slot, read(numbers), dtype), where `numbers`
    # is what the caller hands `run` for this call
    traced: tuple[tuple[int, Callable[[Any], Any], DType], ...] = ()
    # made by `prepare`: the buffers a replay passes (None: filled per call, at `fills`), the
    # fixed scalars packed as the program takes them, and whether the output is a new buffer
    # each call (it outlives the call) or one the step owns
    template: list = field(default_factory=list)
    fills: list[tuple[int, int, int]] = field(default_factory=list)
    words: list[int] = field(default_factory=list)
    fresh: bool = True
    # a copy between devices, not a launch: the output is a new buffer on `runtime` holding
    # the one source, a buffer of this device (Runtime.copy_from)
    copy_from: Runtime | None = None

    def prepare(self, fresh: bool = True, kept: Sequence[Buffer] = (),
                owned: Callable[[int], Buffer | None] | None = None,
                output: Buffer | None = None) -> None:
        """Fills in what does not change between replays: the output buffer unless `fresh`
        (a copy's is always new; `output`, else a new one), the buffers of table KEPT (from
        `kept`) and those `owned(position)` gives for MADE."""
        self.fresh = fresh or self.copy_from is not None
        self.template = [None if self.fresh else
                         output or self.runtime.alloc(self.dtype, self.size)]
        for kind, position in self.sources:
            found = kept[position] if kind == KEPT else None
            if kind == MADE and owned is not None:
                found = owned(position)
            self.template.append(found)
        self.fills = [(slot, kind, position) for slot, (kind, position) in
                      enumerate(self.sources, 1) if self.template[slot] is None]
        if self.compiled is not None:
            self.words = self.compiled.words(self.fixed)

    def scalars(self, numbers: Any) -> tuple[tuple, list[int]]:
        """The scalars' values and words at this replay."""
        if not self.traced or self.compiled is None:
            return self.fixed, self.words
        values = list(self.fixed)
        for slot, read, dtype in self.traced:
            values[slot] = var_value(read(numbers), dtype)
        return tuple(values), self.compiled.words(values)


def prepare_owned(steps: Sequence[Step], outlive: set[int], kept: Sequence[Buffer]
                  ) -> list[Buffer]:
    """Prepares `steps` (`Step.prepare`) whose outputs, but those of `outlive`, lie in memory
    the caller owns, and returns that memory's blocks. An output's memory is written again by
    a later launch once the last launch reading it has run: each output takes the smallest
    dead block of its device that holds it (the first bytes of a larger one: `Buffer.within`),
    else a new block. A replay's working set is then near what is alive at once, not every
    intermediate: MobileNetV3's 78 outputs, 11 MB, fit 4.1 MB of blocks (1.9 MB alive at
    most), and its call after 0.3 s idle, its data gone from the core's caches, took 3.4 ms
    instead of 3.9 (one thread). Launch order on one device keeps a write after the reads."""
    dead: dict[int, list[int]] = {}     # step k -> the outputs no step after k reads
    last = {k: k for k in range(len(steps))}
    for k, step in enumerate(steps):
        for kind, position in step.sources:
            if kind == MADE:
                last[position] = k
    for position, k in last.items():
        if position not in outlive:
            dead.setdefault(k, []).append(position)
    free: dict[Runtime, list[Buffer]] = {}      # dead blocks, by device
    block: dict[int, Buffer] = {}               # the block step k's output lies in

    def owned(position: int) -> Buffer | None:
        return None if position in outlive else steps[position].template[0]

    for k, step in enumerate(steps):
        output, blocks = None, free.setdefault(step.runtime, [])
        fits = [b for b in blocks if b.nbytes >= step.size * step.dtype.itemsize]
        if fits and step.compiled is not None and k not in outlive:
            block[k] = min(fits, key=lambda b: b.nbytes)
            blocks.remove(block[k])
            output = block[k].within(step.dtype, step.size)
        step.prepare(k in outlive, kept, owned, output)
        if not step.fresh and step.compiled is not None:
            block.setdefault(k, step.template[0])
        for position in dead.get(k, ()):
            if position in block:
                free[steps[position].runtime].append(block[position])
    return list({id(b): b for b in block.values()}.values())


class Queue:
    """The steps of one plan as one device batch, made at their first replay through it: what
    each replay changes is listed once, so a replay costs a look-up per changed buffer and
    scalar, and one submission."""

    def __init__(self) -> None:
        self.batch: Batch | None = None
        self.runtime: Runtime | None = None
        self.usable = True      # False: steps on several devices, launched one by one
        self.busy = threading.Lock()
        self.kernels: list[Kernel] = []     # the launches', for a profile
        self.fresh: list[int] = []      # steps whose output is a new buffer at each replay
        # what a replay replaces: (launch, slot, table, position) and (launch, step)
        self.fills: list[tuple[int, int, int, int]] = []
        self.traced: list[tuple[int, int]] = []

    def run(self, steps: Sequence[Step], found: tuple[Sequence, ...], numbers: Any,
            made: list[Buffer | None]) -> None:
        """Allocates the fresh steps' outputs into `made` and runs every launch as one batch,
        reading buffers from `found` (the tables) and scalars from `numbers`."""
        for k in self.fresh:
            step = steps[k]
            made[k] = step.runtime.alloc(step.dtype, step.size)
        if self.batch is None:
            self._make(steps, found, numbers)
            buffers: list = []
            scalars: list = []
        else:
            buffers = [(launch, slot, found[kind][position].handle)
                       for launch, slot, kind, position in self.fills]
            scalars = [(launch, steps[k].scalars(numbers)[1]) for launch, k in self.traced]
        assert self.runtime is not None and self.batch is not None
        self.runtime.run_batch(self.batch, buffers, scalars, self.kernels)

    def _make(self, steps: Sequence[Step], found: tuple[Sequence, ...], numbers: Any) -> None:
        launches: list[tuple[Compiled, list, list[int]]] = []
        fills, traced = [], []
        for k, step in enumerate(steps):
            if step.compiled is None:
                continue
            launch = len(launches)
            buffers = [b.handle if b is not None else None for b in step.template]
            if step.fresh:
                buffers[0] = found[MADE][k].handle
                fills.append((launch, 0, MADE, k))
            for slot, kind, position in step.fills:
                buffers[slot] = found[kind][position].handle
                fills.append((launch, slot, kind, position))
            if step.traced:
                traced.append((launch, k))
            launches.append((step.compiled, buffers, step.scalars(numbers)[1]))
        assert self.runtime is not None     # set by `take`
        self.batch = self.runtime.batch(launches)
        self.kernels = [compiled.kernel for compiled, _, _ in launches]
        self.fills, self.traced = fills, traced

    def take(self, steps: Sequence[Step]) -> bool:
        """Whether `steps` can replay through this queue now; if so, it is this thread's until
        `busy` is released."""
        if self.runtime is None and self.usable:
            devices = {step.runtime for step in steps if step.compiled is not None}
            self.usable = len(devices) == 1 and all(s.copy_from is None for s in steps)
            self.runtime = devices.pop() if self.usable else None
            self.fresh = [k for k, step in enumerate(steps) if step.fresh]
        return self.usable and self.busy.acquire(blocking=False)


def run(steps: Sequence[Step], tables: tuple[Sequence | None, ...], numbers: Any,
        report: Callable[[Step, list], None] | None = None,
        flags: settings.Launch | None = None, queue: Queue | None = None
        ) -> list[Buffer | None]:
    """Launches `steps` in order on the buffers `tables` name (MADE filled as they run) and the
    scalars read from `numbers`; returns the buffers the fresh steps wrote. `report(step,
    buffers)`, if given, hears of each launch; `flags`: the caller's `settings.launch()`;
    `queue`: the steps' Queue, kept with them between replays, to run them as one batch."""
    flags = flags or settings.launch()       # once per replay, not per launch
    made: list[Buffer | None] = [None] * len(steps)
    args, state, _, kept = tables          # spelled out: a generator costs a microsecond
    found: tuple[Sequence, ...] = (args or (), state or (), made, kept or ())
    if (queue is not None and report is None and not flags.debug and not flags.check
            and queue.take(steps)):
        try:
            queue.run(steps, found, numbers, made)
        finally:
            queue.busy.release()
        return made
    for k, step in enumerate(steps):
        buffers = step.template.copy()
        for slot, kind, position in step.fills:
            buffers[slot] = found[kind][position]
        if step.copy_from is not None:
            buffers[0] = made[k] = step.runtime.copy_from(step.copy_from, buffers[1], step.size)
            if report is not None:
                report(step, buffers)
            continue
        if step.fresh:
            buffers[0] = made[k] = step.runtime.alloc(step.dtype, step.size)
        if step.compiled is None:
            continue
        values, words = step.scalars(numbers)
        step.runtime.launch_again(step.compiled, buffers, values, words, flags)
        if report is not None:
            report(step, buffers)
    return made


# -- capture (portkit.jit) ------------------------------------------------------------------
class _Capture(threading.local):
    # a class default, so that a thread that never recorded reads None without the
    # AttributeError a getattr default costs (0.4 us; a launch asks at every replay)
    recorder = None


_capture = _Capture()


def recording() -> Any:
    """The recorder of this thread's capture (portkit/jit.py), or None."""
    return _capture.recorder


@contextmanager
def record(recorder: Any) -> Iterator[Any]:
    """Reports this thread's launches to `recorder` inside the block."""
    previous, _capture.recorder = recording(), recorder
    try:
        yield recorder
    finally:
        _capture.recorder = previous
