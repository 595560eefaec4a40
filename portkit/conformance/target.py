"""The backend under test: its Runtime (the one device pipeline), driven part by part.

Kernels go through `portkit.runtime.Runtime` (decompose, check, render, compile, program), the
same pipeline the Tensor stack uses, so conformance checks what users run. Memory and launches
are driven through the Device's own parts (alloc, copyin, program, copyout) so that a fault is
pinned on the part that has it, and so that a test can hand in a Device whose parts are wrapped
or broken on purpose.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from portkit import backends
from portkit.abi import Device, Kernel
from portkit.conformance.case import Unsupported
from portkit.runtime import Compiled, Runtime, debug_level, get, print_launch


class Target:
    """A loaded device and the Runtime that compiles for it (its cache keyed by kernel JSON)."""

    def __init__(self, device: Device, name: str | None = None, runtime: Runtime | None = None,
                 origin: str | None = None):
        self.runtime = runtime or Runtime(name or device.name, device)
        self.device = device
        self.name = self.runtime.name
        self.capabilities = device.capabilities
        # The entry point ("module:attribute") the backend was loaded from, so that a worker
        # process can load it again; None for a Device handed in directly.
        self.origin = origin

    @classmethod
    def load(cls, name: str) -> Target:
        """The backend registered as `name`; raises BackendUnavailable with the fix."""
        found = get(name)
        point = backends.entry_point(name)
        return cls(found.device, name, found, point.value if point else None)

    def prepare(self, kernel: Kernel) -> Kernel:
        """`kernel` as this device can run it: ops it lacks decomposed, limits checked."""
        lacking = sorted({n.dtype.name for n in kernel.nodes if n.dtype} -
                         {d.name for d in self.capabilities.dtypes})
        if lacking:
            raise Unsupported(f"backend declares no support for dtypes {lacking}")
        return self.runtime.prepare(kernel)

    def compile(self, kernel: Kernel, cached: bool = True) -> tuple[Any, str, float]:
        """(program, rendered source, compile seconds), cached per kernel in memory and, for
        binaries, on disk (portkit.cache); `cached=False` builds from scratch."""
        compiled = self.runtime.compile(kernel) if cached else self.runtime.build(
            kernel, disk_cache=False)
        return compiled.program, compiled.source, compiled.seconds

    def precompile(self, kernels: Sequence[Kernel], jobs: int) -> None:
        """Compiles `kernels` on `jobs` threads, so that running them later only launches.
        Errors are left for the run itself to report, with its case."""
        def build(kernel: Kernel) -> None:
            try:
                self.compile(self.prepare(kernel))
            except Exception:  # noqa: BLE001, S110 - the case's own run reports it
                pass

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(build, kernels))

    def run(self, kernel: Kernel, arrays: Sequence[np.ndarray],
            scalars: Sequence[int] = ()) -> list[np.ndarray]:
        """Uploads `arrays` (one per PARAM), launches once, returns every buffer afterwards."""
        compiled, level = self.runtime.compile(kernel), debug_level()
        with self.buffers(arrays) as handles:
            seconds = compiled.program(handles, list(scalars), kernel.grid, kernel.block,
                                       wait=level >= 2)
            self.device.synchronize()
            self._debug(compiled, seconds, level)
            return [self.read(h, a.dtype, a.size) for h, a in zip(handles, arrays)]

    @staticmethod
    def _debug(compiled: Compiled, seconds: float | None, level: int) -> None:
        """What PORTKIT_DEBUG prints for a launch through the Runtime, for this one too."""
        if level >= 2:
            print_launch(compiled, seconds, level)
            compiled.launched = True

    def buffers(self, arrays: Sequence[np.ndarray]) -> _Buffers:
        """A context manager: device copies of `arrays`, freed on exit."""
        return _Buffers(self, arrays)

    def read(self, handle: Any, dtype: np.dtype, size: int) -> np.ndarray:
        """Copies `size` elements of `dtype` out of a device buffer."""
        host = np.empty(size * np.dtype(dtype).itemsize, np.uint8)
        self.device.allocator.copyout(memoryview(host), handle)
        return host.view(dtype)

    def time(self, kernel: Kernel, arrays: Sequence[np.ndarray], scalars: Sequence[int] = (),
             repeats: int = 5, wall: bool = False, max_seconds: float = 5.0) -> list[float]:
        """Seconds per launch, `repeats` times after one warm-up launch (fewer, but at least 3,
        once `max_seconds` have passed): the seconds the program reports, or (with `wall`, or
        when it reports none) the host's clock."""
        compiled, level = self.runtime.compile(kernel), debug_level()
        times: list[float] = []
        with self.buffers(arrays) as handles:
            for i in range(repeats + 1):
                if len(times) >= min(3, repeats) and sum(times) > max_seconds:
                    break
                start = time.perf_counter()
                reported = compiled.program(handles, list(scalars), kernel.grid, kernel.block,
                                            wait=True)
                self.device.synchronize()
                elapsed = time.perf_counter() - start
                self._debug(compiled, reported, level)
                if i:
                    times.append(reported if reported and not wall else elapsed)
        return times


class _Buffers:
    def __init__(self, target: Target, arrays: Sequence[np.ndarray]):
        self.target, self.arrays, self.handles = target, arrays, []

    def __enter__(self) -> list[Any]:
        allocator = self.target.device.allocator
        for array in self.arrays:
            raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
            handle = allocator.alloc(raw.nbytes)
            self.handles.append((handle, raw.nbytes))
            allocator.copyin(handle, memoryview(raw))
        return [h for h, _ in self.handles]

    def __exit__(self, *exc: object) -> None:
        for handle, nbytes in self.handles:
            self.target.device.allocator.free(handle, nbytes)


def available() -> list[str]:
    """The names of the backends that load here."""
    return [name for name, reason in backends.available().items() if reason is None]
