"""The CPU reference backend: kernels rendered as C, built by the system compiler, run in-process.

    device.py        find_device() -> the host C compiler, probed; devices(); load(index)
    capabilities.py  capabilities(compiler): all dtypes and ops, host limits
    renderer.py      CPURenderer: C11, one entry point per kernel, named after it
    runtime.py       CPUAllocator (host memory), CPUCompiler (clang or gcc), CPUProgram (dlopen),
                     the thread pool that spreads a launch over cores
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.cpu.device import devices, load

backend = Backend("cpu", load, "C on the host CPU (clang or gcc)",
                  abi_version=ABI_VERSION, devices=devices)
