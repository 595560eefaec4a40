"""The device: finds an OpenCL device and joins its parts into one portkit `Device`.

Any OpenCL driver works (PoCL runs kernels on a CPU). Devices are numbered GPUs first, then
the rest, over every platform: "opencl" is the first GPU, else the first device; "opencl:1"
the next. Each device has its own context, so copies between them go through the host.
"""
from __future__ import annotations

import functools

try:
    import pyopencl as cl
except ImportError:   # find_device then reports the backend unavailable, with the fix
    cl = None

from portkit.abi import dtypes
from portkit.abi.backend import Device
from portkit.abi.errors import BackendUnavailable
from portkit.reference_backends.opencl.capabilities import capabilities
from portkit.reference_backends.opencl.renderer import OpenCLRenderer
from portkit.reference_backends.opencl.runtime import (
    OpenCLAllocator,
    OpenCLBatch,
    OpenCLCompiler,
    OpenCLProgram,
)


def find_device(index: int = 0):
    """Device `index` of every platform's devices, GPUs first (by default the first GPU, else
    the first device); BackendUnavailable if there is none."""
    if cl is None:
        raise BackendUnavailable("pyopencl or filelock is not installed", "pip install portkit[opencl]")
    fix = "apt-get install pocl-opencl-icd (or your vendor's OpenCL driver)"
    try:
        found = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as error:   # no ICD: PLATFORM_NOT_FOUND_KHR; a platform without devices
        raise BackendUnavailable(f"no OpenCL platform or device ({error})", fix) from None
    if not found:
        raise BackendUnavailable("no OpenCL device on any platform", fix)
    return sorted(found, key=lambda d: not d.type & cl.device_type.GPU)[index]


def devices() -> int:
    """How many OpenCL devices there are here (PoCL: POCL_DEVICES="pthread pthread" gives two
    CPU devices); 1 where there are none, so that loading the first says why."""
    if cl is None:
        return 1
    try:
        return max(1, sum(len(p.get_devices()) for p in cl.get_platforms()))
    except cl.Error:    # no ICD, or a platform without devices
        return 1


def load(index: int = 0) -> Device:
    """Device `index`, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    device = find_device(index)
    context = cl.Context([device])
    queue = cl.CommandQueue(context, device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
    compiler = OpenCLCompiler(context, device)
    caps = capabilities(device)
    renderer = OpenCLRenderer("cl_khr_fp16" in device.extensions.split(),
                              dtypes.float64 in caps.dtypes, cpu=caps.threads_are_loops)
    return Device("opencl", caps, OpenCLAllocator(context, queue), renderer, compiler,
                  functools.partial(OpenCLProgram, compiler, queue), queue.finish,
                  batch=functools.partial(OpenCLBatch, queue))
