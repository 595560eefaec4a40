"""The OpenCL reference backend: OpenCL C built by the driver (PoCL on a CPU), run via pyopencl.

The Compiler builds a program and returns the driver's binary, which the disk cache keeps;
loading a kernel rebuilds the program from that binary, so a warm cache skips the compiler.
OpenCL's global size counts threads, not workgroups: global = grid * block.
"""
from __future__ import annotations

import numpy as np

try:
    import pyopencl as cl
except ImportError:   # the backend then reports itself unavailable, with the fix
    cl = None

from portkit.abi import dtypes
from portkit.abi.backend import Allocator, Backend, Capabilities, Compiler, Device, Program
from portkit.abi.errors import BackendUnavailable, CompileError
from portkit.abi.ops import COMPUTE
from portkit.codegen.cstyle import function_name
from portkit.reference_backends.opencl.renderer import OpenCLRenderer

# No -cl-fast-relaxed-math or -cl-mad-enable: they change float results.
# -w: warnings (e.g. `x || 0` from constant folding) are for hand-written code.
OPTIONS = ["-cl-fp32-correctly-rounded-divide-sqrt", "-w"]


class CLCompiler(Compiler):
    """Builds OpenCL C for one device; the binary is whatever the driver's program holds."""

    def __init__(self, context, device):
        self.context, self.device = context, device
        self.cache_key = "|".join((device.platform.version, device.name, device.version,
                                   device.driver_version, *OPTIONS))

    def compile(self, source: str) -> bytes:
        try:
            program = cl.Program(self.context, source).build(OPTIONS, [self.device])
        except cl.RuntimeError as error:
            raise CompileError("the OpenCL compiler rejected the kernel (the source is in "
                               ".source)", source, str(error)) from None
        return program.binaries[0]


class CLProgram(Program):
    """A kernel loaded from a program binary, launched on the device's in-order queue."""

    def __init__(self, compiler: CLCompiler, queue, name: str, binary: bytes):
        self.queue = queue
        program = cl.Program(compiler.context, [compiler.device], [binary]).build(OPTIONS)
        self.kernel = cl.Kernel(program, function_name(name))

    def __call__(self, buffers, scalars, grid, block, wait: bool = False) -> float | None:
        self.kernel.set_args(*buffers, *(np.int32(s) for s in scalars))
        event = cl.enqueue_nd_range_kernel(
            self.queue, self.kernel, [g * b for g, b in zip(grid, block)], list(block))
        if not wait:
            return None
        event.wait()
        return (event.profile.end - event.profile.start) * 1e-9


class CLAllocator(Allocator):
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


def capabilities(device) -> Capabilities:
    """What `device` (a pyopencl Device) can do, read from its properties and extensions."""
    extensions = device.extensions.split()
    fp64 = "cl_khr_fp64" in extensions or bool(device.double_fp_config)
    threads = device.max_work_group_size
    denormal = device.single_fp_config & cl.device_fp_config.DENORM
    return Capabilities(
        dtypes=frozenset(d for d in dtypes.ALL if d != dtypes.float64 or fp64),
        ops=frozenset(COMPUTE), max_block_threads=threads,
        max_block=tuple(min(s, threads) for s in device.max_work_item_sizes[:3]),
        # global = grid * block must stay an int32 thread index
        max_grid=(2**31 - 1, 65535, 65535), local_memory_bytes=device.local_mem_size,
        # half the argument space for buffer pointers, the rest for scalars
        max_buffers=device.max_parameter_size // (device.address_bits // 8) // 2,
        denormals="preserve" if denormal else "flush",
        device_name=f"{device.name} ({device.platform.name})")


def find_device():
    """The first GPU of any platform, else the first device; BackendUnavailable if none."""
    if cl is None:
        raise BackendUnavailable("pyopencl is not installed",
                                 "pip install portkit[opencl]")
    fix = "apt-get install pocl-opencl-icd (or your vendor's OpenCL driver)"
    try:
        found = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as error:   # no ICD: PLATFORM_NOT_FOUND_KHR; a platform without devices
        raise BackendUnavailable(f"no OpenCL platform or device ({error})", fix) from None
    if not found:
        raise BackendUnavailable("no OpenCL device on any platform", fix)
    return min(found, key=lambda d: not d.type & cl.device_type.GPU)


def _load() -> Device:
    device = find_device()
    context = cl.Context([device])
    queue = cl.CommandQueue(context, device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
    compiler = CLCompiler(context, device)
    fp16 = "cl_khr_fp16" in device.extensions.split()
    caps = capabilities(device)
    renderer = OpenCLRenderer(fp16, dtypes.float64 in caps.dtypes)
    return Device("opencl", caps, CLAllocator(context, queue), renderer, compiler,
                  lambda name, binary: CLProgram(compiler, queue, name, binary), queue.finish)


backend = Backend("opencl", _load, "OpenCL C through pyopencl (PoCL on a CPU)")
