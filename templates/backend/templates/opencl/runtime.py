"""Runtime: device memory (Allocator), the toolchain (Compiler) and kernel launches (Program).

Starter: all three go through pyopencl to the OpenCL driver. Keep the method signatures
(portkit/abi/backend.py) if you replace pyopencl with your own driver's calls.
"""
import numpy as np

try:
    import pyopencl as cl
except ImportError:   # device.load() reports the backend unavailable, with the fix
    cl = None
from portkit.abi import Allocator, CompileError, Compiler, Program
from portkit.codegen.cstyle import function_name

# No -cl-fast-relaxed-math or -cl-mad-enable: they change float results. -w: warnings about
# generated code (e.g. `x || 0`) are noise.
OPTIONS = ["-cl-fp32-correctly-rounded-divide-sqrt", "-w"]


class {{ cookiecutter.__title }}Allocator(Allocator):
    """Device memory: OpenCL buffers. Copies block, so the host memory may be reused at once."""

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


class {{ cookiecutter.__title }}Compiler(Compiler):
    """The toolchain: the driver builds OpenCL C; the binary is what its program holds."""

    def __init__(self, context, device):
        self.context, self.device = context, device
        # Whatever could change the binary for the same source belongs in the cache key.
        self.cache_key = "|".join((device.platform.version, device.name, device.version,
                                   device.driver_version, *OPTIONS))

    def compile(self, source: str) -> bytes:
        try:
            program = cl.Program(self.context, source).build(OPTIONS, [self.device])
        except cl.RuntimeError as error:
            raise CompileError("the OpenCL compiler rejected the kernel", source,
                               str(error)) from None
        return program.binaries[0]


class {{ cookiecutter.__title }}Program(Program):
    """One kernel, loaded from its binary and launched on the device's in-order queue."""

    def __init__(self, compiler: {{ cookiecutter.__title }}Compiler, queue, name: str, binary: bytes):
        self.queue = queue
        program = cl.Program(compiler.context, [compiler.device], [binary]).build(OPTIONS)
        self.kernel = cl.Kernel(program, function_name(name))

    def __call__(self, buffers, scalars, grid, block, wait: bool = False) -> float | None:
        self.kernel.set_args(*buffers, *(np.int32(s) for s in scalars))
        # OpenCL counts threads in the global size, not workgroups: global = grid * block.
        event = cl.enqueue_nd_range_kernel(
            self.queue, self.kernel, [g * b for g, b in zip(grid, block, strict=True)], list(block))
        if not wait:
            return None
        event.wait()
        return (event.profile.end - event.profile.start) * 1e-9
