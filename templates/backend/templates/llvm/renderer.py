"""The instruction set: how an ABI kernel becomes {{ cookiecutter.name }} code, as LLVM IR.

Starter: llvm. portkit's LLVM IR base (portkit/codegen/llvm.py) renders every op, and its
threads-as-loops transform (portkit/codegen/loops.py) turns workgroup threads and BARRIERs
into loops. What is yours is below: the base's knobs, and `{{ cookiecutter.__title }}Function`, where
you override the method of an op group (`float_op`, `int_op`, `cast`, `bitcast`,
`safe_divisor`) that your chip does differently; read the base, each op is a few lines. A chip
with hardware threads sets `threads_are_loops = False` and writes `special` (its thread-id
intrinsics) and `barrier`. A native op your LLVM target has (an `llvm.exp2`, say) goes in
capabilities.py and here (docs/porting.md, "Tier 2: ops").
"""
from portkit.codegen.llvm import LAUNCH, LLVMFunction, LLVMRenderer


class {{ cookiecutter.__title }}Function(LLVMFunction):
    """One kernel's IR; override an op group's method here where the chip differs."""


class {{ cookiecutter.__title }}Renderer(LLVMRenderer):
    """Kernel -> an LLVM module with the entry point `pk_launch` (see runtime.py)."""

    threads_are_loops = True    # the host runs a workgroup's threads one after another
    kernel_linkage = "internal"
    launch = LAUNCH             # pk_launch: a loop over the grid that calls @kernel
    function = {{ cookiecutter.__title }}Function
