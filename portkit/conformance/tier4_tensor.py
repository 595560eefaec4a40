"""Tier 4, Tensor ops forward and backward, through the whole stack, on the backend.

Each op runs on the backend as portkit.Tensor code (forward, then `.backward()` of
sum(out * w) for a random w), and is judged against float64 numpy: the forward, and the
vector-Jacobian product w^T J for each float input. Bounds (docs/conformance.md):
- exact: movement, integer results, selections (max, relu, pooling by max);
- one ABI op (sqrt, add, ...): that op's ULP budget from portkit.abi.spec;
- anything longer: (U * eps + gamma_n) * M per element, where U sums (ULP budget + 1) over the
  rounding ABI ops of the kernels that compute it (read from the stack's own schedule), n is
  the longest sum, and M the magnitude of the terms (the computation on absolute values, times
  the growth of an argument's error through exp).
A failing case also runs on the CPU reference, to say whether the fault is the backend's.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from portkit.abi import PortkitError, dtypes, spec
from portkit.abi.errors import UnsupportedDType
from portkit.abi.ops import Op
from portkit.conformance.case import (
    Case,
    Check,
    Context,
    Outcome,
    Status,
    TierNotRun,
    Unsupported,
    judge,
)
from portkit.conformance.tier1_runtime import ESSENTIAL
from portkit.conformance.tier3_kernels import ops_used

TIER = 4
NAME = "tensor"
# ABI ops that round their result; the others (MAX, WHERE, NEG, ...) are exact selections.
ROUNDING = (Op.ADD, Op.SUB, Op.MUL, Op.FDIV, Op.RECIP, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN,
            Op.MULACC, Op.CAST)
EXACT = "exact"
# A magnitude rule: (inputs in float64, w) -> (M, n) for the output, or one pair per input.
Bound = Callable[..., Any]


@dataclass(frozen=True)
class TensorOp:
    """One Tensor op under test: its inputs, the portkit call, the numpy oracle, the bounds.

    `check` is EXACT, an Op (a single ABI op: its ULP budget), or fn(*xs) -> (M, n);
    `vjp(w, *xs)` gives d(sum(out * w))/dx for each float input, `grad_check` is EXACT or
    fn(w, *xs) -> [(M, n), ...]. Float inputs take the case's dtype; integers stay int32.
    """

    name: str
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    run: Callable[..., Any]
    forward: Callable[..., np.ndarray]
    check: str | Op | Bound
    vjp: Callable[..., list[np.ndarray]] | None = None
    grad_check: str | Bound = EXACT
    dtypes: tuple[str, ...] = ("float32",)
    quick: bool = False


@dataclass
class Ran:
    """What one run of a TensorOp on one device produced."""

    out: np.ndarray
    grads: list[np.ndarray] = field(default_factory=list)
    units: tuple[float, float] = (0.0, 0.0)     # U of the forward and of the gradients
    kernels: tuple[list, list] = ([], [])         # ABI kernels, forward and backward (planned)


# -- numpy helpers ------------------------------------------------------------------------------


def _normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape)


def _ins(*makers: Callable) -> Callable[[np.random.Generator], list[np.ndarray]]:
    return lambda rng: [make(rng) for make in makers]


def _positive(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.uniform(0.25, 4.0, shape)


def _ints(low: int, high: int, *shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(low, high, shape).astype(np.int32)


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sums g over the dims that broadcasting added to `shape`."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1),
                 keepdims=True)


def _moved(move: Callable[[np.ndarray], np.ndarray], x: np.ndarray, w: np.ndarray
           ) -> np.ndarray:
    """The VJP of a movement (or gather) `move` of x: w summed back onto the elements read.

    Moving the indices 1..n shows which element each output came from (0: padding)."""
    source = move(np.arange(1, x.size + 1, dtype=np.float64).reshape(x.shape)).astype(np.int64)
    return np.bincount(source.reshape(-1), w.reshape(-1), x.size + 1)[1:].reshape(x.shape)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _spread(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """1 + the largest |x - max| along axis: how far an argument error of exp grows."""
    return 1 + np.abs(x - x.max(axis, keepdims=True)).max(axis, keepdims=True)


def _windows(x: np.ndarray, k: int, pad: int = 0) -> np.ndarray:
    """(N, C, H, W) -> (N, C, OH, OW, k, k) sliding windows, stride 1."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    return np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))


def _conv(x: np.ndarray, weight: np.ndarray, pad: int) -> np.ndarray:
    return np.einsum("nchwij,ocij->nohw", _windows(x, weight.shape[-1], pad), weight)


def _conv_input_grad(w: np.ndarray, weight: np.ndarray, pad: int) -> np.ndarray:
    """d(sum(conv(x) * w))/dx: w convolved with the flipped, transposed weight."""
    k = weight.shape[-1]
    flipped = weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    return _conv(w, flipped, k - 1 - pad)


def _layernorm_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, rstd, A): layernorm of the last axis, 1/std, and mean|x| * rstd (how much the
    mean's rounding grows when it is subtracted)."""
    c = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
    return c * rstd, rstd, np.abs(x).mean(-1, keepdims=True) * rstd


def _layernorm_vjp(w: np.ndarray, x: np.ndarray) -> list[np.ndarray]:
    y, rstd, _ = _layernorm_parts(x)
    return [rstd * (w - w.mean(-1, keepdims=True) - y * (w * y).mean(-1, keepdims=True))]


def _layernorm_grad_bound(w: np.ndarray, x: np.ndarray) -> list[tuple[np.ndarray, int]]:
    y, rstd, grow = _layernorm_parts(x)
    big = np.abs(y) + grow
    m = rstd * (np.abs(w) + np.abs(w).mean(-1, keepdims=True) +
                big * (np.abs(w) * big).mean(-1, keepdims=True))
    return [(m, 2 * x.shape[-1])]


def _log_softmax_bound(x: np.ndarray) -> tuple[np.ndarray, int]:
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    return np.abs(x) + np.abs(x.max(-1, keepdims=True)) + np.abs(lse) + _spread(x), x.shape[-1]


def _cross_entropy(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    logp = x - x.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, t[:, None].astype(np.int64), -1).mean()


def _cross_entropy_vjp(w: np.ndarray, x: np.ndarray, t: np.ndarray) -> list[np.ndarray]:
    hot = np.eye(x.shape[-1])[t]
    return [w * (_softmax(x) - hot) / x.shape[0]]


def _pool_max(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max((3, 5))


def _pool_avg(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).mean((3, 5))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def gamma(n: int, eps: float) -> float:
    """gamma_n = n*u / (1 - n*u), u = eps / 2: the relative error of any n-term sum."""
    u = eps / 2
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def _elementwise(m: Callable[..., np.ndarray]) -> Bound:
    return lambda *xs: (m(*xs), 1)


def _each(*rules: Callable[..., tuple[np.ndarray, int]]) -> Bound:
    return lambda w, *xs: [rule(w, *xs) for rule in rules]


_X_2D = _ins(_normal(6, 7))
_BCAST = _ins(_normal(3, 1, 5), _normal(4, 5))

# The op table: name, inputs, portkit call, numpy forward, bound, VJP, gradient bound.
OPS: list[TensorOp] = [
    # elementwise, one ABI op each: the spec's ULP budget forward
    TensorOp("neg", _X_2D, lambda x: -x, np.negative, Op.NEG,
             lambda w, x: [-w], EXACT),
    TensorOp("sqrt", _ins(_positive(6, 7)), lambda x: x.sqrt(), np.sqrt, Op.SQRT,
             lambda w, x: [w / (2 * np.sqrt(x))],
             _each(lambda w, x: (np.abs(w / np.sqrt(x)), 1)), ("float32", "float16"), True),
    TensorOp("reciprocal", _ins(_positive(6, 7)), lambda x: x.reciprocal(), np.reciprocal,
             Op.RECIP, lambda w, x: [-w / (x * x)], _each(lambda w, x: (np.abs(w / (x * x)), 1))),
    TensorOp("sin", _ins(lambda rng: rng.uniform(-6, 6, (6, 7))), lambda x: x.sin(), np.sin,
             Op.SIN, lambda w, x: [w * np.cos(x)],
             _each(lambda w, x: (np.abs(w) * (1 + np.abs(np.pi / 2 - x)), 1)), quick=True),
    TensorOp("add", _BCAST, lambda x, y: x + y, np.add, Op.ADD,
             lambda w, x, y: [_unbroadcast(w, x.shape), _unbroadcast(w, y.shape)],
             _each(lambda w, x, y: (_unbroadcast(np.abs(w), x.shape), 4),
                   lambda w, x, y: (_unbroadcast(np.abs(w), y.shape), 3)), quick=True),
    TensorOp("mul", _BCAST, lambda x, y: x * y, np.multiply, Op.MUL,
             lambda w, x, y: [_unbroadcast(w * y, x.shape), _unbroadcast(w * x, y.shape)],
             _each(lambda w, x, y: (_unbroadcast(np.abs(w * y), x.shape), 4),
                   lambda w, x, y: (_unbroadcast(np.abs(w * x), y.shape), 3)),
             ("float32", "float16", "float64")),
    TensorOp("div", _ins(_normal(6, 7), _positive(6, 7)), lambda x, y: x / y, np.divide,
             Op.FDIV, lambda w, x, y: [w / y, -w * x / (y * y)],
             _each(lambda w, x, y: (np.abs(w / y), 1),
                   lambda w, x, y: (np.abs(w * x / (y * y)), 1))),
    TensorOp("maximum", _ins(_normal(6, 7), _normal(6, 7)), lambda x, y: x.maximum(y),
             np.maximum, Op.MAX, lambda w, x, y: [w * (x > y), w * (y > x)], EXACT),
    # elementwise chains: M is the result times the growth of an argument error through exp
    TensorOp("exp", _ins(lambda rng: rng.uniform(-8, 8, (6, 7))), lambda x: x.exp(), np.exp,
             _elementwise(lambda x: np.exp(x) * (1 + np.abs(x))),
             lambda w, x: [w * np.exp(x)],
             _each(lambda w, x: (np.abs(w * np.exp(x)) * (1 + np.abs(x)), 1)),
             ("float32", "float16", "float64"), True),
    TensorOp("log", _ins(_positive(6, 7)), lambda x: x.log(), np.log,
             _elementwise(lambda x: 1 + np.abs(np.log(x))), lambda w, x: [w / x],
             _each(lambda w, x: (np.abs(w / x), 1))),
    TensorOp("sigmoid", _X_2D, lambda x: x.sigmoid(), _sigmoid,
             _elementwise(lambda x: _sigmoid(x) * (1 + np.abs(x))),
             lambda w, x: [w * _sigmoid(x) * (1 - _sigmoid(x))],
             _each(lambda w, x: (np.abs(w) * _sigmoid(x) * (1 + np.abs(x)), 1))),
    # tanh = 2 sigmoid(2x) - 1 cancels near 0: its error is absolute there, not relative
    TensorOp("tanh", _X_2D, lambda x: x.tanh(), np.tanh,
             _elementwise(lambda x: 1 + 2 * np.abs(x)),
             lambda w, x: [w * (1 - np.tanh(x) ** 2)],
             _each(lambda w, x: (np.abs(w) * (1 + 2 * np.abs(x)), 1))),
    TensorOp("relu", _X_2D, lambda x: x.relu(), lambda x: np.maximum(x, 0), EXACT,
             lambda w, x: [w * (x > 0)], EXACT, quick=True),
    # integers: exact, forward only
    TensorOp("int-arith", _ins(_ints(-1000, 1000, 3, 1, 5), _ints(1, 50, 4, 5)),
             lambda a, b: (a * 3 + b) // 7 - a % b, lambda a, b: (a * 3 + b) // 7 - a % b,
             EXACT, dtypes=("int32",), quick=True),
    TensorOp("compare", _ins(_ints(-5, 5, 6, 7), _ints(-5, 5, 6, 7)),
             lambda a, b: (a < b) & (a != 3), lambda a, b: (a < b) & (a != 3), EXACT,
             dtypes=("int32",)),
    TensorOp("argmax", _X_2D, lambda x: x.argmax(1), lambda x: x.argmax(1).astype(np.int32),
             EXACT),
    # reductions: gamma_n * sum|x|
    TensorOp("sum-axis", _ins(_normal(6, 37, 5)), lambda x: x.sum(1), lambda x: x.sum(1),
             lambda x: (np.abs(x).sum(1), 37), lambda w, x: [np.broadcast_to(w[:, None], x.shape)],
             EXACT, ("float32", "float16", "float64"), True),
    TensorOp("sum-all", _ins(_normal(7, 13)), lambda x: x.sum(), np.sum,
             lambda x: (np.abs(x).sum(), x.size), lambda w, x: [np.broadcast_to(w, x.shape)],
             EXACT),
    TensorOp("int-sum", _ins(_ints(-10**6, 10**6, 9, 33)), lambda x: x.sum(0),
             lambda x: x.sum(0, dtype=np.int32), EXACT, dtypes=("int32",)),
    TensorOp("max-axis", _ins(_normal(6, 37)), lambda x: x.max(-1), lambda x: x.max(-1), EXACT,
             lambda w, x: [w[:, None] * (x == x.max(-1, keepdims=True))], EXACT, quick=True),
    TensorOp("mean-axis", _ins(_normal(9, 8)), lambda x: x.mean(0), lambda x: x.mean(0),
             lambda x: (np.abs(x).mean(0), 9),
             lambda w, x: [np.broadcast_to(w / 9, x.shape)],
             _each(lambda w, x: (np.broadcast_to(np.abs(w) / 9, x.shape), 1))),
    # movement: exact both ways (the gradient of a permutation is a permutation)
    TensorOp("permute", _ins(_normal(2, 3, 4)), lambda x: x.permute(2, 0, 1),
             lambda x: x.transpose(2, 0, 1), EXACT,
             lambda w, x: [_moved(lambda i: i.transpose(2, 0, 1), x, w)], EXACT,
             ("float32", "float16", "float64", "int8"), True),
    TensorOp("reshape-transpose", _ins(_normal(4, 6)), lambda x: x.reshape(3, 8).T,
             lambda x: x.reshape(3, 8).T, EXACT,
             lambda w, x: [_moved(lambda i: i.reshape(3, 8).T, x, w)], EXACT),
    TensorOp("pad", _ins(_normal(3, 4)), lambda x: x.pad(((1, 2), (0, 3))),
             lambda x: np.pad(x, ((1, 2), (0, 3))), EXACT,
             lambda w, x: [_moved(lambda i: np.pad(i, ((1, 2), (0, 3))), x, w)], EXACT,
             ("float32", "int32")),
    TensorOp("slice", _ins(_normal(7, 9)), lambda x: x[1:6:2, ::-3], lambda x: x[1:6:2, ::-3],
             EXACT, lambda w, x: [_moved(lambda i: i[1:6:2, ::-3], x, w)], EXACT, quick=True),
    TensorOp("flip", _ins(_normal(4, 5)), lambda x: x.flip((0, 1)), lambda x: x[::-1, ::-1],
             EXACT, lambda w, x: [_moved(lambda i: i[::-1, ::-1], x, w)], EXACT),
    TensorOp("cat", _ins(_normal(3, 2), _normal(3, 4)), lambda x, y: x.cat(y, dim=1),
             lambda x, y: np.concatenate([x, y], 1), EXACT,
             lambda w, x, y: [w[:, :2], w[:, 2:]], EXACT),
    TensorOp("expand", _ins(_normal(3, 1)), lambda x: x.expand(3, 5),
             lambda x: np.broadcast_to(x, (3, 5)), EXACT, lambda w, x: [w.sum(1, keepdims=True)],
             _each(lambda w, x: (np.abs(w).sum(1, keepdims=True), 5))),
    # indexing: the forward picks exactly; the gradient sums w over repeated picks
    TensorOp("gather", _ins(_normal(4, 6), _ints(0, 6, 4, 5)), lambda x, i: x.gather(1, i),
             lambda x, i: np.take_along_axis(x, i.astype(np.int64), 1), EXACT,
             lambda w, x, i: [_moved(lambda s: np.take_along_axis(s, i.astype(np.int64), 1),
                                     x, w)],
             _each(lambda w, x, i: (_moved(lambda s: np.take_along_axis(
                 s, i.astype(np.int64), 1), x, np.abs(w)), 5)), quick=True),
    TensorOp("index-rows", _ins(_normal(5, 3), _ints(-5, 5, 7)), lambda x, i: x[i],
             lambda x, i: x[i], EXACT, lambda w, x, i: [_moved(lambda s: s[i], x, w)],
             _each(lambda w, x, i: (_moved(lambda s: s[i], x, np.abs(w)), 7))),
    # matmul and conv: gamma_n on the product of absolute values
    TensorOp("matmul", _ins(_normal(17, 33), _normal(33, 9)), lambda a, b: a @ b, np.matmul,
             lambda a, b: (np.abs(a) @ np.abs(b), 33), lambda w, a, b: [w @ b.T, a.T @ w],
             _each(lambda w, a, b: (np.abs(w) @ np.abs(b).T, 9),
                   lambda w, a, b: (np.abs(a).T @ np.abs(w), 17)),
             ("float32", "float16", "float64"), True),
    TensorOp("matmul-batched", _ins(_normal(2, 5, 7), _normal(2, 7, 3)), lambda a, b: a @ b,
             np.matmul, lambda a, b: (np.abs(a) @ np.abs(b), 7),
             lambda w, a, b: [w @ b.transpose(0, 2, 1), a.transpose(0, 2, 1) @ w],
             _each(lambda w, a, b: (np.abs(w) @ np.abs(b).transpose(0, 2, 1), 3),
                   lambda w, a, b: (np.abs(a).transpose(0, 2, 1) @ np.abs(w), 5))),
    TensorOp("conv2d", _ins(_normal(2, 3, 7, 7), _normal(4, 3, 3, 3), _normal(4)),
             lambda x, k, b: x.conv2d(k, b, padding=1),
             lambda x, k, b: _conv(x, k, 1) + b[:, None, None],
             lambda x, k, b: (_conv(np.abs(x), np.abs(k), 1) + np.abs(b)[:, None, None], 28),
             lambda w, x, k, b: [_conv_input_grad(w, k, 1),
                                 np.einsum("nchwij,nohw->ocij", _windows(x, 3, 1), w),
                                 w.sum((0, 2, 3))],
             _each(lambda w, x, k, b: (_conv_input_grad(np.abs(w), np.abs(k), 1), 36),
                   lambda w, x, k, b: (np.einsum("nchwij,nohw->ocij", _windows(np.abs(x), 3, 1),
                                                 np.abs(w)), 98),
                   lambda w, x, k, b: (np.abs(w).sum((0, 2, 3)), 98)), quick=True),
    TensorOp("max-pool2d", _ins(_normal(2, 3, 6, 6)), lambda x: x.max_pool2d(2), _pool_max,
             EXACT, lambda w, x: [np.repeat(np.repeat(w, 2, 2), 2, 3) *
                                  (x == np.repeat(np.repeat(_pool_max(x), 2, 2), 2, 3))], EXACT),
    TensorOp("avg-pool2d", _ins(_normal(2, 3, 6, 6)), lambda x: x.avg_pool2d(2), _pool_avg,
             lambda x: (_pool_avg(np.abs(x)), 4),
             lambda w, x: [np.repeat(np.repeat(w, 2, 2), 2, 3) / 4],
             _each(lambda w, x: (np.repeat(np.repeat(np.abs(w), 2, 2), 2, 3) / 4, 1))),
    # softmax family and layernorm
    TensorOp("softmax", _ins(lambda rng: 3 * rng.standard_normal((5, 11))),
             lambda x: x.softmax(-1), _softmax, lambda x: (_softmax(x) * _spread(x), 11),
             lambda w, x: [_softmax(x) * (w - (w * _softmax(x)).sum(-1, keepdims=True))],
             _each(lambda w, x: (_softmax(x) * _spread(x) * (
                 np.abs(w) + (np.abs(w) * _softmax(x)).sum(-1, keepdims=True)), 11)), quick=True),
    TensorOp("log-softmax", _ins(lambda rng: 3 * rng.standard_normal((5, 11))),
             lambda x: x.log_softmax(-1), lambda x: x - x.max(-1, keepdims=True) - np.log(
                 np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
             _log_softmax_bound,
             lambda w, x: [w - _softmax(x) * w.sum(-1, keepdims=True)],
             _each(lambda w, x: (np.abs(w) + _softmax(x) * _spread(x) * np.abs(w).sum(
                 -1, keepdims=True), 11))),
    TensorOp("cross-entropy", _ins(lambda rng: 3 * rng.standard_normal((8, 10)),
                                   _ints(0, 10, 8)),
             lambda x, t: x.cross_entropy(t), _cross_entropy,
             lambda x, t: (_log_softmax_bound(x)[0].max(-1).mean(), 10),
             _cross_entropy_vjp,
             _each(lambda w, x, t: (np.abs(w) * (_softmax(x) * _spread(x) + 1) / 8, 10)),
             quick=True),
    TensorOp("layernorm", _ins(lambda rng: rng.standard_normal((6, 16)) + 2),
             lambda x: x.layernorm(), lambda x: _layernorm_parts(x)[0],
             lambda x: (np.abs(_layernorm_parts(x)[0]) + _layernorm_parts(x)[2], 32),
             _layernorm_vjp, _layernorm_grad_bound, quick=True),
]


# -- running an op on a device ------------------------------------------------------------------


def stack_device(target: Any) -> str:
    """The device name under which the Tensor stack reaches `target`'s Runtime.

    A backend loaded by name is already there; a Device handed in directly (a test's broken
    backend, say) is registered under "<name>.conform" (numbered if that name is taken).
    """
    from portkit import runtime

    for k in itertools.count(-1):
        name = target.name if k < 0 else f"{target.name}.conform{k or ''}"
        try:
            if runtime.get(name).device is target.device:
                return name
        except PortkitError:
            if k >= 0:
                runtime.register(runtime.Runtime(name, target.device))
                return name
    raise AssertionError("unreachable")


def _is_float(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16


def machine_eps(dtype: dtypes.DType) -> float:
    """The distance from 1 to the next float of `dtype`."""
    return float(ml_dtypes.finfo(dtype.np).eps)


def _arrays(op: TensorOp, dtype: dtypes.DType, rng: np.random.Generator
            ) -> tuple[list[np.ndarray], list[bool]]:
    """The inputs in the case's dtype (floats; integers stay int32) and which are floats."""
    raw = op.inputs(rng)
    is_float = [x.dtype.kind == "f" for x in raw]
    return [x.astype(dtype.np) if f or dtype.is_int else x
            for x, f in zip(raw, is_float)], is_float


def rounding_units(kernels: list) -> float:
    """U: the sum of (ULP budget + 1) over the rounding float ops of `kernels` (each distinct
    kernel once: the schedules of several results repeat the kernels they share)."""
    total = 0.0
    for kernel in {k.to_json(): k for k in kernels}.values():
        for node in kernel.nodes:
            if node.op in ROUNDING and node.dtype is not None and node.dtype.is_float:
                total += spec.budget(node.op, node.dtype) + 1
    return total


def run_op(op: TensorOp, dtype: dtypes.DType, inputs: list[np.ndarray], is_float: list[bool],
           w: np.ndarray | None, device: str, plan: bool = False) -> Ran:
    """Runs `op` on `device`: the forward and, with `w`, the gradients of sum(out * w).

    With `plan`, nothing runs: the result holds U and `kernels`, the ABI kernels it would use.
    """
    from portkit.tensor import Tensor, realize

    grads = w is not None
    tensors = [Tensor(x, device=device, requires_grad=grads and f)
               for x, f in zip(inputs, is_float)]
    out = op.run(*tensors)
    if plan:
        forward = out.schedule()
        ran = Ran(np.zeros(0), units=(rounding_units(forward), 0.0), kernels=(forward, []))
    else:
        ran = Ran(out.numpy())
    if not grads:
        return ran
    (out * Tensor(w.astype(out.dtype.np), device=device)).sum().backward()
    wanted = [t.grad for t, f in zip(tensors, is_float) if f]
    if plan:
        backward = [k for g in wanted for k in g.schedule()]
        ran.units = (ran.units[0], rounding_units(backward))
        ran.kernels = (forward, backward)
        return ran
    realize(*wanted)
    ran.grads = [g.numpy() for g in wanted]
    return ran


# -- judging --------------------------------------------------------------------------------


def _judge(label: str, actual: np.ndarray, check: Check) -> Any:
    verdict = judge(check, actual.reshape(-1), [])
    if not verdict.ok:
        index = verdict.worst["index"]
        where = list(np.unravel_index(index, actual.shape)) if actual.ndim else []
        verdict.message = f"{label}: " + verdict.message.replace(
            f"buffer 0[{index}]", f"{label}{where}")
    return verdict


def _bound_check(expected: np.ndarray, rule: tuple[np.ndarray, int], units: float,
                 dtype: dtypes.DType) -> Check:
    magnitude, n = rule
    eps = machine_eps(dtype)
    bound = (units * eps + gamma(n, eps)) * np.broadcast_to(magnitude, expected.shape)
    return Check(0, "bound", (expected.reshape(-1),), expected.size,
                 bound=np.asarray(bound, np.float64).reshape(-1))


def _exact_check(expected: np.ndarray, dtype: np.dtype) -> Check:
    expected = np.asarray(expected).astype(dtype)
    return Check(0, "exact", (expected.reshape(-1),), expected.size)


def forward_checks(op: TensorOp, dtype: dtypes.DType, inputs: list[np.ndarray], ran: Ran,
                   units: float) -> list[tuple[str, np.ndarray, Check]]:
    """(label, actual, check) for the forward output."""
    wide = [x.astype(np.float64) if _is_float(x) else x for x in inputs]
    if isinstance(op.check, Op):
        if op.check is Op.MAX or op.check is Op.NEG:
            return [("out", ran.out, _exact_check(op.forward(*wide), ran.out.dtype))]
        args = np.broadcast_arrays(*inputs)
        expected = spec.evaluate(op.check, *args)
        check = Check(0, "op", tuple(e.reshape(-1) for e in expected), ran.out.size,
                      op=op.check.name, dtype=dtype.name,
                      mask=np.asarray(spec.valid(op.check, *args)).reshape(-1))
        return [("out", ran.out, check)]
    expected = np.asarray(op.forward(*wide))
    if op.check == EXACT or not _is_float(ran.out):
        return [("out", ran.out, _exact_check(expected, ran.out.dtype))]
    return [("out", ran.out, _bound_check(expected, op.check(*wide), units, dtype))]


def backward_checks(op: TensorOp, dtype: dtypes.DType, inputs: list[np.ndarray],
                    is_float: list[bool], w: np.ndarray, ran: Ran, units: float
                    ) -> list[tuple[str, np.ndarray, Check]]:
    """(label, actual, check) for the gradient of each float input."""
    wide = [x.astype(np.float64) if f else x for x, f in zip(inputs, is_float)]
    w = w.astype(dtype.np).astype(np.float64)
    expected = op.vjp(w, *wide)
    rules = op.grad_check(w, *wide) if op.grad_check != EXACT else [None] * len(expected)
    labels = [f"grad x{k}" for k, f in enumerate(is_float) if f]
    found = []
    for label, actual, e, rule in zip(labels, ran.grads, expected, rules):
        e = np.broadcast_to(e, actual.shape)
        check = (_exact_check(e, actual.dtype) if rule is None
                 else _bound_check(e, rule, units, dtype))
        found.append((label, actual, check))
    return found


# -- cases ----------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the stack will run for one (op, dtype), found before the run: the tier 2 and 3
    cases it depends on, and U forward and backward."""

    requires: tuple[tuple[str, ...], tuple[str, ...]]
    units: tuple[float, float]
    error: str = ""


def _oracle_shape(op: TensorOp, inputs: list[np.ndarray]) -> tuple[int, ...]:
    return np.shape(op.forward(*[x.astype(np.float64) if x.dtype.kind == "f" else x
                                 for x in inputs]))


def _plan(ctx: Context, op: TensorOp, dtype: dtypes.DType, device: str) -> _Plan:
    """Builds the op's graph on the interpreter (nothing runs) to read its kernels."""
    rng = ctx.rng(f"tensor/{op.name}/{dtype.name}")
    inputs, is_float = _arrays(op, dtype, rng)
    w = rng.standard_normal(_oracle_shape(op, inputs)) if _differentiable(op, dtype) else None
    try:
        ran = run_op(op, dtype, inputs, is_float, w, device, plan=True)
    except Exception as error:  # noqa: BLE001 - reported by the case when it runs
        return _Plan((ESSENTIAL, ESSENTIAL), (0.0, 0.0), f"{type(error).__name__}: {error}")
    forward, backward = ran.kernels
    return _Plan((_requires(forward), _requires(forward + backward)), ran.units)


def _requires(kernels: list) -> tuple[str, ...]:
    """Tier 1's essentials, the tier 2 case of every (op, dtype) the kernels use, and tier 3's
    workgroup-memory cases where they use LOCAL."""
    needs = [case_id for kernel in kernels for case_id in ops_used(kernel)]
    if any(n.op is Op.LOCAL for kernel in kernels for n in kernel.nodes):
        needs.append("kernels/local/*")
    return ESSENTIAL + tuple(dict.fromkeys(needs))


def _differentiable(op: TensorOp, dtype: dtypes.DType) -> bool:
    return op.vjp is not None and dtype.is_float


def _outcome(verdicts: list) -> Outcome:
    failed = [v for v in verdicts if not v.ok]
    ulps = [v.error for v in verdicts if v.unit == "ulp"]
    errors = [v.error for v in verdicts if v.unit != "ulp"]
    return Outcome(Status.FAILED if failed else Status.PASSED,
                   "; ".join(v.message for v in failed), max(ulps) if ulps else None,
                   max(errors) if errors else None, failed[0].worst if failed else None)


def evaluate(ctx: Context, op: TensorOp, dtype: dtypes.DType, backward: bool, plan: _Plan,
             device: str) -> Outcome:
    """Runs one case on `device` and judges it against float64 numpy."""
    rng = ctx.rng(f"tensor/{op.name}/{dtype.name}")
    inputs, is_float = _arrays(op, dtype, rng)
    w = rng.standard_normal(_oracle_shape(op, inputs)) if _differentiable(op, dtype) else None
    try:
        ran = run_op(op, dtype, inputs, is_float, w if backward else None, device)
    except UnsupportedDType as why:
        raise Unsupported(str(why)) from None
    if backward:
        checks = backward_checks(op, dtype, inputs, is_float, w, ran, plan.units[1])
    else:
        checks = forward_checks(op, dtype, inputs, ran, plan.units[0])
    return _outcome([_judge(label, actual, check) for label, actual, check in checks])


def _blame(ctx: Context, op: TensorOp, dtype: dtypes.DType, backward: bool, plan: _Plan,
           target_name: str) -> str:
    """Whether the CPU reference passes the same case: says whose fault a failure is."""
    from portkit.conformance.target import Target

    try:
        reference = evaluate(ctx, op, dtype, backward, plan, stack_device(Target.load("cpu")))
    except Exception as error:  # noqa: BLE001 - only context for a failure already found
        return f" (the CPU reference could not run it: {type(error).__name__}: {error})"
    if reference.status is Status.PASSED:
        return f" (the CPU reference passes this case: the fault is {target_name}'s)"
    return (" (the CPU reference fails this case too: the stack or this bound is at fault, "
            "not the backend)")


def _case(ctx: Context, op: TensorOp, dtype: dtypes.DType, backward: bool,
          plan: _Plan) -> Case:
    case_id = f"tensor/{op.name}/{dtype.name}/{'bwd' if backward else 'fwd'}"

    def fn(target: Any) -> Outcome:
        if plan.error:
            return Outcome(Status.FAILED, f"building the graph failed: {plan.error}")
        outcome = evaluate(ctx, op, dtype, backward, plan, stack_device(target))
        if outcome.status is Status.FAILED:
            if target.name != "cpu":
                outcome.message += _blame(ctx, op, dtype, backward, plan, target.name)
            outcome.replay = f"portkit conform --backend {target.name} --tier 4 -k {case_id}"
        return outcome

    return Case(case_id, TIER, op.name, dtype.name, plan.requires[backward], fn=fn)


def _interpreter() -> Any:
    """The interpreter as a Target: the registered one, so its device name stays the same."""
    from portkit.abi import interpreter
    from portkit.conformance.target import Target

    try:
        return Target.load("interpreter")
    except PortkitError:    # discovery replaced (a test's fake registry): use it unregistered
        return Target(interpreter.backend.load(), "interpreter")


def cases(ctx: Context) -> list[Case]:
    """Forward and backward cases per op and dtype; `--quick` keeps the marked ops, float32."""
    try:
        planner = stack_device(_interpreter())
    except ImportError as error:
        raise TierNotRun(f"needs portkit.tensor, which does not import here ({error})") from None
    found = []
    for op in OPS:
        if ctx.quick and not op.quick:
            continue
        for name in op.dtypes[:1] if ctx.quick else op.dtypes:
            dtype = dtypes.by_name(name)
            plan = _plan(ctx, op, dtype, planner)
            found.append(_case(ctx, op, dtype, False, plan))
            if _differentiable(op, dtype):
                found.append(_case(ctx, op, dtype, True, plan))
    return found
