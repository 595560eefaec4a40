"""The tuner: times a matmul kernel's candidate LOCAL tilings on its device and keeps the fastest.

With PORTKIT_BEAM=N, the first time a matmul-shaped kernel structure is lowered for a device
with workgroup memory, the first N tilings of codegen/tiles.py that fit the device, and the
untiled lowering, are each lowered, compiled and timed on the device itself (zero inputs, the
median of a few launches). The winner goes to the on-disk cache (portkit/cache.py), keyed by the
device's name and the structure (shapes, axes, dtype, operand layouts), and every later lowering,
in this process or another, reads it; so does `portkit tune`, which tunes one matmul shape.
Without a stored choice the default heuristics of tiles.py apply. The search shows a progress
bar and reports the time it took on stderr.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from math import prod

import numpy as np
from rich.console import Console
from rich.progress import Progress

from portkit import cache
from portkit.abi.backend import Capabilities
from portkit.abi.kernel import Kernel
from portkit.codegen import tiles
from portkit.codegen.lower import lower
from portkit.codegen.plan import load_steps
from portkit.graph import Lazy

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


def beam() -> int:
    """PORTKIT_BEAM: how many tilings a search times (0, the default: no search)."""
    value = os.environ.get("PORTKIT_BEAM", "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise ValueError(f"PORTKIT_BEAM={value!r} is not a count: use a whole number, e.g. 4")
    return int(value)


def contraction(root: Lazy, inputs: list[Lazy], caps: Capabilities) -> tiles.Contraction | None:
    """The LOCAL-tileable matmul `root` computes on `caps`, or None."""
    return tiles.find(root, inputs, caps, lambda node, name: load_steps(node, inputs, name))


def stored(caps: Capabilities, found: tiles.Contraction) -> tiles.Tiling | None:
    """The tiling a search stored for `found` on this device, or None."""
    choice = cache.tuned(caps.device_name, found.key())
    names = {f.name for f in fields(tiles.Tiling)}
    if not isinstance(choice, dict) or set(choice) != names:
        return None
    return tiles.Tiling(**choice)


def search(runtime, root: Lazy, inputs: list[Lazy], width: int, timer: Timer | None = None,
           scalars: Sequence[Lazy] = (), slots: dict[int, int] | None = None,
           progress: bool = True) -> Search | None:
    """Times up to `width` tilings and the untiled kernel of `root` on `runtime`'s device (or
    with `timer`), stores the fastest and returns the search; None if nothing is to tune."""
    caps = runtime.capabilities
    found = contraction(root, inputs, caps)
    if found is None:
        return None
    # the candidates this kernel can take (tile and grid fit), then the default and untiled
    options = [t for t in tiles.CANDIDATES if tiles.choose(found, caps, t) == t][:width]
    default = tiles.choose(found, caps) or tiles.UNTILED
    options += [t for t in dict.fromkeys((default, tiles.UNTILED)) if t not in options]
    timer = timer or _device_timer(runtime, [prod(root.shape)] + [prod(x.shape) for x in inputs])
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


def ensure(runtime, root: Lazy, inputs: list[Lazy], scalars: Sequence[Lazy] = (),
           slots: dict[int, int] | None = None) -> None:
    """Searches `root`'s tilings when PORTKIT_BEAM asks and no choice is stored yet."""
    width = beam()
    if not width:
        return
    found = contraction(root, inputs, runtime.capabilities)
    if found is not None and stored(runtime.capabilities, found) is None:
        search(runtime, root, inputs, width, scalars=scalars, slots=slots)


def _describe(tiling: tiles.Tiling) -> str:
    if tiling == tiles.UNTILED:
        return "untiled"
    return (f"{tiling.block_m}x{tiling.block_n}x{tiling.depth} tiles, "
            f"{tiling.per_thread_m}x{tiling.per_thread_n} per thread"
            + (" (adjacent)" if tiling.contiguous else ""))


def _device_timer(runtime, sizes: list[int]) -> Timer:
    """Times a kernel on `runtime` with zero buffers of `sizes` elements and zero scalars: one
    warm-up launch, then the median of a few; a candidate whose first timed launch is over
    _GIVE_UP times the best median so far is not launched again (it cannot win)."""
    best = [float("inf")]

    def timed(kernel: Kernel) -> float:
        compiled = runtime.compile(kernel)
        buffers = [runtime.alloc(p.dtype, size).copyin(np.zeros(size, p.dtype.np))
                   for p, size in zip(compiled.kernel.params, sizes)]
        scalars = tuple(0 for _ in compiled.kernel.vars)
        runtime.launch(compiled, buffers, scalars, wait=True)
        seconds = [runtime.launch(compiled, buffers, scalars, wait=True)]
        if seconds[0] > _GIVE_UP * best[0]:
            return seconds[0]
        seconds += [runtime.launch(compiled, buffers, scalars, wait=True)
                    for _ in range(_REPEATS - 1)]
        best[0] = min(best[0], statistics.median(seconds))
        return statistics.median(seconds)
    return timed


def _run(args: argparse.Namespace) -> int:
    from portkit import runtime, schedule
    from portkit.tensor import Tensor

    m, k, n = args.shape
    rt = runtime.get(args.device)
    left = Tensor(np.zeros((m, k), np.float32), device=args.device)
    right = Tensor(np.zeros((n, k) if args.transposed else (k, n), np.float32),
                   device=args.device)
    product = left @ (right.T if args.transposed else right)
    item, = schedule.create_schedule([product.lazy])
    if search(rt, item.root, item.inputs, args.beam) is None:
        Console(stderr=True).print(f"portkit tune: nothing to tune on {args.device}: it has "
                                   "no workgroup memory, or its threads are loops")
        return 1
    return 0


def register(subparsers) -> None:
    """Adds `portkit tune` to the command line."""
    parser = subparsers.add_parser("tune", help="time a matmul's LOCAL tilings on a device and "
                                   "keep the fastest in the cache")
    parser.add_argument("--device", required=True, help="backend name, e.g. opencl")
    parser.add_argument("--shape", type=int, nargs=3, metavar=("M", "K", "N"),
                        default=(1024, 1024, 1024))
    parser.add_argument("--transposed", action="store_true", help="time x @ W.T (W is N x K)")
    parser.add_argument("--beam", type=int, default=len(tiles.CANDIDATES),
                        help="how many tilings to time (default: all)")
    parser.set_defaults(run=_run)
