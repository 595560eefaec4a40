"""The CUDA reference backend: CUDA C from the C-style renderer, NVRTC, the driver API.

    device.py        find_device() -> the first GPU's CUDAContext; load() -> Device
    capabilities.py  capabilities(context, compiler): the device's attributes
    renderer.py      CUDARenderer: CUDA C, one extern "C" __global__ function per kernel
    runtime.py       CUDAAllocator (cuMemAlloc), CUDACompiler (NVRTC), CUDAProgram
                     (cuLaunchKernel), CUDAGraph (a batch as one CUDA graph)

The renderer and the compiler need no driver, so CI compiles every kernel on machines without
a GPU.
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.cuda.device import load

backend = Backend("cuda", load, "CUDA C through NVRTC and the CUDA driver API (cuda-python)",
                  abi_version=ABI_VERSION)
