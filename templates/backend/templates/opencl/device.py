"""The board: finds an OpenCL device for {{ cookiecutter.name }} and joins its parts into a `Device`.

Starter: any OpenCL driver works (PoCL runs it on a CPU), so the backend runs before your
hardware does. With your vendor's OpenCL driver installed, `find_device` picks your chip; or
replace pyopencl with your own driver's calls in runtime.py.
"""
try:
    import pyopencl as cl
except ImportError:   # load() then reports the backend unavailable, with the fix
    cl = None
from portkit.abi import BackendUnavailable, Device, dtypes

from {{ cookiecutter.__module }}.capabilities import capabilities
from {{ cookiecutter.__module }}.renderer import {{ cookiecutter.__title }}Renderer
from {{ cookiecutter.__module }}.runtime import (
    {{ cookiecutter.__title }}Allocator,
    {{ cookiecutter.__title }}Compiler,
    {{ cookiecutter.__title }}Program,
)


def find_device():
    """The first GPU of any platform, else the first device; BackendUnavailable if none."""
    if cl is None:
        raise BackendUnavailable("pyopencl is not installed", "pip install pyopencl")
    fix = "install your device's OpenCL driver (on a CPU: apt-get install pocl-opencl-icd)"
    try:
        found = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as error:   # no driver at all: PLATFORM_NOT_FOUND_KHR
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
    compiler = {{ cookiecutter.__title }}Compiler(context, device)
    caps = capabilities(device)
    return Device("{{ cookiecutter.name }}", caps, {{ cookiecutter.__title }}Allocator(context, queue),
                  {{ cookiecutter.__title }}Renderer(fp64=dtypes.float64 in caps.dtypes), compiler,
                  lambda name, binary: {{ cookiecutter.__title }}Program(compiler, queue, name, binary),
                  queue.finish)
