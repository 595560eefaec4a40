"""Per-row decoding: on a device whose threads are loops, an elementwise kernel's thread loops
over rows of its output with an inner loop along the last axis.

A flat loop over elements decodes every element's position with a div and a mod per axis
(`t % 58`, `t / 58 % 64`), and clang keeps such a loop scalar: a padded or permuted copy then
runs at a fraction of the memory's speed. Looping over rows decodes a row's position once, and
the inner loop's indices are plain strides, which vectorize (tests/codegen/test_conv_tiles.py
checks that no div or mod is left inside the inner loop). `lower` emits the two loops.
"""
from __future__ import annotations

from math import prod

# Shorter rows keep the flat loop: an inner loop of a few iterations vectorizes badly.
MIN_ROW = 8


def row_length(tile_shape: tuple[int, ...], elementwise_on_loops: bool) -> int:
    """The inner loop's length when a thread decodes its tiles' positions once per row (given
    a kernel without a tiled reduce on a device whose threads are loops), else 1."""
    if (elementwise_on_loops and len(tile_shape) > 1 and prod(tile_shape[:-1]) > 1
            and tile_shape[-1] >= MIN_ROW):
        return tile_shape[-1]
    return 1
