"""One device, ready to use: its caches, its buffer pool and its launches.

    rt = runtime.get("cpu")
    out, = rt.run(kernel, np.zeros(16, np.float32))

This is the one device pipeline: `prepare` (decompose what the device lacks, fold a long grid,
check the launch), render, compile through the disk cache, make the program; and `run_program`,
the one place a program runs. The Tensor stack, the tuner and conformance all go through it.

PORTKIT_DEBUG=2 prints one line per launch (name, grid, block, time); 3 adds the kernel's JSON
and 4 its rendered source, both at a kernel's first launch. A realize or a replay reads it and
PORTKIT_CHECK once (`settings.launch()`) and hands them to each of its launches.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import cast

import numpy as np

from portkit import cache, settings
from portkit.abi import dtypes
from portkit.abi.backend import Batch, Capabilities, Compiler, Device, HostAllocator, Launch
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel, validate
from portkit.abi.ops import COMPUTE
from portkit.runtime import profile, progress
from portkit.runtime.memory import Buffer, BufferPool, LaunchError
from portkit.runtime.programs import LRU, Compiled


class OutOfBoundsError(LaunchError):
    """PORTKIT_CHECK found a LOAD or STORE outside its buffer (and did not perform it)."""


# Kernels in one batched compile at most: a clang process costs ~0.25 s of CPU besides its
# kernels (clang 14 -O2 on an empty file with the cpu kernels' headers), so 32 kernels pay it
# 1/32 each, and a model's or a suite's progress still moves.
BATCH = 32


def batch_sizes(count: int, jobs: int) -> list[int]:
    """The batches `count` kernels compile in on `jobs` threads: at most BATCH kernels each, as
    many batches as a multiple of `jobs` allows, of sizes within one of each other, so that
    every thread compiles about as many kernels (97 kernels on 2 threads: 25, 24, 24, 24,
    where batches of 32 left one thread compiling the fourth batch alone)."""
    if count <= 0:
        return []
    groups = -(-count // BATCH)
    groups = -(-groups // jobs) * jobs
    groups = min(groups, count)
    size, extra = divmod(count, groups)
    return [size + 1] * extra + [size] * (groups - extra)


def kernel_cache_size() -> int:
    """How many compiled kernels a cache keeps: PORTKIT_KERNEL_CACHE (default 1024)."""
    return settings.read("PORTKIT_KERNEL_CACHE")


class Runtime:
    """A loaded device with its caches and buffer pool. Get one with `get(name)`.

    Thread-safe: every call into the device (allocate, copy, make a program, launch, wait)
    holds `device_lock`, because drivers are not (an OpenCL kernel's arguments are set, then
    enqueued: two threads interleave them; wgpu-core panicked on buffers freed by another
    thread). Compiling runs outside it, so threads still compile in parallel.
    """

    def __init__(self, name: str, device: Device):
        self.name, self.device = name, device
        # the backend's name: the devices of one backend share its disk cache (a compiler's
        # cache_key names the target where a binary differs between them)
        self.backend = name.partition(":")[0]
        self.device_lock = threading.RLock()   # re-entrant: a Buffer may be freed inside a call
        self.pool = BufferPool(device.allocator, self.device_lock)
        # Programs of the most recent kernels (PORTKIT_KERNEL_CACHE, default 1024): one per
        # distinct shape otherwise grows without bound; an evicted program is unloaded when
        # its last launch reference goes.
        self._compiled: LRU = LRU(kernel_cache_size())
        self._lock = threading.Lock()     # conformance compiles on several threads
        self.builds = 0     # kernels rendered and compiled (through the disk cache) so far

    @property
    def capabilities(self) -> Capabilities:
        """What the device declares it supports."""
        return self.device.capabilities

    def alloc(self, dtype: DType, size: int) -> Buffer:
        """A buffer of `size` elements of `dtype` (contents undefined until written)."""
        return Buffer(self.pool, dtype, size)

    def share(self, dtype: DType, memory: np.ndarray) -> Buffer | None:
        """A buffer over the caller's host bytes `memory` (no copy; the caller keeps it alive
        through the buffer), or None where this device's buffers are not host memory."""
        if not isinstance(self.device.allocator, HostAllocator) or memory.dtype != np.uint8:
            return None
        return Buffer(self.pool, dtype, memory.size // dtype.itemsize, borrowed=memory)

    def copy_from(self, source: Runtime, buffer: Buffer, size: int) -> Buffer:
        """A new buffer on this device holding the first `size` elements of `buffer`, a buffer
        of device `source`: this device's `peer_copy` where it copies from that device (after
        `source` finishes its launched work), else through the host."""
        out = self.alloc(buffer.dtype, max(size, 1))
        if not size:
            return out
        peer = self.device.peer_copy
        if peer is not None:
            source.synchronize()
            with self.device_lock:
                done = peer(out.handle, source.device, buffer.handle, size * buffer.dtype.itemsize)
            if done:
                return out
        return out.copyin(buffer.numpy((size,)))

    def prepare(self, kernel: Kernel) -> Kernel:
        """`kernel` as this device runs it: ops it lacks decomposed, a name longer than the
        device takes shortened (its start and a hash), a grid longer than it takes folded
        (codegen/grid.py), checked against its limits."""
        capabilities = self.capabilities
        longest = capabilities.max_name_length
        if longest is not None and len(kernel.name) > longest:
            digest = hashlib.sha256(kernel.name.encode()).hexdigest()[:12]
            kernel = dataclasses.replace(kernel, name=f"{kernel.name[:longest - 13]}_{digest}")
        if {n.op for n in kernel.nodes if n.op in COMPUTE} - capabilities.ops:
            from portkit.codegen.decompose import decompose

            kernel = decompose(kernel, capabilities.ops)
        if any(g > m for g, m in zip(kernel.grid, capabilities.max_grid)):
            from portkit.codegen.grid import fold_grid

            kernel = fold_grid(kernel, capabilities.max_grid)
        validate(kernel)
        capabilities.check_launch(kernel)
        return kernel

    def build(self, kernel: Kernel, disk_cache: bool = True) -> Compiled:
        """Prepares, renders and compiles `kernel` now (through the disk cache unless told not
        to), bypassing the in-memory cache: for timing a compile."""
        start = time.perf_counter()
        with self._lock:
            self.builds += 1
        kernel = self.prepare(kernel)
        source = self.device.renderer.render(kernel)
        if disk_cache:
            binary = cache.compile_cached(self.backend, self.device.compiler, source)
        else:
            binary = self.device.compiler.compile(source)
        with self.device_lock:
            program = self.device.make_program(kernel, binary)
        seconds = time.perf_counter() - start
        if profile.current is not None:
            profile.current.add("compile", kernel.name, start, seconds, backend=self.name)
        return Compiled(kernel, source, program, seconds)

    def compile(self, kernel: Kernel) -> Compiled:
        """`build(kernel)`, once per kernel: later calls return the same Compiled."""
        # Keyed by the JSON form, not the Kernel: Kernel equality holds -0.0 == 0.0 and
        # NaN != NaN for CONST values, which would share or miss programs wrongly.
        key = kernel.to_json()
        with self._lock:
            compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.build(kernel)
            with self._lock:
                compiled = self._compiled.setdefault(key, compiled)
        return compiled

    def clear(self) -> None:
        """Forgets every compiled kernel and frees every pooled buffer."""
        with self._lock:
            self._compiled.clear()
        self.pool.clear()

    def launch(self, compiled: Compiled, buffers: list[Buffer], scalars: tuple = (),
               wait: bool = False, flags: settings.Launch | None = None) -> float | None:
        """Runs `compiled` on its own grid and block; with `wait`, returns the seconds it took.
        `scalars` are the VARs' values (ints or floats), in argument order; `flags`: the
        caller's `settings.launch()`, read now if not given."""
        flags = flags or settings.launch()
        _check_arguments(compiled, buffers, scalars)
        words = compiled.words(scalars)
        checked = self._checked(compiled) if flags.check == "compiled" else None
        if checked is not None:
            return self._launch_checked(compiled, checked, buffers, words, wait, flags.debug)
        if flags.check:
            _check_bounds(compiled.kernel, buffers, words)
        return self.run_program(compiled, [b.handle for b in buffers], words, wait, flags.debug)

    def _checked(self, compiled: Compiled) -> tuple | None:
        """`compiled`'s bounds-checked build, its Compiled and its zeroed fault buffer, made
        once; None where the fault buffer would exceed the device's buffer limit (the
        interpreter checks then)."""
        if compiled.checked is None:
            from portkit.codegen.check import bounds_checked

            checked = bounds_checked(compiled.kernel)
            if len(checked.kernel.params) > self.capabilities.max_buffers:
                compiled.checked = (checked, None, None)
            else:
                fault = self.alloc(dtypes.int32, checked.fault_words)
                fault.copyin(np.zeros(checked.fault_words, np.int32))
                compiled.checked = (checked, self.compile(checked.kernel), fault)
        return compiled.checked if compiled.checked[1] is not None else None

    def _launch_checked(self, compiled: Compiled, built: tuple, buffers: list[Buffer],
                        words: list, wait: bool, level: int) -> float | None:
        checked, program, fault = built
        sizes = [b.size for b in buffers]
        # The fault buffer stays zero until an access is out of bounds; it is the kernel's, so
        # the launch and its reading hold the device's lock together.
        with self.device_lock:
            seconds = self.run_program(program, [b.handle for b in buffers] + [fault.handle],
                                       sizes + words, wait, level)
            found = checked.fault(fault.numpy(), sizes)
            if found is not None:
                fault.copyin(np.zeros(checked.fault_words, np.int32))
        if found is not None:
            raise OutOfBoundsError(f"{found.message(compiled.kernel)} (PORTKIT_CHECK=1 skipped "
                                   f"it); the buffers hold {sizes} elements: fix the kernel's "
                                   "index or the buffer sizes")
        return seconds

    def launch_again(self, compiled: Compiled, buffers: list[Buffer], scalars: tuple,
                     words: list | None = None, flags: settings.Launch | None = None) -> None:
        """Runs `compiled` again on buffers and scalars of the kinds an earlier `launch` of it
        checked (a replay: the scheduler's of a graph seen before, portkit.jit's): no argument
        checks and no waiting. `words`: the scalars already packed (`compiled.words`);
        `flags`: the replay's `settings.launch()`. While PORTKIT_DEBUG or PORTKIT_CHECK is
        set it is `launch`, so each replayed launch is printed or checked."""
        flags = flags or settings.launch()
        if flags.debug or flags.check:
            self.launch(compiled, buffers, scalars, flags=flags)
            return
        words = compiled.words(scalars) if words is None else words
        self.run_program(compiled, [b.handle for b in buffers], words, False, 0)

    def run_program(self, compiled: Compiled, handles: list, words: list, wait: bool = False,
                    level: int = 0) -> float | None:
        """The one place a program runs: on the allocator's `handles` and the scalars' 32-bit
        `words`, under the device's lock; with `wait` (or PORTKIT_DEBUG `level` >= 2, which
        prints the launch) it waits and returns the seconds the program reports."""
        kernel = compiled.kernel
        tracing = profile.current
        if tracing is not None:
            start = time.perf_counter()
        with self.device_lock:
            seconds = compiled.program(handles, words, kernel.grid, kernel.block,
                                       wait=wait or level >= 2 or tracing is not None)
        if tracing is not None:
            took = seconds or (time.perf_counter() - start)
            tracing.add("kernel", kernel.name, start, took, self.name, grid=kernel.grid,
                        block=kernel.block, buffers=len(handles))
        if level >= 2:
            print_launch(compiled, seconds, level)
        return seconds if wait else None

    def batch(self, launches: list[tuple[Compiled, list, list]]) -> Batch:
        """The device's Batch (ABI 0.7) of `launches`, each (compiled, handles, words)."""
        with self.device_lock:
            return self.device.batch([Launch(c.program, handles, words, c.kernel.grid,
                                             c.kernel.block) for c, handles, words in launches])

    def run_batch(self, batch: Batch, buffers: list, scalars: list, kernels: list[Kernel]
                  ) -> None:
        """The one place a batch runs (a replay's): the launches of `kernels`, under the
        device's lock, after replacing its `buffers` and `scalars` (`Batch.__call__`). An open
        profile gets one span for the whole batch (named after its kernel if it has one, with
        every launch's kernel and grid), which then waits."""
        tracing = profile.current
        if tracing is None:
            with self.device_lock:
                batch(buffers, scalars)
            return
        start = time.perf_counter()
        with self.device_lock:
            seconds = batch(buffers, scalars, wait=True)
        one = kernels[0] if len(kernels) == 1 else None
        tracing.add("kernel", one.name if one else f"batch of {len(kernels)} launches", start,
                    seconds or (time.perf_counter() - start), self.name,
                    grid=one.grid if one else [k.grid for k in kernels],
                    block=one.block if one else [k.block for k in kernels],
                    kernels=[k.name for k in kernels])

    def run(self, kernel: Kernel, *arrays: np.ndarray, scalars: tuple = ()
            ) -> list[np.ndarray]:
        """Uploads `arrays` (one per PARAM, in order), launches, returns every param's array."""
        compiled = self.compile(kernel)
        params = compiled.kernel.params
        if len(arrays) != len(params):
            raise LaunchError(f"kernel {kernel.name!r} takes {len(params)} buffers, "
                              f"got {len(arrays)} arrays")
        arrays = tuple(np.asarray(a) for a in arrays)
        buffers = [self.alloc(p.value_dtype, a.size).copyin(a) for p, a in zip(params, arrays)]
        self.launch(compiled, buffers, scalars, wait=True)
        return [b.numpy().reshape(a.shape) for b, a in zip(buffers, arrays)]

    def time(self, compiled: Compiled, handles: list, words: list, repeats: int = 5,
             wall: bool = False, max_seconds: float = 5.0, give_up: float = float("inf"),
             batched: int = 0) -> list[float]:
        """The one kernel timer: seconds per launch of `compiled`, `repeats` times after one
        warm-up launch: the seconds the program reports, or (with `wall`, or when it reports
        none) the host's clock. It stops early, after at least min(3, repeats) launches, once
        `max_seconds` have passed, and after the first when that one took over `give_up`.
        With `batched` launches, each repeat is a replay of one batch of that many launches
        of `compiled` (`batch`, `run_batch`), by the host's clock, divided by `batched`."""
        level = settings.read("PORTKIT_DEBUG")
        batch = self.batch([(compiled, list(handles), list(words))
                            for _ in range(batched)]) if batched else None
        times: list[float] = []
        for i in range(repeats + 1):
            if len(times) >= min(3, repeats) and sum(times) > max_seconds:
                break
            start = time.perf_counter()
            if batch is None:
                reported = self.run_program(compiled, handles, words, True, level)
            else:
                self.run_batch(batch, [], [], [compiled.kernel] * batched)
                reported = None
            self.synchronize()
            elapsed = (time.perf_counter() - start) / max(batched, 1)
            if i:
                times.append(reported if reported and not wall else elapsed)
                if times[0] > give_up:
                    break
        return times

    def compile_all(self, kernels: Iterable[Kernel], jobs: int | None = None,
                    count: int | None = None) -> list[Compiled | Exception]:
        """`compile` of every kernel, on `jobs` threads side by side (default: one per core;
        compilers run as processes or release the GIL): a graph's or a suite's kernels compile
        together. A compiler with its own `compile_batch` (Compiler, ABI 0.6) gets the uncached
        sources in batches (`batch_sizes`); a batch that fails as a whole is compiled one by
        one, so each kernel that fails gives its own error. A kernel that fails gives its
        exception in its place. `kernels` may be made while they compile (a generator, with
        `count` the number of kernels to compile it will give): a batch starts as soon as it
        is full. Within `progress.reporting(report)`, `report(done, total)` follows each
        batch; without it, progress shows on stderr once the compile has taken
        PORTKIT_PROGRESS seconds."""
        # a caller's `count` includes kernels that turn out compiled already or the same as
        # another: they count as done, so that progress ends at count of count
        given = count is not None
        if count is None:
            kernels = list(kernels)
            keys = [kernel.to_json() for kernel in kernels]   # as `compile` keys them
            with self._lock:
                count = len({key for key in keys if self._compiled.get(key) is None})
            pairs: Iterable[tuple[Kernel, str]] = zip(kernels, keys)
        else:
            pairs = ((kernel, kernel.to_json()) for kernel in kernels)
        results: list[Compiled | Exception | None] = []
        jobs = max(1, min(count, jobs or os.cpu_count() or 1))
        batched = type(self.device.compiler).compile_batch is not Compiler.compile_batch
        sizes = iter(batch_sizes(count, jobs) if batched else [])
        report, shown = progress.hook(), contextlib.ExitStack()
        after = settings.read("PORTKIT_PROGRESS")
        if report is None and after is not None and count:
            report = shown.enter_context(progress.delayed(
                f"compiling {count} {self.name} kernel{'s' * (count > 1)}", after, count))
        places: dict[str, list[int]] = {}     # each kernel to compile: where it goes
        group: list[tuple[str, Kernel]] = []
        started: list[tuple[list[str], Future]] = []
        size, skipped = next(sizes, 1), 0
        with shown, ThreadPoolExecutor(jobs) as pool:
            for kernel, key in pairs:
                results.append(None)
                if key in places:
                    places[key].append(len(results) - 1)
                    skipped += given
                    continue
                with self._lock:
                    results[-1] = self._compiled.get(key)
                if results[-1] is not None:
                    skipped += given
                    continue
                places[key] = [len(results) - 1]
                group.append((key, kernel))
                if len(group) >= size:
                    started.append(self._start(pool, group, batched))
                    group, size = [], next(sizes, size)
            if group:
                started.append(self._start(pool, group, batched))
            done = 0
            for keys, future in started:
                for key, compiled in zip(keys, future.result()):
                    if not isinstance(compiled, Exception):
                        with self._lock:
                            compiled = self._compiled.setdefault(key, compiled)
                    for i in places[key]:
                        results[i] = compiled
                done += len(keys)
                if report is not None:
                    report(done + skipped, len(places) + skipped)
        return cast(list[Compiled | Exception], results)

    def _start(self, pool: ThreadPoolExecutor, group: list[tuple[str, Kernel]], batched: bool
               ) -> tuple[list[str], Future]:
        """One batch of `compile_all` started on `pool`: its keys and its future results."""
        kernels = [kernel for _, kernel in group]
        if batched:
            future = pool.submit(self._build_batch, kernels)
        else:
            future = pool.submit(lambda: [self._build_or_error(kernel) for kernel in kernels])
        return [key for key, _ in group], future

    def _build_or_error(self, kernel: Kernel) -> Compiled | Exception:
        try:
            return self.compile(kernel)
        except Exception as error:  # noqa: BLE001 - handed back to the caller, in place
            return error

    def _build_batch(self, kernels: list[Kernel]) -> list[Compiled | Exception]:
        """`build` of `kernels`, their sources compiled as one `compile_batch` through the
        disk cache; one by one if the batch fails as a whole, so each error is its kernel's."""
        start = time.perf_counter()
        made: list[tuple[Kernel, str] | Exception] = []
        names: dict[str, int] = {}
        for kernel in kernels:
            # a backend finds each kernel of a batch by its name: a repeated one gets a number
            names[kernel.name] = seen = names.get(kernel.name, 0) + 1
            if seen > 1:
                kernel = dataclasses.replace(kernel, name=f"{kernel.name}_{seen}")
            try:
                kernel = self.prepare(kernel)
                made.append((kernel, self.device.renderer.render(kernel)))
            except Exception as error:  # noqa: BLE001 - handed back in place
                made.append(error)
        ready = [m for m in made if not isinstance(m, Exception)]
        try:
            binaries = iter(cache.compile_batch_cached(
                self.backend, self.device.compiler, [source for _, source in ready]))
        except Exception:  # noqa: BLE001 - a CompileError of the whole batch, or worse
            return [self._build_or_error(kernel) for kernel in kernels]
        with self._lock:
            self.builds += len(ready)
        share = (time.perf_counter() - start) / max(1, len(ready))
        if profile.current is not None:
            profile.current.add("compile", f"compile_batch of {len(ready)}", start,
                                share * len(ready), backend=self.name)
        results: list[Compiled | Exception] = []
        for entry in made:
            if isinstance(entry, Exception):
                results.append(entry)
                continue
            binary = next(binaries)
            if isinstance(binary, Exception):
                results.append(binary)
                continue
            kernel, source = entry
            try:
                with self.device_lock:
                    program = self.device.make_program(kernel, binary)
            except Exception as error:  # noqa: BLE001 - handed back in place
                results.append(error)
                continue
            results.append(Compiled(kernel, source, program, share))
        return results

    def synchronize(self) -> None:
        """Waits until every launched kernel has finished."""
        with self.device_lock:
            self.device.synchronize()


def _check_bounds(kernel: Kernel, buffers: list[Buffer], words: list[int]) -> None:
    from portkit.abi.interpreter import OutOfBounds, run

    try:
        run(kernel, [b.numpy() for b in buffers], words)
    except OutOfBounds as error:
        raise OutOfBoundsError(f"{error} (PORTKIT_CHECK stopped the launch); the buffers "
                               f"hold {[b.size for b in buffers]} elements: fix the kernel's "
                               "index or the buffer sizes") from None


def _check_arguments(compiled: Compiled, buffers: list[Buffer], scalars: tuple) -> None:
    wanted = compiled.buffer_dtypes
    if len(buffers) != len(wanted) or len(scalars) != len(compiled.var_dtypes):
        kernel = compiled.kernel
        raise LaunchError(f"kernel {kernel.name!r} takes {len(wanted)} buffers and scalars "
                          f"{kernel.vars}, got {len(buffers)} buffers and {len(scalars)} scalars")
    for position, (dtype, buffer) in enumerate(zip(wanted, buffers)):
        if buffer.dtype != dtype:
            raise LaunchError(f"kernel {compiled.kernel.name!r}: buffer {position} must hold "
                              f"{dtype.name}, got {buffer.dtype.name}")


def print_launch(compiled: Compiled, seconds: float | None, level: int) -> None:
    """PORTKIT_DEBUG's line for one launch (level 2), with the kernel's JSON (3) and source
    (4) the first time a launch of it is printed."""
    kernel = compiled.kernel
    print(f"portkit: {kernel.name:<28} grid {kernel.grid} block {kernel.block} "
          f"{(seconds or 0.0) * 1e3:9.3f} ms", file=sys.stderr)
    if not compiled.shown and level >= 3:
        compiled.shown = True
        print(kernel.to_json(), file=sys.stderr)
        if level >= 4:
            print(compiled.source, file=sys.stderr)
