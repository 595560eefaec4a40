"""The device: finds an OpenCL device and joins its parts into one portkit `Device`.

Any OpenCL driver works (PoCL runs kernels on a CPU). `find_device` prefers a GPU of any
platform, else takes the first device.
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


def find_device():
    """The first GPU of any platform, else the first device; BackendUnavailable if none."""
    if cl is None:
        raise BackendUnavailable("pyopencl or filelock is not installed", "pip install portkit[opencl]")
    fix = "apt-get install pocl-opencl-icd (or your vendor's OpenCL driver)"
    try:
        found = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as error:   # no ICD: PLATFORM_NOT_FOUND_KHR; a platform without devices
        raise BackendUnavailable(f"no OpenCL platform or device ({error})", fix) from None
    if not found:
        raise BackendUnavailable("no OpenCL device on any platform", fix)
    return min(found, key=lambda d: not d.type & cl.device_type.GPU)


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    device = find_device()
    context = cl.Context([device])
    queue = cl.CommandQueue(context, device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
    compiler = OpenCLCompiler(context, device)
    caps = capabilities(device)
    renderer = OpenCLRenderer("cl_khr_fp16" in device.extensions.split(),
                              dtypes.float64 in caps.dtypes)
    return Device("opencl", caps, OpenCLAllocator(context, queue), renderer, compiler,
                  functools.partial(OpenCLProgram, compiler, queue), queue.finish,
                  functools.partial(OpenCLBatch, queue))
