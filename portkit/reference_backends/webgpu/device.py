"""The device: the system's WebGPU adapter, opened with its own limits, and its parts joined
into one portkit `Device`."""
from __future__ import annotations

import functools

from portkit.abi import dtypes
from portkit.abi.backend import Device
from portkit.abi.errors import BackendUnavailable
from portkit.reference_backends.webgpu.capabilities import capabilities
from portkit.reference_backends.webgpu.renderer import WebGPURenderer
from portkit.reference_backends.webgpu.runtime import (
    WebGPUAllocator,
    WebGPUBatch,
    WebGPUCompiler,
    WebGPUProgram,
    fence,
    synchronize,
    wgpu,
)


def find_device():
    """The system's WebGPU adapter; BackendUnavailable naming the fix when there is none."""
    if wgpu is None:
        raise BackendUnavailable("wgpu is not installed", "pip install portkit[webgpu]")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as error:  # noqa: BLE001 - wgpu-native raises a plain RuntimeError
        adapter, reason = None, f" ({error})"
    else:
        reason = ""
    if adapter is None:
        raise BackendUnavailable(f"no WebGPU adapter: no Vulkan, Metal or D3D12 driver{reason}",
                                 "apt-get install mesa-vulkan-drivers")
    return adapter


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    adapter = find_device()
    caps = capabilities(adapter)
    # The adapter's own limits: without them a device gets WebGPU's portable minimum.
    device = adapter.request_device_sync(
        required_features=["shader-f16"] if dtypes.float16 in caps.dtypes else [],
        required_limits=dict(adapter.limits))
    done = fence(device)
    return Device("webgpu", caps, WebGPUAllocator(device), WebGPURenderer(),
                  WebGPUCompiler(device), functools.partial(WebGPUProgram, device, done),
                  functools.partial(synchronize, device, done),
                  batch=functools.partial(WebGPUBatch, device, done))
