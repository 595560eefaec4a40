"""Adaptive pools (windows chosen by the output size, as torch.nn.functional's) and the pixel
and channel shuffles, which move channels into space and back.

An adaptive pool whose output size divides the input's is a plain pool (kernel = stride =
input / output); otherwise output i along a dim reduces input [floor(i * in / out),
ceil((i + 1) * in / out)), torch's windows, one dim at a time (a window is a box, so its mean
or max is the mean or max over each of its dims in turn).
"""
from __future__ import annotations

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

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

OutputSize = int | None | Sequence[int | None]
_POOLS: dict[tuple[str, int], Callable[..., Any]] = {("mean", 1): avg_pool1d, ("mean", 2): avg_pool2d, ("mean", 3): avg_pool3d,
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


__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
           "channel_shuffle", "pixel_shuffle", "pixel_unshuffle"]
