"""What one kernel may hold, as the scheduler enforces it: how many ops it fuses along a path,
how many elements it indexes, how many bytes its output takes."""
from __future__ import annotations

from collections.abc import Callable

from portkit import graph
from portkit.graph import GraphOp, Lazy

# Ops fused into one kernel along any path, at most: a chain of 100,000 adds becomes 100
# kernels of 1,000, so no walk of one kernel's graph (lowering, rendering, the C compiler's own)
# gets deeper than that, and kernels of one structure compile once.
MAX_FUSED_DEPTH = 1000


def cut_deep(order: list[Lazy], realize: set[int]) -> None:
    """Adds to `realize` (the ids of kernel roots) the nodes of `order` (sources first) where a
    path of fused ops would pass MAX_FUSED_DEPTH; a view is never cut (it may be an expand)."""
    depth: dict[int, int] = {}
    for node in order:
        deepest = max((depth.get(id(s), 0) for s in node.src if id(s) not in realize), default=0)
        depth[id(node)] = deepest + 1
        if deepest >= MAX_FUSED_DEPTH and node.op is not GraphOp.VIEW:
            realize.add(id(node))


def check_sizes(roots: list[Lazy], max_buffer_bytes: Callable[[str], int | None]) -> None:
    """Raises graph.TooLarge, before anything is allocated, for a kernel output (in `roots`)
    with more elements than int32 indexes, or more bytes than `max_buffer_bytes(device)`."""
    for root in roots:
        graph.check_elements(root.shape)
        limit = max_buffer_bytes(root.device)
        size = root.size * root.dtype.itemsize
        if limit is not None and size > limit:
            raise graph.TooLarge(
                f"a {root.dtype.name} tensor of shape {root.shape} takes {size:,} bytes; device "
                f"{root.device!r} allocates at most {limit:,} per buffer "
                "(Capabilities.max_buffer_bytes): split it, or use another device")
