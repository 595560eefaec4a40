"""Padded copies: a scheduling pass for devices whose threads are loops (CPUs).

A convolution reads its input through a padded view, then through windows that read each
element many times (portkit/tensor/spatial.py). Lowered as it is, every load is gated by the padding
mask, and a gate that differs between neighbouring outputs keeps a C compiler from vectorizing
them (it leaves branches and scalar loads). Copying the padded input once into its own buffer
costs one pass over it; the reduce that reads the copy needs no gates, and its output axis along
the rows becomes vector lanes. The pass rewrites the view in place, as the scheduler's reduce
split does; the scheduler realizes the copy as a kernel of its own.

A pool pads with a fill (a max pool's -inf): WHERE(padding mask, padded input, fill), which its
windows read. That WHERE is the copy, realized as it is: read gated through the windows, a
ResNet stem's 3 x 3 stride-2 max pool (64 x 112 x 112) decoded every element and recomputed
the bias and ReLU before it at each of its nine terms, scalar.
"""
from __future__ import annotations

from portkit.abi.ops import Op
from portkit.graph import GraphOp, Lazy
from portkit.view import ShapeTracker, View


def pad_apart(node: Lazy) -> Lazy | None:
    """If `node` is a padded view read again through an expanding view (a convolution's
    windows), rewrites it to read a new padded copy, which it returns; else None."""
    if node.op is not GraphOp.VIEW:
        return None
    views = node.arg.views
    # the windows' expand is in a later view, or (a depthwise conv's, whose windows are only
    # permuted after) in the padded view itself
    if len(views) < 2 or not any(st == 0 and size > 1 for view in views
                                 for size, st in zip(view.shape, view.strides)):
        return None
    filled = node.src[0]
    if filled.op is Op.WHERE and not filled.realized and any(
            s.op is GraphOp.VIEW and s.arg.views[-1].mask is not None for s in filled.src):
        return filled
    if node.src[0].op is GraphOp.VIEW and not node.src[0].realized:
        return node.src[0]          # rewritten by an earlier schedule of the same graph
    view = views[0]
    if view.mask is None:
        return None
    # the copy holds each element once: axes the first view expands (stride 0) become size 1
    # in it, and the rewritten view expands them again; an expanded axis that is also padded
    # (a constant's, such as the gradient of a sum) is copied whole
    spread = [st == 0 and size > 1 and (lo, hi) == (0, size)
              for size, st, (lo, hi) in zip(view.shape, view.strides, view.mask)]
    shape = tuple(1 if wide else size for wide, size in zip(spread, view.shape))
    mask = tuple((0, 1) if wide else m for wide, m in zip(spread, view.mask))
    first = ShapeTracker((View(shape, view.strides, view.offset, mask),))
    padded = Lazy(GraphOp.VIEW, node.dtype, shape, node.src, first, node.device)
    node.src = (padded,)
    strides = View.contiguous(shape).strides
    node.arg = ShapeTracker((View(view.shape, strides),) + views[1:])
    return padded
