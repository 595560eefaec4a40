"""Neural-network functions, as torch.nn.functional: linear, convolution, pools, losses, norms,
dropout, attention, embedding and the activations PyTorch keeps here.

Tensor has a thin method for each (x.conv2d(w) is conv2d(x, w)); the layers in portkit.nn call
these. They compose Tensor ops only, so autograd differentiates them with no rule of their own.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from portkit.tensor import Tensor
from portkit.tensor.dtype import bool_, float_of, int32

IntPair = int | tuple[int, int]
Reduction = Literal["mean", "sum", "none"]


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """input @ weight.T + bias."""
    out = input.matmul(weight.T)
    return out if bias is None else out + bias


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntPair = 1,
           padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1) -> Tensor:
    """2-d convolution, (N, C, H, W) or unbatched (C, H, W) x (O, C/groups, kh, kw)."""
    if input.ndim == 3 and weight.ndim == 4:
        return conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation,
                      groups).squeeze(0)
    if input.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"conv2d needs 4-d input and weight, got shapes {input.shape} "
                         f"and {weight.shape}")
    n, cin, _, _ = input.shape
    cout, cin_g, kh, kw = weight.shape
    if cin != cin_g * groups or cout % groups:
        raise ValueError(f"conv2d: input shape {input.shape} and weight shape "
                         f"{weight.shape} do not match for groups={groups}")
    stride, dilation = _pair(stride), _pair(dilation, "dilation")
    ph, pw = _pair(padding, "padding", 0)
    x = _windows(input.pad(((0, 0), (0, 0), (ph, ph), (pw, pw))), (kh, kw), stride, dilation)
    oh, ow = x.shape[2:4]
    per_group = cout // groups
    x = x.reshape(n, groups, cin_g, 1, oh, ow, kh, kw).expand(
        n, groups, cin_g, per_group, oh, ow, kh, kw).permute(0, 1, 3, 4, 5, 2, 6, 7)
    w = weight.reshape(1, groups, per_group, 1, 1, cin_g, kh, kw)
    out = (x * w).sum((5, 6, 7)).reshape(n, cout, oh, ow)
    return out if bias is None else out + bias.reshape(1, -1, 1, 1)


def max_pool2d(input: Tensor, kernel_size: IntPair = 2, stride: IntPair | None = None,
               padding: IntPair = 0, dilation: IntPair = 1, ceil_mode: bool = False) -> Tensor:
    """The maximum of each window over the last two dims (padding never wins)."""
    kernel, stride, pads, dilation = _pool_args(input, kernel_size, stride, padding, dilation,
                                                ceil_mode)
    # -inf for floats, the dtype's minimum for integers (which keeps the dtype)
    lowest = float("-inf") if input.dtype.is_float else input.dtype.min
    x = input.pad(((0, 0),) * (input.ndim - 2) + pads, lowest)
    return _windows(x, kernel, stride, dilation).amax((-2, -1))


def avg_pool2d(input: Tensor, kernel_size: IntPair = 2, stride: IntPair | None = None,
               padding: IntPair = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """The mean of each window over the last two dims. Padding counts as 0 and, with
    count_include_pad, in the divisor; windows that ceil_mode adds past the padding never do."""
    kernel, stride, pads, _ = _pool_args(input, kernel_size, stride, padding, 1, ceil_mode)
    x = input.cast(float_of(input.dtype)).pad(((0, 0),) * (input.ndim - 2) + pads)
    total = _windows(x, kernel, stride, (1, 1)).sum((-2, -1))
    (ph, _), (pw, _) = pads
    if not count_include_pad:
        ph = pw = 0
    # the divisor of each window: how many of its elements are input (or counted padding)
    h, w = input.shape[-2:]
    counted = Tensor.ones(h + 2 * ph, w + 2 * pw, device=input.device)
    counted = counted.pad(tuple((p - c, after - c) for (p, after), c in zip(pads, (ph, pw))))
    count = _windows(counted, kernel, stride, (1, 1)).sum((-2, -1))
    return total / count


def _pool_args(input: Tensor, kernel_size: IntPair, stride: IntPair | None, padding: IntPair,
               dilation: IntPair, ceil_mode: bool):
    """kernel, stride, ((before, after) padding per spatial dim) and dilation of a 2-d pool;
    ceil_mode pads the end so a last partial window fits, if it starts inside the input or the
    padding before it (PyTorch's rule)."""
    if input.ndim < 2:
        raise RuntimeError(f"2-d pooling needs at least 2 dims, got shape {input.shape}")
    kernel = _pair(kernel_size, "kernel_size")
    stride = _pair(kernel_size if stride is None else stride)
    pad, dilation = _pair(padding, "padding", 0), _pair(dilation, "dilation")
    if any(2 * p > k for p, k in zip(pad, kernel)):
        raise RuntimeError(f"padding {pad} should be at most half of kernel size {kernel}")
    pads = []
    for size, k, s, p, d in zip(input.shape[-2:], kernel, stride, pad, dilation):
        span = size + 2 * p - d * (k - 1) - 1
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        pads.append((p, p + max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))))
    return kernel, stride, tuple(pads), dilation


def cross_entropy(input: Tensor, target: Tensor, reduction: Reduction = "mean",
                  label_smoothing: float = 0.0, weight: Tensor | None = None,
                  ignore_index: int = -100) -> Tensor:
    """Cross entropy of logits (N, C) or (N, C, d...) against class indices (N,) / (N, d...) or
    probabilities of the input's shape; the class axis is 1, as in PyTorch."""
    if not target.dtype.is_float and not label_smoothing:
        return nll_loss(input.log_softmax(1 if input.ndim > 1 else 0), target, weight,
                        ignore_index, reduction)
    if weight is not None or ignore_index != -100:
        raise NotImplementedError("cross_entropy: weight and ignore_index are supported with "
                                  "class-index targets and no label smoothing")
    if input.ndim > 2:
        # classes on axis 1 (PyTorch): move them last, where the rest of this works
        order = (0, *range(2, input.ndim), 1)
        input = input.permute(order)
        if target.dtype.is_float:
            target = target.permute(order)
    if not target.dtype.is_float:
        _check_classes(target, input.shape[-1])
    logp = input.log_softmax(-1)
    if target.dtype.is_float:
        probs = target
    else:
        if target.shape != input.shape[:-1]:
            raise ValueError(f"cross_entropy: target shape {target.shape} does not match "
                             f"logits shape {input.shape} (want {input.shape[:-1]})")
        probs = one_hot(target, input.shape[-1]).cast(logp.dtype)
    if label_smoothing:
        probs = probs * (1 - label_smoothing) + label_smoothing / input.shape[-1]
    loss = -(logp * probs).sum(-1)
    return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
             ignore_index: int = -100, reduction: Reduction = "mean") -> Tensor:
    """The negative log-probability of each target class: input (N, C) or (N, C, d...) of
    log-probabilities, target (N,) or (N, d...) of class indices, optional per-class weights;
    targets equal to ignore_index count for nothing (as torch's)."""
    if target.dtype.is_float or target.dtype == bool_:
        raise TypeError(f"nll_loss: target must hold integer class indices, got "
                        f"{target.dtype.name}")
    if input.ndim > 2:
        input = input.permute((0, *range(2, input.ndim), 1))
    if target.shape != input.shape[:-1]:
        raise ValueError(f"nll_loss: target shape {target.shape} does not match input shape "
                         f"{input.shape} (want {input.shape[:-1]})")
    classes = input.shape[-1]
    known = _check_classes(target, classes, ignore_index)
    valid = target != ignore_index
    safe = valid.where(target, 0)
    picked = (one_hot(safe, classes).cast(bool_)).where(input, 0).sum(-1)
    w = valid.cast(input.dtype)
    if weight is not None:
        w = w * weight.cast(input.dtype).index_select(0, safe)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if weight is None and known is not None:
        # the host knows how many targets count: one reduction fewer than dividing by w.sum()
        count = int((known != ignore_index).sum())
        return loss.sum() * (1 / count if count else float("nan"))
    return loss.sum() / w.sum()


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: Reduction = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)) of probabilities p; each log is at least -100 (torch)."""
    logp, log1mp = input.log().clip(min=-100), (1 - input).log().clip(min=-100)
    loss = -(target * logp + (1 - target) * log1mp)
    return _reduce(loss if weight is None else loss * weight, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,
                                     weight: Tensor | None = None,
                                     reduction: Reduction = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy of sigmoid(input), computed from the logits without overflow."""
    x = input.cast(float_of(input.dtype))
    # log(1 + e^-x) for either sign of x: softplus(-x)
    log_sig_neg = softplus(-x)
    if pos_weight is None:
        loss = (1 - target) * x + log_sig_neg
    else:
        loss = (1 - target) * x + (1 + (pos_weight - 1) * target) * log_sig_neg
    return _reduce(loss if weight is None else loss * weight, reduction)


def _reduce(loss: Tensor, reduction: Reduction) -> Tensor:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()


def _check_classes(target: Tensor, classes: int, ignore_index: int | None = None
                   ) -> np.ndarray | None:
    """The class indices, where the host holds them (else None); IndexError for any outside
    [0, classes) but ignore_index."""
    if not target.lazy.realized or target.numel() == 0:
        return None
    values = target.numpy()
    bad = values[((values < 0) | (values >= classes)) & (values != ignore_index)]
    if bad.size:
        raise IndexError(f"cross_entropy: target class {int(bad[0])} is out of bounds for "
                         f"{classes} classes")
    return values


def one_hot(input: Tensor, num_classes: int) -> Tensor:
    """int32 vectors with a 1 at each index of `input` (a new last dim of num_classes)."""
    if num_classes < 0:
        raise ValueError(f"one_hot: num_classes must be >= 0, got {num_classes} (PyTorch's -1, "
                         "infer from the data, needs the values on the host: pass the count)")
    return (input.unsqueeze(-1) == Tensor.arange(num_classes, device=input.device)).cast(int32)


def layernorm(input: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axis` (biased variance, as torch); no affine part."""
    x = input.cast(float_of(input.dtype))
    centered = x - x.mean(axis, keepdim=True)
    return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()


def batchnorm(input: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
              invstd: Tensor) -> Tensor:
    """(x - mean) * invstd * weight + bias, with per-channel (dim 1) statistics."""
    shape = (1, -1) + (1,) * (input.ndim - 2)
    x = (input - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        x = x * weight.reshape(shape)
    return x if bias is None else x + bias.reshape(shape)


def layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """layernorm over the trailing dims `normalized_shape`, then * weight + bias (torch's)."""
    dims = _trailing(input, normalized_shape, "layer_norm")
    return _affine(layernorm(input, dims, eps), weight, bias)


def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the trailing dims `normalized_shape`, times weight; eps
    defaults to the dtype's machine epsilon, as torch's."""
    dims = _trailing(input, normalized_shape, "rms_norm")
    x = input.cast(float_of(input.dtype))
    eps = float(np.finfo(x.dtype.np).eps) if eps is None else eps
    return _affine(x * ((x * x).mean(dims, keepdim=True) + eps).rsqrt(), weight, None)


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """layernorm over each group of channels (dim 1) and the spatial dims, then a per-channel
    weight and bias, as torch's."""
    if input.ndim < 2 or num_groups <= 0 or input.shape[1] % num_groups:
        raise RuntimeError(f"group_norm: expected input of shape (N, C, ...) with C divisible "
                           f"by num_groups={num_groups}, got {input.shape}")
    n, c = input.shape[:2]
    grouped = input.reshape(n, num_groups, -1)
    x = layernorm(grouped, -1, eps).reshape(input.shape)
    channel = (1, c) + (1,) * (input.ndim - 2)
    return _affine(x, None if weight is None else weight.reshape(channel),
                   None if bias is None else bias.reshape(channel))


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """input / max(||input||_p over dim, eps), as torch's (p may be inf)."""
    if not p > 0:
        raise ValueError(f"normalize: p must be > 0 (or inf), got {p}")
    x = input.cast(float_of(input.dtype))
    magnitude = x.abs()
    if p == float("inf"):
        norm = magnitude.amax(dim, keepdim=True)
    else:
        total = (magnitude ** p).sum(dim, keepdim=True)
        value = total.detach() ** (1 / p)
        # torch's norm has gradient 0 at the zero vector, where total ** (1/p)'s is inf * 0
        norm = value._with_grad((total, (total == 0).where(0.0, value / (p * total))))
    return x / norm.clip(min=eps)


def softmin(input: Tensor, dim: int | None = None) -> Tensor:
    """softmax(-input) over `dim` (without one, torch's legacy choice: 0 for 0-, 1- and 3-d
    input, else 1)."""
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    return (-input).softmax(dim)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """x where x > 0, else weight * x, with one weight or one per channel (dim 1)."""
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() not in (1, channels):
        raise RuntimeError(f"prelu: weight has {weight.numel()} elements; it needs 1 or one "
                           f"per channel ({channels}) of input shape {input.shape}")
    shape = (1, channels) + (1,) * (input.ndim - 2) if weight.numel() > 1 else ()
    return (input > 0).where(input, input * weight.reshape(shape))


def _trailing(input: Tensor, normalized_shape: Sequence[int] | int, name: str
              ) -> tuple[int, ...]:
    """The dims a norm over trailing `normalized_shape` reduces; RuntimeError if they differ."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
        normalized_shape)
    if not shape or input.shape[len(input.shape) - len(shape):] != shape:
        raise RuntimeError(f"{name}: normalized_shape {list(shape)} does not match the last "
                           f"dims of input shape {input.shape}")
    return tuple(range(input.ndim - len(shape), input.ndim))


def _affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    x = x if weight is None else x * weight
    return x if bias is None else x + bias


def dropout(input: Tensor, p: float = 0.5, training: bool | None = None) -> Tensor:
    """Zeroes each element with probability p and scales the rest by 1 / (1 - p) when
    training (default: Tensor.training); else returns input itself."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
    if not (training if training is not None else Tensor.training) or p == 0:
        return input
    if p == 1:
        return input * 0
    keep = Tensor.rand(*input.shape, device=input.device) >= p
    return keep.where(input, 0) * (1 / (1 - p))


def embedding(input: Tensor, weight: Tensor) -> Tensor:
    """Rows of `weight` picked by the integer tensor `input`."""
    return weight.index_select(0, input)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None,
                                 is_causal: bool = False) -> Tensor:
    """softmax(q @ k^T / sqrt(d) + mask) @ v, with an optional causal mask."""
    scores = query.matmul(key.transpose(-1, -2)) * (1 / math.sqrt(query.shape[-1]))
    if is_causal:
        q, k = scores.shape[-2:]
        causal = Tensor.arange(q, device=query.device).reshape(q, 1) >= Tensor.arange(
            k, device=query.device).reshape(1, k)
        scores = causal.where(scores, float("-inf"))
    if attn_mask is not None:
        scores = attn_mask.where(scores, float("-inf")) if attn_mask.dtype == bool_ \
            else scores + attn_mask
    return scores.softmax(-1).matmul(value)


# -- activations --------------------------------------------------------------------------------

def leaky_relu(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x."""
    return (input > 0).where(input, input * negative_slope)


def gelu(input: Tensor, approximate: Literal["none", "tanh"] = "none") -> Tensor:
    """x * Phi(x) with the exact normal CDF, or its tanh approximation."""
    x = input.cast(float_of(input.dtype))
    if approximate == "tanh":
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    # erfc, not 1 + erf: for negative x the result is a tiny product, kept accurate
    return 0.5 * x * (x * -math.sqrt(0.5)).erfc()


def silu(input: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return input * input.sigmoid()


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, computed without overflow; x itself where
    beta * x > threshold (as torch)."""
    x = input.cast(float_of(input.dtype)) * beta
    smooth = (x.relu() + (1 + (-x.abs()).exp()).log()) * (1 / beta)
    return (x > threshold).where(input.cast(x.dtype), smooth)


def relu6(input: Tensor) -> Tensor:
    """min(max(x, 0), 6)."""
    return hardtanh(input, 0.0, 6.0)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """x limited to [min_val, max_val]."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} is above max_val {max_val}")
    return input.clip(min_val, max_val)


def hardsigmoid(input: Tensor) -> Tensor:
    """relu6(x + 3) / 6."""
    return relu6(input + 3) * (1 / 6)


def hardswish(input: Tensor) -> Tensor:
    """x * relu6(x + 3) / 6."""
    return input * hardsigmoid(input)


def elu(input: Tensor, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha * (exp(x) - 1)."""
    x = input.cast(float_of(input.dtype))
    # exp of the negative part only: e^x of a large positive x would overflow the other branch
    return (x > 0).where(x, alpha * (x.clip(max=0).exp() - 1))


def selu(input: Tensor) -> Tensor:
    """scale * elu(x, alpha) with the self-normalizing constants."""
    return _SELU_SCALE * elu(input, _SELU_ALPHA)


def celu(input: Tensor, alpha: float = 1.0) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = input.cast(float_of(input.dtype))
    return (x > 0).where(x, alpha * ((x.clip(max=0) * (1 / alpha)).exp() - 1))


def mish(input: Tensor) -> Tensor:
    """x * tanh(softplus(x))."""
    return input * softplus(input).tanh()


def softsign(input: Tensor) -> Tensor:
    """x / (1 + |x|)."""
    return input / (1 + input.abs())


def logsigmoid(input: Tensor) -> Tensor:
    """log(sigmoid(x)) = -softplus(-x), without overflow."""
    return -softplus(-input)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


# -- sliding windows ----------------------------------------------------------------------------

def _pair(v: IntPair, name: str = "stride", minimum: int = 1) -> tuple[int, int]:
    pair = (v, v) if isinstance(v, int) else tuple(v)
    if len(pair) != 2 or any(not isinstance(p, int) or p < minimum for p in pair):
        raise RuntimeError(f"{name} must be an int or a pair of ints >= {minimum}, got {v!r}")
    return pair


def _windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilation: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(kernel) dims -> (..., *out, *kernel), as views."""
    keep = x.shape[:-len(kernel)]
    sizes = x.shape[-len(kernel):]
    noop = [(0, s) for s in keep]
    outs = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(sizes, dilation, kernel,
                                                                 stride)]
    if any(o <= 0 for o in outs):
        raise ValueError(f"input of spatial size {sizes} is smaller than kernel {kernel} "
                         f"(dilation {dilation})")
    reps = [-(-k * (i + d) // i) for k, i, d in zip(kernel, sizes, dilation)]
    x = x.reshape(keep + tuple(d for i in sizes for d in (1, i)))
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


__all__ = ["avg_pool2d", "batchnorm", "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "celu", "conv2d", "cross_entropy", "dropout", "elu",
           "embedding", "gelu", "hardsigmoid", "hardswish", "hardtanh", "layernorm", "leaky_relu",
           "linear", "logsigmoid", "max_pool2d", "mish", "nll_loss", "one_hot", "relu6",
           "scaled_dot_product_attention", "selu", "silu", "softplus", "softsign"]
