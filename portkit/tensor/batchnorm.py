"""Batch normalization, as torch.nn.functional.batch_norm: by the batch's statistics when
training, else by the running ones; importable from functional.py, as torch's.

When training, its gradients are given (autograd's "given_vjp") in closed form, and forward
and backward take four sums over the activation: the mean and the variance forward, and
backward the two PyTorch's takes, of the output gradient and of the output gradient times the
normalized input, which are also the bias's and the weight's gradients. Derived through the
mean and the variance (with input.var, which takes a mean of its own) they took eight, each a
pass over 32 x 64 x 32 x 32 at ResNet's first stage.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


def batchnorm(input: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
              invstd: Tensor) -> Tensor:
    """(x - mean) * invstd * weight + bias, with per-channel (dim 1) statistics."""
    shape = (1, -1) + (1,) * (input.ndim - 2)
    x = (input - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        x = x * weight.reshape(shape)
    return x if bias is None else x + bias.reshape(shape)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalizes each channel (dim 1) by the batch's statistics when training (and moves the
    running ones toward them, the variance unbiased, as torch), else by the running ones."""
    axes = (0, *range(2, input.ndim))
    if not training:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var are needed when not "
                             "training; pass them or training=True")
        return batchnorm(input, weight, bias, running_mean, (running_var + eps).rsqrt())
    count = input.numel() // input.shape[1]
    if count <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, "
                         f"got input shape {input.shape}")
    # one mean for the variance and the normalization (input.var takes a mean of its own, a
    # pass more over the input)
    x = input.detach()
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    mean, var = mean.reshape(-1), (centered * centered).mean(axes)
    if running_mean is not None:
        running_mean.assign(running_mean * (1 - momentum) + mean * momentum)
    if running_var is not None:
        unbiased = var * (momentum * count / (count - 1))
        running_var.assign(running_var * (1 - momentum) + unbiased)
    invstd = (var + eps).rsqrt()
    given = [t for t in (weight, bias) if t is not None]
    y = batchnorm(x, None if weight is None else weight.detach(),
                  None if bias is None else bias.detach(), mean, invstd)
    if not (input.requires_grad or any(t.requires_grad for t in given)):
        return y
    return y._prim("given_vjp", input, *given, arg=lambda g: _gradients(
        g, x, weight, bias, mean, invstd, axes, count))


def _gradients(g: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None,
               mean: Tensor, invstd: Tensor, axes: tuple[int, ...], count: int
               ) -> tuple[Tensor, ...]:
    """The gradients of the input, and of the weight and the bias where given: with xhat the
    normalized input, dbias = sum(g), dweight = sum(g * xhat), and dinput = weight * invstd *
    (g - (dbias + xhat * dweight) / count)."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    normalized = (x - mean.reshape(shape)) * invstd.reshape(shape)
    summed, scaled = g.sum(axes), (g * normalized).sum(axes)
    gain = invstd if weight is None else invstd * weight.detach()
    dx = (g - (summed / count).reshape(shape) - normalized * (scaled / count).reshape(shape)) \
        * gain.reshape(shape)
    return (dx.cast(x.dtype), *([scaled.cast(weight.dtype)] if weight is not None else []),
            *([summed.cast(bias.dtype)] if bias is not None else []))
