"""The OpenCL reference backend: OpenCL C built by the driver (PoCL on a CPU), run via pyopencl.

    device.py        find_device(index) -> a pyopencl Device; devices(); load(index)
    capabilities.py  capabilities(device): read from the device's properties and extensions
    renderer.py      OpenCLRenderer: OpenCL C 1.2
    runtime.py       OpenCLAllocator (cl.Buffer), OpenCLCompiler (the driver's binaries),
                     OpenCLProgram (launches on an in-order queue)
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.opencl.device import devices, load

backend = Backend("opencl", load, "OpenCL C through pyopencl (PoCL on a CPU)",
                  abi_version=ABI_VERSION, devices=devices)
