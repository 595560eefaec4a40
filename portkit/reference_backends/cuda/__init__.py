"""The CUDA reference backend: CUDA C from the C-style renderer, NVRTC, the driver API.

Everything goes through cuda-python's `cuda.bindings`: NVRTC compiles a kernel for the device's
compute capability, `cuModuleLoadData` loads it, `cuLaunchKernel` runs the ABI's grid and block
on one stream, and events time it. Buffers are `cuMemAlloc` allocations. The renderer and the
compiler need no driver, so CI compiles every kernel on machines without a GPU.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from portkit.abi import dtypes
from portkit.abi.backend import Allocator, Backend, Capabilities, Device, Program
from portkit.abi.errors import BackendUnavailable, PortkitError
from portkit.abi.ops import COMPUTE
from portkit.codegen.cstyle import function_name
from portkit.reference_backends.cuda.compiler import NVRTCCompiler, architecture_for, nvrtc
from portkit.reference_backends.cuda.renderer import CUDARenderer

__all__ = ["CUDARenderer", "NVRTCCompiler", "backend"]

_NO_DRIVER_FIX = ("install the NVIDIA driver (it provides libcuda.so.1); on a machine without "
                  "an NVIDIA GPU use another backend, e.g. PORTKIT_DEVICE=cpu")


class CUDAError(PortkitError):
    """A driver API call failed; the message names the call and the CUresult."""


def _driver():
    from cuda.bindings import driver

    return driver


def check(result: tuple, what: str):
    """The value of a driver call returning (CUresult, value...); CUDAError on failure."""
    status, *values = result
    if int(status) != 0:
        raise CUDAError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class CUDAContext:
    """The device's primary context, made current on whichever thread calls `enter`."""

    def __init__(self, ordinal: int = 0):
        driver = _driver()
        self.device = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.device),
                             "cuDevicePrimaryCtxRetain")
        self._current = threading.local()

    def enter(self) -> None:
        # A context is current per host thread; conformance compiles on worker threads.
        if not getattr(self._current, "set", False):
            check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            self._current.set = True

    def attribute(self, name: str) -> int:
        driver = _driver()
        key = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return check(driver.cuDeviceGetAttribute(key, self.device), name)


class CUDAAllocator(Allocator):
    """Device memory from cuMemAlloc; copies are synchronous cuMemcpy calls."""

    def __init__(self, context: CUDAContext):
        self.context = context

    def alloc(self, nbytes: int):
        self.context.enter()
        return check(_driver().cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")   # 0 bytes is invalid

    def free(self, buffer, nbytes: int) -> None:
        self.context.enter()
        check(_driver().cuMemFree(buffer), "cuMemFree")

    def copyin(self, buffer, source: memoryview) -> None:
        host = np.frombuffer(source, np.uint8)
        if host.size:
            self.context.enter()
            check(_driver().cuMemcpyHtoD(buffer, host.ctypes.data, host.size), "cuMemcpyHtoD")

    def copyout(self, destination: memoryview, buffer) -> None:
        host = np.frombuffer(destination, np.uint8)
        if host.size:
            self.context.enter()
            check(_driver().cuMemcpyDtoH(host.ctypes.data, buffer, host.size), "cuMemcpyDtoH")


class CUDAProgram(Program):
    """A loaded module's kernel function, launched on the default stream."""

    def __init__(self, context: CUDAContext, name: str, binary: bytes):
        driver = _driver()
        context.enter()
        self.context = context
        self.module = check(driver.cuModuleLoadData(binary), "cuModuleLoadData")
        self.function = check(driver.cuModuleGetFunction(self.module, function_name(name)
                                                         .encode()), "cuModuleGetFunction")
        self.start, self.end = (check(driver.cuEventCreate(0), "cuEventCreate") for _ in "se")

    def __call__(self, buffers: list, scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        driver = _driver()
        self.context.enter()
        # kernelParams: an array of pointers, each to one argument's value.
        values = [ctypes.c_uint64(int(b)) for b in buffers] + [ctypes.c_int32(s) for s in scalars]
        pointers = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.addressof(v) for v in values])
        if wait:
            check(driver.cuEventRecord(self.start, 0), "cuEventRecord")
        check(driver.cuLaunchKernel(self.function, *grid, *block, 0, 0,
                                    ctypes.addressof(pointers), 0), "cuLaunchKernel")
        if not wait:
            return None
        check(driver.cuEventRecord(self.end, 0), "cuEventRecord")
        check(driver.cuEventSynchronize(self.end), "cuEventSynchronize")
        return check(driver.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime") / 1e3


def init_driver() -> None:
    """cuInit, turning every way it can fail into BackendUnavailable with the fix."""
    try:
        driver = _driver()
    except ImportError as error:
        raise BackendUnavailable(f"cuda-python is not installed ({error})",
                                 "pip install 'portkit[cuda]'") from None
    try:
        (status,) = driver.cuInit(0)
    except RuntimeError:   # cuda-bindings raises DynamicLibNotFoundError when libcuda is absent
        raise BackendUnavailable("no NVIDIA driver (libcuda) found", _NO_DRIVER_FIX) from None
    if status == driver.CUresult.CUDA_ERROR_NO_DEVICE:
        raise BackendUnavailable("the NVIDIA driver is installed but sees no CUDA device",
                                 "check `nvidia-smi`, and CUDA_VISIBLE_DEVICES if set")
    if int(status) != 0:
        raise BackendUnavailable(f"cuInit failed: {status!r}",
                                 "check `nvidia-smi`; the driver may be older than the bindings")


def compute_capability(context: CUDAContext) -> tuple[int, int]:
    """(major, minor) of the device."""
    return (context.attribute("COMPUTE_CAPABILITY_MAJOR"),
            context.attribute("COMPUTE_CAPABILITY_MINOR"))


def capabilities_of(context: CUDAContext, compiler: NVRTCCompiler) -> Capabilities:
    """What the device reports: limits, shared memory, name; and what it is compiled for."""
    a = context.attribute
    major, minor = compute_capability(context)
    name = check(_driver().cuDeviceGetName(256, context.device), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode()
    return Capabilities(
        # float16/bfloat16 compute in float (see renderer.py), so every GPU runs every dtype.
        dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE),
        max_block_threads=a("MAX_THREADS_PER_BLOCK"),
        max_block=(a("MAX_BLOCK_DIM_X"), a("MAX_BLOCK_DIM_Y"), a("MAX_BLOCK_DIM_Z")),
        max_grid=(a("MAX_GRID_DIM_X"), a("MAX_GRID_DIM_Y"), a("MAX_GRID_DIM_Z")),
        local_memory_bytes=a("MAX_SHARED_MEMORY_PER_BLOCK"),
        max_buffers=256,   # 8-byte pointers in the 4 KiB of kernel parameters, with room
        denormals="preserve",   # -ftz=false
        peak_bandwidth_gbs=a("GLOBAL_MEMORY_BUS_WIDTH") / 8 * a("MEMORY_CLOCK_RATE") * 2 / 1e6,
        device_name=f"{name} (compute capability {major}.{minor}; {compiler.version} "
                    f"-arch={compiler.arch})")


def _load() -> Device:
    init_driver()
    nvrtc()
    context = CUDAContext(0)
    compiler = NVRTCCompiler(architecture_for(compute_capability(context)))
    caps = capabilities_of(context, compiler)

    def synchronize() -> None:
        context.enter()
        check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")

    return Device("cuda", caps, CUDAAllocator(context), CUDARenderer(), compiler,
                  lambda name, binary: CUDAProgram(context, name, binary), synchronize)


backend = Backend("cuda", _load, "CUDA C through NVRTC and the CUDA driver API (cuda-python)")
