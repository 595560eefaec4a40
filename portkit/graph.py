"""The lazy graph: what a Tensor is before it runs.

A `Lazy` node is one high-level op on whole tensors: an ALU op of the ABI (elementwise), a
REDUCE (sum, product or max over axes), a VIEW (a movement op, as a ShapeTracker over its source: it
costs nothing), or a leaf: LOAD (a realized device buffer), CONST (one value in every element)
and ITER (the index along one axis, for arange and random numbers). GATHER reads its source at
positions an integer index tensor holds along one axis (a load whose address is data). COPY moves
data between devices. Realizing a node (portkit/schedule/) turns it into a LOAD of its buffer.
"""
from __future__ import annotations

import functools
import gc
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from math import prod
from typing import Any, NamedTuple, TypeVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.errors import PortkitError
from portkit.abi.ops import COMPARISON, Op
from portkit.view import Shape, ShapeTracker

# Kernels index elements with int32 (the ABI's index type): a tensor has at most this many.
MAX_ELEMENTS = 2**31 - 1
T = TypeVar("T")


class TooLarge(PortkitError, RuntimeError):
    """A tensor past a size limit: more elements than int32 indexes, or more bytes than the
    device's largest buffer (Capabilities.max_buffer_bytes). Raised before any allocation."""


def check_elements(shape: Sequence[int]) -> None:
    """Raises TooLarge if a tensor of `shape` has more elements than kernels can index."""
    if prod(shape) > MAX_ELEMENTS:
        raise TooLarge(f"a tensor of shape {tuple(shape)} has {prod(shape):,} elements; kernels "
                       f"index elements with int32, so a tensor holds at most {MAX_ELEMENTS:,} "
                       "(2^31 - 1): split it into smaller tensors")


def gc_paused(function: Callable[..., T]) -> Callable[..., T]:
    """`function` with Python's cyclic garbage collector paused while it runs (unless it is off
    already). Backward and scheduling allocate a graph's worth of objects that all live until
    they return, and that refcounting frees: the collections their allocations set off find
    nothing to free but walk every live object each time, about a third of an eager LSTM
    step's CPU time (a step's graph of 35 unrolled time steps holds 20,000 nodes)."""
    @functools.wraps(function)
    def paused(*args: Any, **kwargs: Any) -> T:
        if not gc.isenabled():
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()
    return paused


class DeviceMismatch(PortkitError, RuntimeError):
    """An op given tensors on two devices: a RuntimeError with torch's message, raised when
    the op is written."""


def check_devices(first: Lazy, others: Iterable[Lazy]) -> None:
    """Raises DeviceMismatch, naming both devices and the fix, if any of `others` is on
    another device than `first`."""
    for other in others:
        if other.device != first.device:
            raise DeviceMismatch(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {first.device} and {other.device}! Copy one to the other's device "
                f"first: .to({first.device!r})")


class GraphOp(Enum):
    """Graph ops that are not ABI compute ops."""

    LOAD = "LOAD"
    CONST = "CONST"
    ITER = "ITER"
    REDUCE = "REDUCE"
    VIEW = "VIEW"
    GATHER = "GATHER"
    COPY = "COPY"


class Gather(NamedTuple):
    """A GATHER's argument: the axis the index replaces, whether a negative index counts from
    the end (once), and the code its kernel stores into the fault flag for an index outside
    the axis (0: the indices are in range by construction, no check)."""

    axis: int
    wrap: bool
    code: int


class Lazy:
    """One node of the lazy graph; `buffer` is set once it is realized (op becomes LOAD)."""

    __slots__ = ("__weakref__", "arg", "buffer", "device", "dtype", "op", "shape", "src")

    def __init__(self, op: Op | GraphOp, dtype: DType, shape: Shape, src: tuple[Lazy, ...] = (),
                 arg: Any = None, device: str = "cpu", buffer: Any = None):
        self.op, self.dtype, self.shape, self.src, self.arg = op, dtype, tuple(shape), src, arg
        self.device, self.buffer = device, buffer

    def __repr__(self) -> str:
        name = self.op.name
        return f"<Lazy {name} {self.dtype.name}{list(self.shape)} on {self.device}>"

    @property
    def size(self) -> int:
        """The number of elements."""
        return prod(self.shape)

    @property
    def realized(self) -> bool:
        """True once the node holds a device buffer (it is a LOAD)."""
        return self.op is GraphOp.LOAD

    def realize_as(self, buffer: Any) -> None:
        """Turns this node into a LOAD of `buffer`, dropping its sources (frees the graph)."""
        self.op, self.src, self.arg, self.buffer = GraphOp.LOAD, (), None, buffer

    @property
    def base(self) -> Lazy:
        """The node a VIEW looks at; any other node is its own base."""
        return self.src[0] if self.op is GraphOp.VIEW else self

    @property
    def tracker(self) -> ShapeTracker:
        """How this node's elements map onto its base's (contiguous unless it is a VIEW)."""
        return self.arg if self.op is GraphOp.VIEW else ShapeTracker.contiguous(self.shape)

    # -- elementwise and reduce ---------------------------------------------------------------

    def alu(self, op: Op, *others: Lazy) -> Lazy:
        """An ABI compute op over same-shaped operands (Tensor broadcasts first)."""
        check_devices(self, others)
        srcs = (self,) + others
        dtype = dtypes.bool_ if op in COMPARISON else srcs[1 if op is Op.WHERE else 0].dtype
        return Lazy(op, dtype, self.shape, srcs, None, self.device)

    def cast(self, dtype: DType, bitcast: bool = False) -> Lazy:
        """The values converted to `dtype` (or, with `bitcast`, their bits reinterpreted)."""
        if dtype == self.dtype and not bitcast:
            return self
        return Lazy(Op.BITCAST if bitcast else Op.CAST, dtype, self.shape, (self,), None,
                    self.device)

    def reduce(self, op: Op, axes: tuple[int, ...]) -> Lazy:
        """op in (ADD, MUL, MAX) over `axes`, which keep size 1; no axes: the node itself."""
        if not axes:
            return self
        shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
        return Lazy(GraphOp.REDUCE, self.dtype, shape, (self,), (op, tuple(sorted(axes))),
                    self.device)

    # -- movement -----------------------------------------------------------------------------

    def view(self, method: str, arg: Any) -> Lazy:
        """A movement op (reshape permute expand pad shrink flip) as a view of the base."""
        tracker = _moved(self.tracker, method, arg)
        base = self.base
        if tracker.shape == base.shape and tracker.is_contiguous:
            return base
        if base.op is GraphOp.CONST and tracker.views[-1].mask is None and len(tracker.views) == 1:
            return Lazy(GraphOp.CONST, self.dtype, tracker.shape, (), base.arg, self.device)
        return Lazy(GraphOp.VIEW, self.dtype, tracker.shape, (base,), tracker, self.device)

    def gather(self, index: Lazy, fault: Lazy, arg: Gather) -> Lazy:
        """self[..., index[..., i, ...], ...] along `arg.axis`: the result has self's shape
        with that axis index's size; index has self's ndim and, outside the axis, self's size
        or 1 (the same index for every position there). `fault` is the int32 flag buffer an
        index out of range sets (portkit/tensor/faults.py)."""
        check_devices(self, (index,))
        shape = tuple(index.shape[d] if d == arg.axis else s for d, s in enumerate(self.shape))
        return Lazy(GraphOp.GATHER, self.dtype, shape, (self, index, fault), arg, self.device)

    def copy_to(self, device: str) -> Lazy:
        """The same values on another device."""
        return Lazy(GraphOp.COPY, self.dtype, self.shape, (self,), device, device)


@functools.lru_cache(maxsize=4096)
def _moved(tracker: ShapeTracker, method: str, arg: Any) -> ShapeTracker:
    """`tracker` moved by ShapeTracker's `method`, a function of its arguments alone, which a
    training step passes again at every step: an eager LSTM step shrinks and pads 500 views
    (5 us each; a look-up here is 0.2)."""
    return getattr(tracker, method)(arg)


class Traced(float):
    """A number that portkit.jit recomputes at every replay (portkit/jit.py): `const` keeps it
    as the node's value, so that a capture finds which kernel arguments came from it."""

    __slots__ = ()


def const(value: Any, dtype: DType, shape: Shape, device: str) -> Lazy:
    """`value` in every element: folded into kernels, never stored."""
    return Lazy(GraphOp.CONST, dtype, shape, (), _as_kind(value, dtype), device)


def _as_kind(value: Any, dtype: DType) -> Any:
    kind = dtype.kind
    if kind == "float":
        return value if isinstance(value, Traced) else float(value)
    return bool(value) if kind == "bool" else int(value)


# shared_const's nodes by value, dtype, shape and device, least recently asked for first; at the
# bound the oldest goes, so the constants of the graph being built stay one node each
_shared: OrderedDict[tuple, Lazy] = OrderedDict()
_MAX_SHARED = 4096
_evicted = 0        # nodes the table has let go: a holder of its nodes asks again after one


def shared_evictions() -> int:
    """How many nodes shared_const has let go of so far: one who keeps its nodes keeps this
    too, and asks again for them once it has changed."""
    return _evicted


def shared_const(value: Any, dtype: DType, shape: tuple[int, ...], device: str) -> Lazy:
    """`const`, one node for every caller that asks for the same constant: for operands that
    no one realizes (the number an op reads, a composition's coefficients), whose node a
    realize never turns into a buffer. An eager LSTM step's graph held 4,500 constant nodes
    of a few dozen values, each allocated, numbered and keyed at every step. A number
    portkit.jit traces gets a node of its own (its identity finds its kernel arguments)."""
    global _evicted
    if isinstance(value, Traced):
        return const(value, dtype, shape, device)
    value = _as_kind(value, dtype)
    # a float by its bits: -0.0 and 0.0 are two constants, and every NaN one
    key = (value.hex() if type(value) is float else value, dtype.name, shape, device)
    found = _shared.get(key)
    if found is not None and found.op is GraphOp.CONST:
        _shared.move_to_end(key)
        return found
    if len(_shared) >= _MAX_SHARED:
        _shared.popitem(last=False)
        _evicted += 1
    found = _shared[key] = Lazy(GraphOp.CONST, dtype, shape, (), value, device)
    return found


def iota(shape: Shape, axis: int, device: str) -> Lazy:
    """The int32 index along `axis` in every element."""
    return Lazy(GraphOp.ITER, dtypes.int32, shape, (), axis, device)


def load(buffer: Any, dtype: DType, shape: Shape, device: str) -> Lazy:
    """A realized buffer holding `shape` contiguously."""
    return Lazy(GraphOp.LOAD, dtype, shape, (), None, device, buffer)


class Walk(NamedTuple):
    """What `walk` found: the nodes sources first, and the stopped nodes in first-seen order."""

    order: list
    stopped: list


def _src(node: Any) -> Sequence[Any]:
    """A Lazy's sources: what `walk` follows unless told otherwise."""
    return node.src


def walk(roots: Iterable[T], stop: Callable[[T], bool] = lambda node: False,
         sources: Callable[[T], Sequence[T]] = _src) -> Walk:
    """Every node reachable from `roots` through `sources`, depth first, left source first.

    A node for which `stop` is true is neither listed in `order` nor walked through; it is
    listed once in `stopped`. Iterative, since graphs get deep (a training loop's chain of
    updates), and by identity, so nodes need not be hashable by value.
    """
    order: list = []
    stopped: list = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False) for root in reversed(list(roots))]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if stop(node):
            stopped.append(node)
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in reversed(sources(node)))
    return Walk(order, stopped)


def toposort(roots: Iterable[T], stop: Callable[[T], bool] = lambda node: False,
             sources: Callable[[T], Sequence[T]] = _src) -> list:
    """The nodes reachable from `roots` that `stop` does not cut off, sources first."""
    return walk(roots, stop, sources).order


def gathers(node: Lazy, stop: Callable[[Lazy], bool]) -> bool:
    """True if a GATHER is among `node` and the sources it reaches before `stop` (those where
    it stops included): computing `node` reads at positions only data knows."""
    found = walk([node], stop)
    return any(n.op is GraphOp.GATHER for n in found.order + found.stopped)
