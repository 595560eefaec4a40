"""Neural-network functions, as torch.nn.functional: linear, losses, norms, dropout, attention,
embedding and the activations PyTorch keeps here; convolution, pools, pad and interpolate are
written in spatial.py and importable from here, as torch's. `portkit.nn.functional` is this
module under torch's name.

Tensor has a thin method for each (x.conv2d(w) is conv2d(x, w), functional_methods.py), which is
why these live in the tensor package, below portkit.nn; the layers in portkit.nn call them.
They compose Tensor ops only, so autograd differentiates them with no rule of their own, and
they make tensors through the type of the tensors they are given (see core.py).
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from portkit import schedule
from portkit.tensor.activations import softmin
from portkit.tensor.autocast_mode import runs_in_float32, runs_in_low_precision
from portkit.tensor.batchnorm import batch_norm, batchnorm
from portkit.tensor.distances import vector_norm
from portkit.tensor.dtype import bool_, float_of, int32, promote
from portkit.tensor.elementwise import in_float32
from portkit.tensor.losses import Reduction, check_reduction, legacy_reduction, reduce_loss
from portkit.tensor.spatial import (
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    grid_sample,
    interpolate,
    max_pool1d,
    max_pool2d,
    max_pool3d,
    max_unpool2d,
    pad,
)

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

IntPair = int | tuple[int, int]


@runs_in_low_precision
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """input @ weight.T + bias."""
    if input.ndim >= 2 and weight.ndim == 2 and input.shape[-1] == weight.shape[1]:
        # matmul's product and sum with weight as it lies: matmul(weight.T) transposes it back,
        # two movement ops each way (forward and backward) that compose to nothing
        dtype = promote(input.dtype, weight.dtype)
        out = (input.cast(dtype).unsqueeze(-2) * weight.cast(dtype).unsqueeze(-3)).sum(-1)
    else:
        out = input.matmul(weight.T)
    return out if bias is None else out + bias


@runs_in_float32
def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average: bool | None = None, ignore_index: int = -100,
                  reduce: bool | None = None, reduction: Reduction = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy of logits (N, C) or (N, C, d...) against class indices (N,) / (N, d...) or
    probabilities of the input's shape; the class axis is 1, as in PyTorch."""
    how = legacy_reduction(size_average, reduce, reduction)
    if not target.dtype.is_float and not label_smoothing:
        return nll_loss(input.log_softmax(1 if input.ndim > 1 else 0), target, weight,
                        ignore_index=ignore_index, reduction=how)
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
    return reduce_loss(-(logp * probs).sum(-1), how)


@runs_in_float32
def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
             size_average: bool | None = None, ignore_index: int = -100,
             reduce: bool | None = None, reduction: Reduction = "mean") -> Tensor:
    """The negative log-probability of each target class: input (N, C) or (N, C, d...) of
    log-probabilities, target (N,) or (N, d...) of class indices, optional per-class weights;
    targets equal to ignore_index count for nothing (as torch's)."""
    how = check_reduction(legacy_reduction(size_average, reduce, reduction))
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
    safe = valid._where(target, 0)
    picked = _class_mask(safe, classes)._where(input, 0).sum(-1)
    w = valid.cast(input.dtype)
    if weight is not None:
        w = w * weight.cast(input.dtype).index_select(0, safe)
    loss = -picked * w
    if how == "none":
        return loss
    if how == "sum":
        return loss.sum()
    if weight is None and known is not None:
        # the host knows how many targets count: one reduction fewer than dividing by w.sum()
        count = int((known != ignore_index).sum())
        return loss.sum() * (1 / count if count else float("nan"))
    return loss.sum() / w.sum()


@runs_in_float32
def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average: bool | None = None, reduce: bool | None = None,
                         reduction: Reduction = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)) of probabilities p; each log is at least -100 (torch)."""
    logp, log1mp = input.log().clip(min=-100), (1 - input).log().clip(min=-100)
    loss = -(target * logp + (1 - target) * log1mp)
    return reduce_loss(loss if weight is None else loss * weight,
                       legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,
                                     weight: Tensor | None = None,
                                     size_average: bool | None = None,
                                     reduce: bool | None = None,
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
    return reduce_loss(loss if weight is None else loss * weight,
                       legacy_reduction(size_average, reduce, reduction))


# The class indices of target buffers already checked, by buffer: a training loop passes the
# same target every step, and checking it again would copy it to the host every step. A
# buffer the stack owns is written once (every result gets a new one), so what was checked
# stays true; memory borrowed from the user (from_dlpack) may change and is checked each time.
_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_classes(target: Tensor, classes: int, ignore_index: int | None = None
                   ) -> np.ndarray | None:
    """The class indices, where the host holds them (else None); IndexError for any outside
    [0, classes) but ignore_index."""
    if not target.lazy.realized or target.numel() == 0 or schedule.recording():
        return None     # inside portkit.jit the values are the device's, as unrealized ones
    buffer = target.lazy.buffer
    known = _checked.get(buffer) if buffer.owned else None
    if known is not None and known[0] == (classes, ignore_index, target.shape):
        return known[1]
    values = target.numpy()
    bad = values[((values < 0) | (values >= classes)) & (values != ignore_index)]
    if bad.size:
        raise IndexError(f"cross_entropy: target class {int(bad[0])} is out of bounds for "
                         f"{classes} classes")
    if buffer.owned:
        _checked[buffer] = ((classes, ignore_index, target.shape), values)
    return values


def one_hot(input: Tensor, num_classes: int = -1) -> Tensor:
    """int32 vectors with a 1 at each index of `input` (a new last dim of num_classes); -1
    reads the largest index back to the host, as torch's does (pass the count to avoid it)."""
    if num_classes == -1:
        if not input.numel():
            raise RuntimeError("one_hot: cannot infer num_classes from an empty tensor; pass it")
        num_classes = int(input.amax().item()) + 1
    if num_classes < 0:
        raise ValueError(f"one_hot: num_classes must be >= 0 or -1, got {num_classes}")
    if input.lazy.realized and input.numel() and not schedule.recording():
        # values the host holds: checked, as torch (inside portkit.jit they are the device's)
        values = input.numpy()
        if values.min() < 0 or values.max() >= num_classes:
            raise RuntimeError(f"one_hot: class values must be in [0, {num_classes}), got "
                               f"{int(values.min() if values.min() < 0 else values.max())}")
    return _class_mask(input, num_classes).cast(int32)


def _class_mask(input: Tensor, classes: int) -> Tensor:
    """True where the new last dim's index equals `input` (one_hot, as bools)."""
    return input.unsqueeze(-1) == type(input).arange(classes, device=input.device)


@runs_in_float32
def layernorm(input: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axis` (biased variance, as torch); no affine part."""
    x = input.cast(float_of(input.dtype))
    centered = x - x.mean(axis, keepdim=True)
    return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()


@runs_in_float32
def layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """layernorm over the trailing dims `normalized_shape`, then * weight + bias (torch's)."""
    dims = _trailing(input, normalized_shape, "layer_norm")
    return _affine(layernorm(input, dims, eps), weight, bias)


@runs_in_float32
def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the trailing dims `normalized_shape`, times weight; eps
    defaults to the dtype's machine epsilon, as torch's."""
    dims = _trailing(input, normalized_shape, "rms_norm")
    x = input.cast(float_of(input.dtype))
    eps = float(np.finfo(x.dtype.np).eps) if eps is None else eps
    return _affine(x * ((x * x).mean(dims, keepdim=True) + eps).rsqrt(), weight, None)


@runs_in_float32
def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """layernorm over each group of channels (dim 1) and the spatial dims, then a per-channel
    weight and bias, as torch's."""
    if input.ndim < 2 or num_groups <= 0 or input.shape[1] % num_groups:
        raise RuntimeError(f"group_norm: expected input of shape (N, C, ...) with C divisible "
                           f"by num_groups={num_groups}, got {input.shape}")
    grouped = input.reshape(input.shape[0], num_groups, -1)
    return _channel_affine(layernorm(grouped, -1, eps).reshape(input.shape), weight, bias)


@runs_in_float32
def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """input / max(||input||_p over dim, eps), as torch's (p may be inf)."""
    if not p > 0:
        raise ValueError(f"normalize: p must be > 0 (or inf), got {p}")
    x = input.cast(float_of(input.dtype))
    return x / vector_norm(x, p, dim, keepdim=True).clip(min=eps)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """x where x > 0, else weight * x, with one weight or one per channel (dim 1)."""
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() not in (1, channels):
        raise RuntimeError(f"prelu: weight has {weight.numel()} elements; it needs 1 or one "
                           f"per channel ({channels}) of input shape {input.shape}")
    shape = (1, channels) + (1,) * (input.ndim - 2) if weight.numel() > 1 else ()
    return (input > 0)._where(input, input * weight.reshape(shape))


def _trailing(input: Tensor, normalized_shape: Sequence[int] | int, name: str
              ) -> tuple[int, ...]:
    """The dims a norm over trailing `normalized_shape` reduces; RuntimeError if they differ."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
        normalized_shape)
    if not shape or input.shape[len(input.shape) - len(shape):] != shape:
        raise RuntimeError(f"{name}: normalized_shape {list(shape)} does not match the last "
                           f"dims of input shape {input.shape}")
    return tuple(range(input.ndim - len(shape), input.ndim))


def _channel_affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """x * weight + bias with one weight and bias per channel (dim 1)."""
    channel = (1, -1) + (1,) * (x.ndim - 2)
    return _affine(x, None if weight is None else weight.reshape(channel),
                   None if bias is None else bias.reshape(channel))


def _affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    x = x if weight is None else x * weight
    return x if bias is None else x + bias


def dropout(input: Tensor, p: float = 0.5, training: bool | None = None) -> Tensor:
    """Zeroes each element with probability p and scales the rest by 1 / (1 - p) when
    training (default: Tensor.training); else returns input itself."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
    if not (training if training is not None else type(input).training) or p == 0:
        return input
    if p == 1:
        return input * 0
    keep = type(input).rand(*input.shape, device=input.device) >= p
    return keep._where(input, 0) * (1 / (1 - p))


def _feature_dropout(input: Tensor, p: float, training: bool | None, dims: int,
                     batched: tuple[int, ...]) -> Tensor:
    """dropout of whole channels: one draw per (N, C), or per C of unbatched input, for input
    of `dims` + 1 or + 2 dims (torch's dropout{dims}d); `batched` lists the ranks read as
    (N, C, ...)."""
    if input.ndim not in (dims + 1, dims + 2):
        raise RuntimeError(f"dropout{dims}d: Expected {dims + 1}D or {dims + 2}D input, but "
                           f"received a {input.ndim}D input")
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
    if not (training if training is not None else type(input).training) or p == 0:
        return input
    drawn = 2 if input.ndim in batched else 1          # (N, C) or C
    shape = input.shape[:drawn] + (1,) * (input.ndim - drawn)
    ones = type(input).full(shape, 1.0, input.dtype, input.device)
    return input * dropout(ones, p, training=True)


def dropout1d(input: Tensor, p: float = 0.5, training: bool | None = None,
              inplace: bool = False) -> Tensor:
    """dropout of whole channels of (N, C, L) or (C, L) input."""
    return _feature_dropout(input, p, training, 1, (3,))


def dropout2d(input: Tensor, p: float = 0.5, training: bool | None = None,
              inplace: bool = False) -> Tensor:
    """dropout of whole channels of (N, C, H, W) input; 3-d input is read as (N, C, L), as
    torch does today."""
    return _feature_dropout(input, p, training, 2, (3, 4))


def dropout3d(input: Tensor, p: float = 0.5, training: bool | None = None,
              inplace: bool = False) -> Tensor:
    """dropout of whole channels of (N, C, D, H, W) or (C, D, H, W) input."""
    return _feature_dropout(input, p, training, 3, (5,))


@runs_in_float32
def instance_norm(input: Tensor, running_mean: Tensor | None = None,
                  running_var: Tensor | None = None, weight: Tensor | None = None,
                  bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalizes each channel of each sample over its spatial dims (moving the running
    statistics toward their batch means when given), or by the running statistics when not
    use_input_stats; then a per-channel weight and bias."""
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    spatial = tuple(range(2, input.ndim))
    count = math.prod(input.shape[2:])
    if count <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                         f"{input.shape}")
    if running_mean is not None:
        mean = input.detach().mean(spatial).mean(0)
        running_mean.assign(running_mean * (1 - momentum) + mean * momentum)
    if running_var is not None:
        var = input.detach().var(spatial, correction=1).mean(0)
        running_var.assign(running_var * (1 - momentum) + var * momentum)
    return _channel_affine(layernorm(input, spatial, eps), weight, bias)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of `weight` picked by the integer tensor `input`; the row padding_idx gets no
    gradient, as torch's."""
    rows = weight._take(0, input, "embedding", wrap=False)
    if padding_idx is None:
        return rows
    padding_idx = padding_idx % weight.shape[0]
    return (input == padding_idx).unsqueeze(-1)._where(rows.detach(), rows)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over (..., heads, L, E) queries and (..., S, E) keys,
    as torch's: scale defaults to 1/sqrt(E); a bool mask keeps where True, a float mask is
    added; is_causal keeps key j for query i where j <= i (top-left, also when L != S, and
    together with attn_mask); a row with no key left gives 0; dropout_p drops attention weights
    (always, as torch's, not only when training); enable_gqa repeats each key/value head for
    its group of query heads (dim -3)."""
    if not 0 <= dropout_p <= 1:
        raise RuntimeError(f"scaled_dot_product_attention: dropout probability has to be "
                           f"between 0 and 1, but got {dropout_p}")
    if attn_mask is not None and is_causal:
        raise RuntimeError("scaled_dot_product_attention: an explicit attn_mask should not be "
                           "set when is_causal=True; fold the causal mask into attn_mask")
    if attn_mask is not None and attn_mask.dtype != bool_ and not attn_mask.dtype.is_float:
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be bool or float, got "
                        f"{attn_mask.dtype.name}; cast it (mask.bool() keeps where True)")
    if enable_gqa:
        key, value = _grouped_heads(query, key, value)
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query.matmul(key.transpose(-1, -2)) * scale
    if is_causal:
        q, k = scores.shape[-2:]
        causal = type(query).arange(q, device=query.device).reshape(q, 1) >= type(query).arange(
            k, device=query.device).reshape(1, k)
        scores = causal._where(scores, float("-inf"))
    if attn_mask is not None:
        scores = attn_mask._where(scores, float("-inf")) if attn_mask.dtype == bool_ \
            else scores + attn_mask
        # torch's safe softmax: a row masked everywhere gives weights 0 (and gradient 0), not
        # NaN; the finite stand-in keeps the NaN of -inf - -inf out of the backward pass too
        empty = scores.amax(-1, keepdim=True) == float("-inf")
        weights = empty._where(0.0, empty._where(0.0, scores).softmax(-1))
    else:
        weights = scores.softmax(-1)
    if dropout_p:
        weights = dropout(weights, dropout_p, training=True)
    return weights.matmul(value)


def _grouped_heads(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """key and value with each head (dim -3) repeated for the query heads sharing it."""
    if min(query.ndim, key.ndim, value.ndim) < 3:
        raise RuntimeError("scaled_dot_product_attention: enable_gqa needs (..., heads, L, E) "
                           f"inputs, got shapes {query.shape}, {key.shape}, {value.shape}")
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if kv_heads != value.shape[-3] or kv_heads == 0 or heads % kv_heads:
        raise RuntimeError(f"scaled_dot_product_attention: the number of heads in key "
                           f"({kv_heads}) and value ({value.shape[-3]}) must be equal and "
                           f"divide the number of heads in query ({heads})")
    if heads == kv_heads:
        return key, value
    groups = heads // kv_heads
    return key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)


# -- activations --------------------------------------------------------------------------------

def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x where x > 0, else negative_slope * x."""
    return (input > 0)._where(input, input * negative_slope)


@in_float32
def gelu(input: Tensor, approximate: Literal["none", "tanh"] = "none") -> Tensor:
    """x * Phi(x) with the exact normal CDF, or its tanh approximation."""
    x = input.cast(float_of(input.dtype))
    if approximate == "tanh":
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    # erfc, not 1 + erf: for negative x the result is a tiny product, kept accurate
    return 0.5 * x * (x * -math.sqrt(0.5)).erfc()


@in_float32
def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """x * sigmoid(x)."""
    return input * input.sigmoid()


@in_float32
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, computed without overflow; x itself where
    beta * x > threshold (as torch)."""
    plain = input.detach()      # the value records no gradient of its own: _with_grad gives it
    x = plain.cast(float_of(input.dtype)) * beta
    smooth = (x.relu() + (1 + (-x.abs())._exp_of_nonpositive()).log()) * (1 / beta)
    value = (x > threshold)._where(plain.cast(x.dtype), smooth)
    if not input.requires_grad:
        return value
    # sigmoid(beta x), torch's: through relu and abs the gradient at 0 was 1 (0 + 1), not 1/2
    return value._with_grad((input, (x > threshold)._where(1.0, x.sigmoid())))


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6)."""
    return hardtanh(input, 0.0, 6.0)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: bool = False) -> Tensor:
    """x limited to [min_val, max_val]; the gradient is 0 at the bounds, as PyTorch's (clip's
    is 1 there, as torch.clamp's)."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} is above max_val {max_val}")
    x = input.detach()
    value = x.clip(min_val, max_val)
    return value._with_grad((input, ((x > min_val) & (x < max_val)).cast(
        x.dtype))) if input.requires_grad else value


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3) / 6."""
    return relu6(input + 3) * (1 / 6)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6."""
    return input * hardsigmoid(input)


@in_float32
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, else alpha * (exp(x) - 1)."""
    x = input.cast(float_of(input.dtype))
    # exp of the negative part only: e^x of a large positive x would overflow the other branch
    return (x > 0)._where(x, alpha * (x.clip(max=0)._exp_of_nonpositive() - 1))


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """scale * elu(x, alpha) with the self-normalizing constants."""
    return _SELU_SCALE * elu(input, _SELU_ALPHA)


@in_float32
def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = input.cast(float_of(input.dtype))
    return (x > 0)._where(x, alpha * ((x.clip(max=0) * (1 / alpha)).exp() - 1))


@in_float32
def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * tanh(softplus(x))."""
    return input * softplus(input).tanh()


def softsign(input: Tensor) -> Tensor:
    """x / (1 + |x|)."""
    return input / (1 + input.abs())


@in_float32
def logsigmoid(input: Tensor) -> Tensor:
    """log(sigmoid(x)) = -softplus(-x), without overflow."""
    return -softplus(-input)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


__all__ = ["avg_pool1d", "avg_pool2d", "avg_pool3d", "batch_norm", "batchnorm",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu", "conv1d", "conv2d",
           "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cross_entropy",
           "dropout", "dropout1d", "dropout2d", "dropout3d", "elu", "embedding", "gelu",
           "grid_sample", "group_norm", "hardsigmoid", "hardswish", "hardtanh", "instance_norm",
           "interpolate", "layer_norm", "layernorm", "leaky_relu", "linear", "logsigmoid",
           "max_pool1d", "max_pool2d", "max_pool3d", "max_unpool2d", "mish", "nll_loss",
           "normalize", "one_hot", "pad", "prelu", "relu6", "rms_norm",
           "scaled_dot_product_attention", "selu", "silu", "softmin", "softplus", "softsign"]
