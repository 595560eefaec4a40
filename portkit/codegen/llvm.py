"""LLVM IR from ABI kernels: the renderer base for targets whose toolchain is LLVM.

`LLVMRenderer.render(kernel)` gives a textual LLVM module with one entry point,
`void pk_launch(ptr buffers, ptr scalars, i32 groups_x, i32 groups_y, i32 groups_z)`: `buffers`
is an array of the buffers' addresses, `scalars` the VARs' 32-bit words, and it runs every
workgroup of the grid. With `threads_are_loops` (the default) the kernel first goes through
portkit.codegen.loops, so a workgroup's threads are loops and BARRIER needs nothing; a target
with hardware threads sets it False and overrides `special` and `barrier`.

How the ABI maps to SSA (docs/abi.md, "What an SSA target needs"): an ACC and a RANGE counter
live in an `alloca` (LLVM's mem2reg makes them registers), each read of an ACC is a `load`
where it is used; a gated LOAD is a branch around the load with a phi, never a `select`; a
RANGE's end is a value computed before the loop; integer division guards its divisor (x86's
`idiv` traps on 0 and on MIN / -1) and shifts mask their amount; no instruction carries a
fast-math flag, so nothing is contracted into an FMA. Each op's instructions come from one
method of `LLVMFunction` per op group (`float_op`, `int_op`, `cast`, `bitcast`,
`safe_divisor`), so a target changes one op by overriding one method in a subclass. An MMA
node goes to `mma`, which a target with matrix units overrides (the `llvm` starter's example
unit is one; `vector` builds an LLVM vector of values for it).
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from portkit.abi import dtypes
from portkit.abi.backend import Renderer
from portkit.abi.dtypes import DType
from portkit.abi.errors import CapabilityError
from portkit.abi.kernel import Kernel, Node
from portkit.abi.ops import Op
from portkit.codegen.loops import threads_as_loops

LLVM_TYPES = {
    dtypes.bool_: "i1", dtypes.int8: "i8", dtypes.int16: "i16", dtypes.int32: "i32",
    dtypes.int64: "i64", dtypes.uint8: "i8", dtypes.uint16: "i16", dtypes.uint32: "i32",
    dtypes.uint64: "i64", dtypes.float16: "half", dtypes.bfloat16: "bfloat",
    dtypes.float32: "float", dtypes.float64: "double",
}
_INTRINSIC_SUFFIX = {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}
_FLOAT_BINARY = {Op.ADD: "fadd", Op.SUB: "fsub", Op.MUL: "fmul", Op.FDIV: "fdiv"}
_INT_BINARY = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.AND: "and", Op.OR: "or",
               Op.XOR: "xor"}

LAUNCH = """\
define void @pk_launch(ptr %buffers, ptr %scalars, i32 %nx, i32 %ny, i32 %nz) {
entry:
  br label %z
z:
  %gz = phi i32 [ 0, %entry ], [ %gz1, %z_next ]
  br label %y
y:
  %gy = phi i32 [ 0, %z ], [ %gy1, %y_next ]
  br label %x
x:
  %gx = phi i32 [ 0, %y ], [ %gx1, %x ]
  call void @kernel(ptr %buffers, ptr %scalars, i32 %gx, i32 %gy, i32 %gz)
  %gx1 = add i32 %gx, 1
  %x_more = icmp slt i32 %gx1, %nx
  br i1 %x_more, label %x, label %y_next
y_next:
  %gy1 = add i32 %gy, 1
  %y_more = icmp slt i32 %gy1, %ny
  br i1 %y_more, label %y, label %z_next
z_next:
  %gz1 = add i32 %gz, 1
  %z_more = icmp slt i32 %gz1, %nz
  br i1 %z_more, label %z, label %done
done:
  ret void
}
"""


class LLVMRenderer(Renderer):
    """Renders an ABI kernel as an LLVM module; a target subclass sets the knobs below."""

    threads_are_loops = True      # run a workgroup's threads as loops (portkit.codegen.loops)
    kernel_linkage = "internal"   # the kernel function; pk_launch calls it once per workgroup
    launch = LAUNCH               # the entry point; "" for a target that launches @kernel itself
    type_map: ClassVar[dict[DType, str]] = LLVM_TYPES
    function: ClassVar[type[LLVMFunction]]    # set below the class: LLVMFunction

    def render(self, kernel: Kernel) -> str:
        """The kernel as LLVM IR text: @kernel (one workgroup) and the entry point."""
        if self.threads_are_loops:
            kernel = threads_as_loops(kernel)
        function = self.function(self, kernel)
        return "\n".join([*function.render(), "", self.launch, *sorted(function.declares)])

    def special(self, kind: str, axis: int) -> str:
        """SPECIAL's value: the workgroup's id is an argument of @kernel; with threads as
        loops no `local` id is left (codegen.loops replaced it)."""
        if kind == "group":
            return f"%group{axis}"
        raise NotImplementedError("SPECIAL local on an LLVM target with hardware threads: "
                                  "override LLVMRenderer.special in your renderer")

    def barrier(self) -> str:
        """BARRIER's instruction (a call to the target's intrinsic)."""
        raise NotImplementedError("BARRIER on an LLVM target with hardware threads: override "
                                  "LLVMRenderer.barrier, or keep threads_are_loops = True")

    # ---- types and constants -----------------------------------------------------------

    def value_type(self, dtype: DType) -> str:
        """The LLVM type of registers holding `dtype`."""
        return self.type_map[dtype]

    def storage_type(self, dtype: DType) -> str:
        """The element type in buffers and LOCAL arrays: a bool is a byte there."""
        return "i8" if dtype == dtypes.bool_ else self.value_type(dtype)

    def const(self, value, dtype: DType) -> str:
        """An exact literal of `dtype` (floats as LLVM's hexadecimal forms)."""
        if dtype == dtypes.bool_:
            return "true" if value else "false"
        if dtype.is_int:   # LLVM's integers have no sign: an unsigned max is written -1
            value = int(value)
            return str(value - (1 << dtype.bits) if value >= 1 << (dtype.bits - 1) else value)
        with np.errstate(over="ignore"):
            rounded = np.array(value, dtype.np)
        if dtype == dtypes.float16:
            return f"0xH{int(rounded.view(np.uint16)):04X}"
        if dtype == dtypes.bfloat16:
            return f"0xR{int(rounded.view(np.uint16)):04X}"
        # float and double constants are both written as the double's bits.
        return f"0x{int(np.array(float(rounded)).view(np.uint64)):016X}"


class LLVMFunction:
    """One kernel's @kernel function being written: its lines, names and current basic block,
    and one method per node kind and op group. A target that renders an op differently
    subclasses this and names the subclass in its renderer's `function`."""

    def __init__(self, renderer: LLVMRenderer, kernel: Kernel):
        self.r, self.kernel, self.nodes = renderer, kernel, kernel.nodes
        self.entry: list[str] = []            # allocas and argument loads, in the entry block
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.declares: set[str] = set()
        self.temps = 0
        self.block = "body"

    def temp(self) -> str:
        """A fresh name for an intermediate value."""
        self.temps += 1
        return f"%t{self.temps}"

    def emit(self, line: str) -> None:
        """Appends an instruction to the current basic block."""
        self.lines.append("  " + line)

    def label(self, name: str) -> None:
        """Starts the basic block `name`."""
        self.lines.append(f"{name}:")
        self.block = name

    def render(self) -> list[str]:
        """The lines of @kernel: the entry block (allocas, arguments), then every node."""
        for i, node in enumerate(self.nodes):
            self.node(i, node)
        self.emit("ret void")
        head = (f"define {self.r.kernel_linkage} void @kernel(ptr %buffers, ptr %scalars, "
                "i32 %group0, i32 %group1, i32 %group2) {")
        return [head, "entry:", *self.entry, "  br label %body", "body:", *self.lines, "}"]

    def value(self, ref: int) -> str:
        """Node `ref`'s value here: an ACC is loaded where it is read."""
        node = self.nodes[ref]
        if node.op is Op.ACC:
            name = self.temp()
            self.emit(f"{name} = load {self.r.value_type(node.value_dtype)}, ptr %acc{ref}")
            return name
        return self.names[ref]

    def node(self, i: int, node: Node) -> None:
        """Writes node `i`; its value (if any) is then named in `names`."""
        op, name = node.op, f"%v{i}"
        if op is Op.PARAM:
            self.entry.append(f"  %p{i} = getelementptr ptr, ptr %buffers, i64 {node.arg}")
            self.entry.append(f"  {name} = load ptr, ptr %p{i}")
        elif op is Op.VAR:
            position = self.kernel.vars.index(node.arg)
            self.entry.append(f"  %w{i} = getelementptr i32, ptr %scalars, i64 {position}")
            self.entry.append(f"  %word{i} = load i32, ptr %w{i}")
            kind = self.r.value_type(node.value_dtype)
            self.entry.append(f"  {name} = bitcast i32 %word{i} to {kind}")
        elif op is Op.CONST:
            name = self.r.const(node.arg, node.value_dtype)
        elif op is Op.SPECIAL:
            name = self.r.special(*node.arg)
        elif op is Op.LOCAL:
            self.entry.append(f"  {name} = alloca [{node.arg} x "
                              f"{self.r.storage_type(node.value_dtype)}], align 16")
        elif op is Op.ACC:
            kind = self.r.value_type(node.value_dtype)
            self.entry.append(f"  %acc{i} = alloca {kind}")
            self.emit(f"store {kind} {self.value(node.src[0])}, ptr %acc{i}")
        elif op is Op.ASSIGN:
            kind = self.r.value_type(self.nodes[node.src[0]].value_dtype)
            self.emit(f"store {kind} {self.value(node.src[1])}, ptr %acc{node.src[0]}")
        elif op is Op.RANGE:
            self.range(i, node)
        elif op is Op.END:
            start = node.src[0]
            self.emit(f"%next{start} = add i32 %v{start}, 1")
            self.emit(f"store i32 %next{start}, ptr %counter{start}")
            self.emit(f"br label %loop{start}")
            self.label(f"done{start}")
        elif op is Op.IF:
            self.emit(f"br i1 {self.value(node.src[0])}, label %then{i}, label %endif{i}")
            self.label(f"then{i}")
        elif op is Op.ENDIF:
            self.emit(f"br label %endif{node.src[0]}")
            self.label(f"endif{node.src[0]}")
        elif op is Op.BARRIER:
            self.emit(self.r.barrier())
        elif op is Op.MMA:
            self.mma(node)
        elif op is Op.LOAD:
            self.load(name, node)
        elif op is Op.STORE:
            self.store(node)
        else:
            operands = [self.value(s) for s in node.src]
            source = self.nodes[node.src[-1]].value_dtype
            self.compute(name, node, operands, source)
        self.names[i] = name

    def range(self, i: int, node: Node) -> None:
        """RANGE: the counter in a stack slot, the end compared at the loop's head."""
        start, end = (self.value(s) for s in node.src)   # the end is read once, here
        self.entry.append(f"  %counter{i} = alloca i32")
        self.emit(f"store i32 {start}, ptr %counter{i}")
        self.emit(f"br label %loop{i}")
        self.label(f"loop{i}")
        self.emit(f"%v{i} = load i32, ptr %counter{i}")
        self.emit(f"%more{i} = icmp slt i32 %v{i}, {end}")
        self.emit(f"br i1 %more{i}, label %step{i}, label %done{i}")
        self.label(f"step{i}")

    def address(self, node: Node) -> str:
        """The element pointer of a LOAD or STORE."""
        buffer = self.nodes[node.src[0]]
        pointer, index = self.value(node.src[0]), self.value(node.src[1])
        storage = self.r.storage_type(buffer.value_dtype)
        name = self.temp()
        if buffer.op is Op.LOCAL:
            self.emit(f"{name} = getelementptr [{buffer.arg} x {storage}], ptr {pointer}, "
                      f"i32 0, i32 {index}")
        else:
            self.emit(f"{name} = getelementptr {storage}, ptr {pointer}, i32 {index}")
        return name

    def load(self, name: str, node: Node) -> None:
        """A LOAD; a gated one branches around the memory access (never a select)."""
        dtype = node.value_dtype
        kind, storage = self.r.value_type(dtype), self.r.storage_type(dtype)
        gate = self.value(node.src[2]) if len(node.src) == 3 else None
        before = self.block
        if gate is not None:
            self.emit(f"br i1 {gate}, label %{name[1:]}_load, label %{name[1:]}_join")
            self.label(f"{name[1:]}_load")
        raw = self.temp()
        self.emit(f"{raw} = load {storage}, ptr {self.address(node)}")
        value = raw
        if node.dtype == dtypes.bool_:
            value = self.temp()
            self.emit(f"{value} = icmp ne i8 {raw}, 0")
        if gate is None:
            self.emit(f"{name} = {_copy(kind, value)}")
            return
        loaded = self.block
        self.emit(f"br label %{name[1:]}_join")
        self.label(f"{name[1:]}_join")
        zero = self.r.const(0, dtype)
        self.emit(f"{name} = phi {kind} [ {value}, %{loaded} ], [ {zero}, %{before} ]")

    def store(self, node: Node) -> None:
        """A STORE; a gated one branches around the memory access."""
        dtype = self.nodes[node.src[0]].value_dtype
        value = self.value(node.src[2])
        gated = len(node.src) == 4
        if gated:
            label = f"s{self.temp()[2:]}"
            self.emit(f"br i1 {self.value(node.src[3])}, label %{label}, label %{label}_after")
            self.label(label)
        if dtype == dtypes.bool_:
            wide = self.temp()
            self.emit(f"{wide} = zext i1 {value} to i8")
            value = wide
        self.emit(f"store {self.r.storage_type(dtype)} {value}, ptr {self.address(node)}")
        if gated:
            self.emit(f"br label %{label}_after")
            self.label(f"{label}_after")

    def mma(self, node: Node) -> None:
        """An MMA node on its unit (`node.arg`): sets C's ACC registers, the last of its
        sources, to D. A target that declares matrix units overrides this; the `llvm`
        starter's renderer shows one."""
        raise CapabilityError(f"{type(self).__name__} renders no matrix unit, yet the kernel "
                              f"uses {node.arg.name}: declare only the units the renderer has "
                              "(Capabilities.matrix_units)")

    def vector(self, kind: str, values: list[str]) -> str:
        """A <len(values) x kind> vector of `values`, lane 0 first."""
        vector = "poison"
        for lane, value in enumerate(values):
            name = self.temp()
            self.emit(f"{name} = insertelement <{len(values)} x {kind}> {vector}, "
                      f"{kind} {value}, i32 {lane}")
            vector = name
        return vector

    # ---- compute ops ---------------------------------------------------------------------

    def intrinsic(self, base: str, kind: str, count: int = 1) -> str:
        """The name of llvm.BASE for `kind`, declared once in the module."""
        name = f"@llvm.{base}.{_INTRINSIC_SUFFIX[kind]}"
        self.declares.add(f"declare {kind} {name}({', '.join([kind] * count)})")
        return name

    def compute(self, name: str, node: Node, operands: list[str], dtype: DType) -> None:
        """`name` = the compute op of `node` on `operands` of `dtype` (WHERE: the values')."""
        op, kind = node.op, self.r.value_type(dtype)
        if op in (Op.CAST, Op.BITCAST):
            convert = self.cast if op is Op.CAST else self.bitcast
            self.emit(f"{name} = {convert(operands[0], dtype, node.value_dtype)}")
            return
        a, b = operands[0], operands[1] if len(operands) > 1 else ""    # "": a unary op
        if op is Op.WHERE:
            self.emit(f"{name} = select i1 {a}, {kind} {b}, {kind} {operands[2]}")
        elif op is Op.MULACC:    # unfused: the product is rounded, then the sum
            product = self.temp()
            self.compute(product, Node(Op.MUL, dtype), operands[:2], dtype)
            self.compute(name, Node(Op.ADD, dtype), [product, operands[2]], dtype)
        elif dtype.is_float:
            self.emit(f"{name} = {self.float_op(op, kind, a, b)}")
        else:
            self.emit(f"{name} = {self.int_op(op, dtype, kind, a, b)}")

    def float_op(self, op: Op, kind: str, a: str, b: str) -> str:
        """The instruction of a compute op on floats of LLVM type `kind`."""
        if op in _FLOAT_BINARY:
            return f"{_FLOAT_BINARY[op]} {kind} {a}, {b}"
        if op is Op.NEG:
            return f"fneg {kind} {a}"
        if op is Op.RECIP:
            return f"fdiv {kind} {self.r.const(1.0, _float_dtype(kind))}, {a}"
        if op in (Op.SQRT, Op.TRUNC):
            return f"call {kind} {self.intrinsic(op.name.lower(), kind)}({kind} {a})"
        if op is Op.CMPLT:
            return f"fcmp olt {kind} {a}, {b}"
        if op is Op.CMPNE:
            return f"fcmp une {kind} {a}, {b}"     # true when either is NaN
        if op is Op.MAX:                           # NaN wins: a > b, or a is NaN
            greater, nan, either = self.temp(), self.temp(), self.temp()
            self.emit(f"{greater} = fcmp ogt {kind} {a}, {b}")
            self.emit(f"{nan} = fcmp uno {kind} {a}, {a}")
            self.emit(f"{either} = or i1 {greater}, {nan}")
            return f"select i1 {either}, {kind} {a}, {kind} {b}"
        raise NotImplementedError(f"{op.name} on floats has no LLVM rendering here; leave it "
                                  "out of Capabilities.ops so that codegen decomposes it")

    def int_op(self, op: Op, dtype: DType, kind: str, a: str, b: str) -> str:
        """The instruction of a compute op on integers (or bools) of `dtype`."""
        signed = dtype.kind == "int"
        if op in _INT_BINARY:
            return f"{_INT_BINARY[op]} {kind} {a}, {b}"
        if op is Op.NEG:
            return f"sub {kind} 0, {a}"
        if op in (Op.IDIV, Op.MOD):
            divisor = self.safe_divisor(dtype, kind, a, b)
            instruction = {Op.IDIV: "sdiv" if signed else "udiv",
                           Op.MOD: "srem" if signed else "urem"}[op]
            return f"{instruction} {kind} {a}, {divisor}"
        if op in (Op.SHL, Op.SHR):                 # amounts >= bits are unspecified: mask
            amount = self.temp()
            self.emit(f"{amount} = and {kind} {b}, {dtype.bits - 1}")
            instruction = "shl" if op is Op.SHL else ("ashr" if signed else "lshr")
            return f"{instruction} {kind} {a}, {amount}"
        if op is Op.CMPLT:
            return f"icmp {'slt' if signed else 'ult'} {kind} {a}, {b}"
        if op is Op.CMPNE:
            return f"icmp ne {kind} {a}, {b}"
        if op is Op.MAX:
            greater = self.temp()
            self.emit(f"{greater} = icmp {'sgt' if signed else 'ugt'} {kind} {a}, {b}")
            return f"select i1 {greater}, {kind} {a}, {kind} {b}"
        raise NotImplementedError(f"{op.name} on {dtype} has no LLVM rendering here")

    def safe_divisor(self, dtype: DType, kind: str, a: str, b: str) -> str:
        """b, or 1 where the ABI leaves the quotient unspecified and the CPU would trap."""
        bad = self.temp()
        self.emit(f"{bad} = icmp eq {kind} {b}, 0")
        if dtype.kind == "int":
            minimum, minus_one, overflow, either = (self.temp() for _ in range(4))
            self.emit(f"{minimum} = icmp eq {kind} {a}, {self.r.const(dtype.min, dtype)}")
            self.emit(f"{minus_one} = icmp eq {kind} {b}, -1")
            self.emit(f"{overflow} = and i1 {minimum}, {minus_one}")
            self.emit(f"{either} = or i1 {bad}, {overflow}")
            bad = either
        safe = self.temp()
        self.emit(f"{safe} = select i1 {bad}, {kind} 1, {kind} {b}")
        return safe

    def cast(self, a: str, src: DType, dst: DType) -> str:
        """CAST: to bool is != 0 (NaN is true); float to int truncates; ints wrap."""
        have, want = self.r.value_type(src), self.r.value_type(dst)
        if dst == dtypes.bool_:
            if src.is_float:
                return f"fcmp une {have} {a}, {self.r.const(0.0, src)}"
            return f"icmp ne {have} {a}, 0" if src != dst else _copy(have, a)
        if src == dst or have == want and not (src.is_float or dst.is_float):
            return _copy(want, a)
        if src.is_float and dst.is_float:
            if src == dtypes.bfloat16 and dst == dtypes.float16 or (
                    src == dtypes.float16 and dst == dtypes.bfloat16):
                wide = self.temp()
                self.emit(f"{wide} = fpext {have} {a} to float")
                return f"fptrunc float {wide} to {want}"
            grow = _float_bits(want) > _float_bits(have)
            return f"{'fpext' if grow else 'fptrunc'} {have} {a} to {want}"
        if src.is_float:   # out of range is poison in LLVM: freeze it to some value
            converted = self.temp()
            self.emit(f"{converted} = {'fptosi' if dst.kind == 'int' else 'fptoui'} {have} {a} "
                      f"to {want}")
            return f"freeze {want} {converted}"
        if dst.is_float:
            signed = src.kind == "int"
            return f"{'sitofp' if signed else 'uitofp'} {have} {a} to {want}"
        if dst.bits < src.bits:
            return f"trunc {have} {a} to {want}"
        return f"{'sext' if src.kind == 'int' else 'zext'} {have} {a} to {want}"

    def bitcast(self, a: str, src: DType, dst: DType) -> str:
        """BITCAST: the same bits; a bool's are 0 or 1."""
        have, want = self.r.value_type(src), self.r.value_type(dst)
        if dst == dtypes.bool_:
            return f"icmp ne {have} {a}, 0" if src != dst else _copy(want, a)
        if src == dtypes.bool_:
            return f"zext i1 {a} to {want}"
        return f"bitcast {have} {a} to {want}"


LLVMRenderer.function = LLVMFunction


def _copy(kind: str, value: str) -> str:
    """An instruction whose result is `value` (LLVM has no plain copy)."""
    return f"bitcast {kind} {value} to {kind}"


def _float_bits(kind: str) -> int:
    return {"half": 16, "bfloat": 16, "float": 32, "double": 64}[kind]


def _float_dtype(kind: str) -> DType:
    return {"half": dtypes.float16, "bfloat": dtypes.bfloat16, "float": dtypes.float32,
            "double": dtypes.float64}[kind]

