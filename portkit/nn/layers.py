"""The layers with parameters, as torch.nn has them: Linear, Bilinear, LayerNorm, BatchNorm
(1-3 d), Embedding, convolutions (1-3 d, and transposed), GroupNorm, InstanceNorm (1-3 d),
RMSNorm, PReLU (the parameterless ones are in containers.py, the losses in losses.py).
Parameters are initialized as torch initializes them (uniform in +-1/sqrt(fan_in))."""
from __future__ import annotations

import math
from collections.abc import Sequence

from portkit.nn import functional as F
from portkit.nn.module import Module, deferred, uniform_parameter
from portkit.tensor import Tensor, realize
from portkit.tensor.spatial import IntTuple


class Linear(Module):
    """y = x @ weight.T + bias, initialized as torch.nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = uniform_parameter((out_features, in_features), bound)
        self.bias = uniform_parameter((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out, inp = self.weight.shape
        return f"in_features={inp}, out_features={out}, bias={self.bias is not None}"


class Bilinear(Module):
    """y = x1^T weight x2 + bias per output feature, initialized as torch.nn.Bilinear."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True):
        bound = 1 / math.sqrt(in1_features)
        self.weight = uniform_parameter((out_features, in1_features, in2_features), bound)
        self.bias = uniform_parameter((out_features,), bound) if bias else None

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        out, in1, in2 = self.weight.shape
        return (f"in1_features={in1}, in2_features={in2}, out_features={out}, "
                f"bias={self.bias is not None}")


class LayerNorm(Module):
    """Normalizes the last len(shape) dims, then scales and shifts."""

    def __init__(self, shape, eps: float = 1e-5, elementwise_affine: bool = True):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.eps = eps
        self.weight = deferred(Tensor.ones(*self.shape).contiguous()).requires_grad_() \
            if elementwise_affine else None
        self.bias = deferred(Tensor.zeros(*self.shape).contiguous()).requires_grad_() \
            if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        axes = tuple(range(-len(self.shape), 0))
        x = F.layernorm(x, axes, self.eps)
        return x if self.weight is None else x * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class _BatchNorm(Module):
    """Batch normalization per channel (dim 1) over the other dims, with running statistics."""

    dims = 2

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        self.eps, self.momentum = eps, momentum
        self.weight = deferred(Tensor.ones(channels).contiguous()).requires_grad_()
        self.bias = deferred(Tensor.zeros(channels).contiguous()).requires_grad_()
        self.running_mean = deferred(Tensor.zeros(channels).contiguous())
        self.running_var = deferred(Tensor.ones(channels).contiguous())

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != self.dims + 2 and not (self.dims == 1 and x.ndim == 2):
            raise ValueError(f"{type(self).__name__} expects {self.dims + 2}-d input (N, C, "
                             f"...), got shape {x.shape}")
        out = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                           self.training, self.momentum, self.eps)
        if self.training:
            realize(self.running_mean, self.running_var)
        return out

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) input (torch.nn.BatchNorm1d)."""

    dims = 1


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) input (torch.nn.BatchNorm2d)."""

    dims = 2


class BatchNorm3d(_BatchNorm):
    """Batch normalization of (N, C, D, H, W) input (torch.nn.BatchNorm3d)."""

    dims = 3


class Embedding(Module):
    """A table of vectors looked up by integer index."""

    def __init__(self, count: int, dim: int, padding_idx: int | None = None):
        weight = Tensor.randn(count, dim)
        if padding_idx is not None:        # that row starts at 0 and never learns, as torch's
            rows = Tensor.arange(count).reshape(count, 1)
            weight = (rows == padding_idx % count)._where(0.0, weight)
        self.weight = deferred(weight).requires_grad_()
        self.padding_idx = padding_idx

    def forward(self, index: Tensor) -> Tensor:
        return F.embedding(index, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}{pad}"


# -- safetensors files, through the safetensors library ------------------------------------------


class _ConvNd(Module):
    """A convolution layer over `dims` spatial dims; transposed ones swap the weight's first
    two dims, as torch's."""

    dims = 2
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntTuple,
                 stride: IntTuple = 1, padding: IntTuple | str = 0, dilation: IntTuple = 1,
                 groups: int = 1, bias: bool = True, output_padding: IntTuple = 0):
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{type(self).__name__}: in_channels {in_channels} and "
                             f"out_channels {out_channels} must be divisible by groups {groups}")
        kernel = ((kernel_size,) * self.dims if isinstance(kernel_size, int)
                  else tuple(kernel_size))
        shape = ((in_channels, out_channels // groups) if self.transposed
                 else (out_channels, in_channels // groups)) + kernel
        bound = 1 / math.sqrt(shape[1] * math.prod(kernel))
        self.weight = uniform_parameter(shape, bound)
        self.bias = uniform_parameter((out_channels,), bound) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding = output_padding

    def forward(self, x: Tensor) -> Tensor:
        if self.transposed:
            fn = getattr(F, f"conv_transpose{self.dims}d")
            return fn(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                      self.groups, self.dilation)
        return getattr(F, f"conv{self.dims}d")(x, self.weight, self.bias, self.stride,
                                                self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        """As torch's: the channels, kernel and stride, then what differs from the default."""
        def dims(value):
            return value if isinstance(value, str) else (
                (value,) * self.dims if isinstance(value, int) else tuple(value))
        channels = self.weight.shape[:2]
        inp, out = ((channels[0], channels[1] * self.groups) if self.transposed
                    else (channels[1] * self.groups, channels[0]))
        text = (f"{inp}, {out}, kernel_size={tuple(self.weight.shape[2:])}, "
                f"stride={dims(self.stride)}")
        for name, default in (("padding", 0), ("dilation", 1), ("output_padding", 0)):
            if dims(getattr(self, name)) != dims(default):
                text += f", {name}={dims(getattr(self, name))}"
        text += f", groups={self.groups}" if self.groups != 1 else ""
        return text + (", bias=False" if self.bias is None else "")


class Conv1d(_ConvNd):
    """1-d convolution layer (torch.nn.Conv1d)."""

    dims = 1


class Conv2d(_ConvNd):
    """2-d convolution layer (torch.nn.Conv2d)."""

    dims = 2


class Conv3d(_ConvNd):
    """3-d convolution layer (torch.nn.Conv3d)."""

    dims = 3


class ConvTranspose1d(_ConvNd):
    """1-d transposed convolution layer (torch.nn.ConvTranspose1d)."""

    dims, transposed = 1, True


class ConvTranspose2d(_ConvNd):
    """2-d transposed convolution layer (torch.nn.ConvTranspose2d)."""

    dims, transposed = 2, True


class ConvTranspose3d(_ConvNd):
    """3-d transposed convolution layer (torch.nn.ConvTranspose3d)."""

    dims, transposed = 3, True


class GroupNorm(Module):
    """F.group_norm with a per-channel weight (ones) and bias (zeros) when affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True):
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} must be divisible by "
                             f"num_groups {num_groups}")
        self.num_groups, self.eps = num_groups, eps
        self.weight = _filled(1.0, (num_channels,)) if affine else None
        self.bias = _filled(0.0, (num_channels,)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        channels = "" if self.weight is None else f"{self.weight.shape[0]}, "
        return f"{self.num_groups}, {channels}eps={self.eps}, affine={self.weight is not None}"


class RMSNorm(Module):
    """F.rms_norm over the trailing `normalized_shape`, with a weight of ones."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True):
        self.shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        self.eps = eps
        self.weight = _filled(1.0, self.shape) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class PReLU(Module):
    """F.prelu with a learned slope, one or one per channel, starting at `init`."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25):
        self.weight = _filled(init, (num_parameters,))

    def forward(self, x: Tensor) -> Tensor:
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.weight.shape[0]}"


class _InstanceNorm(Module):
    """F.instance_norm per sample and channel, with a per-channel weight (ones) and bias
    (zeros) when affine, and running statistics (used in eval mode) when
    track_running_stats, as torch's."""

    dims = 2

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = False, track_running_stats: bool = False, *,
                 bias: bool = True):
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = _filled(1.0, (num_features,)) if affine else None
        self.bias = _filled(0.0, (num_features,)) if affine and bias else None
        self.running_mean = deferred(Tensor.zeros(num_features).contiguous()) \
            if track_running_stats else None
        self.running_var = deferred(Tensor.ones(num_features).contiguous()) \
            if track_running_stats else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in (self.dims + 1, self.dims + 2):
            raise ValueError(f"{type(self).__name__}: expected {self.dims + 1}D or "
                             f"{self.dims + 2}D input (got {x.ndim}D input)")
        unbatched = x.ndim == self.dims + 1
        use_input_stats = self.training or self.running_mean is None
        out = F.instance_norm(x.unsqueeze(0) if unbatched else x, self.running_mean,
                              self.running_var, self.weight, self.bias, use_input_stats,
                              self.momentum, self.eps)
        if use_input_stats and self.running_mean is not None and self.running_var is not None:
            realize(self.running_mean, self.running_var)
        return out.squeeze(0) if unbatched else out

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.weight is not None}, bias={self.bias is not None}, "
                f"track_running_stats={self.running_mean is not None}")


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of (N, C, L) or (C, L) input (torch.nn.InstanceNorm1d)."""

    dims = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of (N, C, H, W) or (C, H, W) input (torch.nn.InstanceNorm2d)."""

    dims = 2


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of (N, C, D, H, W) or (C, D, H, W) input."""

    dims = 3


def _filled(value: float, shape: tuple[int, ...]) -> Tensor:
    return deferred(Tensor.full(shape, value).contiguous()).requires_grad_()


__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Bilinear", "Conv1d", "Conv2d", "Conv3d",
           "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Embedding", "GroupNorm",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "Linear", "PReLU",
           "RMSNorm"]
