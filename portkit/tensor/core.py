"""The Tensor class: construction, dtype/device/shape, running the graph, operators, backward.

Tensor's ops are methods, as in PyTorch; they are written in one module per concern (creation,
random, elementwise, movement, indexing, reduce, and the thin nn methods) as mixin classes that
Tensor inherits. Mixins rather than functions attached after the fact: every method is visible
on the class to readers, `help()`, editors and type checkers, and each concern module reads as
the methods it adds. Those modules reach the Tensor class as `core.Tensor` at call time, since
this module imports them to define it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from portkit import autograd, graph, runtime, schedule
from portkit.abi.dtypes import DType, from_numpy
from portkit.abi.kernel import Kernel
from portkit.autograd import GRADIENTS, Context
from portkit.graph import Lazy
from portkit.tensor import autocast_mode, faults, movement
from portkit.tensor.creation import CreationOps
from portkit.tensor.dtype import DTypeLike, Scalar, bool_, check_dtype, to_dtype
from portkit.tensor.elementwise import ElementwiseOps
from portkit.tensor.exponential import ExponentialOps
from portkit.tensor.functional_methods import FunctionalMethods
from portkit.tensor.indexing import IndexingOps
from portkit.tensor.interop import InteropOps, import_dlpack
from portkit.tensor.movement import MovementOps
from portkit.tensor.random import RandomOps
from portkit.tensor.reduce import ReduceOps
from portkit.tensor.scan import ScanOps
from portkit.tensor.selection import SelectionOps
from portkit.tensor.transcendental import TranscendentalOps

_new = object.__new__

# what a primitive gives where its input has no elements (the identity of a reduction)
_EMPTY_INPUT = {"prod_reduce": 1}

# a binary operator method: self OP other
_Operator = Callable[["Tensor", "Tensor | Scalar"], "Tensor"]


def _operators(apply: Callable[[Tensor, Tensor | Scalar, bool], Tensor]
               ) -> tuple[_Operator, _Operator]:
    """self OP other and its reflected form other OP self, as methods, from apply(a, b, reverse)."""
    def operator(self: Tensor, other: Tensor | Scalar) -> Tensor:
        return apply(self, other, False)

    def reflected(self: Tensor, other: Tensor | Scalar) -> Tensor:
        return apply(self, other, True)
    return operator, reflected


def _primitive_operators(name: str) -> tuple[_Operator, _Operator]:
    """_operators of the binary primitive `name`, its operands promoted and broadcast (written
    out rather than through _operators: one call fewer on every + and * of a step)."""
    def operator(self: Tensor, other: Tensor | Scalar) -> Tensor:
        return self._binary(name, other)

    def reflected(self: Tensor, other: Tensor | Scalar) -> Tensor:
        return self._binary(name, other, True)
    return operator, reflected


class Tensor(CreationOps, RandomOps, ElementwiseOps, ExponentialOps, TranscendentalOps,
             MovementOps, IndexingOps, ReduceOps, ScanOps, SelectionOps, FunctionalMethods,
             InteropOps):
    """A lazy n-dimensional array on a device, with autograd.

    Integers default to int32 (Python ints, int64 numpy data, arange, argmax, randint), not
    PyTorch's int64: WebGPU and many accelerators have no 64-bit integers. Pass dtype=int64
    where a device has it. A dtype the device lacks raises UnsupportedDType when the tensor is
    made or cast, not later when it runs.
    """

    __slots__ = ("_ctx", "grad", "lazy", "requires_grad")
    __hash__ = object.__hash__
    training = False        # what dropout() does when not told training=True or False

    @staticmethod
    def _wrap(lazy: Lazy) -> Tensor:
        """A Tensor around `lazy` with no history: Tensor(lazy) without the argument checks,
        for the ops that make one per node (also `wrap`, and `self._wrap` in the modules that
        write Tensor's methods, which reach the class only through the tensors they get)."""
        out = _new(Tensor)
        out.lazy, out.grad, out._ctx, out.requires_grad = lazy, None, None, False
        return out

    def __init__(self, data: Any, dtype: DTypeLike | None = None, device: str | None = None,
                 requires_grad: bool = False):
        dtype = to_dtype(dtype)
        if isinstance(data, Lazy):
            lazy = data
        elif isinstance(data, Tensor):
            lazy = data.lazy if dtype is None else data.lazy.cast(dtype)
        else:
            device = runtime.device_name(device)
            array = _to_numpy(data, dtype)
            target = check_dtype(dtype or from_numpy(array.dtype), device)
            lazy = _host_data(array, device, target)
        self.lazy, self.grad, self._ctx = lazy, None, None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_()

    # -- properties ---------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each dimension."""
        return self.lazy.shape

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self.lazy.dtype

    @property
    def device(self) -> str:
        """The name of the backend holding the values."""
        return self.lazy.device

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def numel(self) -> int:
        """The number of elements."""
        return self.lazy.size

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        """The shape, or the size of dimension `dim`."""
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def requires_grad_(self, flag: bool = True) -> Tensor:
        """Marks this (float) tensor as a leaf whose gradient backward() fills in."""
        if flag and not self.dtype.is_float:
            raise TypeError(f"only float tensors can require gradients, this one is "
                            f"{self.dtype.name}")
        self.requires_grad = flag
        return self

    def detach(self) -> Tensor:
        """The same values, cut from the gradient graph."""
        return wrap(self.lazy)

    # -- running ------------------------------------------------------------------------------

    def realize(self) -> Tensor:
        """Runs the graph behind this tensor; returns self."""
        if self.lazy.op is not graph.GraphOp.LOAD:    # computed already: nothing to walk
            schedule.realize([self.lazy])
        return self

    def schedule(self) -> list[Kernel]:
        """The ABI kernels a realize of this tensor would run now (nothing runs)."""
        return schedule.kernels([self.lazy])

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values."""
        recorder = schedule.recording()
        if recorder is not None:       # inside portkit.jit: a replay could not redo it
            recorder.host_read(self)
        lazy = self.lazy
        if lazy.op is not graph.GraphOp.LOAD:
            schedule.realize([lazy])        # which makes it a LOAD
        faults.check(lazy.device)           # an index out of range in a kernel run so far
        if 0 in lazy.shape:
            return np.zeros(lazy.shape, lazy.dtype.np)
        return lazy.buffer.numpy(lazy.shape)

    def item(self) -> Scalar:
        """The value of a one-element tensor, as a Python number."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape "
                             f"{self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        """The values as nested Python lists."""
        return self.numpy().tolist()

    def to(self, device: str) -> Tensor:
        """This tensor on device `device` ("cpu:1"), lazily: the copy runs at realize, directly
        where the backend declares a peer copy, else through the host; a gradient flows back
        to this tensor's device. An unknown name raises here, not at realize."""
        device = runtime.device_name(device)
        if device == self.device:
            return self
        return self._prim("copy", arg=device)

    def assign(self, value: Tensor | Any) -> Tensor:
        """Replaces this tensor's contents (same shape and dtype), keeping the object and its
        device: a value on another device is copied here, as torch's copy_."""
        value = value if isinstance(value, Tensor) else Tensor(value, self.dtype, self.device)
        value = value.detach().to(self.device) if value.device != self.device else value
        if value.shape != self.shape:
            raise ValueError(f"assign: shapes differ, {self.shape} vs {value.shape}")
        recorder = schedule.recording()
        if recorder is not None:       # inside portkit.jit: a replay updates self too
            recorder.assign(self)
        self.lazy = value.lazy.cast(self.dtype)
        return self

    def contiguous(self) -> Tensor:
        """A copy laid out row-major in its own buffer once realized."""
        return self + 0 if self.dtype != bool_ else self | False

    # -- primitives: the only place that records autograd history ----------------------------

    def _prim(self, name: str, *others: Tensor, arg: Any = None) -> Tensor:
        rule = GRADIENTS[name]
        # spelled out for one and two operands: every op of a step passes here
        if not others:
            lazy = rule.forward(self.lazy, arg=arg)
            empty = 0 in self.lazy.shape
            grad = self.requires_grad
        elif len(others) == 1:
            other = others[0]
            lazy = rule.forward(self.lazy, other.lazy, arg=arg)
            empty = 0 in self.lazy.shape or 0 in other.lazy.shape
            grad = self.requires_grad or other.requires_grad
        else:
            lazy = rule.forward(self.lazy, *[t.lazy for t in others], arg=arg)
            empty = 0 in self.lazy.shape or any(0 in t.lazy.shape for t in others)
            grad = self.requires_grad or any(t.requires_grad for t in others)
        if (empty or 0 in lazy.shape) and name != "copy":
            lazy = _empty_result(name, lazy, self.shape)
        out = wrap(lazy)
        if grad and rule.backward is not None and autograd.grad_enabled():
            out.requires_grad = True
            out._ctx = Context(name, (self,) + others, lazy, arg)
        return out

    # -- operators: PyTorch's, wired to the elementwise and reduce methods ---------------------

    __add__, __radd__ = _primitive_operators("add")
    __sub__, __rsub__ = _primitive_operators("sub")
    __mul__, __rmul__ = _primitive_operators("mul")
    __and__, __rand__ = _primitive_operators("and")
    __or__, __ror__ = _primitive_operators("or")
    __xor__, __rxor__ = _primitive_operators("xor")
    __lt__, __gt__ = _primitive_operators("lt")         # a > b is b < a
    __lshift__, __rshift__ = _primitive_operators("shl")[0], _primitive_operators("shr")[0]
    __ne__ = _primitive_operators("ne")[0]
    __truediv__, __rtruediv__ = _operators(lambda a, b, reverse: a.div(b, reverse))
    __floordiv__, __rfloordiv__ = _operators(lambda a, b, reverse: a._floordiv(b, reverse))
    __mod__, __rmod__ = _operators(lambda a, b, reverse: a._mod(b, reverse))

    def __pow__(self, exponent: Tensor | Scalar) -> Tensor:
        return self.pow(exponent)

    def __rpow__(self, base: Scalar) -> Tensor:
        dtype = self.dtype if isinstance(base, int) else self._float().dtype
        return Tensor.full((), base, dtype, self.device).pow(self)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matmul(other)

    def __rmatmul__(self, other: Tensor) -> Tensor:
        return other.matmul(self)

    def __invert__(self) -> Tensor:
        return self ^ (True if self.dtype == bool_ else
                       -1 if self.dtype.kind == "int" else self.dtype.max)

    def __le__(self, other: Tensor | Scalar) -> Tensor:
        return (self < other) | (self == other)

    def __ge__(self, other: Tensor | Scalar) -> Tensor:
        return (self > other) | (self == other)

    def __eq__(self, other: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return ~self._binary("ne", other)

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a lazy Tensor is ambiguous; use .item() or .numpy()")

    # -- autograd -----------------------------------------------------------------------------

    def backward(self, gradient: Tensor | None = None) -> None:
        """Fills `.grad` of every leaf this tensor depends on (lazily: grads are graphs)."""
        if self._ctx is autograd.FREED:
            raise RuntimeError("backward() through the same graph a second time: its "
                               "intermediate results were freed; compute the loss again")
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad: no input "
                               "was created with requires_grad=True")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"backward() on a non-scalar tensor of shape {self.shape} "
                                   "needs a gradient argument of that shape")
            gradient = self.ones_like()
            autograd.note_loss(self.lazy)
        elif gradient.shape != self.shape:
            raise ValueError(f"backward: gradient shape {gradient.shape} does not match "
                             f"tensor shape {self.shape}")
        with autocast_mode.suspended():     # the gradients keep the dtypes the forward chose
            autograd.backward(self, gradient.cast(self.dtype))


def from_dlpack(source: Any, device: str | None = None) -> Tensor:
    """A Tensor with the values and dtype of any DLPack producer (torch, numpy, jax...): sharing
    its memory on a host-memory backend, else a copy (see the module docstring)."""
    array = import_dlpack(source)
    device = runtime.device_name(device)
    dtype = check_dtype(from_numpy(array.dtype), device)
    shared = None
    if array.size and array.flags.c_contiguous and array.ctypes.data % array.itemsize == 0:
        shared = runtime.get(device).share(dtype, array.reshape(-1).view(np.uint8))
    if shared is None:
        return Tensor(_host_data(array, device, dtype))
    return Tensor(graph.load(shared, dtype, array.shape, device))


def _host_data(array: np.ndarray, device: str, dtype: DType) -> Lazy:
    """`array` on the device as `dtype`: one buffer, or where that would pass the device's
    largest (Capabilities.max_buffer_bytes: WebGPU binds 128 MiB, GPT-2's 50257 x 768 float32
    embedding is 154 MB) blocks of whole slices along its first axis whose slice fits, joined
    as a lazy cat. Kernels read the blocks through it (a gather, a matmul: each reading
    every block it needs, in one kernel); realizing it whole is refused as any kernel output
    that large would be (schedule.limits.check_bytes)."""
    limit = runtime.get(device).capabilities.max_buffer_bytes
    if limit is None or array.size * dtype.itemsize <= limit:
        return graph.load(schedule.upload(array, device, dtype), dtype, array.shape, device)
    axis = next((a for a in range(array.ndim)
                 if math.prod(array.shape[a + 1:]) * dtype.itemsize <= limit), None)
    if axis is None:            # one element past the limit: refused, naming the limit
        schedule.upload(array, device, dtype)
    step = limit // (math.prod(array.shape[axis + 1:]) * dtype.itemsize)
    blocks = [Tensor(_host_data(block, device, dtype)) for block in
              np.split(array, range(step, array.shape[axis], step), axis)]
    return movement.cat(blocks, axis).lazy


wrap = Tensor._wrap


def _empty_result(name: str, lazy: Lazy, shape: tuple[int, ...]) -> Lazy:
    """What primitive `name` gives where its input or output has no elements: a constant keeps
    zero-size views out of the scheduler's index math (which divides by the sizes). An empty
    result is any constant; a sum or pad of nothing is 0."""
    if lazy.size and name == "max_reduce":
        raise IndexError(f"max/min/argmax over a dimension of size 0 (shape {shape}): it has "
                         "no elements to choose from")
    return graph.const(_EMPTY_INPUT.get(name, 0), lazy.dtype, lazy.shape, lazy.device)


def realize(*tensors: Tensor) -> None:
    """Runs the graphs behind several tensors in one schedule (shared work runs once)."""
    schedule.realize([t.lazy for t in tensors])


def _to_numpy(data: Any, dtype: DType | None) -> np.ndarray:
    if isinstance(data, np.ndarray | np.generic):     # numpy scalars keep their dtype, as torch
        array = np.asarray(data)
        if array.dtype == np.int64 and dtype is None:      # the int32 default, as documented
            _check_fits(array, np.dtype(np.int32), "dtype=portkit.int64")
            array = array.astype(np.int32)
    else:
        array = np.asarray(data)
        if array.dtype == np.float64 and dtype is None:
            array = array.astype(np.float32)
        elif array.dtype == np.int64 and dtype is None:
            _check_fits(array, np.dtype(np.int32), "dtype=portkit.int64")
            array = array.astype(np.int32)
    if dtype is not None:
        if array.dtype.kind in "iu" and dtype.is_int:
            _check_fits(array, dtype.np, "a wider dtype")
        array = array.astype(dtype.np)
    elif array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
        raise TypeError(f"cannot make a Tensor from numpy dtype {array.dtype}")
    return array


def _check_fits(array: np.ndarray, dtype: np.dtype, fix: str) -> None:
    """OverflowError (as PyTorch) if integer data do not fit `dtype`, instead of wrapping."""
    if array.size and (array.min() < np.iinfo(dtype).min or array.max() > np.iinfo(dtype).max):
        bad = array.max() if array.max() > np.iinfo(dtype).max else array.min()
        raise OverflowError(f"value {int(bad)} does not fit {dtype.name}; pass {fix}")
