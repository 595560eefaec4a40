"""The interpreter backend: every kernel runs in the ABI's numpy interpreter (abi/interpreter.py),
so the whole stack runs without a compiler or a device. Slow and exact: the reference that
conformance and the tests compare with.

    device.py        find_device() -> nothing to find; load() -> Device
    capabilities.py  capabilities(): every dtype and op, generous limits
    renderer.py      InterpreterRenderer: the kernel's JSON is its source
    runtime.py       InterpreterAllocator (host memory), InterpreterCompiler (the JSON as
                     bytes), InterpreterProgram (abi.interpreter.run)
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.interpreter.device import load

backend = Backend("interpreter", load, "numpy interpreter of ABI kernels (slow, exact)",
                  abi_version=ABI_VERSION)
