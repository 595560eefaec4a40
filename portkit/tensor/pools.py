"""Max and average pools in 1, 2 and 3 dims as torch.nn.functional has them (max_pool with
return_indices, max_unpool2d).

A pool is a reduce over windows of the (padded) input. Where the windows tile it (stride ==
kernel, no dilation: a 2x2 stride-2 pool), they are blocks of a reshape, (N, C, H / k, k, W / k,
k), so the forward and its gradient read with plain strides. The gradient is given (autograd's
"given_vjp"), not derived from the views: derived, the gradient of overlapping views is a sum of
shifted copies, a gather with a div and a mod per term. A max pool's gradient reaches the
element of each window that torch's does (the first maximum in row-major order, or the last
NaN), found once per window by a reduce that stores its position; the gradient then compares
each element's position with it, a compare and a select per element. It is a sum over one
element, a reduce, so that the scheduler gives it a kernel of its own rather than recompute it
inside every kernel that reads it (a convolution's weight gradient, once for each of its
terms).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product
from typing import TYPE_CHECKING

from portkit.tensor.dtype import float_of
from portkit.tensor.windows import IntTuple, ntuple, windows

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

def max_pool1d(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None = None,
               padding: IntTuple = 0, dilation: IntTuple = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each window over the last dim."""
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1)


def max_pool2d(input: Tensor, kernel_size: IntTuple = 2, stride: IntTuple | None = None,
               padding: IntTuple = 0, dilation: IntTuple = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each window over the last two dims (padding never wins); with
    return_indices, also where in each (H * W) plane it was, as torch's."""
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2)


def max_pool3d(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None = None,
               padding: IntTuple = 0, dilation: IntTuple = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each window over the last three dims."""
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 3)


def _max_pool(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None, padding: IntTuple,
              dilation: IntTuple, ceil_mode: bool, return_indices: bool, d: int):
    kernel, stride, pads, dilation = _pool_args(input, kernel_size, stride, padding, dilation,
                                                ceil_mode, d)
    # -inf for floats, the dtype's minimum for integers (which keeps the dtype)
    lowest = float("-inf") if input.dtype.is_float else input.dtype.min
    keep = ((0, 0),) * (input.ndim - d)
    if not return_indices and stride == kernel and dilation == (1,) * d:
        return _max_blocks(input, kernel, pads, lowest)
    last = tuple(range(-d, 0))
    if not return_indices and dilation == (1,) * d:
        padded = input.detach().pad(keep + pads, lowest)
        out = windows(padded, kernel, stride, dilation).amax(last)
        if not input.requires_grad:
            return out
        return out._prim("given_vjp", input, arg=lambda g: (
            _max_phases_grad(input, padded, out, g, kernel, stride, pads),))
    views = windows(input.pad(keep + pads, lowest), kernel, stride, dilation)
    if not return_indices:
        return views.amax(last)
    flat = views.reshape(*views.shape[:-d], math.prod(kernel))
    choice = flat.argmax(-1, keepdim=True)
    # each input element's index in its plane, padded with anything (padding never wins)
    spatial = input.shape[-d:]
    where = type(input).arange(math.prod(spatial), device=input.device).reshape(spatial)
    where = windows(where.pad(pads), kernel, stride, dilation)
    where = where.reshape((1,) * (flat.ndim - d - 1) + flat.shape[-d - 1:]).expand(flat.shape)
    # gathered, the gradient reaches the element picked only, as torch's
    return flat.gather(-1, choice).squeeze(-1), where.gather(-1, choice).squeeze(-1)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size: IntTuple,
                 stride: IntTuple | None = None, padding: IntTuple = 0,
                 output_size: Sequence[int] | None = None) -> Tensor:
    """Puts each value back where max_pool2d(return_indices=True) found it; zeros elsewhere."""
    if input.shape != indices.shape or input.ndim not in (3, 4):
        raise ValueError(f"max_unpool2d: input {input.shape} and indices {indices.shape} must "
                         "have one (N, C, H, W) or (C, H, W) shape")
    kernel = ntuple(kernel_size, 2, "kernel_size")
    stride = ntuple(kernel_size if stride is None else stride, 2, "stride")
    padding = ntuple(padding, 2, "padding", 0)
    size = tuple((i - 1) * s - 2 * p + k for i, s, p, k in zip(input.shape[-2:], stride,
                                                              padding, kernel))
    if output_size is not None:
        size = tuple(output_size)[-2:]
    lead = input.shape[:-2]
    plane = type(input).zeros(*lead, math.prod(size), dtype=input.dtype, device=input.device)
    out = plane.scatter(-1, indices.reshape(*lead, -1), input.reshape(*lead, -1))
    return out.reshape(*lead, *size)


def avg_pool1d(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None = None,
               padding: IntTuple = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """The mean of each window over the last dim."""
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, 1)


def avg_pool2d(input: Tensor, kernel_size: IntTuple = 2, stride: IntTuple | None = None,
               padding: IntTuple = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """The mean of each window over the last two dims. Padding counts as 0 and, with
    count_include_pad, in the divisor; windows that ceil_mode adds past the padding never do."""
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, 2)


def avg_pool3d(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None = None,
               padding: IntTuple = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """The mean of each window over the last three dims."""
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, 3)


def _avg_pool(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None,
              padding: IntTuple, ceil_mode: bool, count_include_pad: bool, d: int) -> Tensor:
    kernel, stride, pads, _ = _pool_args(input, kernel_size, stride, padding, 1, ceil_mode, d)
    if stride == kernel and all(p == (0, 0) for p in pads):
        return _avg_blocks(input, kernel)
    ones = (1,) * d
    x = input.cast(float_of(input.dtype)).pad(((0, 0),) * (input.ndim - d) + pads)
    total = windows(x, kernel, stride, ones).sum(tuple(range(-d, 0)))
    counted_pad = [p if count_include_pad else 0 for p, _ in pads]
    # the divisor of each window: how many of its elements are input (or counted padding)
    counted = type(input).ones(*(s + 2 * c for s, c in zip(input.shape[-d:], counted_pad)),
                               device=input.device)
    counted = counted.pad(tuple((p - c, after - c) for (p, after), c in zip(pads, counted_pad)))
    count = windows(counted, kernel, stride, ones).sum(tuple(range(-d, 0)))
    return total / count


def _max_blocks(input: Tensor, kernel: tuple[int, ...], pads: tuple[tuple[int, int], ...],
               lowest: float) -> Tensor:
    """A max pool whose windows tile the padded input, with its gradient given."""
    keep = ((0, 0),) * (input.ndim - len(kernel))
    blocks = _blocks(input.detach().pad(keep + pads, lowest), kernel)
    axes = _window_axes(blocks, kernel)
    out = blocks.amax(axes)
    if not input.requires_grad:
        return out

    def grad(g: Tensor) -> tuple[Tensor]:
        top = out.reshape(_kept(blocks.shape, axes))
        real = _real(input, pads)
        position = _positions(blocks, axes, kernel)
        first = _first_max(blocks, top, position, None if real is None else
                           _blocks(real, kernel), axes)
        return (_unblock((position == first)._where(g.reshape(top.shape), 0.0), input.shape,
                         pads),)
    return out._prim("given_vjp", input, arg=grad)


def _avg_blocks(input: Tensor, kernel: tuple[int, ...]) -> Tensor:
    """An average pool whose windows tile the input, with its gradient given."""
    blocks = _blocks(input.detach().cast(float_of(input.dtype)), kernel)
    axes = _window_axes(blocks, kernel)
    out = blocks.mean(axes)
    if not input.requires_grad:
        return out

    def grad(g: Tensor) -> tuple[Tensor]:
        share = (g / math.prod(kernel)).reshape(_kept(blocks.shape, axes)).expand(blocks.shape)
        return (_unblock(share, input.shape, ((0, 0),) * len(kernel)).cast(input.dtype),)
    return out._prim("given_vjp", input, arg=grad)


def _blocks(x: Tensor, kernel: tuple[int, ...]) -> Tensor:
    """The last len(kernel) dims cut into whole windows: (..., H / kh, kh, W / kw, kw), what
    does not fill a window at the end dropped."""
    d = len(kernel)
    outs = [size // k for size, k in zip(x.shape[-d:], kernel)]
    x = x.shrink([None] * (x.ndim - d) + [(0, o * k) for o, k in zip(outs, kernel)])
    return x.reshape(*x.shape[:-d], *(n for o, k in zip(outs, kernel) for n in (o, k)))


def _window_axes(blocks: Tensor, kernel: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(range(blocks.ndim - 2 * len(kernel) + 1, blocks.ndim, 2))


def _kept(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if a in axes else s for a, s in enumerate(shape))


def _unblock(grad: Tensor, shape: tuple[int, ...], pads: tuple[tuple[int, int], ...]) -> Tensor:
    """The gradient of `_blocks` of the input padded by `pads`, from that of the blocks. It is
    summed over one element first: a reduce, which gets a kernel of its own that loops over the
    blocks' shape (an elementwise gradient is computed inside each kernel that reads it, where
    the merged axes would cost a div and a mod per element)."""
    d = len(pads)
    grad = grad.unsqueeze(-1).sum(-1)
    spatial = [grad.shape[grad.ndim - 2 * d + 2 * i] * grad.shape[grad.ndim - 2 * d + 2 * i + 1]
               for i in range(d)]
    grad = grad.reshape(*shape[:-d], *spatial)
    padded = [size + lo + hi for size, (lo, hi) in zip(shape[-d:], pads)]
    grad = grad.pad(((0, 0),) * (len(shape) - d) + tuple(
        (0, p - n) for p, n in zip(padded, spatial)))
    return grad.shrink([None] * (len(shape) - d) + [(lo, lo + size) for size, (lo, _) in
                                                    zip(shape[-d:], pads)])


def _real(input: Tensor, pads: tuple[tuple[int, int], ...]) -> Tensor | None:
    """True at the input's spatial positions, False at the padding around them (None where
    there is none): a constant, for the padded input's views to read beside it."""
    if all(p == (0, 0) for p in pads):
        return None
    return type(input).full(input.shape[-len(pads):], True, device=input.device).pad(pads, False)


def _positions(windows: Tensor, axes: tuple[int, ...], kernel: tuple[int, ...]) -> Tensor:
    """Each element's row-major position in its window, i * kw + j for a 2-d one: an int32
    constant with the dims of `windows`, spanning `axes` (the window's) and 1 elsewhere."""
    shape = [1] * windows.ndim
    for a, k in zip(axes, kernel):
        shape[a] = k
    return type(windows).arange(math.prod(kernel), device=windows.device).reshape(shape)


def _first_max(x: Tensor, top: Tensor, position: Tensor, real: Tensor | None,
               axes: tuple[int, ...]) -> Tensor:
    """The position of the element of each window of `x` that torch's max pools send the
    gradient to: the first equal to the window's maximum `top` in row-major order, or the last
    NaN where the window has one (its kernels keep a maximum and move on a greater value or a
    NaN); never padding, where `real` is False. One reduce over the window axes."""
    count = math.prod(x.shape[a] for a in axes)
    # a score that the maximum decides: count - 1 - position for the first maximum, count +
    # position for the last NaN, which outranks any maximum
    score = (x == top)._where(count - 1 - position, -1)
    if x.dtype.is_float:
        score = x.isnan()._where(count + position, score)
    if real is not None:
        score = real._where(score, -1)
    best = score.amax(axes, keepdim=True)
    return (best < count)._where(count - 1 - best, best - count)


def _max_phases_grad(input: Tensor, padded: Tensor, out: Tensor, g: Tensor,
                     kernel: tuple[int, ...], stride: tuple[int, ...],
                     pads: tuple[tuple[int, int], ...]) -> Tensor:
    """The input gradient of a max pool whose windows overlap (ResNet's 3x3 stride-2): for
    each window position, g where `_first_max` found that position, placed at the input
    elements it read. The input is laid out in phases, (..., H / s, s, W / s, s):
    position i of window o reads element o * s + i, block o + i // s, phase i % s, so each
    term is a strided read padded into place, with no div or mod; a sum of one element gives
    the sum its own kernel, looping over that layout."""
    d = len(kernel)
    lead = out.shape[:-d]
    outs = out.shape[-d:]
    blocks = [-(-size // s) for size, s in zip(padded.shape[-d:], stride)]
    ones = (1,) * d
    views = windows(padded, kernel, stride, ones)
    axes = tuple(range(views.ndim - d, views.ndim))
    real = _real(input, pads)
    first = _first_max(views, out.reshape(*out.shape, *ones), _positions(views, axes, kernel),
                       None if real is None else windows(real, kernel, stride, ones), axes)
    first = first.reshape(out.shape)
    total = None
    for k, at in enumerate(product(*(range(n) for n in kernel))):
        term = (first == k)._where(g, 0.0).reshape(*lead, *(n for o in outs for n in (o, 1)))
        places = [((i // s, b - o - i // s), (i % s, s - 1 - i % s))
                  for i, s, o, b in zip(at, stride, outs, blocks)]
        term = term.pad(((0, 0),) * len(lead) + tuple(p for place in places for p in place))
        total = term if total is None else total + term
    assert total is not None    # a window has at least one position
    total = total.unsqueeze(-1).sum(-1).reshape(*lead, *(b * s for b, s in zip(blocks, stride)))
    sizes = [size - lo - hi for size, (lo, hi) in zip(padded.shape[-d:], pads)]
    return total.shrink([None] * len(lead) + [(lo, lo + n) for (lo, _), n in zip(pads, sizes)])


def _pool_args(input: Tensor, kernel_size: IntTuple, stride: IntTuple | None,
               padding: IntTuple, dilation: IntTuple, ceil_mode: bool, d: int
               ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...],
                          tuple[int, ...]]:
    """kernel, stride, ((before, after) padding per spatial dim) and dilation of a d-dim pool;
    ceil_mode pads the end so a last partial window fits, if it starts inside the input or the
    padding before it (PyTorch's rule)."""
    if input.ndim < d + 1:
        raise RuntimeError(f"{d}-d pooling needs at least {d + 1} dims, got shape "
                           f"{input.shape}")
    kernel = ntuple(kernel_size, d, "kernel_size")
    stride = ntuple(kernel_size if stride is None or stride == [] else stride, d, "stride")
    pad, dilation = ntuple(padding, d, "padding", 0), ntuple(dilation, d, "dilation")
    if any(2 * p > k for p, k in zip(pad, kernel)):
        raise RuntimeError(f"padding {pad} should be at most half of kernel size {kernel}")
    pads = []
    for size, k, s, p, dd in zip(input.shape[-d:], kernel, stride, pad, dilation):
        span = size + 2 * p - dd * (k - 1) - 1
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        pads.append((p, p + max(0, (out - 1) * s + dd * (k - 1) + 1 - (size + 2 * p))))
    return kernel, stride, tuple(pads), dilation


