"""The backend under test: its Runtime (the one device pipeline), driven part by part.

Kernels go through `portkit.runtime.Runtime` (decompose, check, render, compile, program), the
same pipeline the Tensor stack uses, and launch through its `run_program`, the one place a
program runs, so conformance checks what users run. Memory is driven through the Device's own
allocator (alloc, copyin, copyout) so that a fault is pinned on the part that has it, and so
that a test can hand in a Device whose parts are wrapped or broken on purpose.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from portkit import backends, settings
from portkit.abi import Device, Kernel
from portkit.conformance.case import Unsupported
from portkit.runtime import Runtime, get


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
        """Compiles `kernels` on `jobs` threads (Runtime.compile_all), so that running them
        later only launches. Errors are left for the run itself to report, with its case."""
        prepared = []
        for kernel in kernels:
            try:
                prepared.append(self.prepare(kernel))
            except Exception:  # noqa: BLE001, S112 - the case's own run reports it
                continue
        self.runtime.compile_all(prepared, jobs)

    def run(self, kernel: Kernel, arrays: Sequence[np.ndarray],
            scalars: Sequence[int] = ()) -> list[np.ndarray]:
        """Uploads `arrays` (one per PARAM), launches once, returns every buffer afterwards."""
        compiled = self.runtime.compile(kernel)
        with self.buffers(arrays) as handles:
            self.runtime.run_program(compiled, handles, list(scalars), True,
                                     settings.read("PORTKIT_DEBUG"))
            self.runtime.synchronize()
            return [self.read(h, a.dtype, a.size) for h, a in zip(handles, arrays)]

    def buffers(self, arrays: Sequence[np.ndarray]) -> _Buffers:
        """A context manager: device copies of `arrays`, freed on exit."""
        return _Buffers(self, arrays)

    def read(self, handle: Any, dtype: np.dtype, size: int) -> np.ndarray:
        """Copies `size` elements of `dtype` out of a device buffer."""
        host = np.empty(size * np.dtype(dtype).itemsize, np.uint8)
        self.device.allocator.copyout(memoryview(host), handle)
        return host.view(dtype)

    def time(self, kernel: Kernel, arrays: Sequence[np.ndarray], scalars: Sequence[int] = (),
             repeats: int = 5, wall: bool = False, max_seconds: float = 5.0, batched: int = 0
             ) -> list[float]:
        """Seconds per launch, `repeats` times after one warm-up launch (fewer, but at least 3,
        once `max_seconds` have passed): the seconds the program reports, or (with `wall`, or
        when it reports none) the host's clock; with `batched`, of a launch inside a replayed
        batch of that many (`Runtime.time`)."""
        compiled = self.runtime.compile(kernel)
        with self.buffers(arrays) as handles:
            return self.runtime.time(compiled, handles, list(scalars), repeats, wall,
                                     max_seconds, batched=batched)


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
