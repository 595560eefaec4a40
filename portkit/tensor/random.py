"""The random generator: counter-based, so the same seed gives the same numbers on every device.

Each draw hashes the element index under keys derived from (seed, draw number) on the device,
with uint32 arithmetic that every device has bit-exactly.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from portkit import graph, runtime
from portkit.tensor.dtype import DTypeLike, default_float, int32, to_dtype, uint32
from portkit.tensor.shapes import ShapeLike, as_sizes

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

_seed, _draws = 0, 0

# bits of uniform randomness per float dtype: its significand (float64 gets the 32 there are)
_PRECISION = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 32}


def seed(value: int) -> None:
    """Seeds the random generator: the same seed gives the same numbers on every device."""
    global _seed, _draws
    _seed, _draws = int(value) & 0xFFFFFFFF, 0


class RandomOps:
    """Tensor's random constructors: rand, randn, randint and their `_like` forms."""

    __slots__ = ()

    @classmethod
    def rand(cls: type[Tensor], *shape: ShapeLike, dtype: DTypeLike | None = None,
             device: str | None = None) -> Tensor:
        """Uniform in [0, 1): the same numbers on every device for the same seed()."""
        dtype = to_dtype(dtype) or default_float
        if not dtype.is_float:
            raise TypeError(f"rand makes floats, not {dtype.name}; use randint for integers")
        bits = _random_bits(cls, as_sizes(shape), runtime.device_name(device))
        # the top p bits, p the dtype's precision, scaled by 2**-p: exact in the dtype, so
        # never rounded up to 1.0 and identical on every device
        precision = _PRECISION[dtype.name]
        return (bits >> (32 - precision)).cast(dtype) * (1.0 / (1 << precision))

    @classmethod
    def randn(cls: type[Tensor], *shape: ShapeLike, dtype: DTypeLike | None = None,
              device: str | None = None) -> Tensor:
        """Standard normal (Box-Muller over two uniform draws, computed in float32)."""
        shape = as_sizes(shape)
        u1 = cls.rand(*shape, device=device)
        u2 = cls.rand(*shape, device=device)
        out = (-2.0 * (1.0 - u1).log()).sqrt() * (u2 * (2 * math.pi)).cos()
        return out.cast(to_dtype(dtype) or default_float)

    @classmethod
    def randint(cls: type[Tensor], low: int, high: int, shape: ShapeLike = (), dtype: DTypeLike | None = None,
                device: str | None = None) -> Tensor:
        """Integers uniform in [low, high) (int32 unless dtype says otherwise)."""
        span = high - low
        if not 0 < span <= 1 << 32:
            raise ValueError(f"randint needs low < high <= low + 2**32, got [{low}, {high})")
        bits = _random_bits(cls, as_sizes(shape), runtime.device_name(device))
        # the remainder is exact in uint32 on every device; its bias is below span / 2**32
        picked = bits if span == 1 << 32 else bits % span
        return picked.cast(to_dtype(dtype) or int32) + low

    def rand_like(self: Tensor) -> Tensor:
        """rand() with this tensor's shape, dtype and device."""
        return type(self).rand(*self.shape, dtype=self.dtype, device=self.device)

    def randn_like(self: Tensor) -> Tensor:
        """randn() with this tensor's shape, dtype and device."""
        return type(self).randn(*self.shape, dtype=self.dtype, device=self.device)


def _mix(x: int) -> int:
    """The "lowbias32" integer hash (Chris Wellons), on the host."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _random_bits(cls: type[Tensor], shape: tuple[int, ...], device: str) -> Tensor:
    """uint32 bits: the element index hashed under two key words, computed on the device.

    Counter-based: element i of a draw is lowbias32(lowbias32(i ^ k0) ^ k1), the keys a hash of
    (seed, draw number). It uses only uint32 XOR, shifts and multiplies, which every device has
    bit-exactly, so every device yields the same bits. The keys are data, not constants, so
    each shape compiles once however many draws it makes.
    """
    global _draws
    _draws += 1
    k0 = _mix(_mix(_seed) ^ (_draws * 0x9E3779B9 & 0xFFFFFFFF))
    keys = cls(np.array([k0, _mix(k0 ^ 0x85EBCA6B)], np.uint32), device=device)
    x = cls(graph.iota((math.prod(shape),), 0, device)).cast(uint32)
    for k in range(2):
        x = x ^ keys[k]
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        x = x ^ (x >> 16)
    return x.reshape(shape)
