"""The instruction set: how an ABI kernel becomes {{ cookiecutter.name }} code, as LLVM IR.

Starter: llvm. portkit's LLVM IR base (portkit/codegen/llvm.py) renders every op, and its
threads-as-loops transform (portkit/codegen/loops.py) turns workgroup threads and BARRIERs
into loops. What is yours is below: the knobs of the base, and a method per op group to
override where your chip differs (read the base: each op is a few lines). A chip with
hardware threads sets `threads_are_loops = False` and writes `special` (its thread-id
intrinsics) and `barrier`; a chip whose LLVM has a native op adds it to capabilities.py and
renders it here (docs/porting.md, "Tier 2: ops").
"""
from portkit.codegen.llvm import LAUNCH, LLVMRenderer


class {{ cookiecutter.__title }}Renderer(LLVMRenderer):
    """Kernel -> an LLVM module with the entry point `pk_launch` (see runtime.py)."""

    threads_are_loops = True    # the host runs a workgroup's threads one after another
    kernel_linkage = "internal"
    launch = LAUNCH             # pk_launch: a loop over the grid that calls @kernel
