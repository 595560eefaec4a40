"""The frozen backend ABI: the only thing a device implements. See docs/abi.md.

Nothing in this package imports anything above it: a backend sees ABI kernels, buffers and
capabilities, never a Tensor or a scheduler object.
"""
from portkit.abi import dtypes
from portkit.abi.backend import (
    Allocator,
    Backend,
    Batch,
    Capabilities,
    Compiler,
    Device,
    HostAllocator,
    Launch,
    OneByOne,
    Program,
    Renderer,
)
from portkit.abi.dtypes import DType
from portkit.abi.errors import (
                                 BackendUnavailable,
                                 CapabilityError,
                                 CompileError,
                                 InvalidKernel,
                                 PortkitError,
                                 UnsupportedDType,
)
from portkit.abi.kernel import Kernel, KernelBuilder, Node, Signature, validate
from portkit.abi.ops import Op
from portkit.abi.version import ABI_VERSION

__all__ = [
    "ABI_VERSION", "Allocator", "Backend", "BackendUnavailable", "Batch", "Capabilities",
    "CapabilityError", "CompileError", "Compiler", "DType", "Device", "HostAllocator",
    "InvalidKernel", "Kernel", "KernelBuilder", "Launch", "Node", "OneByOne", "Op",
    "PortkitError", "Program", "Renderer", "Signature", "UnsupportedDType",
    "dtypes", "validate",
]
