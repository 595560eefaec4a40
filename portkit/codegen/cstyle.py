"""C-like source from ABI kernels: one renderer, one subclass per language.

A C-like language is data: string knobs (declarations, casts, bitcasts, literals, special float
values, argument binding, barrier, thread indices, type names) and op -> expression tables on
`CStyleRenderer`. C (CPU), OpenCL C, CUDA C, Metal and WGSL are subclasses that set knobs; the
walk over the nodes is written once, here, and no subclass overrides it.

The kernel is rendered top to bottom, one line per node: a value is `const T vN = expr;`
(constants are inlined as literals), RANGE opens a for loop, IF an if block, ACC declares a
mutable local and ASSIGN writes it; `const_declaration` and `var_declaration` spell these (WGSL:
`let vN: T = e;`). LOCAL arrays are declared first, at the function's top scope (OpenCL and MSL
require it), or before the function when `locals_at_module_scope` is set (WGSL, GLSL). The ABI's
exact semantics live here, once, so every target inherits them: integer ops that can overflow
are computed in the unsigned type (signed overflow is undefined in C; `wrapping_ints` turns
this off), 8- and 16-bit results are cast back to their type (or wrapped through their bits
where the language holds them in its 32-bit type), and a dtype without an arithmetic type in
the language (`emulated`) is computed in float and rounded after every op.
Every expression this module builds is a primary or postfix expression (a name, a call, an
index, or parenthesized), so expressions nest without precedence surprises.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
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
from portkit.codegen import lanes, straight, vectorize
from portkit.codegen.emulated import Emulated
from portkit.codegen.loops import threads_as_loops
from portkit.codegen.positions import positions

# Integer ops that can overflow, and how many of their leading operands are widened to the
# unsigned type so that the C operation wraps instead of being undefined.
_WRAPPING = {Op.ADD: 2, Op.SUB: 2, Op.MUL: 2, Op.NEG: 1, Op.SHL: 1}

# Ops whose result needs no rounding on an emulated dtype: one of the operands, its negation,
# an integral value of it, or a bool.
_EXACT = (Op.WHERE, Op.MAX, Op.NEG, Op.TRUNC, *COMPARISON)

# A spelling of an op: a format string of the operands ("({0} + {1})"), or a function of the
# operands and their dtype for a spelling that depends on the dtype.
Spelling = str | Callable[..., str]

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

    # ---- the function and its arguments ---------------------------------------------------
    kernel_prefix = ""            # before `void name(...)`, e.g. "__kernel "
    template = _TEMPLATE          # jinja2: the source around the body (see template_context)
    # A buffer parameter ({type} the element, {name} dataN, {slot} N), or None where buffers
    # are bound at module scope by the template (WGSL, GLSL)
    buffer_param: str | None = "{type} *{name}"
    # A scalar (VAR) parameter, its 32-bit word ({type} int32's name, {name} var_x); or None
    scalar_param: str | None = "const {type} {name}"
    # One parameter holding every scalar ({slot}: after the buffers), read by `scalar_read`
    scalars_param: str | None = None
    # Where scalar_param is None: how the body reads scalar number {index}; it is declared
    # first in the body as var_x
    scalar_read: str | None = None

    # ---- statements -----------------------------------------------------------------------
    const_declaration = "const {type} {name} = {expr};"   # a value, assigned once
    var_declaration = "{type} {name} = {expr};"           # an ACC or a loop counter
    gated_store = "if ({gate}) {statement}"
    # A LOCAL array ({size} elements; {offset}: its byte offset among the kernel's LOCALs)
    local_declaration = "{type} {name}[{size}];"
    locals_at_module_scope = False   # True: LOCAL arrays are declared before the function
    barrier = ""                  # the BARRIER statement
    # True: a kernel with a BARRIER becomes one thread per group that loops over the block's
    # threads between the barriers (codegen/loops.py), for threads that are not concurrent
    threads_as_loops = False
    # A line before each short loop that the compiler would leave scalar, and True to compute
    # a loop's costly terms of a float sum in a loop of their own (codegen/vectorize.py)
    short_loop_pragma: str | None = None
    strided_loop_pragma: str | None = None    # before each loop of stride-2 loads it may leave scalar
    split_sums = False
    signed_positions = False      # True: element positions in signed int (codegen/positions.py)
    # SPECIAL ("group" | "local", axis) -> expression; "{}" is the axis number, "{xyz}" its letter
    workitem: ClassVar[dict[str, str]] = {"group": "group_id({})", "local": "local_id({})"}
    indent = "  "

    # ---- types, conversions and literals --------------------------------------------------
    type_map: ClassVar[dict[DType, str]] = _C_TYPES
    storage_types: ClassVar[dict[DType, str]] = {}   # buffer element types unlike type_map's
    # dtype -> (load, store) formats converting between a storage_types element and a value,
    # for languages that do not convert them implicitly (GLSL's bool held in a uint8_t)
    stored_as: ClassVar[dict[DType, tuple[str, str]]] = {}
    emulated: ClassVar[dict[DType, Emulated]] = {}
    cast_format = "({type}){expr}"                   # a value conversion: "{type}({expr})"
    # The bits of {expr}, a {src} value, read as {dst} (type names of the language)
    bitcast_format = "((union {{ {src} from; {dst} to; }}){{{expr}}}).to"
    # Casts into an emulated dtype convert to this type first and round once from it, so it
    # must hold every source value exactly; integer sources it does not hold exactly are
    # converted by `rounded_to_odd` instead
    widest_float = "double"
    # dtype -> a format converting it to a float rounded to odd, so that rounding that once
    # more to a 16-bit float (emulated or native) rounds the source itself, once
    rounded_to_odd: ClassVar[dict[DType, str]] = {}
    int_suffix: ClassVar[dict[DType, str]] = {dtypes.int64: "ll", dtypes.uint32: "u",
                                              dtypes.uint64: "ull"}
    float_suffix: ClassVar[dict[str, str]] = {"float": "f"}     # value type -> literal suffix
    # Values with no literal: "inf", "-inf", "nan", and "-0.0" where `-0.0` would misread
    float_specials: ClassVar[dict[str, str]] = {"inf": "INFINITY", "-inf": "(-INFINITY)",
                                                "nan": "NAN"}
    # Value types whose special values are cast to them (the specials' own type is float)
    typed_specials: ClassVar[frozenset[str]] = frozenset()
    # Dtypes with no literal of their own (GLSL's int8_t): each literal is cast to the type
    cast_literals: ClassVar[frozenset[DType]] = frozenset()
    # True: literals the renderer adds (a divisor guard's 0, 1 and -1, the 0 a cast to bool
    # compares with) carry the operand's type, for languages without implicit narrowing (GLSL);
    # False: plain C int literals
    typed_literals = False

    # ---- arithmetic -----------------------------------------------------------------------
    # True: the language's signed integers wrap (no undefined overflow), so ops that may
    # overflow are not computed in the unsigned type
    wrapping_ints = False
    # True: integer division by zero (or MIN / -1) may trap, so the divisor is guarded
    guard_division = True
    fma_dtypes: tuple[DType, ...] = ()   # MULACC is fma(a, b, c), one rounding
    # Runs of accumulators held in vectors (codegen/lanes.py): dtype -> the vector type of
    # `vector_bytes`, spelled by `vector_spelling(type, lanes)` (a staticmethod)
    vector_types: ClassVar[dict[DType, str]] = {}
    vector_bytes = 0
    vector_spelling: ClassVar[staticmethod[[str, int], lanes.Spelling] | None] = None

    # Op -> spelling (see `Spelling`) from rendered operands and the operands' dtype. RECIP and
    # MULACC may be left out: they are then rendered as 1 / a and as a * b + c rounded after
    # the product.
    code_for_op: ClassVar[dict[Op, Spelling]] = {
        Op.NEG: "(-{0})",
        Op.SQRT: "sqrt({0})",
        Op.EXP2: "exp2({0})",
        Op.LOG2: "log2({0})",
        Op.SIN: "sin({0})",
        Op.TRUNC: "trunc({0})",
        Op.ADD: "({0} + {1})",
        Op.SUB: "({0} - {1})",
        Op.MUL: "({0} * {1})",
        Op.FDIV: "({0} / {1})",
        Op.IDIV: "({0} / {1})",
        Op.MOD: "({0} % {1})",
        # NaN must win: `a != a` is true only for NaN. Integers have no NaN. Two selects, not
        # one select of (a > b || a != a): clang 14's SLP vectorizer takes no vector of the
        # `||`'s i1 values, and a row max ran scalar at 2.1x the time (560 x 2000: 0.30 ms).
        Op.MAX: lambda a, b, dtype: (f"({a} != {a} ? {a} : ({a} > {b} ? {a} : {b}))"
                                     if dtype.is_float else f"({a} > {b} ? {a} : {b})"),
        Op.CMPLT: "({0} < {1})",
        Op.CMPNE: "({0} != {1})",
        Op.AND: "({0} & {1})",
        Op.OR: "({0} | {1})",
        Op.XOR: "({0} ^ {1})",
        Op.SHL: "({0} << {1})",
        Op.SHR: "({0} >> {1})",
        Op.WHERE: "({0} ? {1} : {2})",
    }
    # Op -> spelling on bool operands, where code_for_op's does not apply (GLSL: `&&`, `^^`)
    bool_ops: ClassVar[dict[Op, Spelling]] = {}

    # ---- knobs applied ----------------------------------------------------------------------

    def cast(self, expr: str, type_name: str) -> str:
        """A value conversion in the language's syntax (`cast_format`)."""
        return self.cast_format.format(type=type_name, expr=expr)

    def value_type(self, dtype: DType) -> str:
        """The type of registers holding `dtype` values."""
        return self.emulated[dtype].value_type if dtype in self.emulated else self.type_map[dtype]

    def storage_type(self, dtype: DType) -> str:
        """The element type of buffers and LOCAL arrays of `dtype`."""
        if dtype in self.storage_types:
            return self.storage_types[dtype]
        return (self.emulated[dtype].storage_type if dtype in self.emulated
                else self.type_map[dtype])

    def render_bitcast(self, expr: str, src: DType, dst: DType) -> str:
        """The bits of `expr` (a `src` value) read as `dst` (`bitcast_format`)."""
        return self.bitcast_format.format(expr=expr, src=self.value_type(src),
                                          dst=self.value_type(dst))

    def declare(self, name: str, type_name: str, expr: str, mutable: bool = False) -> str:
        """The statement declaring `name` = `expr`; `mutable` for registers that ASSIGN writes."""
        form = self.var_declaration if mutable else self.const_declaration
        return form.format(type=type_name, name=name, expr=expr)

    def loop_header(self, name: str, start: str, end: str) -> str:
        """The line opening a loop of the int32 counter `name` from `start` while below `end`."""
        counter = self.declare(name, self.type_map[dtypes.int32], start, mutable=True)
        return f"for ({counter} {name} < {end}; {name}++) {{"

    def render_local(self, name: str, dtype: DType, size: int, offset: int) -> str:
        """Declares workgroup memory; `offset` is its byte offset among the kernel's LOCALs."""
        return self.local_declaration.format(type=self.storage_type(dtype), name=name,
                                             size=size, offset=offset)

    def render_locals(self, kernel: Kernel) -> list[str]:
        """The declarations of all the kernel's LOCAL arrays, each 16-byte aligned."""
        lines, offset = [], 0
        for i, node in enumerate(kernel.nodes):
            if node.op is Op.LOCAL:
                lines.append(self.render_local(f"local{i}", node.value_dtype, node.arg, offset))
                offset += _align(node.arg * node.value_dtype.itemsize)
        return lines

    def render_args(self, kernel: Kernel) -> list[str]:
        """The kernel function's parameters: buffers, then int32 scalars (see the knobs)."""
        args = [self.buffer_param.format(type=self.storage_type(p.value_dtype),
                                         name=f"data{p.arg}", slot=p.arg)
                for p in kernel.params] if self.buffer_param is not None else []
        if self.scalar_param is not None:
            args += [self.scalar_param.format(type=self.type_map[dtypes.int32], name=f"var_{v}")
                     for v in kernel.vars]
        elif self.scalars_param is not None and kernel.vars:
            args.append(self.scalars_param.format(slot=len(kernel.params)))
        return args

    def prelude(self, kernel: Kernel) -> str:
        """Text before the kernel function: includes and helpers."""
        return ""

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        """What the template sees; a subclass adds the names its template uses."""
        module_locals = self.render_locals(kernel) if self.locals_at_module_scope else []
        return {"r": self, "kernel": kernel, "name": function_name(kernel.name),
                "args": self.render_args(kernel), "body": body,
                "prelude": self.prelude(kernel), "module_locals": module_locals,
                "dtypes": {n.dtype.name for n in kernel.nodes if n.dtype is not None}}

    # ---- the renderer proper -------------------------------------------------------------

    def render(self, kernel: Kernel) -> str:
        """The kernel as source text."""
        if self.threads_as_loops and any(n.op is Op.BARRIER for n in kernel.nodes):
            kernel = threads_as_loops(kernel)
        if self.split_sums:
            kernel = vectorize.split_sums(kernel)
        return self._template.render(**self.template_context(kernel, self.render_body(kernel)))

    @functools.cached_property
    def _template(self) -> jinja2.Template:
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                                 undefined=jinja2.StrictUndefined)
        return env.from_string(self.template)

    def render_body(self, kernel: Kernel) -> list[str]:
        """The kernel's statements, indented: the scalars read from their block, the LOCAL
        arrays, then one line per other node (none for PARAM, an int32 VAR, CONST)."""
        nodes = kernel.nodes
        names: dict[int, str] = {}
        lines = [] if self.scalar_read is None else [
            self.indent + self.declare(f"var_{v}", self.type_map[dtypes.int32],
                                       self.scalar_read.format(index=index))
            for index, v in enumerate(kernel.vars)]
        local_lines = [] if self.locals_at_module_scope else self.render_locals(kernel)
        lines += [self.indent + line for line in local_lines]
        depth = 1
        signed = positions(kernel) if self.signed_positions else set()
        own = self.rendered_together(kernel)
        short = vectorize.short_loops(kernel) if self.short_loop_pragma else set()
        strided = vectorize.strided_loops(kernel) if self.strided_loop_pragma else set()
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
                if i in short:
                    line = f"{self.short_loop_pragma}\n{line}"
                elif i in strided:
                    line = f"{self.strided_loop_pragma}\n{line}"
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
                value = (self.spell(node.op, src, node.value_dtype) if i in signed else
                         self.render_value(node, [nodes[s] for s in node.src], src))
                line = self.declare(names[i], self.value_type(node.value_dtype), value)
            if line is not None:     # a group rendered together may write several lines
                lines += [self.indent * depth + part for part in line.split("\n")]
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
        """Nodes a language renders as a group (accumulators held in one vector, a written-out
        row's lanes: codegen/lanes.py, straight.py): node -> a function of the names given so
        far returning (its name, its line or None). None here unless the language has
        `vector_types`: every node is rendered on its own."""
        if not self.vector_types or self.vector_spelling is None:
            return {}
        own = lanes.spelled(kernel, self.vector_types, self.vector_bytes, self.vector_spelling)
        own.update(straight.spelled(kernel, self.vector_types, self.vector_bytes,
                                    self.vector_spelling, set(own)))
        return own

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
        if dtype in self.stored_as:
            element = self.stored_as[dtype][0].format(element)
        if gate is not None:
            storage = dtype if dtype in self.stored_as else self._storage_dtype(dtype)
            element = self.spell(Op.WHERE, [gate, element, self.render_const(0, storage)], storage)
        return self.emulated[dtype].load.format(element) if dtype in self.emulated else element

    def render_store(self, dtype: DType, buffer: str, index: str, value: str,
                     gate: str | None = None) -> str:
        """The statement buffer[index] = value, only when the gate is true."""
        if dtype in self.emulated:
            value = self.emulated[dtype].store.format(value)
        elif dtype in self.stored_as:
            value = self.stored_as[dtype][1].format(value)
        statement = f"{buffer}[{index}] = {value};"
        return statement if gate is None else self.gated_store.format(gate=gate,
                                                                      statement=statement)

    def _storage_dtype(self, dtype: DType) -> DType:
        # An emulated dtype's storage is its raw bits, so its zero is the integer 0.
        return _unsigned(dtype) if dtype in self.emulated else dtype

    def render_alu(self, op: Op, operands: list[str], dtype: DType) -> str:
        """A compute op on rendered operands of `dtype` (for WHERE: the values' dtype)."""
        if op is Op.MULACC and dtype in self.fma_dtypes:
            return f"fma({', '.join(operands)})"
        if op is Op.MULACC and op not in self.code_for_op:
            product = self.render_alu(Op.MUL, operands[:2], dtype)
            return self.render_alu(Op.ADD, [product, operands[2]], dtype)
        if op is Op.RECIP and op not in self.code_for_op:
            return self.render_alu(Op.FDIV, [self.render_const(1.0, dtype), operands[0]], dtype)
        if dtype in self.emulated:
            expr = self.spell(op, operands, dtypes.float32)
            return expr if op in _EXACT else self.emulated[dtype].round.format(expr)
        if op in (Op.IDIV, Op.MOD) and self.guard_division:
            operands = [operands[0], self.safe_divisor(operands[0], operands[1], dtype)]
        if (dtype.is_int and op in _WRAPPING and not self.wrapping_ints
                and not (dtype.kind == "uint" and dtype.bits >= 32)):
            wide = self.type_map[dtypes.uint32 if dtype.bits <= 32 else dtypes.uint64]
            count = _WRAPPING[op]
            operands = [self.cast(x, wide) for x in operands[:count]] + operands[count:]
            return self.cast(self.spell(op, operands, dtype), self.type_map[dtype])
        expr = self.spell(op, operands, dtype)
        if dtype.is_int and dtype.bits < 32 and op not in COMPARISON:
            return self.narrow(expr, dtype)   # C computes them in int
        return expr

    def spell(self, op: Op, operands: list[str], dtype: DType) -> str:
        """`op` on rendered operands of `dtype` as `bool_ops` or `code_for_op` spells it."""
        spelling = self.bool_ops.get(op) if dtype == dtypes.bool_ else None
        spelling = spelling or self.code_for_op[op]
        if isinstance(spelling, str):
            return spelling.format(*operands)
        return spelling(*operands, dtype)

    def narrow(self, expr: str, dtype: DType) -> str:
        """An 8- or 16-bit integer computed in a wider type, wrapped back to `dtype`: a cast,
        or where the language holds `dtype` in its 32-bit type (WGSL), its low bits."""
        if not self._held_wide(dtype):
            return self.cast(expr, self.type_map[dtype])
        mask = f"{(1 << dtype.bits) - 1:#x}{self.int_suffix.get(dtypes.uint32, '')}"
        return self.from_bits(f"({self.to_bits(expr, _wide(dtype))} & {mask})", dtype)

    def _held_wide(self, dtype: DType) -> bool:
        # An 8- or 16-bit integer with no type of its own in the language.
        return (dtype.is_int and dtype.bits < 32
                and self.type_map[dtype] == self.type_map[_wide(dtype)])

    def safe_divisor(self, a: str, b: str, dtype: DType) -> str:
        """b, or 1 where the ABI leaves a / b undefined and a CPU would trap (SIGFPE).

        Dividing by 1 instead keeps the host process alive; for MIN / -1 it even gives the
        wrapped quotient MIN and the remainder 0.
        """
        zero, one, minus_one = ([self.render_const(n, dtype) for n in (0, 1, -1)]
                                if self.typed_literals else ("0", "1", "-1"))
        bad = f"{b} == {zero}"
        if dtype.kind == "int" and dtype.bits >= 32:
            bad += f" || ({b} == {minus_one} && {a} == {self.render_const(int(dtype.min), dtype)})"
        return f"(({bad}) ? {one} : {b})"

    def render_cast(self, expr: str, src: DType, dst: DType) -> str:
        """Converts a value: to bool is != 0; float to int truncates (C's rule)."""
        if dst == dtypes.bool_:
            zero = self.render_const(0, src) if self.typed_literals else "0"
            return expr if src == dst else f"({expr} != {zero})"
        odd = self.rounded_to_odd.get(src) if dst.is_float and dst.bits <= 16 else None
        if odd is not None:
            expr = odd.format(expr)
        if dst in self.emulated:
            # Through the widest float: the source is exact there, so this rounds once.
            wide = expr if odd is not None else self.cast(expr, self.widest_float)
            return self.emulated[dst].round.format(wide)
        if self._held_wide(dst):
            return self.narrow(self.cast(expr, self.value_type(dst)), dst)
        return self.cast(expr, self.value_type(dst))

    def render_bitcast_value(self, expr: str, src: DType, dst: DType) -> str:
        """Reinterprets bits; emulated dtypes go through their storage bits, bool through 0/1."""
        if src == dst:
            return expr
        if dst == dtypes.bool_:
            return f"({expr} != 0)"
        if src == dtypes.bool_:
            return self.cast(expr, self.value_type(dst))
        if any(d in self.emulated or self._held_wide(d) for d in (src, dst)):
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
        text = self._literal(value, dtype)
        return self.cast(text, self.value_type(dtype)) if dtype in self.cast_literals else text

    def _literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.bool_:
            return "true" if value else "false"
        if dtype.is_float:
            with np.errstate(over="ignore"):             # too large: inf, as the spec says
                value = float(np.array(value, dtype.np))  # rounded to the dtype, as in the spec
            value_type = self.value_type(dtype)
            name = _special_name(value)
            special = self.float_specials.get(name) if name is not None else None
            if special is not None:
                return self.cast(special, value_type) if value_type in self.typed_specials \
                    else special
            text = repr(value) + self.float_suffix.get(value_type, "")
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


def _special_name(value: float) -> str | None:
    """The key of `value` in `float_specials`: "inf", "-inf", "nan", "-0.0", or None."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return "-0.0" if value == 0 and math.copysign(1, value) < 0 else None


def _wide(dtype: DType) -> DType:
    """The 32-bit integer of `dtype`'s signedness."""
    return dtypes.int32 if dtype.kind == "int" else dtypes.uint32


def _unsigned(dtype: DType) -> DType:
    return dtypes.by_name(f"uint{dtype.bits}")


def _align(nbytes: int, to: int = 16) -> int:
    return (nbytes + to - 1) // to * to
