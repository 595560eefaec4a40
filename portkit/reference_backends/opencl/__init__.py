"""The OpenCL reference backend: OpenCL C built by the driver (PoCL on a CPU), run via pyopencl.

    device.py        find_device() -> a pyopencl Device; load() -> Device
    capabilities.py  capabilities(device): read from the device's properties and extensions
    renderer.py      OpenCLRenderer: OpenCL C 1.2
    runtime.py       OpenCLAllocator (cl.Buffer), OpenCLCompiler (the driver's binaries),
                     OpenCLProgram (launches on an in-order queue)
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.opencl.device import load

backend = Backend("opencl", load, "OpenCL C through pyopencl (PoCL on a CPU)",
                  abi_version=ABI_VERSION)
