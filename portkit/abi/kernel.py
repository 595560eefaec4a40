"""The kernel IR handed to a backend: a linear SSA list of nodes, launch dimensions, a JSON form.

A node refers to earlier nodes by their position in the list. Loops (RANGE..END) and branches
(IF..ENDIF) are brackets in the list, so a backend renders a kernel top to bottom in one pass.
Launch dimensions follow CUDA: `grid` counts workgroups per axis, `block` threads per workgroup.
Arguments are the buffers (PARAM, by position) and then the scalars (VAR, in list order), each
passed to a Program as one 32-bit word: an int32 VAR is its value, a float32 or uint32 VAR its
bits (`scalar_words`), which the rendered kernel reinterprets.

Rules `validate` cannot check, which a kernel must keep and a backend may rely on:
- LOCAL memory holds unspecified values until a thread stores to it.
- Threads of one launch do not communicate through PARAM buffers: no thread loads an element
  another thread of the same launch stores (workgroup threads use LOCAL and BARRIER instead).
- Every thread of a workgroup reaches each BARRIER the same number of times: the bounds of a
  RANGE around a BARRIER are the same for the whole workgroup.
- Indices stay inside their buffer, except under a false gate.
- ADD, MUL and the other ops are each rounded on their own: a backend must not contract
  MUL then ADD into a fused multiply-add (only MULACC may be fused).
- Every thread of a matrix unit's group reaches each MMA together (as for BARRIER: uniform loop
  bounds), and the threads that hold copies of one A or B element give it the same value.
"""
from __future__ import annotations

import json
import keyword
import struct
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.errors import InvalidKernel
from portkit.abi.matrix import MatrixUnit
from portkit.abi.ops import BINARY, COMPARISON, DOMAIN, TERNARY, UNARY, Op
from portkit.abi.version import ABI_VERSION

Dim3 = tuple[int, int, int]

# The dtypes a VAR may have: one 32-bit word each, so every backend passes the same words.
VAR_DTYPES = (dtypes.int32, dtypes.uint32, dtypes.float32)
_WORD_FORMAT = {dtypes.int32: "i", dtypes.uint32: "I", dtypes.float32: "f"}


@dataclass(frozen=True)
class Node:
    """One instruction. `src` holds positions of earlier nodes; `arg` is op-specific (see Op)."""

    op: Op
    dtype: DType | None = None
    src: tuple[int, ...] = ()
    arg: Any = None

    @property
    def value_dtype(self) -> DType:
        """The dtype of a node that has one: every node but STORE, ASSIGN, BARRIER, IF and the
        closing END and ENDIF. InvalidKernel for those, as `validate` would say."""
        if self.dtype is None:
            raise InvalidKernel(f"a {self.op.name} node has no value, so no dtype")
        return self.dtype


@dataclass(frozen=True)
class Signature:
    """A kernel's arguments, as an explicit-layout API (Vulkan's descriptor set and push
    constants) declares them before it builds a pipeline: each buffer's dtype in argument
    order, the positions of those it stores to, and each scalar's dtype (one 32-bit word each)."""

    buffers: tuple[DType, ...]
    written: frozenset[int]
    scalars: tuple[DType, ...]


@dataclass(frozen=True)
class Kernel:
    """A complete, launchable unit of work: what every backend renders, compiles and runs."""

    name: str
    nodes: tuple[Node, ...]
    grid: Dim3 = (1, 1, 1)
    block: Dim3 = (1, 1, 1)

    @property
    def params(self) -> tuple[Node, ...]:
        """The buffer arguments, in argument order."""
        return tuple(sorted((n for n in self.nodes if n.op is Op.PARAM), key=lambda n: n.arg))

    @property
    def vars(self) -> tuple[str, ...]:
        """The names of the scalar arguments, in argument order."""
        return tuple(n.arg for n in self.nodes if n.op is Op.VAR)

    @property
    def var_dtypes(self) -> tuple[DType, ...]:
        """The dtypes of the scalar arguments, in argument order (each in VAR_DTYPES)."""
        return tuple(n.value_dtype for n in self.nodes if n.op is Op.VAR)

    @property
    def written(self) -> frozenset[int]:
        """Positions (PARAM.arg) of the buffers this kernel stores to."""
        nodes = self.nodes
        return frozenset(nodes[n.src[0]].arg for n in nodes
                         if n.op is Op.STORE and nodes[n.src[0]].op is Op.PARAM)

    @property
    def signature(self) -> Signature:
        """Its arguments' dtypes and which buffers it writes (ABI 0.7)."""
        return Signature(tuple(p.value_dtype for p in self.params), self.written,
                         self.var_dtypes)

    def to_json(self) -> str:
        """The kernel as JSON text: exact (floats as hex), so a replay runs the same kernel."""
        return json.dumps({
            "abi_version": ABI_VERSION, "name": self.name,
            "grid": list(self.grid), "block": list(self.block),
            "nodes": [{"op": n.op.value, "dtype": n.dtype.name if n.dtype else None,
                       "src": list(n.src), "arg": _arg_to_json(n)} for n in self.nodes],
        })

    @staticmethod
    def from_json(text: str) -> Kernel:
        """Parses `to_json` output back into an equal Kernel, and validates it; InvalidKernel
        (one line) for JSON that is not a kernel of this ABI version."""
        try:
            data = json.loads(text)
            kernel = Kernel._from_data(data)
            if data.get("abi_version") != ABI_VERSION:
                raise InvalidKernel(f"the kernel is for ABI {data.get('abi_version')!r}, this "
                                    f"portkit reads {ABI_VERSION}; save it again with this "
                                    "portkit")
            return kernel
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as error:
            if isinstance(error, InvalidKernel):
                raise
            what = f"missing key {error}" if isinstance(error, KeyError) else str(error)[:200]
            raise InvalidKernel(f"not a kernel's JSON ({type(error).__name__}: {what})"
                                ) from None

    @staticmethod
    def _from_data(data: dict) -> Kernel:
        nodes = []
        for i, d in enumerate(data["nodes"]):
            try:
                op = Op(d["op"])
            except ValueError:
                raise InvalidKernel(f"node {i}: unknown op {d['op']!r}") from None
            dtype = dtypes.by_name(d["dtype"]) if d["dtype"] else None
            nodes.append(Node(op, dtype, tuple(d["src"]), _arg_from_json(op, dtype, d["arg"])))
        kernel = Kernel(data["name"], tuple(nodes), _dim3(data["grid"]), _dim3(data["block"]))
        validate(kernel)
        return kernel


def _dim3(dims: Any) -> Dim3:
    """A grid or block as a tuple (a list from JSON or a caller); `validate` checks that it is
    three positive ints."""
    return cast(Dim3, tuple(dims))


def _arg_to_json(node: Node) -> Any:
    if node.op is Op.CONST and node.value_dtype.is_float:
        return float(node.arg).hex()
    if isinstance(node.arg, MatrixUnit):
        return node.arg.to_json()
    return list(node.arg) if isinstance(node.arg, tuple) else node.arg


def _arg_from_json(op: Op, dtype: DType | None, arg: Any) -> Any:
    if op is Op.CONST and dtype is not None and dtype.is_float:
        return float.fromhex(arg)
    if op is Op.MMA and isinstance(arg, dict):
        return MatrixUnit.from_json(arg)
    return tuple(arg) if isinstance(arg, list) else arg


_NO_VALUE = (Op.STORE, Op.END, Op.ENDIF, Op.ASSIGN, Op.BARRIER, Op.IF, Op.MMA)
_MEMORY = (Op.PARAM, Op.LOCAL)


# Kernels that passed `validate`, by id (a Kernel is immutable, so it stays valid): the
# builder validates each kernel it makes, and the runtime again before it renders one, which
# cost a model's first call a second pass over every node of every kernel.
_valid: weakref.WeakValueDictionary[int, Kernel] = weakref.WeakValueDictionary()


def validate(kernel: Kernel) -> Kernel:
    """Checks every rule of the IR; raises InvalidKernel naming the first broken one."""
    if _valid.get(id(kernel)) is kernel:
        return kernel
    nodes = kernel.nodes
    if not isinstance(kernel.name, str) or not kernel.name:
        raise InvalidKernel(f"a kernel's name must be a non-empty string, got {kernel.name!r}")
    for dims, what in ((kernel.grid, "grid"), (kernel.block, "block")):
        if len(dims) != 3 or not all(_is_int(d) and d >= 1 for d in dims):
            raise InvalidKernel(f"kernel {kernel.name!r}: {what} must be 3 positive ints, "
                                f"got {dims}")
    scopes: list[int] = []          # positions of the open RANGE / IF nodes
    still_open: set[int] = set()
    # per node, the innermost RANGE or IF open where it is defined (-1: none): a value may be
    # used while that one is open (then so are all around it, which opened before it)
    inner: list[int] = []
    # the failing node, for the message; set per node, the message made only on failure (a
    # kernel has thousands of nodes)
    at: list[Any] = [0, None]

    def fail(message: str) -> InvalidKernel:
        return _failure(kernel.name, at[0], at[1], message)

    for i, node in enumerate(nodes):
        op = at[1] = node.op
        at[0] = i
        for s in node.src:
            if not (type(s) is int or _is_int(s)) or not 0 <= s < i:
                raise fail(f"source {s} is not an earlier node")
            if nodes[s].op in _NO_VALUE and op is not Op.ENDIF:
                raise fail(f"source {s} is a {nodes[s].op.name}, which has no value")
            if inner[s] >= 0 and inner[s] not in still_open:
                raise fail(f"source {s} was defined inside a loop or branch closed before here")
        if op is Op.END or op is Op.ENDIF:
            opener = Op.RANGE if op is Op.END else Op.IF
            if not scopes or node.src != (scopes[-1],) or nodes[scopes[-1]].op is not opener:
                raise fail(f"must close the innermost open {opener.name}")
            still_open.discard(scopes.pop())
        _check_node(node, [nodes[s] for s in node.src], fail)
        if (op is Op.BARRIER or op is Op.MMA) and any(nodes[s].op is Op.IF for s in scopes):
            raise fail(f"a {op.name} inside an IF can deadlock; place it outside every "
                       "branch")
        if op is Op.MMA and (kernel.block[0] * kernel.block[1] * kernel.block[2]
                             ) % node.arg.threads:
            raise fail(f"its unit takes {node.arg.threads} threads a tile, a multiple of which "
                       f"must make the block {kernel.block}")
        if op is Op.RANGE or op is Op.IF:
            scopes.append(i)
            still_open.add(i)
        inner.append(scopes[-1] if scopes else -1)
    if scopes:
        raise InvalidKernel(f"kernel {kernel.name!r}: node {scopes[-1]} "
                            f"({nodes[scopes[-1]].op.name}) is never closed")
    positions = sorted(n.arg for n in nodes if n.op is Op.PARAM)
    if positions != list(range(len(positions))):
        raise InvalidKernel(f"kernel {kernel.name!r}: PARAM positions must be 0..n-1 once each, "
                            f"got {positions}")
    names = kernel.vars
    if len(set(names)) != len(names):
        raise InvalidKernel(f"kernel {kernel.name!r}: VAR names repeat: {names}")
    if not any(n.op is Op.STORE for n in nodes):
        raise InvalidKernel(f"kernel {kernel.name!r} stores nothing; a kernel has at least one "
                            "STORE")
    _valid[id(kernel)] = kernel
    return kernel


def _is_int(value: Any) -> bool:
    # JSON's true and false are Python ints too: a PARAM numbered `true` is not position 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _failure(name: str, position: int, op: Op, message: str) -> InvalidKernel:
    return InvalidKernel(f"kernel {name!r}, node {position} ({op.name}): {message}")


_DOMAIN = {op: frozenset(domain) for op, domain in DOMAIN.items()}
_ARITY = {**dict.fromkeys(UNARY, 1), **dict.fromkeys(BINARY, 2), **dict.fromkeys(TERNARY, 3),
          Op.CAST: 1, Op.BITCAST: 1, Op.RANGE: 2, Op.END: 1, Op.IF: 1, Op.ENDIF: 1,
          Op.ACC: 1, Op.ASSIGN: 2}


def _check_node(node: Node, src: list[Node], fail) -> None:
    op, dtype, arg = node.op, node.dtype, node.arg
    arity = _ARITY.get(op, 0)
    if op is Op.MMA:
        if not isinstance(arg, MatrixUnit) or arg.problems():
            why = arg.problems() if isinstance(arg, MatrixUnit) else type(arg).__name__
            raise fail(f"arg must be a well-formed MatrixUnit, got {why}")
        arity = sum(arg.operand_counts)
    if op is Op.LOAD:
        arity = len(src) if len(src) in (2, 3) else 2
    if op is Op.STORE:
        arity = len(src) if len(src) in (3, 4) else 3
    if len(src) != arity:
        raise fail(f"takes {arity} sources, got {len(src)}")
    if op in _NO_VALUE:
        if dtype is not None:
            raise fail("has no value, so its dtype must be None")
    elif not isinstance(dtype, DType):
        raise fail("needs a dtype")
    int32, bool_ = dtypes.int32, dtypes.bool_

    if op in UNARY or op in BINARY or op in TERNARY:
        operands = src[1:] if op is Op.WHERE else src
        if op is Op.WHERE and src[0].dtype != bool_:
            raise fail(f"condition must be bool, got {src[0].dtype}")
        first = operands[0].dtype
        # `is` before `!=`: dtypes are mostly the module's own objects (a kernel has
        # thousands of nodes)
        if any(s.dtype is not first and s.dtype != first for s in operands[1:]):
            raise fail(f"operand dtypes differ: {[s.dtype for s in operands]}")
        if first not in _DOMAIN[op]:
            raise fail(f"is not defined on {first}")
        want = bool_ if op in COMPARISON else first
        if dtype is not want and dtype != want:
            raise fail(f"result dtype must be {want}, got {dtype}")
    elif op is Op.BITCAST and node.value_dtype.itemsize != src[0].value_dtype.itemsize:
        raise fail(f"cannot bitcast {src[0].dtype} to {dtype}: sizes differ")
    elif op is Op.PARAM and not (_is_int(arg) and arg >= 0):
        raise fail(f"arg must be the buffer's position (int >= 0), got {arg!r}")
    elif op is Op.VAR and (dtype not in VAR_DTYPES or not isinstance(arg, str)
                           or not arg.isidentifier() or keyword.iskeyword(arg)):
        raise fail(f"must be one of {[d.name for d in VAR_DTYPES]} and named by an identifier, "
                   f"got {dtype} {arg!r}")
    elif op is Op.CONST:
        _check_const(node.value_dtype, arg, fail)
    elif op is Op.SPECIAL and (dtype != int32 or arg not in _SPECIALS):
        raise fail(f"must be int32 with arg in {_SPECIALS}, got {dtype} {arg!r}")
    elif op is Op.RANGE and (dtype != int32 or any(s.dtype != int32 for s in src)):
        raise fail("counter and bounds must be int32")
    elif op is Op.IF and src[0].dtype != bool_:
        raise fail(f"condition must be bool, got {src[0].dtype}")
    elif op in (Op.LOAD, Op.STORE):
        buffer, index = src[0], src[1]
        if buffer.op not in _MEMORY:
            raise fail(f"first source must be a PARAM or LOCAL, got {buffer.op.name}")
        if index.dtype != int32:
            raise fail(f"index must be int32, got {index.dtype}")
        value_dtype = dtype if op is Op.LOAD else src[2].dtype
        if value_dtype != buffer.dtype:
            raise fail(f"buffer holds {buffer.dtype}, value is {value_dtype}")
        gate = src[2 if op is Op.LOAD else 3:]
        if gate and gate[0].dtype != bool_:
            raise fail(f"gate must be bool, got {gate[0].dtype}")
    elif op is Op.LOCAL and not (_is_int(arg) and arg > 0):
        raise fail(f"arg must be a positive element count, got {arg!r}")
    elif op is Op.ACC and src[0].dtype != dtype:
        raise fail(f"initial value is {src[0].dtype}, register is {dtype}")
    elif op is Op.ASSIGN and (src[0].op is not Op.ACC or src[1].dtype != src[0].dtype):
        raise fail("must assign a value of the register's dtype to an ACC")
    elif op is Op.MMA:
        _check_mma(arg, node.src, src, fail)


def _check_mma(unit: MatrixUnit, positions: tuple[int, ...], src: list[Node], fail) -> None:
    na, nb, nc = unit.operand_counts
    if len(set(positions[na + nb:])) != nc:
        raise fail("C fragment names one ACC twice; each element has its own register")
    for what, operands, want in (("A", src[:na], unit.a_dtype), ("B", src[na:na + nb],
                                 unit.b_dtype), ("C", src[na + nb:], unit.acc_dtype)):
        if any(s.dtype != want for s in operands):
            got = sorted({s.dtype.name if s.dtype else "no value" for s in operands})
            raise fail(f"{what} fragment must be {want.name}, got {got}")
    if any(s.op is not Op.ACC for s in src[na + nb:]):
        raise fail("C fragment must be ACC registers: MMA adds A·B into them")


_SPECIALS = tuple((kind, axis) for kind in ("group", "local") for axis in range(3))


def _check_const(dtype: DType, value: Any, fail) -> None:
    if dtype == dtypes.bool_:
        ok = isinstance(value, bool)
    elif dtype.is_int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and dtype.min <= value <= dtype.max
    else:
        ok = isinstance(value, float)
    if not ok:
        raise fail(f"value {value!r} is not a {dtype}")


def scalar_words(var_dtypes: tuple[DType, ...], values: tuple) -> list[int]:
    """VAR values as the 32-bit words (signed ints) a Program receives, in argument order.

    A float too large for float32 becomes inf and an int outside 32 bits wraps, as a cast
    to the VAR's dtype would."""
    formats = "".join(_WORD_FORMAT[d] for d in var_dtypes)
    try:
        return list(struct.unpack(f"<{len(formats)}i", struct.pack("<" + formats, *values)))
    except (struct.error, OverflowError):
        with np.errstate(over="ignore", invalid="ignore"):
            words = [np.array(v).astype(d.np).view(np.int32) for d, v in zip(var_dtypes, values)]
        return [int(w) for w in words]


def word_value(word: int, dtype: DType) -> Any:
    """The value of a VAR of `dtype` passed as `word` (the inverse of scalar_words), as numpy."""
    return np.array(word & 0xFFFFFFFF, np.uint32).view(dtype.np)[()]


@dataclass
class KernelBuilder:
    """Appends nodes and returns their positions; the plain way to write a kernel by hand.

    >>> b = KernelBuilder("double")
    >>> x, out = b.param(dtypes.float32), b.param(dtypes.float32)
    >>> i = b.special("group", 0)
    >>> b.store(out, i, b.alu(Op.ADD, b.load(x, i), b.load(x, i)))
    >>> kernel = b.build(grid=(16, 1, 1))
    """

    name: str
    nodes: list[Node] = field(default_factory=list)

    def add(self, op: Op, dtype: DType | None = None, src: tuple[int, ...] = (),
            arg: Any = None) -> int:
        self.nodes.append(Node(op, dtype, tuple(src), arg))
        return len(self.nodes) - 1

    def dtype(self, ref: int) -> DType:
        return self.nodes[ref].value_dtype

    def param(self, dtype: DType) -> int:
        return self.add(Op.PARAM, dtype, arg=sum(n.op is Op.PARAM for n in self.nodes))

    def var(self, name: str, dtype: DType = dtypes.int32) -> int:
        return self.add(Op.VAR, dtype, arg=name)

    def const(self, value: Any, dtype: DType = dtypes.int32) -> int:
        value = bool(value) if dtype == dtypes.bool_ else (
            float(value) if dtype.is_float else int(value))
        return self.add(Op.CONST, dtype, arg=value)

    def special(self, kind: str, axis: int = 0) -> int:
        return self.add(Op.SPECIAL, dtypes.int32, arg=(kind, axis))

    def alu(self, op: Op, *src: int) -> int:
        """A compute op; its dtype follows from the operands (bool for comparisons)."""
        if op in COMPARISON:
            dtype = dtypes.bool_
        else:
            dtype = self.dtype(src[1] if op is Op.WHERE else src[0])
        return self.add(op, dtype, src)

    def cast(self, src: int, dtype: DType, bitcast: bool = False) -> int:
        return self.add(Op.BITCAST if bitcast else Op.CAST, dtype, (src,))

    def load(self, buffer: int, index: int, gate: int | None = None) -> int:
        return self.add(Op.LOAD, self.dtype(buffer), (buffer, index) + (
            () if gate is None else (gate,)))

    def store(self, buffer: int, index: int, value: int, gate: int | None = None) -> int:
        return self.add(Op.STORE, None, (buffer, index, value) + (
            () if gate is None else (gate,)))

    def local(self, dtype: DType, size: int) -> int:
        return self.add(Op.LOCAL, dtype, arg=size)

    def acc(self, init: int) -> int:
        return self.add(Op.ACC, self.dtype(init), (init,))

    def assign(self, acc: int, value: int) -> int:
        return self.add(Op.ASSIGN, None, (acc, value))

    def barrier(self) -> int:
        return self.add(Op.BARRIER)

    @contextmanager
    def loop(self, start: int, end: int) -> Iterator[int]:
        """`with b.loop(start, end) as i:` emits RANGE, the body, then END."""
        counter = self.add(Op.RANGE, dtypes.int32, (start, end))
        yield counter
        self.add(Op.END, None, (counter,))

    @contextmanager
    def branch(self, cond: int) -> Iterator[None]:
        """`with b.branch(cond):` emits IF, the body, then ENDIF."""
        opener = self.add(Op.IF, None, (cond,))
        yield
        self.add(Op.ENDIF, None, (opener,))

    def build(self, grid: Dim3 = (1, 1, 1), block: Dim3 = (1, 1, 1)) -> Kernel:
        """The finished, validated kernel."""
        return validate(Kernel(self.name, tuple(self.nodes), _dim3(grid), _dim3(block)))
