"""ABI kernels as OpenCL C: the C-style base with OpenCL's qualifiers, types and builtins.

Buffers of bool hold one byte each (OpenCL forbids bool in kernel arguments). float16 is native
where the device has cl_khr_fp16; elsewhere, like bfloat16, buffers hold its 16 bits and values
are computed in float, rounded back after every op through a round-to-odd float, which makes
the two roundings equal to one.
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen import exp2f, lanes
from portkit.codegen.cstyle import CStyleRenderer, Emulated, Spelling

_CL_TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int",
    dtypes.int64: "long", dtypes.uint8: "uchar", dtypes.uint16: "ushort",
    dtypes.uint32: "uint", dtypes.uint64: "ulong", dtypes.float16: "half",
    dtypes.bfloat16: "ushort", dtypes.float32: "float", dtypes.float64: "double",
}

# {wide} is double when the device has it, else float (then casts from wide ints to the 16-bit
# floats may round twice). vstore_half_rte rounds a float to half bits correctly.
_HELPERS = """\
float pk_round_odd({wide} x) {{
  const float f = (float)x;
  if ((({wide})f == x) || x != x) return f;
  return as_float((as_uint(f) - (fabs(({wide})f) > fabs(x))) | 1u);
}}
float pk_f16_load(ushort h) {{ return vload_half(0, (half *)&h); }}
ushort pk_f16_store(float f) {{   /* keeps a NaN's sign and payload, as a bitcast must */
  ushort h;
  vstore_half_rte(f, 0, (half *)&h);
  const uint u = as_uint(f);
  return f != f ? (ushort)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu)) : h;
}}
float pk_f16(const {wide} x) {{ return pk_f16_load(pk_f16_store(pk_round_odd(x))); }}
float pk_bf16_load(ushort h) {{ return as_float((uint)h << 16); }}
ushort pk_bf16_store(float f) {{ return (ushort)(as_uint(f) >> 16); }}
float pk_bf16(const {wide} x) {{
  const uint u = as_uint(pk_round_odd(x));
  if ((u & 0x7fffffffu) > 0x7f800000u) return as_float((u | 0x00400000u) & 0xffff0000u);
  return as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}}
"""

_F16 = Emulated("float", "ushort", "pk_f16_load({})", "pk_f16_store({})", "pk_f16({})")
_BF16 = Emulated("float", "ushort", "pk_bf16_load({})", "pk_bf16_store({})", "pk_bf16({})")


def _cl_vectors(vector: str, width: int) -> lanes.Spelling:
    """OpenCL C vectors: a cast broadcasts a scalar, .s0-.sf name lanes, vloadN and vstoreN
    read and write N values at any element-aligned address, fma rounds once per lane, and
    .even/.odd are a vector's even and odd lanes. Every form is the scalar code's arithmetic,
    op for op (FP_CONTRACT is off), so a run in a vector computes what its lanes would."""
    def load(at: str) -> str:
        return f"vload{width}(0, &{at})"

    return lanes.Spelling(
        declare=lambda lead, init, n: f"{vector} {lead} = ({vector})({init});",
        lane=lambda lead, k: f"{lead}.s{k:x}",
        fma=lambda lead, a, at: f"{lead} = fma(({vector})({a}), {load(at)}, {lead});",
        add_into=lambda lead, at: f"vstore{width}({load(at)} + {lead}, 0, &{at});",
        store=lambda lead, at: f"vstore{width}({lead}, 0, &{at});",
        mul_add=lambda lead, a, at: f"{lead} = {lead} + {a} * {load(at)};",
        vector=load,
        pairs=lambda lead, a, b, n: (f"const {vector} {lead} = ({vector})({a}.even, {b}.even)"
                                     f" + ({vector})({a}.odd, {b}.odd);"))


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C 1.2; `fp16`/`fp64`: whether the device has cl_khr_fp16 / cl_khr_fp64."""

    kernel_prefix = "__kernel "
    buffer_param = "__global {type} *{name}"
    local_declaration = "__local {type} {name}[{size}];"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    workitem: ClassVar[dict[str, str]] = {"group": "(int)get_group_id({})",
                                          "local": "(int)get_local_id({})"}
    int_suffix: ClassVar[dict[DType, str]] = {dtypes.int64: "L", dtypes.uint32: "u",
                                              dtypes.uint64: "UL"}
    storage_types: ClassVar[dict[DType, str]] = {dtypes.bool_: "uchar"}   # no bool arguments
    bitcast_format = "as_{dst}(({src}){expr})"

    # Runs of accumulators held in one OpenCL vector (codegen/lanes.py): a packed matmul's
    # register block, or an M = 1 product's partial sums along k, on a CPU device
    # (threads_are_loops), where PoCL compiles them as written: it vectorizes across
    # work-items, not within one, so h @ R.T (1, 256) x (1024, 256) written lane by lane
    # took 60-140 us a launch, 10 us in vectors.
    # float64 ones, like any float64 node, occur only on a device with fp64.
    vector_bytes = 64
    vector_types: ClassVar[dict[DType, str]] = {dtypes.float32: "float16",
                                                dtypes.float64: "double8"}
    vector_spelling = staticmethod(_cl_vectors)
    # MULACC on float and double rounds once (the ABI allows it), as the vector form does
    fma_dtypes = (dtypes.float32, dtypes.float64)
    type_map: ClassVar[dict[DType, str]] = _CL_TYPES

    def __init__(self, fp16: bool, fp64: bool, cpu: bool = False):
        """`cpu`: the device is a CPU (PoCL), whose exp2 is a call that keeps the loop around
        it scalar: EXP2 on float is then codegen/exp2f.py's inline pk_exp2f, as on the cpu
        backend (a GPU's exp2 is an instruction)."""
        self.fp16, self.fp64, self.cpu = fp16, fp64, cpu
        if cpu:
            self.code_for_op: dict[Op, Spelling] = {
                **CStyleRenderer.code_for_op,
                Op.EXP2: exp2f.spelling}
        self.emulated = {dtypes.bfloat16: _BF16} if fp16 else {dtypes.float16: _F16,
                                                               dtypes.bfloat16: _BF16}
        # Emulated casts round from the widest float; without fp64 that is float.
        self.widest_float = "double" if fp64 else "float"

    def prelude(self, kernel: Kernel) -> str:
        # OpenCL contracts a * b + c into an fma by default; the ABI rounds each op.
        lines = ["#pragma OPENCL FP_CONTRACT OFF"]
        lines += [f"#pragma OPENCL EXTENSION cl_khr_fp{bits} : enable"
                  for bits, present in ((16, self.fp16), (64, self.fp64)) if present]
        if {n.dtype for n in kernel.nodes} & set(self.emulated):
            # guarded: a batch (cstyle.compile_joined) is many kernels in one program
            lines += ["#ifndef PK_ONCE_HELPERS", "#define PK_ONCE_HELPERS",
                      _HELPERS.format(wide="double" if self.fp64 else "float"), "#endif"]
        if self.cpu and exp2f.needed(kernel):
            lines.append(exp2f.EXP2F)
        return "\n".join(lines)
