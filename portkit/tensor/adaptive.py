"""Adaptive pools (windows chosen by the output size, as torch.nn.functional's), power-average
pools, local response norm, torch's deprecated upsample functions, and the pixel and channel
shuffles, which move channels into space and back.

An adaptive pool whose output size divides the input's is a plain pool (kernel = stride =
input / output); otherwise output i along a dim reduces input [floor(i * in / out),
ceil((i + 1) * in / out)), torch's windows, one dim at a time (a window is a box, so its mean
or max is the mean or max over each of its dims in turn).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from portkit.tensor.movement import cat
from portkit.tensor.pools import (
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool2d,
    max_pool3d,
)
from portkit.tensor.spatial import interpolate

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

OutputSize = int | None | Sequence[int | None]
_POOLS: dict[tuple[str, int], Callable[..., Any]] = {
    ("mean", 1): avg_pool1d, ("mean", 2): avg_pool2d, ("mean", 3): avg_pool3d,
    ("amax", 1): max_pool1d, ("amax", 2): max_pool2d, ("amax", 3): max_pool3d}


def _adaptive(input: Tensor, output_size: OutputSize, d: int, reduce: str, name: str,
              return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    if input.ndim not in (d + 1, d + 2):
        raise RuntimeError(f"{name}(): Expected {d + 1}D or {d + 2}D tensor, but got "
                           f"{list(input.shape)}")
    sizes = (output_size,) * d if output_size is None or isinstance(output_size, int) \
        else tuple(output_size)
    if len(sizes) != d:
        raise RuntimeError(f"{name}: output_size must be {d}")
    spatial = input.shape[-d:]
    out = tuple(s if o is None else o for o, s in zip(sizes, spatial))
    if all(o > 0 and s % o == 0 for o, s in zip(out, spatial)):
        kernel = tuple(s // o for o, s in zip(out, spatial))
        pool = _POOLS[reduce, d]
        return pool(input, kernel, return_indices=True) if return_indices else pool(input,
                                                                                    kernel)
    if return_indices:
        raise NotImplementedError(f"{name}: return_indices needs an output size that divides "
                                  f"the input's ({spatial} by {out})")
    x = input
    for dim, (s, o) in zip(range(input.ndim - d, input.ndim), zip(spatial, out)):
        pieces = [getattr(x.shrink([(i * s // o, -(-(i + 1) * s // o)) if k == dim else None
                                    for k in range(x.ndim)]), reduce)(dim, keepdim=True)
                  for i in range(o)]
        x = cat(pieces, dim) if pieces else x.shrink(
            [(0, 0) if k == dim else None for k in range(x.ndim)])
    return x


def adaptive_avg_pool1d(input: Tensor, output_size: OutputSize) -> Tensor:
    """The mean of each of output_size windows over the last dim, torch's windows."""
    return cast("Tensor", _adaptive(input, output_size, 1, "mean", "adaptive_avg_pool1d"))


def adaptive_avg_pool2d(input: Tensor, output_size: OutputSize) -> Tensor:
    """The mean of each window over the last two dims, output_size (H, W) of them (None keeps
    the input's size)."""
    return cast("Tensor", _adaptive(input, output_size, 2, "mean", "adaptive_avg_pool2d"))


def adaptive_avg_pool3d(input: Tensor, output_size: OutputSize) -> Tensor:
    """The mean of each window over the last three dims, output_size (D, H, W) of them."""
    return cast("Tensor", _adaptive(input, output_size, 3, "mean", "adaptive_avg_pool3d"))


def adaptive_max_pool1d(input: Tensor, output_size: OutputSize, return_indices: bool = False
                        ) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each of output_size windows over the last dim, torch's windows."""
    return _adaptive(input, output_size, 1, "amax", "adaptive_max_pool1d", return_indices)


def adaptive_max_pool2d(input: Tensor, output_size: OutputSize, return_indices: bool = False
                        ) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each window over the last two dims, output_size (H, W) of them."""
    return _adaptive(input, output_size, 2, "amax", "adaptive_max_pool2d", return_indices)


def adaptive_max_pool3d(input: Tensor, output_size: OutputSize, return_indices: bool = False
                        ) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each window over the last three dims, output_size (D, H, W) of them."""
    return _adaptive(input, output_size, 3, "amax", "adaptive_max_pool3d", return_indices)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C r^2, H, W) to (*, C, H r, W r): each channel's r x r block of channels laid out
    in space."""
    if input.ndim < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but "
                           f"got input with {input.ndim} dimension(s)")
    r = upscale_factor
    *batch, c, h, w = input.shape
    if r <= 0 or c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)={c} "
                           f"is not divisible by {r * r}")
    b = len(batch)
    x = input.reshape(*batch, c // (r * r), r, r, h, w)
    x = x.permute(*range(b), b, b + 3, b + 1, b + 4, b + 2)
    return x.reshape(*batch, c // (r * r), h * r, w * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(*, C, H r, W r) to (*, C r^2, H, W), the inverse of pixel_shuffle."""
    if input.ndim < 3:
        raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but "
                           f"got input with {input.ndim} dimension(s)")
    r = downscale_factor
    *batch, c, h, w = input.shape
    for side, size in (("height", h), ("width", w)):
        if r <= 0 or size % r:
            raise RuntimeError(f"pixel_unshuffle expects {side} to be divisible by "
                               f"downscale_factor, but input.size({-2 if side == 'height' else -1})"
                               f"={size} is not divisible by {r}")
    b = len(batch)
    x = input.reshape(*batch, c, h // r, r, w // r, r)
    x = x.permute(*range(b), b, b + 2, b + 4, b + 1, b + 3)
    return x.reshape(*batch, c * r * r, h // r, w // r)


def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """(N, g * k, *) with channel g_i * k + k_i moved to k_i * g + g_i."""
    if input.ndim < 3 or groups <= 0 or input.shape[1] % groups:
        raise RuntimeError(f"channel_shuffle: expected input of shape (N, C, *) with C "
                           f"divisible by groups={groups}, got {list(input.shape)}")
    n, c, *rest = input.shape
    x = input.reshape(n, groups, c // groups, *rest).transpose(1, 2)
    return x.reshape(n, c, *rest)



def _lp_pool(input: Tensor, norm_type: float, kernel_size, stride, ceil_mode: bool, d: int
             ) -> Tensor:
    """(sum of x^p over each window)^(1/p), torch's: the mean of x^p times the window's size,
    negative sums read as 0."""
    kernel = (kernel_size,) * d if isinstance(kernel_size, int) else tuple(kernel_size)
    mean = _POOLS["mean", d](input ** norm_type, kernel, stride, 0, ceil_mode)
    return (mean.sign() * mean.abs().relu() * math.prod(kernel)) ** (1 / norm_type)


def lp_pool1d(input: Tensor, norm_type: float, kernel_size: int | Sequence[int],
              stride: int | Sequence[int] | None = None, ceil_mode: bool = False) -> Tensor:
    """(sum of x^norm_type over each window of the last dim)^(1 / norm_type)."""
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 1)


def lp_pool2d(input: Tensor, norm_type: float, kernel_size: int | Sequence[int],
              stride: int | Sequence[int] | None = None, ceil_mode: bool = False) -> Tensor:
    """(sum of x^norm_type over each window of the last two dims)^(1 / norm_type)."""
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 2)


def lp_pool3d(input: Tensor, norm_type: float, kernel_size: int | Sequence[int],
              stride: int | Sequence[int] | None = None, ceil_mode: bool = False) -> Tensor:
    """(sum of x^norm_type over each window of the last three dims)^(1 / norm_type)."""
    return _lp_pool(input, norm_type, kernel_size, stride, ceil_mode, 3)


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0) -> Tensor:
    """x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta, the channels
    (dim 1) zero-padded by size // 2 before and (size - 1) // 2 after, as torch's."""
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} "
                         f"dimensions)")
    if input.numel() == 0:
        return input
    channels = input.shape[1]
    padding = [(0, 0)] * input.ndim
    padding[1] = (size // 2, (size - 1) // 2)
    squares = (input * input).pad(padding)
    total = squares.shrink([(0, channels) if d == 1 else None for d in range(input.ndim)])
    for j in range(1, size):
        total = total + squares.shrink([(j, j + channels) if d == 1 else None
                                        for d in range(input.ndim)])
    return input / (total * (alpha / size) + k) ** beta


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    """interpolate (torch's deprecated name for it)."""
    return interpolate(input, size, scale_factor, mode, align_corners)  # type: ignore[arg-type]


def upsample_nearest(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """interpolate in mode "nearest" (deprecated in torch)."""
    return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """interpolate in mode "bilinear" with align_corners=True (deprecated in torch)."""
    return interpolate(input, size, scale_factor, "bilinear", align_corners=True)

__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
           "channel_shuffle", "local_response_norm", "lp_pool1d", "lp_pool2d", "lp_pool3d",
           "pixel_shuffle", "pixel_unshuffle", "upsample", "upsample_bilinear",
           "upsample_nearest"]
