"""The WebGPU reference backend: WGSL compute shaders through wgpu-py (Mesa lavapipe on a CPU).

    device.py        find_device() -> the system's WebGPU adapter; load() -> Device
    capabilities.py  capabilities(adapter): read from its features and limits
    renderer.py      WebGPURenderer: WGSL, the workgroup size baked into each shader
    runtime.py       WebGPUAllocator (storage buffers), WebGPUCompiler (validates the shader),
                     WebGPUProgram (one compute pass per launch)
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.webgpu.device import load

backend = Backend("webgpu", load, "WGSL through wgpu-py (Vulkan, Metal or D3D12)",
                  abi_version=ABI_VERSION)
