"""portkit.Tensor: a PyTorch-like, lazy tensor whose work reaches a device only as ABI kernels.

Operations build a graph (portkit/graph.py); `.realize()`, `.numpy()`, `.item()` and
`.tolist()` schedule and run it (portkit/schedule.py). Only the primitives in
portkit/autograd.py touch the graph; everything below composes them, so every op here is
differentiable wherever its primitives are.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from portkit import autograd, graph, schedule
from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.errors import UnsupportedDType
from portkit.abi.kernel import Kernel
from portkit.autograd import RULES, Context, no_grad
from portkit.codegen.lower import lower
from portkit.graph import Lazy

bool_, int8, int16, int32, int64 = (dtypes.bool_, dtypes.int8, dtypes.int16, dtypes.int32,
                                    dtypes.int64)
uint8, uint16, uint32, uint64 = dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64
float16, bfloat16, float32, float64 = (dtypes.float16, dtypes.bfloat16, dtypes.float32,
                                       dtypes.float64)
default_float = float32

Scalar = int | float | bool


def _dtype(dtype: DType | str | None) -> DType | None:
    if dtype is None or isinstance(dtype, DType):
        return dtype
    return dtypes.by_name(dtype) if isinstance(dtype, str) else dtypes.from_numpy(dtype)


def promote(a: DType, b: DType) -> DType:
    """The dtype of a binary op between tensors of dtypes a and b (PyTorch's rules)."""
    if a == b:
        return a
    if a.is_float or b.is_float:
        floats = [d for d in (a, b) if d.is_float]
        if len(floats) == 2 and {a, b} == {float16, bfloat16}:
            return float32
        return max(floats, key=lambda d: d.itemsize)
    if a == bool_ or b == bool_:
        return b if a == bool_ else a
    if a.kind == b.kind:
        return max((a, b), key=lambda d: d.itemsize)
    signed, unsigned = (a, b) if a.kind == "int" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: int16, 2: int32, 4: int64}.get(unsigned.itemsize, int64)


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise IndexError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted({a % ndim for a in axes})) if ndim else ()


class Tensor:
    """A lazy n-dimensional array on a device, with autograd.

    Integers default to int32 (Python ints, int64 numpy data, arange, argmax, randint), not
    PyTorch's int64: WebGPU and many accelerators have no 64-bit integers. Pass dtype=int64
    where a device has it. A dtype the device lacks raises UnsupportedDType when the tensor is
    made or cast, not later when it runs.
    """

    __slots__ = ("_ctx", "grad", "lazy", "requires_grad")
    __hash__ = object.__hash__
    training = False

    def __init__(self, data: Any, dtype: DType | str | None = None, device: str | None = None,
                 requires_grad: bool = False):
        dtype = _dtype(dtype)
        if isinstance(data, Lazy):
            lazy = data
        elif isinstance(data, Tensor):
            lazy = data.lazy if dtype is None else data.lazy.cast(dtype)
        else:
            device = device or schedule.default_device()
            array = _to_numpy(data, dtype)
            target = _check_dtype(dtype or dtypes.from_numpy(array.dtype), device)
            lazy = graph.load(schedule.upload(array, device, target), target, array.shape,
                              device)
        self.lazy, self.grad, self._ctx = lazy, None, None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_()

    # -- properties ---------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self.lazy.shape

    @property
    def dtype(self) -> DType:
        return self.lazy.dtype

    @property
    def device(self) -> str:
        return self.lazy.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.lazy.size

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"<Tensor {list(self.shape)} {self.dtype.name} on {self.device}{grad}>"

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and not self.dtype.is_float:
            raise TypeError(f"only float tensors can require gradients, this one is "
                            f"{self.dtype.name}")
        self.requires_grad = flag
        return self

    def detach(self) -> Tensor:
        return Tensor(self.lazy)

    # -- running ------------------------------------------------------------------------------

    def realize(self) -> Tensor:
        """Runs the graph behind this tensor; returns self."""
        realize(self)
        return self

    def schedule(self) -> list[Kernel]:
        """The ABI kernels a realize of this tensor would run now (nothing runs)."""
        items = schedule.create_schedule([self.lazy])
        runtime = schedule.device(self.device)
        return [lower(it.root, it.inputs, runtime.capabilities, schedule._serial(runtime),
                      name=schedule._name(it.root)) for it in items if not it.is_copy]

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values."""
        self.realize()
        if self.numel() == 0:
            return np.zeros(self.shape, self.dtype.np)
        return self.lazy.buffer.numpy()[:self.numel()].reshape(self.shape).copy()

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape "
                             f"{self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: str) -> Tensor:
        """This tensor on another device."""
        return self if device == self.device else self._prim("copy", arg=device)

    def assign(self, value: Tensor | Any) -> Tensor:
        """Replaces this tensor's contents (same shape and dtype), keeping the object."""
        value = value if isinstance(value, Tensor) else Tensor(value, self.dtype, self.device)
        if value.shape != self.shape:
            raise ValueError(f"assign: shapes differ, {self.shape} vs {value.shape}")
        self.lazy = value.lazy.cast(self.dtype)
        return self

    def contiguous(self) -> Tensor:
        """A copy laid out row-major in its own buffer once realized."""
        return self + 0 if self.dtype != bool_ else self | False

    # -- construction -------------------------------------------------------------------------

    @staticmethod
    def full(shape, value: Scalar, dtype=None, device: str | None = None) -> Tensor:
        shape = _shape(shape)
        device = device or schedule.default_device()
        dtype = _check_dtype(_dtype(dtype) or _scalar_dtype(value), device)
        return Tensor(graph.const(value, dtype, shape, device))

    @staticmethod
    def zeros(*shape, dtype=None, device: str | None = None) -> Tensor:
        return Tensor.full(shape, 0.0, dtype or default_float, device)

    @staticmethod
    def ones(*shape, dtype=None, device: str | None = None) -> Tensor:
        return Tensor.full(shape, 1.0, dtype or default_float, device)

    @staticmethod
    def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype=None,
               device: str | None = None) -> Tensor:
        if stop is None:
            start, stop = 0, start
        dtype = _dtype(dtype) or (int32 if all(isinstance(v, int) for v in (start, stop, step))
                                  else default_float)
        count = max(0, math.ceil((stop - start) / step))
        index = Tensor(graph.iota((count,), 0, device or schedule.default_device()))
        return (index.cast(dtype) * step + start).cast(dtype)

    @staticmethod
    def linspace(start: float, stop: float, steps: int, dtype=None,
                 device: str | None = None) -> Tensor:
        index = Tensor(graph.iota((steps,), 0, device or schedule.default_device()))
        step = (stop - start) / (steps - 1) if steps > 1 else 0.0
        return (index.cast(default_float) * step + start).cast(_dtype(dtype) or default_float)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype=None, device: str | None = None) -> Tensor:
        device = device or schedule.default_device()
        rows = Tensor(graph.iota((n, m or n), 0, device))
        cols = Tensor(graph.iota((n, m or n), 1, device))
        return (rows == cols).cast(_dtype(dtype) or default_float)

    def full_like(self, value: Scalar, dtype=None) -> Tensor:
        return Tensor.full(self.shape, value, dtype or self.dtype, self.device)

    def zeros_like(self, dtype=None) -> Tensor:
        return self.full_like(0, dtype)

    def ones_like(self, dtype=None) -> Tensor:
        return self.full_like(1, dtype)

    @staticmethod
    def rand(*shape, dtype=None, device: str | None = None) -> Tensor:
        """Uniform in [0, 1): the same numbers on every device for the same seed()."""
        dtype = _dtype(dtype) or default_float
        if not dtype.is_float:
            raise TypeError(f"rand makes floats, not {dtype.name}; use randint for integers")
        bits = _random_bits(_shape(shape), device or schedule.default_device())
        # the top p bits, p the dtype's precision, scaled by 2**-p: exact in the dtype, so
        # never rounded up to 1.0 and identical on every device
        precision = _PRECISION[dtype.name]
        return (bits >> (32 - precision)).cast(dtype) * (1.0 / (1 << precision))

    @staticmethod
    def randn(*shape, dtype=None, device: str | None = None) -> Tensor:
        """Standard normal (Box-Muller over two uniform draws, computed in float32)."""
        shape = _shape(shape)
        u1, u2 = Tensor.rand(*shape, device=device), Tensor.rand(*shape, device=device)
        out = (-2.0 * (1.0 - u1).log()).sqrt() * (u2 * (2 * math.pi)).cos()
        return out.cast(_dtype(dtype) or default_float)

    @staticmethod
    def randint(low: int, high: int, shape=(), dtype=None, device: str | None = None) -> Tensor:
        """Integers uniform in [low, high) (int32 unless dtype says otherwise)."""
        span = high - low
        if not 0 < span <= 1 << 32:
            raise ValueError(f"randint needs low < high <= low + 2**32, got [{low}, {high})")
        bits = _random_bits(_shape(shape), device or schedule.default_device())
        # the remainder is exact in uint32 on every device; its bias is below span / 2**32
        picked = bits if span == 1 << 32 else bits % span
        return picked.cast(_dtype(dtype) or int32) + low

    def rand_like(self) -> Tensor:
        return Tensor.rand(*self.shape, dtype=self.dtype, device=self.device)

    def randn_like(self) -> Tensor:
        return Tensor.randn(*self.shape, dtype=self.dtype, device=self.device)

    # -- primitives ---------------------------------------------------------------------------

    def _prim(self, name: str, *others: Tensor, arg: Any = None) -> Tensor:
        inputs = (self,) + others
        rule = RULES[name]
        lazy = rule.forward(*(t.lazy for t in inputs), arg=arg)
        out = Tensor(lazy)
        if rule.backward is not None and autograd.grad_enabled() and any(
                t.requires_grad for t in inputs):
            out.requires_grad = True
            out._ctx = (name, Context(inputs, Tensor(lazy), arg))
        return out

    def _reduce_prim(self, name: str, axes: tuple[int, ...]) -> Tensor:
        return self._prim(name, arg=axes) if axes else self

    # -- broadcasting and dtypes --------------------------------------------------------------

    def _operand(self, other: Tensor | Scalar, reverse: bool = False
                 ) -> tuple[Tensor, Tensor]:
        if isinstance(other, Tensor):
            dtype = promote(self.dtype, other.dtype)
            if other.device != self.device:
                raise ValueError(f"tensors are on different devices: {self.device} and "
                                 f"{other.device}; move one with .to()")
        else:
            dtype = self.dtype
            if isinstance(other, float) and not dtype.is_float:
                dtype = default_float
            elif isinstance(other, int) and not isinstance(other, bool) and dtype == bool_:
                dtype = int32
            other = Tensor.full((), other, dtype, self.device)
        a, b = _broadcast(self.cast(dtype), other.cast(dtype))
        return (b, a) if reverse else (a, b)

    def _binary(self, name: str, other, reverse: bool = False) -> Tensor:
        a, b = self._operand(other, reverse)
        return a._prim(name, b)

    def cast(self, dtype: DType | str) -> Tensor:
        dtype = _dtype(dtype)
        if dtype == self.dtype:
            return self
        return self._prim("cast", arg=_check_dtype(dtype, self.device))

    def bitcast(self, dtype: DType | str) -> Tensor:
        dtype = _dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise TypeError(f"bitcast from {self.dtype.name} to {dtype.name}: sizes differ")
        return self._prim("bitcast", arg=_check_dtype(dtype, self.device))

    def float(self) -> Tensor:
        return self.cast(float32)

    def int(self) -> Tensor:
        return self.cast(int32)

    def _float(self) -> Tensor:
        return self if self.dtype.is_float else self.cast(default_float)

    # -- arithmetic ---------------------------------------------------------------------------

    def add(self, other) -> Tensor:
        return self._binary("add", other)

    def sub(self, other) -> Tensor:
        return self._binary("sub", other)

    def mul(self, other) -> Tensor:
        return self._binary("mul", other)

    def div(self, other, reverse: bool = False) -> Tensor:
        a, b = self._operand(other, reverse)
        return a._float()._prim("div", b._float())

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self.div(o)
    def __rtruediv__(self, o): return self.div(o, True)
    def __floordiv__(self, o): return self._floordiv(o)
    def __rfloordiv__(self, o): return self._floordiv(o, True)
    def __mod__(self, o): return self._mod(o)
    def __rmod__(self, o): return self._mod(o, True)
    def __pow__(self, o): return self.pow(o)
    def __rpow__(self, o): return Tensor.full((), o, self._float().dtype, self.device).pow(self)
    def __neg__(self): return self.neg()
    def __matmul__(self, o): return self.matmul(o)
    def __rmatmul__(self, o): return o.matmul(self)
    def __and__(self, o): return self._binary("and", o)
    def __rand__(self, o): return self._binary("and", o, True)
    def __or__(self, o): return self._binary("or", o)
    def __ror__(self, o): return self._binary("or", o, True)
    def __xor__(self, o): return self._binary("xor", o)
    def __rxor__(self, o): return self._binary("xor", o, True)
    def __lshift__(self, o): return self._binary("shl", o)
    def __rshift__(self, o): return self._binary("shr", o)
    def __invert__(self): return self ^ (True if self.dtype == bool_ else
                                         -1 if self.dtype.kind == "int" else self.dtype.max)
    def __lt__(self, o): return self._binary("lt", o)
    def __gt__(self, o): return self._binary("lt", o, True)
    def __le__(self, o): return (self < o) | (self == o)
    def __ge__(self, o): return (self > o) | (self == o)
    def __eq__(self, o): return ~self._binary("ne", o)  # type: ignore[override]
    def __ne__(self, o): return self._binary("ne", o)  # type: ignore[override]
    def __bool__(self): raise TypeError("the truth value of a lazy Tensor is ambiguous; "
                                        "use .item() or .numpy()")

    def _floordiv(self, other, reverse: bool = False) -> Tensor:
        a, b = self._operand(other, reverse)
        if a.dtype.is_float:
            return (a / b).floor()
        q = a._prim("idiv", b)
        # IDIV truncates; Python and PyTorch round toward negative infinity
        fix = ((a._prim("mod", b) != 0) & ((a < 0) ^ (b < 0))).cast(a.dtype)
        return q - fix

    def _mod(self, other, reverse: bool = False) -> Tensor:
        a, b = self._operand(other, reverse)
        if a.dtype.is_float:
            return a - (a / b).floor() * b
        r = a._prim("mod", b)
        return (r != 0).where(((r < 0) ^ (b < 0)).where(r + b, r), r)

    def neg(self) -> Tensor:
        return self._prim("neg") if self.dtype != bool_ else ~self

    def reciprocal(self) -> Tensor:
        return self._float()._prim("recip")

    def sqrt(self) -> Tensor:
        return self._float()._prim("sqrt")

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def exp(self) -> Tensor:
        return (self._float() * (1 / math.log(2)))._prim("exp2")

    def exp2(self) -> Tensor:
        return self._float()._prim("exp2")

    def log(self) -> Tensor:
        return self._float()._prim("log2") * math.log(2)

    def log2(self) -> Tensor:
        return self._float()._prim("log2")

    def sin(self) -> Tensor:
        return self._float()._prim("sin")

    def cos(self) -> Tensor:
        return (math.pi / 2 - self._float()).sin()

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def sigmoid(self) -> Tensor:
        return 1 / (1 + (-self._float()).exp())

    def tanh(self) -> Tensor:
        return 2 * (2 * self._float()).sigmoid() - 1

    def relu(self) -> Tensor:
        return (self > 0).where(self, 0)

    def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
        return (self > 0).where(self, self * negative_slope)

    def gelu(self, approximate: str = "none") -> Tensor:
        """GELU as torch: x * Phi(x) with the exact normal CDF, or approximate="tanh"."""
        x = self._float()
        if approximate == "tanh":
            return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
        if approximate != "none":
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        # erfc, not 1 + erf: for negative x the result is a tiny product, kept accurate
        return 0.5 * x * (x * -math.sqrt(0.5)).erfc()

    def erf(self) -> Tensor:
        """The error function (absolute error below 2e-7 in float32)."""
        x = self._float()
        # near 0, 1 - erfc cancels: the Taylor series keeps the relative accuracy there
        x2 = x * x
        series = x2 * _ERF_SERIES[0] + _ERF_SERIES[1]
        for c in _ERF_SERIES[2:]:
            series = x2 * series + c
        small = x * series * (2 / math.sqrt(math.pi))
        return (x.abs() < 0.5).where(small, 1 - x.erfc())

    def erfc(self) -> Tensor:
        """1 - erf(x), accurate to a relative 1.2e-7 (Numerical Recipes' erfcc, Chebyshev)."""
        x = self._float()
        z = x.abs()
        t = 1 / (1 + 0.5 * z)
        poly = t * _ERFC_CHEBYSHEV[0] + _ERFC_CHEBYSHEV[1]
        for c in _ERFC_CHEBYSHEV[2:]:
            poly = t * poly + c
        tail = t * (poly - z * z).exp()
        return (x < 0).where(2 - tail, tail)

    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def softplus(self) -> Tensor:
        x = self._float()
        return x.relu() + (1 + (-x.abs()).exp()).log()

    def sign(self) -> Tensor:
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)

    def abs(self) -> Tensor:
        return self * self.sign()

    def pow(self, exponent) -> Tensor:
        if isinstance(exponent, int) and not isinstance(exponent, bool) and abs(exponent) <= 8:
            out = self.ones_like() if exponent == 0 else self
            for _ in range(abs(exponent) - 1):
                out = out * self
            return out.reciprocal() if exponent < 0 else out
        if exponent == 0.5:
            return self.sqrt()
        x, y = self._float()._operand(exponent)
        magnitude = (y * x.abs().log2()).exp2()
        odd = (y.abs() % 2) == 1
        is_int = y.trunc() == y
        negative = x < 0
        signed = (negative & odd).where(-magnitude, magnitude)
        return (negative & ~is_int).where(float("nan"), signed)

    def maximum(self, other) -> Tensor:
        a, b = self._operand(other)
        return a | b if a.dtype == bool_ else a._prim("max", b)

    def minimum(self, other) -> Tensor:
        a, b = self._operand(other)
        return a & b if a.dtype == bool_ else a._reversed().maximum(b._reversed())._reversed()

    def _reversed(self) -> Tensor:
        # an order-reversing map that cannot overflow: -x for floats, ~x for (unsigned) ints
        return ~self if not self.dtype.is_float else -self

    def clip(self, min=None, max=None) -> Tensor:
        out = self
        if min is not None:
            out = (out < min).where(min, out)
        if max is not None:
            out = (out > max).where(max, out)
        return out

    clamp = clip

    def where(self, a, b) -> Tensor:
        """a where self (a bool tensor) is true, else b; broadcasts all three."""
        if isinstance(a, Tensor):
            x, y = a._operand(b)
        elif isinstance(b, Tensor):
            y, x = b._operand(a)
        else:
            x, y = Tensor.full((), a, _scalar_dtype(a), self.device)._operand(b)
        cond = self.cast(bool_)
        cond, x = _broadcast(cond, x)
        cond, y = _broadcast(cond, y)
        x, y = _broadcast(x, y)
        cond, x = _broadcast(cond, x)
        return cond._prim("where", x, y)

    def trunc(self) -> Tensor:
        return self._prim("trunc") if self.dtype.is_float else self

    def floor(self) -> Tensor:
        t = self.trunc()
        return (t > self).where(t - 1, t) if self.dtype.is_float else self

    def ceil(self) -> Tensor:
        t = self.trunc()
        return (t < self).where(t + 1, t) if self.dtype.is_float else self

    def round(self) -> Tensor:
        """Rounds half to even, as numpy and PyTorch do."""
        if not self.dtype.is_float:
            return self
        f = self.floor()
        d = self - f
        odd = (f - (f * 0.5).floor() * 2) == 1
        return (d > 0.5).where(f + 1, (d < 0.5).where(f, odd.where(f + 1, f)))

    def logical_not(self) -> Tensor:
        return ~self.cast(bool_)

    # -- reductions ---------------------------------------------------------------------------

    def _reduce(self, name: str, axis, keepdim: bool) -> Tensor:
        axes = _axes(axis, self.ndim)
        out = self._reduce_prim(name, axes)
        if keepdim:
            return out
        return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
        x = self
        if dtype is not None:
            x = x.cast(dtype)
        elif x.dtype == bool_ or (x.dtype.is_int and x.dtype.itemsize < 4):
            x = x.cast(int32)
        return x._reduce("sum", axis, keepdim)

    def max(self, axis=None, keepdim: bool = False) -> Tensor:
        if self.dtype == bool_:
            return self.cast(int32).max(axis, keepdim).cast(bool_)
        return self._reduce("max_reduce", axis, keepdim)

    def min(self, axis=None, keepdim: bool = False) -> Tensor:
        return self._reversed().max(axis, keepdim)._reversed()

    def prod(self, axis=None, keepdim: bool = False) -> Tensor:
        return self._reduce("prod_reduce", axis, keepdim)

    def mean(self, axis=None, keepdim: bool = False) -> Tensor:
        axes = _axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        total = self._float().sum(axis, keepdim)
        return total / count if count else total * float("nan")

    def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
        axes = _axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        x = self._float()
        centered = x - x.mean(axes, keepdim=True)
        return (centered * centered).sum(axes, keepdim) / max(count - correction, 0)

    def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def argmax(self, axis=None, keepdim: bool = False) -> Tensor:
        """Index of the first maximum (int32)."""
        if axis is None:
            return self.reshape(-1).argmax(0)
        axis = _axes(axis, self.ndim)[0]
        n = self.shape[axis]
        hit = self == self.max(axis, keepdim=True)
        shape = [1] * self.ndim
        shape[axis] = n
        backwards = Tensor.arange(n - 1, -1, -1, device=self.device).reshape(shape)
        return (n - 1) - (hit.where(backwards, -1)).max(axis, keepdim)

    def argmin(self, axis=None, keepdim: bool = False) -> Tensor:
        return self._reversed().argmax(axis, keepdim)

    def logsumexp(self, axis=None, keepdim: bool = False) -> Tensor:
        m = self.max(axis, keepdim=True).detach()
        m = (m.abs() == float("inf")).where(0.0, m)
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.reshape(
            tuple(s for i, s in enumerate(self.shape) if i not in _axes(axis, self.ndim)))

    def softmax(self, axis: int = -1) -> Tensor:
        e = (self - self.max(axis, keepdim=True).detach()).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        return self - self.logsumexp(axis, keepdim=True)

    # -- movement -----------------------------------------------------------------------------

    def reshape(self, *shape) -> Tensor:
        shape = list(_shape(shape))
        if shape.count(-1) > 1:
            raise ValueError(f"reshape to {tuple(shape)}: only one dimension can be -1")
        if -1 in shape:
            rest = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.numel() // rest if rest else 0
        shape = tuple(shape)
        if math.prod(shape) != self.numel():
            raise ValueError(f"cannot reshape a tensor of shape {self.shape} to {shape}")
        return self if shape == self.shape else self._prim("reshape", arg=shape)

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        start, end = start_dim % self.ndim, end_dim % self.ndim
        return self.reshape(self.shape[:start] + (-1,) + self.shape[end + 1:]) \
            if self.numel() else self.reshape(
                self.shape[:start] + (math.prod(self.shape[start:end + 1]),) +
                self.shape[end + 1:])

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dim = _axes(dim, self.ndim)[0] if self.ndim else 0
        if not self.ndim or self.shape[dim] != 1:
            return self
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:])

    def unsqueeze(self, dim: int) -> Tensor:
        dim = dim % (self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def permute(self, *order) -> Tensor:
        order = tuple(o % self.ndim for o in _shape(order))
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"permute order {order} is not a permutation of "
                             f"{self.ndim} dimensions")
        return self if order == tuple(range(self.ndim)) else self._prim("permute", arg=order)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
        order = list(range(self.ndim))
        order[dim0], order[dim1] = order[dim1], order[dim0]
        return self.permute(order)

    @property
    def T(self) -> Tensor:
        return self.permute(tuple(reversed(range(self.ndim))))

    def expand(self, *shape) -> Tensor:
        shape = _shape(shape)
        new = tuple(s if s != -1 else o for s, o in zip(shape, (None,) * (
            len(shape) - self.ndim) + self.shape))
        x = self.reshape((1,) * (len(new) - self.ndim) + self.shape)
        for old, want in zip(x.shape, new):
            if old != want and old != 1:
                raise ValueError(f"cannot expand shape {self.shape} to {new}")
        return x if x.shape == new else x._prim("expand", arg=new)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(other.shape)

    def pad(self, padding, value: Scalar = 0) -> Tensor:
        """padding: ((before, after), ...) from the first dim (numpy), or flat (before, after,
        ...) from the last dim (torch.nn.functional.pad); negative values crop."""
        if all(isinstance(p, int) for p in padding):
            if len(padding) % 2 or len(padding) > 2 * self.ndim:
                raise ValueError(f"pad: flat padding {tuple(padding)} needs an even length up "
                                 f"to {2 * self.ndim} for shape {self.shape}")
            pairs = [(padding[k], padding[k + 1]) for k in range(0, len(padding), 2)]
            padding = [(0, 0)] * (self.ndim - len(pairs)) + pairs[::-1]
        padding = tuple((int(a), int(b)) for a, b in padding)
        padding += ((0, 0),) * (self.ndim - len(padding))
        if any(a < 0 or b < 0 for a, b in padding):
            crop = tuple((max(-a, 0), s - max(-b, 0)) for (a, b), s in zip(padding, self.shape))
            return self.shrink(crop).pad(tuple((max(a, 0), max(b, 0)) for a, b in padding),
                                         value)
        if all(p == (0, 0) for p in padding):
            return self
        out = self._prim("pad", arg=padding)
        if value == 0:
            return out
        inside = Tensor.ones(*self.shape, dtype=bool_, device=self.device)._prim(
            "pad", arg=padding)
        return inside.where(out, value)

    def shrink(self, arg) -> Tensor:
        arg = tuple((0, s) if a is None else (int(a[0]), int(a[1]))
                    for a, s in zip(arg, self.shape))
        for (b, e), s in zip(arg, self.shape):
            if not 0 <= b <= e <= s:
                raise IndexError(f"shrink {arg} is outside shape {self.shape}")
        if all(a == (0, s) for a, s in zip(arg, self.shape)):
            return self
        return self._prim("shrink", arg=arg)

    def flip(self, axis) -> Tensor:
        axes = _axes(axis, self.ndim)
        return self._prim("flip", arg=axes) if axes else self

    def repeat(self, *repeats) -> Tensor:
        repeats = _shape(repeats)
        x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
        expanded = x.reshape(tuple(d for s in x.shape for d in (1, s))).expand(
            tuple(d for r, s in zip(repeats, x.shape) for d in (r, s)))
        return expanded.reshape(tuple(r * s for r, s in zip(repeats, x.shape)))

    def split(self, sizes, dim: int = 0) -> list[Tensor]:
        dim = dim % self.ndim
        n = self.shape[dim]
        if isinstance(sizes, int):
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if n else [0]
        if sum(sizes) != n:
            raise ValueError(f"split sizes {list(sizes)} do not add up to {n}")
        out, start = [], 0
        for size in sizes:
            arg = [(0, s) for s in self.shape]
            arg[dim] = (start, start + size)
            out.append(self.shrink(arg))
            start += size
        return out

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        n = self.shape[dim % self.ndim]
        return self.split(max(1, math.ceil(n / chunks)), dim)

    def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
        return cat([self, *others], dim)

    # -- indexing -----------------------------------------------------------------------------

    def __getitem__(self, index) -> Tensor:
        index = index if isinstance(index, tuple) else (index,)
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("an index can only have a single ellipsis")
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        if used > self.ndim:
            raise IndexError(f"too many indices ({used}) for a tensor of shape {self.shape}")
        if Ellipsis in [i if not isinstance(i, Tensor) else None for i in index]:
            at = [i is Ellipsis if not isinstance(i, Tensor) else False
                  for i in index].index(True)
            index = index[:at] + (slice(None),) * (self.ndim - used) + index[at + 1:]
            used = self.ndim
        index = index + (slice(None),) * (self.ndim - used)
        x, dim = self, 0
        crop, flips, steps = [], [], []
        for i in index:
            if i is None:
                continue
            size = self.shape[dim]
            if isinstance(i, slice):
                start, stop, step = i.indices(size)
                if step > 0:
                    lo, hi = start, max(start, stop)
                else:
                    lo, hi = (stop + 1, start + 1) if start > stop else (0, 0)
                    flips.append(dim)
                crop.append((lo, hi))
                steps.append(abs(step))
            elif isinstance(i, Tensor | list | np.ndarray):
                crop.append((0, size))
                steps.append(1)

            else:
                k = int(i)
                if not -size <= k < size:
                    raise IndexError(f"index {k} is out of bounds for dimension {dim} "
                                     f"with size {size}")
                k %= size
                crop.append((k, k + 1))
                steps.append(1)
            dim += 1
        x = x.shrink(crop).flip(flips)
        if any(s != 1 for s in steps):
            x = x._stride(steps)
        # drop int-indexed dims, insert None dims, gather tensor-indexed dims
        advanced = any(isinstance(i, Tensor | list | np.ndarray) for i in index)
        dim, shape, gathers = 0, [], []
        for i in index:
            if i is None:
                shape.append(1)
                continue
            if isinstance(i, slice):
                shape.append(x.shape[dim])
            elif isinstance(i, Tensor | list | np.ndarray):
                gathers.append((len(shape), i))
                shape.append(x.shape[dim])
            elif advanced:      # beside integer tensors an int is one more of them (numpy)
                gathers.append((len(shape), 0))
                shape.append(1)
            dim += 1
        x = x.reshape(tuple(shape))
        return x._gather_dims(gathers) if gathers else x

    def _gather_dims(self, gathers: list[tuple[int, Any]]) -> Tensor:
        """numpy's advanced indexing: integer indices at several dims, broadcast together.

        Their result dims replace the indexed dims where those are adjacent, else lead.
        """
        dims = [at for at, _ in gathers]
        sizes = [self.shape[d] for d in dims]
        flat = None
        for (_, i), n in zip(gathers, sizes):
            kind = i.dtype.kind if isinstance(i, Tensor) else np.asarray(i).dtype.kind
            if kind not in ("int", "uint", "i", "u"):
                raise IndexError(f"tensors used as indices must be integer, got {kind} ones; "
                                 "cast them with .cast(portkit.int32)")
            i = i.cast(int32) if isinstance(i, Tensor) else Tensor(np.asarray(i), int32,
                                                                  self.device)
            i = (i < 0).where(i + n, i)
            flat = i if flat is None else flat * n + i
        at = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
        rest = [d for d in range(self.ndim) if d not in dims]
        x = self.permute(rest[:at] + dims + rest[at:])
        x = x.reshape(x.shape[:at] + (math.prod(sizes),) + x.shape[at + len(dims):])
        return x._take(flat, at)

    def _stride(self, steps: list[int]) -> Tensor:
        x = self
        for dim, step in enumerate(steps):
            if step == 1:
                continue
            n = x.shape[dim]
            count = -(-n // step)
            padding = [(0, 0)] * x.ndim
            padding[dim] = (0, count * step - n)
            x = x.pad(padding)
            x = x.reshape(x.shape[:dim] + (count, step) + x.shape[dim + 1:])
            arg = [(0, s) for s in x.shape]
            arg[dim + 1] = (0, 1)
            x = x.shrink(arg).reshape(x.shape[:dim] + (count,) + x.shape[dim + 2:])
        return x

    def _take(self, index: Tensor, dim: int) -> Tensor:
        """self indexed along `dim` by an integer tensor (negative counts from the end)."""
        if index.dtype.is_float or index.dtype == bool_:
            raise IndexError(f"tensors used as indices must be integer, got {index.dtype.name}")
        n = self.shape[dim]
        index = index.cast(int32)
        index = (index < 0).where(index + n, index)
        before, after = self.shape[:dim], self.shape[dim + 1:]
        hot = index.unsqueeze(-1) == Tensor.arange(n, device=self.device)
        hot = hot.reshape((1,) * len(before) + hot.shape + (1,) * len(after))
        x = self.reshape(before + (1,) * index.ndim + (n,) + after)
        value_dtype = self.dtype if self.dtype != bool_ else int32
        picked = hot.where(x.cast(value_dtype), 0).sum(len(before) + index.ndim,
                                                       dtype=value_dtype)
        return picked.cast(self.dtype)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather)."""
        dim = dim % self.ndim
        crop = [(0, s) if d == dim else (0, i) for d, (s, i) in
                enumerate(zip(self.shape, index.shape))]
        x = self.shrink(crop).unsqueeze(dim).transpose(dim + 1, -1)
        n = self.shape[dim]
        hot = index.cast(int32).unsqueeze(-1) == Tensor.arange(n, device=self.device)
        return hot.where(x, 0).sum(-1).cast(self.dtype)

    # -- linear algebra, nn functions -----------------------------------------------------------

    def dot(self, other: Tensor) -> Tensor:
        if self.ndim != 1 or other.ndim != 1:
            raise ValueError(f"dot needs two 1-d tensors, got shapes {self.shape} and "
                             f"{other.shape}")
        return self.matmul(other)

    def matmul(self, other: Tensor) -> Tensor:
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"matmul needs tensors with at least 1 dimension, got shapes "
                             f"{a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise ValueError(f"matmul shapes {a.shape} and {b.shape} do not match: "
                             f"{a.shape[-1]} != {b.shape[-2 if b.ndim > 1 else 0]}")
        squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
        a = a.unsqueeze(0) if squeeze_a else a
        b = b.unsqueeze(-1) if squeeze_b else b
        dtype = promote(a.dtype, b.dtype)
        # (..., M, 1, K) * (..., 1, N, K) summed over K
        out = (a.cast(dtype).unsqueeze(-2) * b.cast(dtype).transpose(-1, -2).unsqueeze(-3)
               ).sum(-1)
        if squeeze_a:
            out = out.squeeze(-2)
        if squeeze_b:
            out = out.squeeze(-1)
        return out

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """self @ weight.T + bias, as torch.nn.functional.linear."""
        out = self.matmul(weight.T)
        return out if bias is None else out + bias

    def _pool(self, kernel: tuple[int, ...], stride: tuple[int, ...],
              dilation: tuple[int, ...]) -> Tensor:
        """Sliding windows over the last len(kernel) dims -> (..., *out, *kernel), as views."""
        keep = self.shape[:-len(kernel)]
        sizes = self.shape[-len(kernel):]
        noop = [(0, s) for s in keep]
        outs = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(sizes, dilation, kernel,
                                                                     stride)]
        if any(o <= 0 for o in outs):
            raise ValueError(f"input of spatial size {sizes} is smaller than kernel {kernel} "
                             f"(dilation {dilation})")
        reps = [-(-k * (i + d) // i) for k, i, d in zip(kernel, sizes, dilation)]
        x = self.reshape(keep + tuple(d for i in sizes for d in (1, i)))
        x = x.expand(keep + tuple(d for e, i in zip(reps, sizes) for d in (e, i)))
        x = x.reshape(keep + tuple(e * i for e, i in zip(reps, sizes)))
        x = x.shrink(noop + [(0, k * (i + d)) for k, i, d in zip(kernel, sizes, dilation)])
        x = x.reshape(keep + tuple(d for k, i, dd in zip(kernel, sizes, dilation)
                                   for d in (k, i + dd)))
        x = x.shrink(noop + [r for k, o, s in zip(kernel, outs, stride)
                             for r in ((0, k), (0, o * s))])
        x = x.reshape(keep + tuple(d for k, o, s in zip(kernel, outs, stride)
                                   for d in (k, o, s)))
        x = x.shrink(noop + [r for k, o in zip(kernel, outs) for r in ((0, k), (0, o), (0, 1))])
        x = x.reshape(keep + tuple(d for k, o in zip(kernel, outs) for d in (k, o)))
        n = len(keep)
        return x.permute(tuple(range(n)) + tuple(n + 2 * i + 1 for i in range(len(kernel))) +
                         tuple(n + 2 * i for i in range(len(kernel))))

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
               dilation=1, groups: int = 1) -> Tensor:
        """2-d convolution, (N, C, H, W) x (O, C/groups, kh, kw), as torch."""
        if self.ndim != 4 or weight.ndim != 4:
            raise ValueError(f"conv2d needs 4-d input and weight, got shapes {self.shape} "
                             f"and {weight.shape}")
        n, cin, _, _ = self.shape
        cout, cin_g, kh, kw = weight.shape
        if cin != cin_g * groups or cout % groups:
            raise ValueError(f"conv2d: input shape {self.shape} and weight shape "
                             f"{weight.shape} do not match for groups={groups}")
        stride, dilation = _pair(stride), _pair(dilation)
        ph, pw = _pair(padding)
        x = self.pad(((0, 0), (0, 0), (ph, ph), (pw, pw)))._pool((kh, kw), stride, dilation)
        oh, ow = x.shape[2:4]
        per_group = cout // groups
        x = x.reshape(n, groups, cin_g, 1, oh, ow, kh, kw).expand(
            n, groups, cin_g, per_group, oh, ow, kh, kw).permute(0, 1, 3, 4, 5, 2, 6, 7)
        w = weight.reshape(1, groups, per_group, 1, 1, cin_g, kh, kw)
        out = (x * w).sum((5, 6, 7)).reshape(n, cout, oh, ow)
        return out if bias is None else out + bias.reshape(1, -1, 1, 1)

    def max_pool2d(self, kernel_size=2, stride=None, padding=0, dilation=1) -> Tensor:
        kernel = _pair(kernel_size)
        ph, pw = _pair(padding)
        x = self.pad(((0, 0),) * (self.ndim - 2) + ((ph, ph), (pw, pw)), float("-inf"))
        return x._pool(kernel, _pair(stride or kernel_size), _pair(dilation)).max((-2, -1))

    def avg_pool2d(self, kernel_size=2, stride=None, padding=0) -> Tensor:
        kernel = _pair(kernel_size)
        ph, pw = _pair(padding)
        x = self.pad(((0, 0),) * (self.ndim - 2) + ((ph, ph), (pw, pw)))
        return x._pool(kernel, _pair(stride or kernel_size), (1, 1)).mean((-2, -1))

    def cross_entropy(self, target: Tensor, label_smoothing: float = 0.0,
                      reduction: str = "mean") -> Tensor:
        """Cross entropy of logits (N, C) against class indices (N,) or probabilities."""
        logp = self.log_softmax(-1)
        if target.dtype.is_float:
            probs = target
        else:
            if target.shape != self.shape[:-1]:
                raise ValueError(f"cross_entropy: target shape {target.shape} does not match "
                                 f"logits shape {self.shape} (want {self.shape[:-1]})")
            probs = target.one_hot(self.shape[-1]).cast(logp.dtype)
        if label_smoothing:
            probs = probs * (1 - label_smoothing) + label_smoothing / self.shape[-1]
        loss = -(logp * probs).sum(-1)
        return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()

    def one_hot(self, num_classes: int) -> Tensor:
        return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).cast(
            int32)

    def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
        """(x - mean) / sqrt(var + eps) over `axis` (biased variance, as torch)."""
        x = self._float()
        centered = x - x.mean(axis, keepdim=True)
        return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
                  invstd: Tensor) -> Tensor:
        """(x - mean) * invstd * weight + bias, with per-channel (dim 1) statistics."""
        shape = (1, -1) + (1,) * (self.ndim - 2)
        x = (self - mean.reshape(shape)) * invstd.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        return x if bias is None else x + bias.reshape(shape)

    def dropout(self, p: float = 0.5, training: bool | None = None) -> Tensor:
        if not (training if training is not None else Tensor.training) or p == 0:
            return self
        keep = Tensor.rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def embedding(self, weight: Tensor) -> Tensor:
        """Rows of `weight` picked by this integer tensor."""
        return weight._take(self, 0)

    def scaled_dot_product_attention(self, key: Tensor, value: Tensor,
                                     attn_mask: Tensor | None = None,
                                     is_causal: bool = False) -> Tensor:
        """softmax(q @ k^T / sqrt(d) + mask) @ v, with an optional causal mask."""
        scores = self.matmul(key.transpose(-1, -2)) * (1 / math.sqrt(self.shape[-1]))
        if is_causal:
            q, k = scores.shape[-2:]
            causal = Tensor.arange(q, device=self.device).reshape(q, 1) >= Tensor.arange(
                k, device=self.device).reshape(1, k)
            scores = causal.where(scores, float("-inf"))
        if attn_mask is not None:
            scores = attn_mask.where(scores, float("-inf")) if attn_mask.dtype == bool_ \
                else scores + attn_mask
        return scores.softmax(-1).matmul(value)

    # -- autograd -----------------------------------------------------------------------------

    def backward(self, gradient: Tensor | None = None) -> None:
        """Fills `.grad` of every leaf this tensor depends on (lazily: grads are graphs)."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad: no input "
                               "was created with requires_grad=True")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"backward() on a non-scalar tensor of shape {self.shape} "
                                   "needs a gradient argument of that shape")
            gradient = self.ones_like()
        elif gradient.shape != self.shape:
            raise ValueError(f"backward: gradient shape {gradient.shape} does not match "
                             f"tensor shape {self.shape}")
        autograd.backward(self, gradient.cast(self.dtype))


def _to_numpy(data: Any, dtype: DType | None) -> np.ndarray:
    if isinstance(data, np.ndarray):
        array = data
    else:
        array = np.asarray(data)
        if array.dtype == np.float64 and dtype is None:
            array = array.astype(np.float32)
        elif array.dtype == np.int64 and dtype is None:
            array = array.astype(np.int32)
    if dtype is not None:
        array = array.astype(dtype.np)
    elif array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
        raise TypeError(f"cannot make a Tensor from numpy dtype {array.dtype}")
    return array


def _check_dtype(dtype: DType, device: str) -> DType:
    """dtype, if the device has it; else UnsupportedDType naming a dtype it has."""
    if dtype in schedule.device(device).capabilities.dtypes:
        return dtype
    instead = "float32" if dtype.is_float else "int32"
    raise UnsupportedDType(f"device {device!r} has no {dtype.name}; use "
                           f"dtype=portkit.{instead} (or .cast(portkit.{instead})), or a device "
                           f"with {dtype.name}")


def _shape(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _scalar_dtype(value: Scalar) -> DType:
    if isinstance(value, bool):
        return bool_
    return int32 if isinstance(value, int) else default_float


def _broadcast(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    if a.shape == b.shape:
        return a, b
    ndim = max(a.ndim, b.ndim)
    sa, sb = (1,) * (ndim - a.ndim) + a.shape, (1,) * (ndim - b.ndim) + b.shape
    out = []
    for x, y in zip(sa, sb):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a.shape} and {b.shape} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return a.reshape(sa).expand(tuple(out)), b.reshape(sb).expand(tuple(out))


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Joins tensors along `dim`: each is padded to the full size and they are summed."""
    first = tensors[0]
    dim = dim % first.ndim
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(
                zip(t.shape, first.shape)) if i != dim):
            raise ValueError(f"cat: shapes {first.shape} and {t.shape} differ outside dim "
                             f"{dim}")
    total = sum(t.shape[dim] for t in tensors)
    out, start = None, 0
    for t in tensors:
        padding = [(0, 0)] * t.ndim
        padding[dim] = (start, total - start - t.shape[dim])
        piece = t.pad(padding)
        out = piece if out is None else out + piece
        start += t.shape[dim]
    return out


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Joins same-shaped tensors along a new dimension."""
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def realize(*tensors: Tensor) -> None:
    """Runs the graphs behind several tensors in one schedule (shared work runs once)."""
    schedule.realize([t.lazy for t in tensors])


_seed, _draws = 0, 0


def seed(value: int) -> None:
    """Seeds the random generator: the same seed gives the same numbers on every device."""
    global _seed, _draws
    _seed, _draws = int(value) & 0xFFFFFFFF, 0


def _mix(x: int) -> int:
    """The "lowbias32" integer hash (Chris Wellons), on the host."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


# erf(x) = 2/sqrt(pi) * x * sum of these times x**2n, highest power first (|x| < 0.5: 1e-8)
_ERF_SERIES = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in reversed(range(7)))
# Numerical Recipes' erfcc: erfc(z) = t * exp(-z*z + poly(t)), t = 1 / (1 + z/2), z >= 0
_ERFC_CHEBYSHEV = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
                   0.09678418, 0.37409196, 1.00002368, -1.26551223)

# bits of uniform randomness per float dtype: its significand (float64 gets the 32 there are)
_PRECISION = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 32}


def _random_bits(shape: tuple[int, ...], device: str) -> Tensor:
    """uint32 bits: the element index hashed under two key words, computed on the device.

    Counter-based: element i of a draw is lowbias32(lowbias32(i ^ k0) ^ k1), the keys a hash of
    (seed, draw number). It uses only uint32 XOR, shifts and multiplies, which every device has
    bit-exactly, so every device yields the same bits. The keys are data, not constants, so
    each shape compiles once however many draws it makes.
    """
    global _draws
    _draws += 1
    k0 = _mix(_mix(_seed) ^ (_draws * 0x9E3779B9 & 0xFFFFFFFF))
    keys = Tensor(np.array([k0, _mix(k0 ^ 0x85EBCA6B)], np.uint32), device=device)
    x = Tensor(graph.iota((math.prod(shape),), 0, device)).cast(uint32)
    for k in range(2):
        x = x ^ keys[k]
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        x = x ^ (x >> 16)
    return x.reshape(shape)


__all__ = ["Tensor", "bfloat16", "bool_", "cat", "default_float", "float16", "float32",
           "float64", "int8", "int16", "int32", "int64", "no_grad", "promote", "realize",
           "seed", "stack", "uint8", "uint16", "uint32", "uint64"]
