"""The instruction set: how an ABI kernel becomes OpenCL C for {{ cookiecutter.name }}.

portkit's C-style renderer (portkit.codegen.cstyle) writes the kernel, one line per ABI node,
from a table of op -> expression and a few string knobs; this class sets OpenCL C's. A vendor
extension (a faster exp2, say) is one entry in `code_for_op`.
"""
from typing import ClassVar

from portkit.abi import DType, Kernel, dtypes
from portkit.codegen.cstyle import CStyleRenderer

_TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int",
    dtypes.int64: "long", dtypes.uint8: "uchar", dtypes.uint16: "ushort",
    dtypes.uint32: "uint", dtypes.uint64: "ulong", dtypes.float32: "float",
    dtypes.float64: "double",
}


class {{ cookiecutter.__title }}Renderer(CStyleRenderer):
    """OpenCL C 1.2. `fp64`: whether the device has double (cl_khr_fp64)."""

    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    local_prefix = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    workitem: ClassVar[dict[str, str]] = {"group": "(int)get_group_id({})",
                                          "local": "(int)get_local_id({})"}
    type_map: ClassVar[dict[DType, str]] = _TYPES
    int_suffix: ClassVar[dict[DType, str]] = {dtypes.int64: "L", dtypes.uint32: "u",
                                              dtypes.uint64: "UL"}

    def __init__(self, fp64: bool):
        self.fp64 = fp64

    def storage_type(self, dtype: DType) -> str:
        # OpenCL forbids bool in kernel arguments: bool buffers hold one byte per element.
        return "uchar" if dtype == dtypes.bool_ else super().storage_type(dtype)

    def render_bitcast(self, expr: str, src: DType, dst: DType) -> str:
        return f"as_{self.value_type(dst)}(({self.value_type(src)}){expr})"

    def prelude(self, kernel: Kernel) -> str:
        # OpenCL fuses a * b + c into one fma by default; the ABI rounds each op.
        lines = ["#pragma OPENCL FP_CONTRACT OFF"]
        if self.fp64:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        return "\n".join(lines)
