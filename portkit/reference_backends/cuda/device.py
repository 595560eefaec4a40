"""The device: initializes the CUDA driver, opens the first GPU, and joins the parts into one
portkit `Device`. Every way the driver or NVRTC can be missing becomes BackendUnavailable."""
from __future__ import annotations

import functools

from portkit.abi.backend import Device
from portkit.abi.errors import BackendUnavailable
from portkit.reference_backends.cuda.capabilities import capabilities
from portkit.reference_backends.cuda.renderer import CUDARenderer
from portkit.reference_backends.cuda.runtime import (
    CUDAAllocator,
    CUDACompiler,
    CUDAContext,
    CUDAGraph,
    CUDAProgram,
    architecture_for,
    driver,
    nvrtc,
)

_NO_DRIVER_FIX = ("install the NVIDIA driver (it provides libcuda.so.1); on a machine without "
                  "an NVIDIA GPU use another backend, e.g. PORTKIT_DEVICE=cpu")


def init_driver() -> None:
    """cuInit, turning every way it can fail into BackendUnavailable with the fix."""
    try:
        api = driver()
    except ImportError as error:
        raise BackendUnavailable(f"cuda-python is not installed ({error})",
                                 "pip install 'portkit[cuda]'") from None
    try:
        (status,) = api.cuInit(0)
    except RuntimeError:   # cuda-bindings raises DynamicLibNotFoundError when libcuda is absent
        raise BackendUnavailable("no NVIDIA driver (libcuda) found", _NO_DRIVER_FIX) from None
    if status == api.CUresult.CUDA_ERROR_NO_DEVICE:
        raise BackendUnavailable("the NVIDIA driver is installed but sees no CUDA device",
                                 "check `nvidia-smi`, and CUDA_VISIBLE_DEVICES if set")
    if int(status) != 0:
        raise BackendUnavailable(f"cuInit failed: {status!r}",
                                 "check `nvidia-smi`; the driver may be older than the bindings")


def find_device() -> CUDAContext:
    """The first GPU's primary context; BackendUnavailable (with the fix) without a driver,
    a device or NVRTC."""
    init_driver()
    nvrtc()
    return CUDAContext(0)


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    context = find_device()
    compiler = CUDACompiler(architecture_for(context.compute_capability()))
    return Device("cuda", capabilities(context, compiler), CUDAAllocator(context),
                  CUDARenderer(), compiler, functools.partial(CUDAProgram, context),
                  context.synchronize, batch=functools.partial(CUDAGraph, context))
