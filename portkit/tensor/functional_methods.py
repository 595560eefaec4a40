"""Tensor methods that forward to the nn functions (functional.py, which portkit.nn.functional
is under torch's name).

x.conv2d(w) is portkit.nn.functional.conv2d(x, w), as PyTorch pairs Tensor methods with
torch.nn.functional. The methods keep the parameter order they always had (cross_entropy's
differs from the function's, which is torch's).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from portkit.tensor import functional

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor
    from portkit.tensor.functional import IntPair, Reduction


class FunctionalMethods:
    """Thin Tensor methods over portkit.nn.functional (conv, pools, losses, norms, ...)."""

    __slots__ = ()

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """self @ weight.T + bias, as torch.nn.functional.linear."""
        return functional.linear(self, weight, bias)

    def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntPair = 1,
               padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1) -> Tensor:
        """2-d convolution, (N, C, H, W) x (O, C/groups, kh, kw), as torch."""
        return functional.conv2d(self, weight, bias, stride, padding, dilation, groups)

    def max_pool2d(self: Tensor, kernel_size: IntPair = 2, stride: IntPair | None = None,
                   padding: IntPair = 0, dilation: IntPair = 1, ceil_mode: bool = False
                   ) -> Tensor:
        """The maximum of each window over the last two dims."""
        return functional.max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode)

    def avg_pool2d(self: Tensor, kernel_size: IntPair = 2, stride: IntPair | None = None,
                   padding: IntPair = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """The mean of each window over the last two dims."""
        return functional.avg_pool2d(self, kernel_size, stride, padding, ceil_mode,
                                        count_include_pad)

    def cross_entropy(self: Tensor, target: Tensor, label_smoothing: float = 0.0,
                      reduction: Reduction = "mean") -> Tensor:
        """Cross entropy of logits (N, C) against class indices (N,) or probabilities."""
        return functional.cross_entropy(self, target, reduction=reduction,
                                           label_smoothing=label_smoothing)

    def one_hot(self: Tensor, num_classes: int) -> Tensor:
        """int32 vectors with a 1 at each index of this integer tensor."""
        return functional.one_hot(self, num_classes)

    def layernorm(self: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """(x - mean) / sqrt(var + eps) over `axis` (biased variance, as torch)."""
        return functional.layernorm(self, axis, eps)

    def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
                  invstd: Tensor) -> Tensor:
        """(x - mean) * invstd * weight + bias, with per-channel (dim 1) statistics."""
        return functional.batchnorm(self, weight, bias, mean, invstd)

    def dropout(self: Tensor, p: float = 0.5, training: bool | None = None) -> Tensor:
        """Random elements zeroed with probability p, the rest scaled, when training."""
        return functional.dropout(self, p, training)

    def embedding(self: Tensor, weight: Tensor) -> Tensor:
        """Rows of `weight` picked by this integer tensor."""
        return functional.embedding(self, weight)

    def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor,
                                     attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False) -> Tensor:
        """softmax(q @ k^T * scale + mask) @ v, as torch's (see nn.functional)."""
        return functional.scaled_dot_product_attention(self, key, value, attn_mask,
                                                          dropout_p, is_causal, scale,
                                                          enable_gqa)

    def leaky_relu(self: Tensor, negative_slope: float = 0.01) -> Tensor:
        """x where x > 0, else negative_slope * x."""
        return functional.leaky_relu(self, negative_slope)

    def gelu(self: Tensor, approximate: Literal["none", "tanh"] = "none") -> Tensor:
        """GELU as torch: x * Phi(x) with the exact normal CDF, or approximate="tanh"."""
        return functional.gelu(self, approximate)

    def silu(self: Tensor) -> Tensor:
        """x * sigmoid(x)."""
        return functional.silu(self)

    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta * x)) / beta, computed without overflow."""
        return functional.softplus(self, beta, threshold)
