"""CUDA C -> a binary for one GPU architecture, with NVRTC. Needs no GPU and no driver.

For a real architecture ("sm_90") NVRTC returns a cubin: PTX already checked and assembled by
the assembler built into NVRTC. For a virtual one ("compute_90") it returns PTX, which the
driver assembles when it loads the module (the path for a GPU newer than this NVRTC).
"""
from __future__ import annotations

from portkit.abi.backend import Compiler
from portkit.abi.errors import BackendUnavailable, CompileError

# -fmad=false: the ABI rounds MUL and ADD separately (only MULACC, rendered as fma, fuses).
# IEEE division and square root and denormals kept are NVRTC's defaults; they are spelled out
# so that the cache key says what the binary assumes.
FLAGS = ("-fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-default-device",
         "-std=c++17")
_FIX = "pip install 'portkit[cuda]' (cuda-bindings and nvidia-cuda-nvrtc)"


def nvrtc():
    """The NVRTC bindings module; BackendUnavailable naming the pip packages if missing."""
    try:
        from cuda.bindings import nvrtc as module

        _check(module.nvrtcVersion(), "nvrtcVersion")
    except ImportError as error:
        raise BackendUnavailable(f"cuda-python is not installed ({error})", _FIX) from None
    except RuntimeError as error:   # the bindings import, but libnvrtc does not load
        raise BackendUnavailable(f"NVRTC does not load: {error}", _FIX) from None
    return module


def supported_architectures() -> list[int]:
    """The compute capabilities this NVRTC compiles for, as 75, 80, ... (major * 10 + minor)."""
    return list(_check(nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


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


class NVRTCCompiler(Compiler):
    """Compiles one kernel's CUDA C for `arch` ("sm_90": cubin, "compute_90": PTX)."""

    def __init__(self, arch: str):
        self.arch = arch
        self.options = [f"-arch={arch}", *FLAGS]
        self.version = "NVRTC {}.{}".format(*_check(nvrtc().nvrtcVersion(), "nvrtcVersion"))
        self.cache_key = f"{self.version}|{' '.join(self.options)}"

    @property
    def emits_ptx(self) -> bool:
        return self.arch.startswith("compute_")

    def compile(self, source: str) -> bytes:
        module = nvrtc()
        program = _check(module.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []),
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
    buffer = b" " * _check(size_fn(program), size_fn.__name__)
    _check(read_fn(program, buffer), read_fn.__name__)
    return buffer


def _check(result: tuple, what: str):
    """The value of a cuda-python call that returns (status, value...); raises on an error."""
    status, *values = result
    if int(status) != 0:
        raise CompileError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else tuple(values) if values else None
