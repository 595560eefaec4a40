"""Runtime: device memory (Allocator), NVRTC (Compiler) and driver-API launches (Program).

Everything goes through cuda-python's `cuda.bindings`. NVRTC compiles a kernel for one GPU
architecture and needs no GPU and no driver, so CI compiles every kernel on machines without
one: for a real architecture ("sm_90") it returns a cubin, PTX already checked and assembled by
the assembler built into NVRTC; for a virtual one ("compute_90") it returns PTX, which the
driver assembles when it loads the module (the path for a GPU newer than this NVRTC).
`cuModuleLoadData` loads a binary, `cuLaunchKernel` runs the ABI's grid and block on one
stream, and events time it. Buffers are `cuMemAlloc` allocations. A Batch is a CUDA graph: a
kernel node per launch, built once, launched with one `cuGraphLaunch` on the same stream.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from portkit.abi.backend import Allocator, Batch, Compiler, Launch, Program
from portkit.abi.errors import BackendUnavailable, CompileError, PortkitError
from portkit.codegen.cstyle import compile_joined, function_name

# -fmad=false: the ABI rounds MUL and ADD separately (only MULACC, rendered as fma, fuses).
# IEEE division and square root and denormals kept are NVRTC's defaults; they are spelled out
# so that the cache key says what the binary assumes.
FLAGS = ("-fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-default-device",
         "-std=c++17")
NVRTC_FIX = "pip install 'portkit[cuda]' (cuda-bindings and nvidia-cuda-nvrtc)"
# Every launch and graph goes on the default stream: in order with each other and with the
# synchronous copies.
STREAM = 0


class CUDAError(PortkitError):
    """A driver API call failed; the message names the call and the CUresult."""


def driver():
    """The driver API bindings module (imported on first use: it loads libcuda)."""
    from cuda.bindings import driver as module

    return module


def check(result: tuple, what: str, error: type[PortkitError] = CUDAError):
    """The value of a cuda-python call returning (status, value...); `error` on failure."""
    status, *values = result
    if int(status) != 0:
        raise error(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class CUDAContext:
    """The device's primary context, made current on whichever thread calls `enter`."""

    def __init__(self, ordinal: int = 0):
        api = driver()
        self.device = check(api.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = check(api.cuDevicePrimaryCtxRetain(self.device),
                             "cuDevicePrimaryCtxRetain")
        self._current = threading.local()

    def enter(self) -> None:
        """Makes the context current on the calling host thread (once per thread)."""
        # A context is current per host thread; conformance compiles on worker threads.
        if not getattr(self._current, "set", False):
            check(driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            self._current.set = True

    def attribute(self, name: str) -> int:
        """The device attribute CU_DEVICE_ATTRIBUTE_<name>."""
        api = driver()
        key = getattr(api.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return check(api.cuDeviceGetAttribute(key, self.device), name)

    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of the device."""
        return (self.attribute("COMPUTE_CAPABILITY_MAJOR"),
                self.attribute("COMPUTE_CAPABILITY_MINOR"))

    def synchronize(self) -> None:
        """Waits for all work launched in this context."""
        self.enter()
        check(driver().cuCtxSynchronize(), "cuCtxSynchronize")



class CUDAAllocator(Allocator):
    """Device memory from cuMemAlloc; copies are synchronous cuMemcpy calls."""

    def __init__(self, context: CUDAContext):
        self.context = context

    def alloc(self, nbytes: int):
        self.context.enter()
        return check(driver().cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")   # 0 bytes is invalid

    def free(self, buffer, nbytes: int) -> None:
        self.context.enter()
        check(driver().cuMemFree(buffer), "cuMemFree")

    def copyin(self, buffer, source: memoryview) -> None:
        host = np.frombuffer(source, np.uint8)
        if host.size:
            self.context.enter()
            check(driver().cuMemcpyHtoD(buffer, host.ctypes.data, host.size), "cuMemcpyHtoD")

    def copyout(self, destination: memoryview, buffer) -> None:
        host = np.frombuffer(destination, np.uint8)
        if host.size:
            self.context.enter()
            check(driver().cuMemcpyDtoH(host.ctypes.data, buffer, host.size), "cuMemcpyDtoH")


def nvrtc():
    """The NVRTC bindings module; BackendUnavailable naming the pip packages if missing."""
    try:
        from cuda.bindings import nvrtc as module

        check_nvrtc(module.nvrtcVersion(), "nvrtcVersion")
    except ImportError as error:
        raise BackendUnavailable(f"cuda-python is not installed ({error})", NVRTC_FIX) from None
    except RuntimeError as error:   # the bindings import, but libnvrtc does not load
        raise BackendUnavailable(f"NVRTC does not load: {error}", NVRTC_FIX) from None
    return module


def supported_architectures() -> list[int]:
    """The compute capabilities this NVRTC compiles for, as 75, 80, ... (major * 10 + minor)."""
    return list(check_nvrtc(nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def architecture_for(capability: tuple[int, int]) -> str:
    """The -arch for a device: its own cubin if NVRTC knows it, else PTX of the newest it knows
    (the driver assembles that for the device); BackendUnavailable if the device is too old."""
    wanted = capability[0] * 10 + capability[1]
    known = supported_architectures()
    if wanted in known:
        return f"sm_{wanted}"
    older = [a for a in known if a < wanted]
    if not older:
        raise BackendUnavailable(f"this NVRTC builds for compute capability {known[0] / 10} and "
                                 f"newer; the GPU is {capability[0]}.{capability[1]}",
                                 "install an nvidia-cuda-nvrtc release that supports it")
    return f"compute_{max(older)}"


class CUDACompiler(Compiler):
    """Compiles one kernel's CUDA C for `arch` ("sm_90": cubin, "compute_90": PTX)."""

    def __init__(self, arch: str):
        self.arch = arch
        self.options = [f"-arch={arch}", *FLAGS]
        self.version = "NVRTC {}.{}".format(*check_nvrtc(nvrtc().nvrtcVersion(), "nvrtcVersion"))
        self.cache_key = f"{self.version}|{' '.join(self.options)}"

    @property
    def emits_ptx(self) -> bool:
        """Whether compile returns PTX (a virtual architecture) rather than a cubin."""
        return self.arch.startswith("compute_")

    def compile(self, source: str) -> bytes:
        module = nvrtc()
        program = check_nvrtc(module.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []),
                         "nvrtcCreateProgram")
        try:
            options = [o.encode() for o in self.options]
            (result,) = module.nvrtcCompileProgram(program, len(options), options)
            if result != module.nvrtcResult.NVRTC_SUCCESS:
                log = _read(module.nvrtcGetProgramLogSize, module.nvrtcGetProgramLog, program)
                raise CompileError(f"NVRTC rejected the kernel for {self.arch} (the CUDA C is "
                                   "in .source)", source, log.decode(errors="replace"))
            if self.emits_ptx:
                return _read(module.nvrtcGetPTXSize, module.nvrtcGetPTX, program)
            return _read(module.nvrtcGetCUBINSize, module.nvrtcGetCUBIN, program)
        finally:
            module.nvrtcDestroyProgram(program)

    def compile_batch(self, sources: list[str]) -> list[bytes | CompileError]:
        """All `sources` as one NVRTC program (cstyle.compile_joined): its binary is every
        source's and each program finds its kernel by name. Raises CompileError if the build
        fails."""
        return compile_joined(self.compile, sources)


class KernelParams:
    """A launch's `kernelParams`, as cuLaunchKernel and a graph's kernel node take them: an
    array of pointers, each to one argument's value (device pointers, then int32 scalars). The
    driver copies the values during the call that is given them, so this need outlive only
    that call."""

    def __init__(self, buffers: Sequence, scalars: Sequence[int]):
        self.values = ([ctypes.c_uint64(int(b)) for b in buffers]
                       + [ctypes.c_int32(s) for s in scalars])
        self.pointers = (ctypes.c_void_p * max(len(self.values), 1))(
            *[ctypes.addressof(v) for v in self.values])

    @property
    def address(self) -> int:
        """The address of the pointer array: the `void **` the driver reads."""
        return ctypes.addressof(self.pointers)


class Events:
    """Two events that time work on the stream, as seconds on the GPU."""

    def __init__(self) -> None:
        api = driver()
        self.start, self.end = (check(api.cuEventCreate(0), "cuEventCreate") for _ in "se")

    def run(self, submit: Callable[[], None], wait: bool) -> float | None:
        """Calls `submit`; with `wait`, between the two events, and returns the seconds between
        them once the second has happened."""
        api = driver()
        if wait:
            check(api.cuEventRecord(self.start, STREAM), "cuEventRecord")
        submit()
        if not wait:
            return None
        check(api.cuEventRecord(self.end, STREAM), "cuEventRecord")
        check(api.cuEventSynchronize(self.end), "cuEventSynchronize")
        return check(api.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime") / 1e3


class CUDAProgram(Program):
    """A loaded module's kernel function, launched on the default stream."""

    def __init__(self, context: CUDAContext, name: str, binary: bytes):
        api = driver()
        context.enter()
        self.context = context
        self.module = check(api.cuModuleLoadData(binary), "cuModuleLoadData")
        self.function = check(api.cuModuleGetFunction(self.module, function_name(name)
                                                         .encode()), "cuModuleGetFunction")
        self.events = Events()

    def __call__(self, buffers: list, scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        api = driver()
        self.context.enter()
        params = KernelParams(buffers, scalars)
        return self.events.run(lambda: check(api.cuLaunchKernel(
            self.function, *grid, *block, 0, STREAM, params.address, 0), "cuLaunchKernel"), wait)


def kernel_node(launch: Launch, params: KernelParams):
    """The CUDA_KERNEL_NODE_PARAMS of `launch` (a CUDAProgram's) with `params`: what
    cuLaunchKernel is given, for a graph's kernel node."""
    node = driver().CUDA_KERNEL_NODE_PARAMS()
    node.func = cast(CUDAProgram, launch.program).function
    node.gridDimX, node.gridDimY, node.gridDimZ = launch.grid
    node.blockDimX, node.blockDimY, node.blockDimZ = launch.block
    node.kernelParams = params.address
    return node


class CUDAGraph(Batch):
    """A Batch as a CUDA graph: a kernel node per launch, each depending on the one before (a
    batch runs in order), instantiated once and launched with one cuGraphLaunch. A replay that
    replaces a launch's buffers or scalars rewrites that launch's node in the instantiated
    graph (cuGraphExecKernelNodeSetParams); the other nodes keep theirs."""

    def __init__(self, context: CUDAContext, launches: list[Launch]):
        api = driver()
        context.enter()
        self.context = context
        self.launches = [Launch(launch.program, list(launch.buffers), list(launch.scalars),
                                launch.grid, launch.block) for launch in launches]
        self.graph = check(api.cuGraphCreate(0), "cuGraphCreate")
        self.nodes: list = []
        for launch in self.launches:
            params = KernelParams(launch.buffers, launch.scalars)
            before = self.nodes[-1:]
            self.nodes.append(check(api.cuGraphAddKernelNode(
                self.graph, before, len(before), kernel_node(launch, params)),
                "cuGraphAddKernelNode"))
        self.executable = check(api.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        self.events = Events()

    def __call__(self, buffers: Sequence[tuple[int, int, object]] = (),
                 scalars: Sequence[tuple[int, list[int]]] = (), wait: bool = False
                 ) -> float | None:
        api = driver()
        self.context.enter()
        changed = set()
        for index, position, handle in buffers:
            if self.launches[index].buffers[position] is not handle:
                self.launches[index].buffers[position] = handle
                changed.add(index)
        for index, words in scalars:
            if self.launches[index].scalars != list(words):
                self.launches[index].scalars = list(words)
                changed.add(index)
        for index in sorted(changed):
            launch = self.launches[index]
            params = KernelParams(launch.buffers, launch.scalars)
            check(api.cuGraphExecKernelNodeSetParams(self.executable, self.nodes[index],
                                                     kernel_node(launch, params)),
                  "cuGraphExecKernelNodeSetParams")
        return self.events.run(lambda: check(api.cuGraphLaunch(self.executable, STREAM),
                                             "cuGraphLaunch"), wait)

    def __del__(self) -> None:
        # At exit the driver frees the graphs with the process (and its bindings may be gone).
        if getattr(self, "executable", None) is not None and not sys.is_finalizing():
            driver().cuGraphExecDestroy(self.executable)
            driver().cuGraphDestroy(self.graph)


def assemble(ptx: bytes, arch: str) -> bytes:
    """PTX -> cubin for `arch` ("sm_90") with nvJitLink, in-process: what the driver does with
    PTX at load time, checked without a driver. CompileError carries ptxas's log."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), "kernel.ptx")
        nvjitlink.complete(handle)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    except nvjitlink.nvJitLinkError as error:
        log = bytearray(nvjitlink.get_error_log_size(handle))
        nvjitlink.get_error_log(handle, log)
        raise CompileError(f"nvJitLink could not assemble the PTX for {arch}: {error}",
                           ptx.decode(errors="replace"),
                           bytes(log).rstrip(b"\0").decode(errors="replace")) from None
    finally:
        nvjitlink.destroy(handle)


def _read(size_fn, read_fn, program) -> bytes:
    buffer = b" " * check_nvrtc(size_fn(program), size_fn.__name__)
    check_nvrtc(read_fn(program, buffer), read_fn.__name__)
    return buffer


def check_nvrtc(result: tuple, what: str):
    """The value of an NVRTC call returning (status, value...); CompileError on failure."""
    return check(result, what, CompileError)
