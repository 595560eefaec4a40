"""C-like source from ABI kernels: one renderer, one subclass per language.

A C-like language is data: string knobs (kernel prefix, qualifiers, barrier, thread indices,
type names) and an op -> expression table on `CStyleRenderer`. C (CPU), OpenCL C, CUDA C, Metal
and WGSL are subclasses that override only what differs.

The kernel is rendered top to bottom, one line per node: a value is `const T vN = expr;`
(constants are inlined as literals), RANGE opens a for loop, IF an if block, ACC declares a
mutable local and ASSIGN writes it; `declare` and `loop_header` spell these, so a language with
other declarations (WGSL's `let vN: T = e;`) overrides two methods. LOCAL arrays are declared
first, at the function's top scope (OpenCL and MSL require it), or before the function when
`locals_at_module_scope` is set (WGSL). The ABI's exact semantics live here, once, so every target
inherits them: integer ops that can overflow are computed in the unsigned type (signed overflow
is undefined in C), 8- and 16-bit results are cast back to their type, and a dtype without an
arithmetic type in the language (`emulated`) is computed in float and rounded after every op.
Every expression this module builds is a primary or postfix expression (a name, a call, an
index, or parenthesized), so expressions nest without precedence surprises.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import jinja2
import numpy as np

from portkit.abi import dtypes
from portkit.abi.backend import Renderer
from portkit.abi.dtypes import DType
from portkit.abi.errors import CapabilityError
from portkit.abi.kernel import Kernel, Node
from portkit.abi.matrix import MatrixUnit
from portkit.abi.ops import COMPARISON, Op
from portkit.codegen.positions import positions


@dataclass(frozen=True)
class Emulated:
    """How a dtype with no arithmetic type in the language is held and computed.

    Values live in `value_type` (e.g. float) holding exact values of the dtype; each op computes
    in it and `round` brings the result back to the dtype. Buffers hold `storage_type` (its raw
    bits); `load` and `store` convert. All three are format strings with one `{}`.
    """

    value_type: str
    storage_type: str
    load: str
    store: str
    round: str


# bfloat16 held in a float, in the C that C, CUDA C and MSL share: buffers hold its top 16 bits
# and pk_bf16_nearest rounds a float to it. A float's bits are read with pk_bits / pk_float,
# which each language defines (memcpy in C, as_type in MSL).
BFLOAT16_HELPERS = """\
static inline float pk_bf16_load(uint16_t h) { return pk_float((uint32_t)h << 16); }
static inline uint16_t pk_bf16_store(float f) { return (uint16_t)(pk_bits(f) >> 16); }
static inline float pk_bf16_nearest(float f) {   /* nearest-even; a NaN stays NaN */
  const uint32_t u = pk_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return pk_float((u | 0x00400000u) & 0xffff0000u);
  return pk_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
"""

# float16 and bfloat16 held in a float, for C and CUDA C (see EMULATED_FLOATS): any double is
# rounded once to either, through a float rounded to odd. Buffers hold the 16 bits.
FLOAT16_HELPERS = """\
static inline uint32_t pk_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float pk_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
""" + BFLOAT16_HELPERS + """
/* x rounded to float toward zero, with the lowest bit set when inexact ("round to odd"):
   rounding that once more to 16 bits gives the same result as rounding x directly. */
static inline float pk_round_odd(double x) {
  const float f = (float)x;
  if ((double)f == x || x != x) return f;
  const uint32_t u = pk_bits(f) - (fabs((double)f) > fabs(x));
  return pk_float(u | 1u);
}
static inline float pk_bf16(double x) { return pk_bf16_nearest(pk_round_odd(x)); }

static inline float pk_f16(double x) {
  const float f = pk_round_odd(x);
  const uint32_t u = pk_bits(f), sign = u & 0x80000000u, a = u ^ sign;
  if (a > 0x7f800000u) return pk_float(u | 0x00400000u);               /* NaN */
  if (a >= 0x477ff000u) return pk_float(sign | 0x7f800000u);           /* >= 65520: inf */
  if (a < 0x38800000u) {                       /* below 2^-14: a multiple of 2^-24 */
    const float r = (fabsf(f) + 0x1p-1f) - 0x1p-1f;
    return pk_float(sign | pk_bits(r));
  }
  return pk_float(sign | ((a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u));
}
static inline float pk_f16_load(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return pk_float(sign | pk_bits((float)m * 0x1p-24f));   /* zero, subnormal */
  return pk_float(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
}
static inline uint16_t pk_f16_store(float f) {
  const uint32_t u = pk_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {                                   /* NaN: keep the payload */
    const uint32_t m = (a >> 13) & 0x3ffu;
    return (uint16_t)(sign | 0x7c00u | (m ? m : 0x200u));
  }
  if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) return (uint16_t)(sign | (uint32_t)(pk_float(a) * 0x1p24f));
  return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}
"""

# Integer ops that can overflow, and how many of their leading operands are widened to the
# unsigned type so that the C operation wraps instead of being undefined.
_WRAPPING = {Op.ADD: 2, Op.SUB: 2, Op.MUL: 2, Op.NEG: 1, Op.SHL: 1}

# Ops whose result needs no rounding on an emulated dtype: one of the operands, its negation,
# an integral value of it, or a bool.
_EXACT = (Op.WHERE, Op.MAX, Op.NEG, Op.TRUNC, *COMPARISON)

# float16 and bfloat16 in C and CUDA C, through FLOAT16_HELPERS (which the prelude must hold).
EMULATED_FLOATS = {
    dtypes.float16: Emulated("float", "uint16_t", "pk_f16_load({})", "pk_f16_store({})",
                             "pk_f16({})"),
    dtypes.bfloat16: Emulated("float", "uint16_t", "pk_bf16_load({})", "pk_bf16_store({})",
                              "pk_bf16({})"),
}

_C_TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "int8_t", dtypes.int16: "int16_t",
    dtypes.int32: "int32_t", dtypes.int64: "int64_t", dtypes.uint8: "uint8_t",
    dtypes.uint16: "uint16_t", dtypes.uint32: "uint32_t", dtypes.uint64: "uint64_t",
    dtypes.float16: "half", dtypes.bfloat16: "bfloat16", dtypes.float32: "float",
    dtypes.float64: "double",
}

_TEMPLATE = """\
{{ prelude }}
{% for line in module_locals %}
{{ line }}
{% endfor %}
{{ r.kernel_prefix }}void {{ name }}({{ args | join(", ") }}) {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""


class CStyleRenderer(Renderer):
    """Renders an ABI kernel as one C-like function. Subclasses set the knobs below."""

    kernel_prefix = ""            # before `void name(...)`, e.g. "__kernel "
    buffer_prefix = ""            # before a buffer argument's element type, e.g. "__global "
    int_arg_prefix = "const "     # before a scalar (VAR) argument's type: its 32-bit word
    local_prefix = ""             # before a LOCAL array declaration, e.g. "__local "
    locals_at_module_scope = False   # True: LOCAL arrays are declared before the function
    barrier = ""                  # the BARRIER statement
    signed_positions = False      # True: element positions in signed int (codegen/positions.py)
    # SPECIAL ("group" | "local", axis) -> expression; "{}" is the axis number, "{xyz}" its letter
    workitem: ClassVar[dict[str, str]] = {"group": "group_id({})", "local": "local_id({})"}
    type_map: ClassVar[dict[DType, str]] = _C_TYPES
    emulated: ClassVar[dict[DType, Emulated]] = {}
    int_suffix: ClassVar[dict[DType, str]] = {dtypes.int64: "ll", dtypes.uint32: "u",
                                              dtypes.uint64: "ull"}
    float_suffix: ClassVar[dict[str, str]] = {"float": "f"}     # value type -> literal suffix
    infinity = "INFINITY"
    nan = "NAN"
    indent = "  "
    template = _TEMPLATE

    # Op -> expression from rendered operands and the operands' dtype. RECIP and MULACC may be
    # left out: they are then rendered as 1 / a and as a * b + c rounded after the product.
    code_for_op: ClassVar[dict[Op, Callable[..., str]]] = {
        Op.NEG: lambda a, dtype: f"(-{a})",
        Op.SQRT: lambda a, dtype: f"sqrt({a})",
        Op.EXP2: lambda a, dtype: f"exp2({a})",
        Op.LOG2: lambda a, dtype: f"log2({a})",
        Op.SIN: lambda a, dtype: f"sin({a})",
        Op.TRUNC: lambda a, dtype: f"trunc({a})",
        Op.ADD: lambda a, b, dtype: f"({a} + {b})",
        Op.SUB: lambda a, b, dtype: f"({a} - {b})",
        Op.MUL: lambda a, b, dtype: f"({a} * {b})",
        Op.FDIV: lambda a, b, dtype: f"({a} / {b})",
        Op.IDIV: lambda a, b, dtype: f"({a} / {b})",
        Op.MOD: lambda a, b, dtype: f"({a} % {b})",
        # NaN must win: `a != a` is true only for NaN. Integers have no NaN.
        Op.MAX: lambda a, b, dtype: (f"(({a} > {b} || {a} != {a}) ? {a} : {b})"
                                     if dtype.is_float else f"({a} > {b} ? {a} : {b})"),
        Op.CMPLT: lambda a, b, dtype: f"({a} < {b})",
        Op.CMPNE: lambda a, b, dtype: f"({a} != {b})",
        Op.AND: lambda a, b, dtype: f"({a} & {b})",
        Op.OR: lambda a, b, dtype: f"({a} | {b})",
        Op.XOR: lambda a, b, dtype: f"({a} ^ {b})",
        Op.SHL: lambda a, b, dtype: f"({a} << {b})",
        Op.SHR: lambda a, b, dtype: f"({a} >> {b})",
        Op.WHERE: lambda c, a, b, dtype: f"({c} ? {a} : {b})",
    }

    # ---- small hooks a language overrides -------------------------------------------------

    def cast(self, expr: str, type_name: str) -> str:
        """A value conversion in the language's syntax."""
        return f"({type_name}){expr}"

    def value_type(self, dtype: DType) -> str:
        """The type of registers holding `dtype` values."""
        return self.emulated[dtype].value_type if dtype in self.emulated else self.type_map[dtype]

    def storage_type(self, dtype: DType) -> str:
        """The element type of buffers and LOCAL arrays of `dtype`."""
        return (self.emulated[dtype].storage_type if dtype in self.emulated
                else self.type_map[dtype])

    def render_bitcast(self, expr: str, src: DType, dst: DType) -> str:
        """The bits of `expr` (a `src` value) read as `dst`; C reads them through a union."""
        return (f"((union {{ {self.value_type(src)} from; {self.value_type(dst)} to; }})"
                f"{{{expr}}}).to")

    def declare(self, name: str, type_name: str, expr: str, mutable: bool = False) -> str:
        """The statement declaring `name` = `expr`; `mutable` for registers that ASSIGN writes."""
        return f"{'' if mutable else 'const '}{type_name} {name} = {expr};"

    def loop_header(self, name: str, start: str, end: str) -> str:
        """The line opening a loop of the int32 counter `name` from `start` while below `end`."""
        counter = self.declare(name, self.type_map[dtypes.int32], start, mutable=True)
        return f"for ({counter} {name} < {end}; {name}++) {{"

    def render_local(self, name: str, dtype: DType, size: int, offset: int) -> str:
        """Declares workgroup memory; `offset` is its byte offset among the kernel's LOCALs."""
        return f"{self.local_prefix}{self.storage_type(dtype)} {name}[{size}];"

    def render_locals(self, kernel: Kernel) -> list[str]:
        """The declarations of all the kernel's LOCAL arrays, each 16-byte aligned."""
        lines, offset = [], 0
        for i, node in enumerate(kernel.nodes):
            if node.op is Op.LOCAL:
                lines.append(self.render_local(f"local{i}", node.value_dtype, node.arg, offset))
                offset += _align(node.arg * node.value_dtype.itemsize)
        return lines

    def render_args(self, kernel: Kernel) -> list[str]:
        """The kernel function's parameters: buffers, then int32 scalars."""
        buffers = [f"{self.buffer_prefix}{self.storage_type(p.value_dtype)} *data{p.arg}"
                   for p in kernel.params]
        scalars = [f"{self.int_arg_prefix}{self.type_map[dtypes.int32]} var_{name}"
                   for name in kernel.vars]
        return buffers + scalars

    def prelude(self, kernel: Kernel) -> str:
        """Text before the kernel function: includes and helpers."""
        return ""

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        """What the template sees; a subclass adds the names its template uses."""
        module_locals = self.render_locals(kernel) if self.locals_at_module_scope else []
        return {"r": self, "kernel": kernel, "name": function_name(kernel.name),
                "args": self.render_args(kernel), "body": body,
                "prelude": self.prelude(kernel), "module_locals": module_locals}

    # ---- the renderer proper -------------------------------------------------------------

    def render(self, kernel: Kernel) -> str:
        """The kernel as source text."""
        return self._template.render(**self.template_context(kernel, self.render_body(kernel)))

    @functools.cached_property
    def _template(self) -> jinja2.Template:
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                                 undefined=jinja2.StrictUndefined)
        return env.from_string(self.template)

    def render_body(self, kernel: Kernel) -> list[str]:
        """The kernel's statements, indented: the LOCAL arrays, then one line per other node
        (none for PARAM, an int32 VAR, CONST)."""
        nodes = kernel.nodes
        names: dict[int, str] = {}
        local_lines = [] if self.locals_at_module_scope else self.render_locals(kernel)
        lines = [self.indent + line for line in local_lines]
        depth = 1
        signed = positions(kernel) if self.signed_positions else set()
        own = self.rendered_together(kernel)
        for i, node in enumerate(nodes):
            src = [names.get(s, "") for s in node.src]
            line = None
            if i in own:
                names[i], line = own[i](names)
            elif node.op is Op.PARAM:
                names[i] = f"data{node.arg}"
            elif node.op is Op.VAR:
                names[i] = f"var_{node.arg}"
                if node.dtype != dtypes.int32:    # the argument is a 32-bit word: its bits
                    names[i] = f"scalar{i}"
                    dtype = node.value_dtype
                    value = self.render_bitcast_value(f"var_{node.arg}", dtypes.int32, dtype)
                    line = self.declare(names[i], self.value_type(dtype), value)
            elif node.op is Op.CONST:
                names[i] = self.render_const(node.arg, node.value_dtype)
            elif node.op is Op.LOCAL:
                names[i] = f"local{i}"   # declared by render_locals
            elif node.op is Op.RANGE:
                names[i] = f"ridx{i}"
                line = self.loop_header(names[i], *src)
            elif node.op is Op.IF:
                line = f"if ({src[0]}) {{"
            elif node.op in (Op.END, Op.ENDIF):
                depth -= 1
                line = "}"
            elif node.op is Op.ACC:
                names[i] = f"acc{i}"
                line = self.declare(names[i], self.value_type(node.value_dtype), src[0],
                                    mutable=True)
            elif node.op is Op.ASSIGN:
                line = f"{src[0]} = {src[1]};"
            elif node.op is Op.STORE:
                line = self.render_store(nodes[node.src[0]].value_dtype, *src)
            elif node.op is Op.BARRIER:
                line = self.barrier
            elif node.op is Op.MMA:
                line = self.render_mma(node.arg, src)
            else:
                names[i] = f"v{i}"
                value = (self.code_for_op[node.op](*src, node.dtype) if i in signed else
                         self.render_value(node, [nodes[s] for s in node.src], src))
                line = self.declare(names[i], self.value_type(node.value_dtype), value)
            if line is not None:
                lines.append(self.indent * depth + line)
            if node.op in (Op.RANGE, Op.IF):
                depth += 1
        return lines

    def render_mma(self, unit: MatrixUnit, src: list[str]) -> str:
        """The statement of an MMA node on `unit`: `src` names A's, B's elements and then C's
        registers, which it updates. A language with matrix units overrides this."""
        raise CapabilityError(f"{type(self).__name__} renders no matrix unit, yet the kernel "
                              f"uses {unit.name}: declare only the units the renderer has "
                              "(Capabilities.matrix_units)")

    def rendered_together(self, kernel: Kernel) -> dict[int, Callable[[dict], tuple]]:
        """Nodes a language renders as a group (accumulators held in one vector, say): node ->
        a function of the names given so far returning (its name, its line or None). None
        here: every node is rendered on its own."""
        return {}

    def render_value(self, node: Node, src_nodes: list[Node], src: list[str]) -> str:
        """The expression of a value node: SPECIAL, LOAD or a compute op."""
        if node.op is Op.SPECIAL:
            kind, axis = node.arg
            return self.workitem[kind].format(axis, xyz="xyz"[axis])
        if node.op is Op.LOAD:
            return self.render_load(node.value_dtype, *src)
        if node.op is Op.CAST:
            return self.render_cast(src[0], src_nodes[0].value_dtype, node.value_dtype)
        if node.op is Op.BITCAST:
            return self.render_bitcast_value(src[0], src_nodes[0].value_dtype, node.value_dtype)
        return self.render_alu(node.op, src, src_nodes[-1].value_dtype)

    def render_load(self, dtype: DType, buffer: str, index: str, gate: str | None = None) -> str:
        """buffer[index], or zero when the gate is false (the element is then not read)."""
        element = f"{buffer}[{index}]"
        if gate is not None:
            element = f"({gate} ? {element} : {self.render_const(0, self._storage_dtype(dtype))})"
        return self.emulated[dtype].load.format(element) if dtype in self.emulated else element

    def render_store(self, dtype: DType, buffer: str, index: str, value: str,
                     gate: str | None = None) -> str:
        """The statement buffer[index] = value, only when the gate is true."""
        if dtype in self.emulated:
            value = self.emulated[dtype].store.format(value)
        statement = f"{buffer}[{index}] = {value};"
        return f"if ({gate}) {statement}" if gate is not None else statement

    def _storage_dtype(self, dtype: DType) -> DType:
        # An emulated dtype's storage is its raw bits, so its zero is the integer 0.
        return _unsigned(dtype) if dtype in self.emulated else dtype

    def render_alu(self, op: Op, operands: list[str], dtype: DType) -> str:
        """A compute op on rendered operands of `dtype` (for WHERE: the values' dtype)."""
        if op is Op.MULACC and op not in self.code_for_op:
            product = self.render_alu(Op.MUL, operands[:2], dtype)
            return self.render_alu(Op.ADD, [product, operands[2]], dtype)
        if op is Op.RECIP and op not in self.code_for_op:
            return self.render_alu(Op.FDIV, [self.render_const(1.0, dtype), operands[0]], dtype)
        if dtype in self.emulated:
            expr = self.code_for_op[op](*operands, dtypes.float32)
            return expr if op in _EXACT else self.emulated[dtype].round.format(expr)
        if op in (Op.IDIV, Op.MOD):
            operands = [operands[0], self.safe_divisor(operands[0], operands[1], dtype)]
        if dtype.is_int and op in _WRAPPING and not (dtype.kind == "uint" and dtype.bits >= 32):
            wide = self.type_map[dtypes.uint32 if dtype.bits <= 32 else dtypes.uint64]
            count = _WRAPPING[op]
            operands = [self.cast(x, wide) for x in operands[:count]] + operands[count:]
            return self.cast(self.code_for_op[op](*operands, dtype), self.type_map[dtype])
        expr = self.code_for_op[op](*operands, dtype)
        if dtype.is_int and dtype.bits < 32 and op not in COMPARISON:
            return self.cast(expr, self.type_map[dtype])   # C computes them in int
        return expr

    def safe_divisor(self, a: str, b: str, dtype: DType) -> str:
        """b, or 1 where the ABI leaves a / b undefined and a CPU would trap (SIGFPE).

        Dividing by 1 instead keeps the host process alive; for MIN / -1 it even gives the
        wrapped quotient MIN and the remainder 0.
        """
        bad = f"{b} == 0"
        if dtype.kind == "int" and dtype.bits >= 32:
            bad += f" || ({b} == -1 && {a} == {self.render_const(int(dtype.min), dtype)})"
        return f"(({bad}) ? 1 : {b})"

    def render_cast(self, expr: str, src: DType, dst: DType) -> str:
        """Converts a value: to bool is != 0; float to int truncates (C's rule)."""
        if dst == dtypes.bool_:
            return expr if src == dst else f"({expr} != 0)"
        if dst in self.emulated:
            # Through double: every valid source value is exact there, so this rounds once.
            return self.emulated[dst].round.format(self.cast(expr, self.type_map[dtypes.float64]))
        return self.cast(expr, self.value_type(dst))

    def render_bitcast_value(self, expr: str, src: DType, dst: DType) -> str:
        """Reinterprets bits; emulated dtypes go through their storage bits, bool through 0/1."""
        if dst == dtypes.bool_:
            return expr if src == dst else f"({expr} != 0)"
        if src == dtypes.bool_:
            return self.cast(expr, self.value_type(dst))
        if src in self.emulated or dst in self.emulated:
            return self.from_bits(self.to_bits(expr, src), dst)
        return self.render_bitcast(expr, src, dst)

    def to_bits(self, expr: str, dtype: DType) -> str:
        """The bits of a `dtype` value as the unsigned integer of its width."""
        if dtype in self.emulated:
            return self.emulated[dtype].store.format(expr)
        raw = _unsigned(dtype)
        return expr if dtype == raw else self.render_bitcast(expr, dtype, raw)

    def from_bits(self, bits: str, dtype: DType) -> str:
        """The `dtype` value of bits held in the unsigned integer of its width (see to_bits)."""
        if dtype in self.emulated:
            return self.emulated[dtype].load.format(bits)
        raw = _unsigned(dtype)
        return bits if dtype == raw else self.render_bitcast(bits, raw, dtype)

    def render_const(self, value: float, dtype: DType) -> str:
        """An exact literal: floats in shortest round-trip decimal, inf and NaN as expressions."""
        if dtype == dtypes.bool_:
            return "true" if value else "false"
        if dtype.is_float:
            with np.errstate(over="ignore"):             # too large: inf, as the spec says
                value = float(np.array(value, dtype.np))  # rounded to the dtype, as in the spec
            if math.isnan(value):
                return self.nan
            if math.isinf(value):
                return self.infinity if value > 0 else f"(-{self.infinity})"
            text = repr(value) + self.float_suffix.get(self.value_type(dtype), "")
            return f"({text})" if value < 0 or text.startswith("-") else text
        suffix = self.int_suffix.get(dtype, "")
        if dtype.kind == "int" and dtype.bits >= 32 and value == dtype.min:
            return f"(-{int(dtype.max)}{suffix} - 1)"   # -2147483648 is not a C literal
        return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"


def function_name(name: str) -> str:
    """A kernel's name as an ASCII identifier in any C-like language (never a keyword: "k_"
    first), as long as the name plus 2: a device whose compiler limits names declares it in
    `Capabilities.max_name_length`, less those 2, and the runtime shortens longer names."""
    return "k_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def compile_joined(compile: Callable[[str], bytes], sources: list[str]) -> list[bytes]:
    """A batched compile (`Compiler.compile_batch`) for sources that may be concatenated:
    `compile` of each unit of `batch_units` joined into one source, whose binary is then each
    of the unit's. The renderers guard their helpers (`#ifndef PK_ONCE_...`) so that they
    are defined once in a unit. A failing unit raises its CompileError."""
    results = [b""] * len(sources)
    for unit in batch_units(sources):
        binary = compile("\n".join(sources[n] for n in unit))
        for number in unit:
            results[number] = binary
    return results


def batch_units(sources: list[str]) -> list[list[int]]:
    """Source numbers grouped so that no two sources of a group define the same kernel
    function (`function_name`): the groups a batched compile builds as one unit each."""
    units: list[tuple[set[str], list[int]]] = []
    for number, source in enumerate(sources):
        found = _FUNCTION.search(source)
        name = found.group(1) if found else ""
        unit = next((u for u in units if name not in u[0]), None)
        if unit is None:
            units.append(unit := (set(), []))
        unit[0].add(name)
        unit[1].append(number)
    return [numbers for _, numbers in units]


_FUNCTION = re.compile(r"\bvoid (k_\w+)\(")


def local_bytes(kernel: Kernel) -> int:
    """Bytes of all LOCAL arrays of `kernel`, each starting at a 16-byte boundary."""
    return sum(_align(n.arg * n.value_dtype.itemsize) for n in kernel.nodes if n.op is Op.LOCAL)


def _unsigned(dtype: DType) -> DType:
    return dtypes.by_name(f"uint{dtype.bits}")


def _align(nbytes: int, to: int = 16) -> int:
    return (nbytes + to - 1) // to * to
