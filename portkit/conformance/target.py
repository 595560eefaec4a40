"""The backend under test, driven through its four Device parts and nothing else.

Conformance talks to the parts directly (render, compile, program, alloc, copyin, launch,
copyout) so that a fault is pinned on the part that has it, and so that a test can hand in a
Device whose parts are wrapped or broken on purpose.
"""
from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from portkit import cache
from portkit.abi import Device, Kernel
from portkit.abi.ops import COMPUTE
from portkit.conformance.case import Unsupported


class Target:
    """A loaded device plus a compile cache keyed by the kernel's JSON."""

    def __init__(self, device: Device, name: str | None = None):
        self.device = device
        self.name = name or device.name
        self.capabilities = device.capabilities
        self._compiled: dict[str, tuple[Any, str, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, name: str) -> Target:
        """The backend registered as `name`; raises BackendUnavailable with the fix."""
        try:
            from portkit import backends
        except ImportError:     # discovery not installed: the interpreter and reference backends
            module = ("portkit.abi.interpreter" if name == "interpreter"
                      else f"portkit.reference_backends.{name}")
            return cls(importlib.import_module(module).backend.load(), name)
        return cls(backends.load(name), name)

    def prepare(self, kernel: Kernel) -> Kernel:
        """`kernel` as this device can run it: ops it lacks decomposed, limits checked."""
        caps = self.capabilities
        lacking = sorted({n.dtype.name for n in kernel.nodes if n.dtype} -
                         {d.name for d in caps.dtypes})
        if lacking:
            raise Unsupported(f"backend declares no support for dtypes {lacking}")
        if any(n.op in COMPUTE and n.op not in caps.ops for n in kernel.nodes):
            kernel = _decompose(kernel, caps)
        caps.check_launch(kernel)
        return kernel

    def compile(self, kernel: Kernel, cached: bool = True) -> tuple[Any, str, float]:
        """(program, rendered source, compile seconds), cached per kernel in memory and, for
        binaries, on disk (portkit.cache); `cached=False` builds from scratch."""
        key = kernel.to_json()
        with self._lock:
            if cached and key in self._compiled:
                return self._compiled[key]
        start = time.perf_counter()
        source = self.device.renderer.render(kernel)
        if cached:
            binary = cache.compile_cached(self.name, self.device.compiler, source)
        else:
            binary = self.device.compiler.compile(source)
        program = self.device.program(kernel.name, binary)
        entry = (program, source, time.perf_counter() - start)
        with self._lock:
            self._compiled[key] = entry
        return entry

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
        program, _, _ = self.compile(kernel)
        with self.buffers(arrays) as handles:
            program(handles, list(scalars), kernel.grid, kernel.block)
            self.device.synchronize()
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
             repeats: int = 5, wall: bool = False, max_seconds: float = 5.0) -> list[float]:
        """Seconds per launch, `repeats` times after one warm-up launch (fewer, but at least 3,
        once `max_seconds` have passed): the seconds the program reports, or (with `wall`, or
        when it reports none) the host's clock."""
        program, _, _ = self.compile(kernel)
        times: list[float] = []
        with self.buffers(arrays) as handles:
            for i in range(repeats + 1):
                if len(times) >= min(3, repeats) and sum(times) > max_seconds:
                    break
                start = time.perf_counter()
                reported = program(handles, list(scalars), kernel.grid, kernel.block, wait=True)
                self.device.synchronize()
                elapsed = time.perf_counter() - start
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


def _decompose(kernel: Kernel, caps: Any) -> Kernel:
    missing = sorted({n.op.name for n in kernel.nodes if n.op in COMPUTE} -
                     {op.name for op in caps.ops})
    try:
        from portkit.codegen import decompose
    except ImportError:
        raise Unsupported(f"ops {missing} are not native and portkit.codegen.decompose is not "
                          "installed to rewrite them") from None
    return decompose.decompose(kernel, caps.ops)


def available() -> list[str]:
    """The names of the backends that load here; without portkit.backends, the interpreter and
    the CPU reference backend if it loads."""
    try:
        from portkit import backends
    except ImportError:
        return [name for name in ("interpreter", "cpu") if _loads(name)]
    return [name for name, reason in backends.available().items() if reason is None]


def _loads(name: str) -> bool:
    try:
        Target.load(name)
    except Exception:  # noqa: BLE001 - a backend that cannot load is not available
        return False
    return True
