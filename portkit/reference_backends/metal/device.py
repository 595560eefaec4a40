"""The device: the system's default Metal GPU and its parts, joined into one portkit `Device`.

Metal exists only on macOS; elsewhere, and without pyobjc or a Metal GPU, `find_device` raises
BackendUnavailable naming the fix.
"""
from __future__ import annotations

import functools
import sys

from portkit.abi.backend import Device
from portkit.abi.errors import BackendUnavailable
from portkit.reference_backends.metal.capabilities import capabilities
from portkit.reference_backends.metal.renderer import MetalRenderer
from portkit.reference_backends.metal.runtime import (
    MetalAllocator,
    MetalBatch,
    MetalCompiler,
    MetalProgram,
    synchronize,
)


def find_device():
    """The system's default MTLDevice; BackendUnavailable (with the fix) if there is none."""
    if sys.platform != "darwin":
        raise BackendUnavailable("Metal needs macOS", "run on a Mac (Apple silicon or a "
                                 "Metal-capable GPU); elsewhere use cpu, opencl or webgpu")
    try:
        import Metal
    except ImportError as error:
        raise BackendUnavailable(f"pyobjc-framework-Metal is not installed ({error})",
                                 "pip install 'portkit[metal]'") from None
    device = Metal.MTLCreateSystemDefaultDevice()
    if device is None:
        raise BackendUnavailable("macOS reports no Metal device",
                                 "Metal needs a Metal-capable GPU (not a virtual machine "
                                 "without GPU passthrough)")
    return device


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    device = find_device()
    limits = device.maxThreadsPerThreadgroup()
    caps = capabilities((limits.width, limits.height, limits.depth),
                        device.maxThreadgroupMemoryLength(), f"{device.name()} (Metal)")
    queue = device.newCommandQueue()
    compiler = MetalCompiler(device)
    return Device("metal", caps, MetalAllocator(device), MetalRenderer(), compiler,
                  functools.partial(MetalProgram, device, queue, compiler),
                  functools.partial(synchronize, queue),
                  batch=functools.partial(MetalBatch, queue))
