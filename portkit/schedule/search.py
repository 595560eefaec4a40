"""The tuner: times a matmul kernel's candidate LOCAL tilings on its device and keeps the fastest.

With PORTKIT_BEAM=N, the first time a matmul-shaped kernel structure is lowered for a device
with workgroup memory, the first N tilings of codegen/tiles.py that fit the device, and the
untiled lowering, are each lowered, compiled and timed on the device itself (zero inputs, the
median of a few launches, Runtime.time). The winner goes to the on-disk cache, where lowering
reads it (codegen/tune.py); so does `portkit tune`, which tunes one matmul shape. The search
shows a progress bar and reports the time it took on stderr.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from math import prod

import numpy as np
from rich.console import Console
from rich.progress import Progress

from portkit import cache, runtime, settings
from portkit.abi.kernel import Kernel
from portkit.codegen import tiles
from portkit.codegen.lower import lower
from portkit.codegen.tune import contraction, stored
from portkit.graph import Lazy
from portkit.schedule.keys import scalar_values

Timer = Callable[[Kernel], float]     # seconds one launch of the kernel takes on the device
_REPEATS = 3
_GIVE_UP = 3


@dataclass(frozen=True)
class Search:
    """What a search found: the winner (tiles.UNTILED: no LOCAL tiling), every candidate's
    seconds, and how long the search took."""

    choice: tiles.Tiling
    seconds: dict[tiles.Tiling, float]
    search_seconds: float


def search(rt: runtime.Runtime, root: Lazy, inputs: list[Lazy], width: int,
           timer: Timer | None = None, scalars: Sequence[Lazy] = (),
           slots: dict[int, int] | None = None,
           progress: bool = True) -> Search | None:
    """Times up to `width` tilings and the untiled kernel of `root` on `rt`'s device (or
    with `timer`), stores the fastest and returns the search; None if nothing is to tune."""
    caps = rt.capabilities
    found = contraction(root, inputs, caps)
    if found is None:
        return None
    # the candidates this kernel can take (tile and grid fit), then the default and untiled
    options = [t for t in tiles.CANDIDATES if tiles.choose(found, caps, t) == t][:width]
    default = tiles.choose(found, caps) or tiles.UNTILED
    options += [t for t in dict.fromkeys((default, tiles.UNTILED)) if t not in options]
    timer = timer or _device_timer(rt, [prod(root.shape)] + [prod(x.shape) for x in inputs],
                                   scalar_values(list(scalars)))
    start = time.perf_counter()
    seconds: dict[tiles.Tiling, float] = {}
    with Progress(transient=True, disable=not progress,
                  console=Console(stderr=True)) as bar:
        task = bar.add_task(f"tuning {found.key()}", total=len(options))
        for option in options:
            kernel = lower(root, inputs, caps, name="tune", scalars=scalars, slots=slots,
                           local=option)
            seconds[option] = timer(kernel)
            bar.advance(task)
    choice = min(seconds, key=seconds.__getitem__)
    cache.keep_tuned(caps.device_name, found.key(), asdict(choice))
    result = Search(choice, seconds, time.perf_counter() - start)
    if progress:
        Console(stderr=True).print(
            f"portkit tune: {found.key()} on {caps.device_name}: "
            f"{_describe(choice)} at {seconds[choice] * 1e3:.3g} ms, default "
            f"{_describe(default)} at {seconds[default] * 1e3:.3g} ms; "
            f"{len(options)} candidates in {result.search_seconds:.1f} s")
    return result


def ensure(rt: runtime.Runtime, root: Lazy, inputs: list[Lazy], scalars: Sequence[Lazy] = (),
           slots: dict[int, int] | None = None) -> None:
    """Searches `root`'s tilings when PORTKIT_BEAM asks and no choice is stored yet."""
    width = settings.read("PORTKIT_BEAM")
    if not width:
        return
    found = contraction(root, inputs, rt.capabilities)
    if found is not None and stored(rt.capabilities, found) is None:
        search(rt, root, inputs, width, scalars=scalars, slots=slots)


def _describe(tiling: tiles.Tiling) -> str:
    if tiling == tiles.UNTILED:
        return "untiled"
    return (f"{tiling.block_m}x{tiling.block_n}x{tiling.depth} tiles, "
            f"{tiling.per_thread_m}x{tiling.per_thread_n} per thread"
            + (" (adjacent)" if tiling.contiguous else ""))


def _device_timer(rt: runtime.Runtime, sizes: list[int], values: tuple = ()) -> Timer:
    """Times a kernel on `rt` with zero buffers of `sizes` elements and its scalars' `values`
    (a view's offset VAR reads inside its buffer only at its own offset): the median of a few
    launches after a warm-up; a candidate whose first timed launch is over _GIVE_UP times the
    best median so far is not launched again (it cannot win)."""
    best = [float("inf")]

    def timed(kernel: Kernel) -> float:
        compiled = rt.compile(kernel)
        buffers = [rt.alloc(p.value_dtype, size).copyin(np.zeros(size, p.value_dtype.np))
                   for p, size in zip(compiled.kernel.params, sizes)]
        words = compiled.words(values or tuple(0 for _ in compiled.kernel.vars))
        seconds = rt.time(compiled, [b.handle for b in buffers], words, repeats=_REPEATS,
                          give_up=_GIVE_UP * best[0])
        median = statistics.median(seconds)
        if len(seconds) == _REPEATS:
            best[0] = min(best[0], median)
        return median
    return timed
