"""The instruction set: how an ABI kernel becomes {{ cookiecutter.name }} code, as LLVM IR.

Starter: llvm. portkit's LLVM IR base (portkit/codegen/llvm.py) renders every op, and its
threads-as-loops transform (portkit/codegen/loops.py) turns workgroup threads and BARRIERs
into loops. What is yours is below: the base's knobs, and `{{ cookiecutter.__title }}Function`, where
you override the method of an op group (`float_op`, `int_op`, `cast`, `bitcast`,
`safe_divisor`) that your chip does differently; read the base, each op is a few lines. A chip
with hardware threads sets `threads_are_loops = False` and writes `special` (its thread-id
intrinsics) and `barrier`. A native op your LLVM target has (an `llvm.exp2`, say) goes in
capabilities.py and here (docs/porting.md, "Tier 2: ops"). `DOT2` is an example matrix unit,
declared in capabilities.py and rendered by `mma` (docs/porting.md, "Matrix units").
"""
from portkit.abi import dtypes
from portkit.abi.kernel import Node
from portkit.abi.matrix import MatrixUnit, fragment
from portkit.codegen.llvm import LAUNCH, LLVMFunction, LLVMRenderer

# An example matrix unit: one thread adds a 1x2 row of A times a 2x16 tile of B into 16 float32
# sums, D[j] = C[j] + A[0]·B[0][j] + A[1]·B[1][j]. A's element e is (0, e); B's element 2j + h
# is (k = h, column j), each column's two terms side by side; C's element j is column j. This
# is the shape the packed matmul (portkit/codegen/pack.py) runs a one-thread unit in, so every
# float32 matmul here uses it. Put your chip's instruction in its place: the cpu backend's
# vdpbf16ps (reference_backends/cpu/renderer.py, DPBF16) is the same shape on bfloat16 inputs.
DOT2 = MatrixUnit(1, 16, 2, 1, dtypes.float32, dtypes.float32, dtypes.float32,
                  a=fragment(1, 2, lambda t, e: (0, e)),
                  b=fragment(1, 32, lambda t, e: (e % 2, e // 2)),
                  c=fragment(1, 16, lambda t, e: (0, e)))


class {{ cookiecutter.__title }}Function(LLVMFunction):
    """One kernel's IR; override an op group's method here where the chip differs."""

    def mma(self, node: Node) -> None:
        """DOT2 as <16 x float> vector ops: C, plus A[0] times B's even elements, plus A[1]
        times its odd ones. Each product and sum is rounded (no FMA), as the unit's error
        bound allows. A chip's own instruction is a `call` to its intrinsic here instead."""
        if node.arg != DOT2:
            super().mma(node)    # raises: DOT2 is the only unit capabilities.py declares
            return
        a, b, c = node.src[:2], node.src[2:34], node.src[34:]
        row = "<16 x float>"
        total = self.vector("float", [self.value(x) for x in c])
        for h in (0, 1):
            broadcast = self.vector("float", [self.value(a[h])] * 16)
            column = self.vector("float", [self.value(x) for x in b[h::2]])
            product, added = self.temp(), self.temp()
            self.emit(f"{product} = fmul {row} {broadcast}, {column}")
            self.emit(f"{added} = fadd {row} {total}, {product}")
            total = added
        for j, acc in enumerate(c):    # each lane of D back into its ACC register
            lane = self.temp()
            self.emit(f"{lane} = extractelement {row} {total}, i32 {j}")
            self.emit(f"store float {lane}, ptr %acc{acc}")


class {{ cookiecutter.__title }}Renderer(LLVMRenderer):
    """Kernel -> an LLVM module with the entry point `pk_launch` (see runtime.py)."""

    threads_are_loops = True    # the host runs a workgroup's threads one after another
    kernel_linkage = "internal"
    launch = LAUNCH             # pk_launch: a loop over the grid that calls @kernel
    function = {{ cookiecutter.__title }}Function
