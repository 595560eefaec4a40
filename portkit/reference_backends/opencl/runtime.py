"""Runtime: device memory (Allocator), the toolchain (Compiler) and kernel launches (Program).

All three go through pyopencl to the OpenCL driver. The Compiler builds a program and returns
the driver's binary, which the disk cache keeps; loading a kernel rebuilds the program from that
binary, so a warm cache skips the compiler. OpenCL's global size counts threads, not
workgroups: global = grid * block. A Batch enqueues all its launches on the in-order queue at
once, each with a kernel object of its own whose arguments stay set between replays, held back
until the last is queued.

PoCL keeps a kernel cache of its own (POCL_CACHE_DIR, else ~/.cache/pocl), and PoCL 3.1 crashes
when two processes touch one program's folder there at once (a segfault reading a program's
binaries, an assertion loading one). On PoCL every build, load and first launch therefore holds
a file lock beside that cache; other drivers need none.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from pathlib import Path
from typing import cast

import numpy as np
import platformdirs

try:
    import pyopencl as cl
    from filelock import FileLock
except ImportError:   # device.find_device reports the backend unavailable, with the fix
    cl = None

from portkit.abi.backend import Allocator, Batch, Compiler, Launch, Program
from portkit.abi.errors import CompileError
from portkit.codegen.cstyle import compile_joined, function_name

# No -cl-fast-relaxed-math or -cl-mad-enable: they change float results.
# -w: warnings (e.g. `x || 0` from constant folding) are for hand-written code.
OPTIONS = ["-cl-fp32-correctly-rounded-divide-sqrt", "-w"]
POCL = "Portable Computing Language"


def driver_lock(device) -> contextlib.AbstractContextManager:
    """Serializes, across threads and processes, what writes the driver's own kernel cache:
    a file lock beside PoCL's cache on PoCL, nothing on other drivers."""
    if device.platform.name != POCL:
        return contextlib.nullcontext()
    folder = Path(os.environ.get("POCL_CACHE_DIR") or platformdirs.user_cache_path("pocl"))
    folder.mkdir(parents=True, exist_ok=True)
    return FileLock(folder / "portkit.lock")


class OpenCLAllocator(Allocator):
    """Device buffers; copies block so the host memory may be reused at once."""

    def __init__(self, context, queue):
        self.context, self.queue = context, queue

    def alloc(self, nbytes: int):
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))  # 0 is invalid

    def free(self, buffer, nbytes: int) -> None:
        buffer.release()

    def copyin(self, buffer, source: memoryview) -> None:
        if source.nbytes:
            cl.enqueue_copy(self.queue, buffer, source, is_blocking=True)

    def copyout(self, destination: memoryview, buffer) -> None:
        if destination.nbytes:
            cl.enqueue_copy(self.queue, np.frombuffer(destination, np.uint8), buffer,
                            is_blocking=True)


class OpenCLCompiler(Compiler):
    """Builds OpenCL C for one device; the binary is whatever the driver's program holds."""

    def __init__(self, context, device):
        self.context, self.device = context, device
        self.lock = driver_lock(device)
        self.loaded: dict[bytes, cl.Program] = {}
        # "locked": binaries cached before the lock may have been read while half written
        self.cache_key = "|".join((device.platform.version, device.name, device.version,
                                   device.driver_version, *OPTIONS, "locked"))

    def compile(self, source: str) -> bytes:
        with self.lock:
            try:
                program = cl.Program(self.context, source).build(OPTIONS, [self.device])
            except cl.RuntimeError as error:
                raise CompileError("the OpenCL compiler rejected the kernel (the source is in "
                                   ".source)", source, str(error)) from None
            return program.binaries[0]

    def compile_batch(self, sources: list[str]) -> list[bytes | CompileError]:
        """All `sources` as one OpenCL program (cstyle.compile_joined): its binary is every
        source's and each program finds its kernel by name. Raises CompileError if the build
        fails."""
        return compile_joined(self.compile, sources)

    def load(self, binary: bytes):
        """The program built from `binary`, once per binary: a batch's kernels share one."""
        digest = hashlib.sha256(binary).digest()
        with self.lock:
            program = self.loaded.get(digest)
            if program is None:
                program = cl.Program(self.context, [self.device], [binary]).build(OPTIONS)
                self.loaded[digest] = program
                if len(self.loaded) > 16:     # a batch's programs are made one after another
                    del self.loaded[next(iter(self.loaded))]
        return program


class OpenCLProgram(Program):
    """A kernel loaded from a program binary, launched on the device's in-order queue."""

    def __init__(self, compiler: OpenCLCompiler, queue, name: str, binary: bytes):
        self.queue, self.lock, self.launched = queue, compiler.lock, False
        self.program, self.function = compiler.load(binary), function_name(name)
        with self.lock:
            self.kernel = cl.Kernel(self.program, self.function)

    def __call__(self, buffers, scalars, grid, block, wait: bool = False) -> float | None:
        if not self.launched:
            # Telling pyopencl which arguments are int32 scalars lets it set them through a
            # generated setter: 0.6 us for five arguments instead of 7.7.
            self.kernel.set_scalar_arg_dtypes([None] * len(buffers) + [np.int32] * len(scalars))
        self.kernel.set_args(*buffers, *scalars)
        launch = functools.partial(cl.enqueue_nd_range_kernel, self.queue, self.kernel,
                                   [g * b for g, b in zip(grid, block)], list(block))
        if self.launched:
            event = launch()
        else:   # the first launch builds the work-group function into the driver's cache
            with self.lock:
                event = launch()
                event.wait()
            self.launched = True
        if not wait:
            return None
        event.wait()
        return (event.profile.end - event.profile.start) * 1e-9


class OpenCLBatch(Batch):
    """Launches enqueued one after another on the in-order queue, with one wait for them all
    when asked to; only a launch whose buffers or scalars were replaced sets its arguments."""

    def __init__(self, queue, launches: list[Launch]):
        self.queue, self.ready = queue, False
        self.launches: list[tuple] = []
        for launch in launches:
            program = cast(OpenCLProgram, launch.program)
            with program.lock:
                kernel = cl.Kernel(program.program, program.function)
            kernel.set_scalar_arg_dtypes([None] * len(launch.buffers)
                                         + [np.int32] * len(launch.scalars))
            kernel.set_args(*launch.buffers, *launch.scalars)
            self.launches.append((kernel, list(launch.buffers), list(launch.scalars),
                                  tuple(g * b for g, b in zip(launch.grid, launch.block)),
                                  tuple(launch.block), program))

    def __call__(self, buffers=(), scalars=(), wait: bool = False) -> float | None:
        changed = set()
        for launch, position, buffer in buffers:
            self.launches[launch][1][position] = buffer
            changed.add(launch)
        for launch, words in scalars:
            self.launches[launch][2][:] = words
            changed.add(launch)
        if not self.launches:
            return 0.0 if wait else None
        for launch in changed:
            kernel, handles, words = self.launches[launch][:3]
            kernel.set_args(*handles, *words)
        if not self.ready:      # a first launch builds the work-group functions (see Program)
            with self.launches[0][5].lock:
                events = self._enqueue()
                events[-1].wait()
            for launch in self.launches:
                launch[5].launched = True
            self.ready = True
        else:
            events = self._enqueue()
        if not wait:
            return None
        events[-1].wait()
        return (events[-1].profile.end - events[0].profile.start) * 1e-9

    def _enqueue(self) -> list:
        """Every launch, the first waiting on a user event that completes once all are queued:
        the in-order queue then holds them all, and the device runs them in one go. Queued
        while the device ran, each launch woke PoCL's workers for its one kernel: 4-11 us of
        CPU a launch, against 2-3 behind the event (a chain of 400 tiny kernels)."""
        gate = cl.UserEvent(self.queue.context)
        try:
            (kernel, _, _, size, block, _), *rest = self.launches
            events = [cl.enqueue_nd_range_kernel(self.queue, kernel, size, block,
                                                 wait_for=[gate])]
            events += [cl.enqueue_nd_range_kernel(self.queue, kernel, size, block)
                       for kernel, _, _, size, block, _ in rest]
        finally:    # even when a launch failed: the launches before it must not wait forever
            gate.set_status(cl.command_execution_status.COMPLETE)
        return events
