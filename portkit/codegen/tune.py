"""What lowering reads of the tuner: which matmul a kernel computes, and the LOCAL tiling a
search stored for it on a device (portkit/schedule/search.py times the candidates).

A stored choice lives in the on-disk cache (portkit/cache.py), keyed by the device's name and
the contraction's structure (shapes, axes, dtype, operand layouts); every lowering, in this
process or another, reads it. Without one the default heuristics of tiles.py apply.
"""
from __future__ import annotations

from dataclasses import fields

from portkit import cache
from portkit.abi.backend import Capabilities
from portkit.codegen import tiles
from portkit.graph import Lazy


def contraction(root: Lazy, inputs: list[Lazy], caps: Capabilities) -> tiles.Contraction | None:
    """The LOCAL-tileable matmul `root` computes on `caps`, or None."""
    return tiles.find(root, inputs, caps)


def stored(caps: Capabilities, found: tiles.Contraction) -> tiles.Tiling | None:
    """The tiling a search stored for `found` on this device, or None."""
    choice = cache.tuned(caps.device_name, found.key())
    names = {f.name for f in fields(tiles.Tiling)}
    if not isinstance(choice, dict) or set(choice) != names:
        return None
    return tiles.Tiling(**choice)
