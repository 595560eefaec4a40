"""Automatic mixed precision: `portkit.autocast`, torch.autocast's context manager and decorator.

Inside it, each op marked `runs_in_low_precision` (matmul, linear, the convolutions) casts its
float tensor arguments on the autocast device to the autocast dtype, bfloat16 or float16, and so
gives a result of that dtype; each op marked `runs_in_float32` (softmax, the norms, the losses,
sum, mean, prod) casts its 16-bit float arguments to float32. Other ops run in their inputs'
dtypes, and a binary op of a 16-bit and a float32 tensor gives float32, as under torch. The casts
are autograd primitives, so a float32 parameter (the master weight) gets a float32 gradient.

An op is marked where it is defined, and the mark registers it in POLICIES (the table the docs
list). Inside a marked op autocast is off, as torch's dispatcher does it: the sums a matmul is
built from stay in its low dtype. backward() runs with autocast off too (core.py), so the
gradient graph keeps the dtypes the forward chose.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from portkit import backends
from portkit.abi.dtypes import DType
from portkit.abi.errors import UnsupportedDType
from portkit.graph import Lazy
from portkit.tensor.dtype import DTypeLike, bfloat16, float16, float32, to_dtype

Function = TypeVar("Function", bound=Callable[..., Any])
State = tuple[str, DType] | None

# the low dtypes autocast runs ops in, and each device type's default (torch's: cuda float16,
# every other device bfloat16)
LOW_DTYPES = (bfloat16, float16)
_DEFAULT_DTYPE = {"cuda": float16}

# op name -> "low precision" or "float32", filled by the two marks below
POLICIES: dict[str, str] = {}

# (device type, low dtype) while autocast is on in this thread (or asyncio task), else None
_ACTIVE: ContextVar[State] = ContextVar("portkit_autocast", default=None)
# device types checked against the registered backends already (listing them takes ~20 ms)
_KNOWN_TYPES: set[str] = set()


class autocast:
    """torch.autocast: on devices of `device_type`, matmul, linear and the convolutions run in
    `dtype` (bfloat16, or float16; default bfloat16, float16 on cuda) and softmax, the norms,
    the losses and sums in float32; a context manager or a function decorator. enabled=False
    turns an enclosing one off. cache_enabled is accepted for torch's signature and does
    nothing: no cast copy is kept (a cast is a node of the lazy graph, made at each use)."""

    def __init__(self, device_type: str, dtype: DTypeLike | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        if device_type not in _KNOWN_TYPES:
            if not isinstance(device_type, str) or device_type not in backends.names():
                raise backends.UnknownBackend(
                    f"autocast: no device type {device_type!r}",
                    f"use one of {', '.join(backends.names())} (a backend name, no ':index')")
            _KNOWN_TYPES.add(device_type)
        low = _DEFAULT_DTYPE.get(device_type, bfloat16) if dtype is None else to_dtype(dtype)
        if low not in LOW_DTYPES:
            raise UnsupportedDType(
                f"autocast: dtype {getattr(low, 'name', low)} is not one autocast runs ops in; "
                f"use dtype={' or '.join(f'portkit.{d.name}' for d in LOW_DTYPES)}")
        self.device_type, self.dtype, self.enabled = device_type, low, bool(enabled)
        self._tokens: list[Token[State]] = []

    def _state(self) -> State:
        return (self.device_type, self.dtype) if self.enabled else None

    def __enter__(self) -> autocast:  # noqa: PYI034  (3.10 has no typing.Self)
        self._tokens.append(_ACTIVE.set(self._state()))
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._tokens.pop())

    def __call__(self, function: Function) -> Function:
        state = self._state()

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = _ACTIVE.set(state)
            try:
                return function(*args, **kwargs)
            finally:
                _ACTIVE.reset(token)
        return wrapper  # type: ignore[return-value]


def is_autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on here for devices of `device_type` (torch.is_autocast_enabled)."""
    state = _ACTIVE.get()
    return state is not None and state[0] == device_type


def get_autocast_dtype(device_type: str) -> DType:
    """The dtype autocast runs low-precision ops in on `device_type`: the enclosing one's, else
    the default (torch.get_autocast_dtype)."""
    state = _ACTIVE.get()
    if state is not None and state[0] == device_type:
        return state[1]
    return _DEFAULT_DTYPE.get(device_type, bfloat16)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Autocast off inside, whatever encloses it: the body of a marked op, a backward pass."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _mark(op: Function, policy: str, eligible: Callable[[DType, DType], bool],
          target: Callable[[DType], DType]) -> Function:
    """`op` registered under `policy`; inside autocast, each of its tensor arguments on the
    autocast device whose dtype `eligible(dtype, low dtype)` picks is cast to `target(low)`."""
    POLICIES[op.__name__] = policy

    def cast(value: Any, device_type: str, low: DType) -> Any:
        lazy = getattr(value, "lazy", None)
        if not isinstance(lazy, Lazy) or not eligible(lazy.dtype, low) or \
                lazy.device.partition(":")[0] != device_type:
            return value
        return value.cast(target(low))

    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = _ACTIVE.get()
        if state is None:
            return op(*args, **kwargs)
        device_type, low = state
        args = tuple(cast(a, device_type, low) for a in args)
        kwargs = {k: cast(v, device_type, low) for k, v in kwargs.items()}
        with suspended():
            return op(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def runs_in_low_precision(op: Function) -> Function:
    """Marks `op` as one autocast runs in its low dtype: every float argument but a float64 is
    cast to it, a float16 one under bfloat16 too (torch's lower_precision_fp)."""
    return _mark(op, "low precision", lambda dtype, low: dtype.is_float and dtype != low
                 and dtype.itemsize <= 4, lambda low: low)


def runs_in_float32(op: Function) -> Function:
    """Marks `op` as one autocast runs in float32: its 16-bit float arguments are cast to
    float32 (torch's fp32 policy)."""
    return _mark(op, "float32", lambda dtype, low: dtype in LOW_DTYPES, lambda low: float32)
