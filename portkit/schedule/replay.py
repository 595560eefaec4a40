"""The one replay engine: launches recorded once, run again on new buffers and new numbers.

Two callers record steps and replay them: `realize`, which keeps the steps a graph's first
realize ran under the graph's structure (runner.py), and `portkit.jit`, which keeps a whole
function's launches (portkit/jit.py). Both describe a launch as a `Step` and run it with `run`:
each input buffer is named by where a replay finds it (a table and a position in it), each
scalar argument is either fixed or read afresh from the call's numbers.

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
from portkit.abi.dtypes import DType
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

    def prepare(self, fresh: bool = True, kept: Sequence[Buffer] = (),
                owned: Callable[[int], Buffer | None] | None = None) -> None:
        """Fills in what does not change between replays: the output buffer unless `fresh`,
        the buffers of table KEPT (from `kept`) and those `owned(position)` gives for MADE."""
        self.fresh = fresh
        self.template = [None if fresh else self.runtime.alloc(self.dtype, self.size)]
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


def run(steps: Sequence[Step], tables: tuple[Sequence | None, ...], numbers: Any,
        report: Callable[[Step, list], None] | None = None,
        flags: settings.Launch | None = None) -> list[Buffer | None]:
    """Launches `steps` in order on the buffers `tables` name (MADE filled as they run) and the
    scalars read from `numbers`; returns the buffers the fresh steps wrote. `report(step,
    buffers)`, if given, hears of each launch; `flags`: the caller's `settings.launch()`."""
    flags = flags or settings.launch()       # once per replay, not per launch
    made: list[Buffer | None] = [None] * len(steps)
    args, state, _, kept = tables          # spelled out: a generator costs a microsecond
    found: tuple[Sequence, ...] = (args or (), state or (), made, kept or ())
    for k, step in enumerate(steps):
        buffers = step.template.copy()
        if step.fresh:
            buffers[0] = made[k] = step.runtime.alloc(step.dtype, step.size)
        if step.compiled is None:
            continue
        for slot, kind, position in step.fills:
            buffers[slot] = found[kind][position]
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
