"""The Tensor ops tier 4 checks: inputs, the portkit call, a float64 numpy oracle, and the
bounds its results must meet forward and backward (see tier4_tensor.py for how they are judged).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from portkit.abi.ops import Op

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


def movement_vjp(move: Callable[[np.ndarray], np.ndarray], x: np.ndarray, w: np.ndarray
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
    TensorOp("max-axis", _ins(_normal(6, 37)), lambda x: x.amax(-1), lambda x: x.max(-1), EXACT,
             lambda w, x: [w[:, None] * (x == x.max(-1, keepdims=True))], EXACT, quick=True),
    TensorOp("mean-axis", _ins(_normal(9, 8)), lambda x: x.mean(0), lambda x: x.mean(0),
             lambda x: (np.abs(x).mean(0), 9),
             lambda w, x: [np.broadcast_to(w / 9, x.shape)],
             _each(lambda w, x: (np.broadcast_to(np.abs(w) / 9, x.shape), 1))),
    # movement: exact both ways (the gradient of a permutation is a permutation)
    TensorOp("permute", _ins(_normal(2, 3, 4)), lambda x: x.permute(2, 0, 1),
             lambda x: x.transpose(2, 0, 1), EXACT,
             lambda w, x: [movement_vjp(lambda i: i.transpose(2, 0, 1), x, w)], EXACT,
             ("float32", "float16", "float64", "int8"), True),
    TensorOp("reshape-transpose", _ins(_normal(4, 6)), lambda x: x.reshape(3, 8).T,
             lambda x: x.reshape(3, 8).T, EXACT,
             lambda w, x: [movement_vjp(lambda i: i.reshape(3, 8).T, x, w)], EXACT),
    TensorOp("pad", _ins(_normal(3, 4)), lambda x: x.pad(((1, 2), (0, 3))),
             lambda x: np.pad(x, ((1, 2), (0, 3))), EXACT,
             lambda w, x: [movement_vjp(lambda i: np.pad(i, ((1, 2), (0, 3))), x, w)], EXACT,
             ("float32", "int32")),
    TensorOp("slice", _ins(_normal(7, 9)), lambda x: x[1:6:2, ::-3], lambda x: x[1:6:2, ::-3],
             EXACT, lambda w, x: [movement_vjp(lambda i: i[1:6:2, ::-3], x, w)], EXACT, quick=True),
    TensorOp("flip", _ins(_normal(4, 5)), lambda x: x.flip((0, 1)), lambda x: x[::-1, ::-1],
             EXACT, lambda w, x: [movement_vjp(lambda i: i[::-1, ::-1], x, w)], EXACT),
    TensorOp("cat", _ins(_normal(3, 2), _normal(3, 4)), lambda x, y: x.cat(y, dim=1),
             lambda x, y: np.concatenate([x, y], 1), EXACT,
             lambda w, x, y: [w[:, :2], w[:, 2:]], EXACT),
    TensorOp("expand", _ins(_normal(3, 1)), lambda x: x.expand(3, 5),
             lambda x: np.broadcast_to(x, (3, 5)), EXACT, lambda w, x: [w.sum(1, keepdims=True)],
             _each(lambda w, x: (np.abs(w).sum(1, keepdims=True), 5))),
    # indexing: the forward picks exactly; the gradient sums w over repeated picks
    TensorOp("gather", _ins(_normal(4, 6), _ints(0, 6, 4, 5)), lambda x, i: x.gather(1, i),
             lambda x, i: np.take_along_axis(x, i.astype(np.int64), 1), EXACT,
             lambda w, x, i: [movement_vjp(lambda s: np.take_along_axis(s, i.astype(np.int64), 1),
                                     x, w)],
             _each(lambda w, x, i: (movement_vjp(lambda s: np.take_along_axis(
                 s, i.astype(np.int64), 1), x, np.abs(w)), 5)), quick=True),
    TensorOp("index-rows", _ins(_normal(5, 3), _ints(-5, 5, 7)), lambda x, i: x[i],
             lambda x, i: x[i], EXACT, lambda w, x, i: [movement_vjp(lambda s: s[i], x, w)],
             _each(lambda w, x, i: (movement_vjp(lambda s: s[i], x, np.abs(w)), 7))),
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
