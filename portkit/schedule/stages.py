"""Long reduces cut into stages, as the scheduler realizes them (portkit/schedule/): a reduce
of many elements into few outputs becomes partial reduces that many workgroups share, and no
stage loops longer than a float32 lane stays exact or a device's loop budget allows."""
from __future__ import annotations

from math import ceil, prod

from portkit import graph
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen.plan import reduce_identity
from portkit.graph import GraphOp, Lazy

# A reduce of at least _SPLIT_FROM elements per output, into fewer than _SPLIT_OUTPUTS outputs,
# becomes up to _SPLIT_PARTS partial reduces of at least _SPLIT_LEAST elements each, so that
# many workgroups share the long part.
_SPLIT_FROM = 1 << 16
_SPLIT_OUTPUTS = 256
_SPLIT_PARTS = 256
_SPLIT_LEAST = 4096
# On a device whose threads are hardware lanes (a GPU) a reduce of at least _LANES_FROM
# elements per output, into fewer than _LANES_THREADS outputs, is cut into interleaved slices:
# partial sum j of an output adds elements j, j + parts, j + 2 * parts, ..., so that
# neighbouring threads read neighbouring elements, with enough partial sums to fill about
# _LANES_THREADS threads and at least _LANES_LEAST elements each. A 16M-element sum split the
# CPU's way ran 1,024 threads over contiguous 64 KiB slices: 29 GB/s on an H200. A thread adds
# an interleaved slice in order, so those slices stay short: a million float32 tenths summed
# 3.8e-6 off in slices of 62 terms, 4.8e-7 off in slices of 31 (the last stage, contiguous,
# keeps several partial sums).
_LANES_FROM = 2048
_LANES_THREADS = 1 << 18
_LANES_LEAST = 16
# A sum of products (a matmul) into at most _LANES_FEW outputs is cut the same way but into
# contiguous slices, whose partial sums lead: thread (slice, n) reads row k of a (K, N)
# weight beside its neighbours. A GPT-2 decode step's 3072-to-768 projection ran as one
# group of 192 threads, each adding 3072 terms: 0.72 ms on an H200. More outputs keep the
# split the tiled lowering expects.
_LANES_FEW = 4096
# On a device whose threads are loops, a product of at most _FEW_ROWS rows (x @ W at decode)
# whose other factor steps by 1 along an output axis and by more along the reduce (W (K, N)
# row-major) is cut along k into slices of _ROW_SLICE rows: a thread then sums its slice's
# rows of W into a strip of outputs, tile after tile, while those rows stay in its cache.
# Uncut, each tile of 32 outputs read one 128-byte piece of every one of the K rows, 12 KiB
# apart (a new page each): (1, 768) @ (768, 3072) ran at 4.6 ms, in slices of 16 at 0.93
# ms (the partial sums' own reduce 0.1 of it); one thread, load 6. A W of fewer than
# _ROWS_APART_LEAST elements (attention's values at decode) stays in the cache uncut.
_FEW_ROWS = 4
_ROW_SLICE = 16
_ROWS_APART_LEAST = 1 << 18
# And no stage of any reduce runs more than CHUNK elements per output (a float32 sum in one
# lane stops growing at 2**24: ones(20_000_001).sum() was 16777216), nor more than half the
# loop iterations a device allows (Capabilities.max_loop_trips: lavapipe stops a shader after
# 65,535 in all, so a longer loop is a wrong answer); the other half covers a stage's blocks,
# its tail and the loops around it.
CHUNK = 1 << 14


def chunk(max_loop_trips: int | None) -> int:
    """The most elements per output one reduce stage runs, as a power of two."""
    if max_loop_trips is None:
        return CHUNK
    return min(CHUNK, 1 << max(0, (max_loop_trips // 2).bit_length() - 1))


def _piece(size: int, rest: int, outputs: int, chunk: int = CHUNK, lanes: bool = False) -> int:
    """The slice length a reduce axis of `size` (times `rest` other reduced elements per output,
    into `outputs` outputs) is cut into, for stages of at most `chunk`, on a device whose
    threads are loops or (`lanes`) hardware lanes; `size`: not cut."""
    piece = size
    if size * rest > chunk:
        # a power of two, so that equal partial sums (a sum of ones) add up exactly
        piece = 1 << max(0, (chunk // rest).bit_length() - 1)
    if lanes:
        if size * rest >= _LANES_FROM and outputs < _LANES_THREADS:
            parts = min(size // _LANES_LEAST, _LANES_THREADS // max(outputs, 1))
            if parts >= 2:
                piece = min(piece, ceil(size / (1 << (parts.bit_length() - 1))))
        return piece
    if size * rest >= _SPLIT_FROM and outputs < _SPLIT_OUTPUTS:
        wide = 1
        while wide * 2 <= _SPLIT_PARTS and size // (wide * 2) >= _SPLIT_LEAST:
            wide *= 2
        if wide >= 4:
            piece = min(piece, ceil(size / wide))
    return piece


def split_reduce(node: Lazy, chunk: int = CHUNK, lanes: bool = False) -> bool:
    """Rewrites a reduce longer than `chunk` (or long enough to share) as two reduces, in
    place; True if it did. With `lanes` (a device whose threads are hardware lanes) the first
    reduce's partial sums of anything but a product interleave, each taking every `parts`-th
    element; a product's lead, before the outputs."""
    op, axes = node.arg
    src = node.src[0]
    # a sum of products (a matmul, a convolution) of many outputs keeps the split its tiled
    # lowering expects
    product = src.op is Op.MUL
    lanes = lanes and (not product or node.size <= _LANES_FEW)
    axis = max(axes, key=lambda a: src.shape[a])
    size = src.shape[axis]
    piece = _piece(size, prod(src.shape[a] for a in axes) // max(size, 1), node.size, chunk,
                   lanes)
    sliced = (not lanes and product and size >= 4 * _ROW_SLICE and _ROW_SLICE < piece
              and _rows_apart(src, axis))
    if sliced:
        piece = _ROW_SLICE
    if piece >= size:
        return False
    parts = ceil(size / piece)
    if parts * piece != size:   # pad the axis with the reduce's identity to parts * piece
        pad = tuple((0, parts * piece - size if a == axis else 0) for a in range(len(src.shape)))
        padded = _moved(src, "pad", pad) if op is Op.ADD else src.view("pad", pad)
        if op is not Op.ADD:     # padding reads 0; a product or a max must see the identity
            shape = padded.shape
            inside = graph.iota(shape, axis, src.device).alu(
                Op.CMPLT, graph.const(size, dtypes.int32, shape, src.device))
            identity = graph.const(reduce_identity(op, src.dtype), src.dtype, shape, src.device)
            padded = inside.alu(Op.WHERE, padded, identity)
        src = padded
    # axis becomes (parts, piece), or (piece, parts) interleaved: the first reduce keeps
    # `parts`, the second reduces it; a product's `parts` on lanes (or in row slices) moves
    # to the front
    interleave = lanes and not product
    pair, kept = ((piece, parts), axis + 1) if interleave else ((parts, piece), axis)
    split = _moved(src, "reshape", src.shape[:axis] + pair + src.shape[axis + 1:])
    inner = [a + (a > axis) for a in axes if a != axis] + [2 * axis + 1 - kept]
    if lanes and product or sliced:     # the partial sums' rows lead, each one contiguous
        order = (axis,) + tuple(a for a in range(len(split.shape)) if a != axis)
        split = _moved(split, "permute", order)
        inner, kept = [order.index(a) for a in inner], 0
    # 16-bit float partials stay float32 (as a kernel's accumulators) and round once at the end
    partial = dtypes.float32 if src.dtype in (dtypes.float16, dtypes.bfloat16) else src.dtype
    whole = split.cast(partial).reduce(op, tuple(sorted(inner))).reduce(op, (kept,)).view(
        "reshape", node.shape).cast(node.dtype)
    node.op, node.src, node.arg = whole.op, whole.src, whole.arg
    return True


def _rows_apart(product: Lazy, axis: int) -> bool:
    """Whether a factor of `product` reads its buffer by 1 along an output axis and by more
    along reduce axis `axis` (a row-major W of x @ W), for at most _FEW_ROWS rows of the other
    factor (the output axes it does not move along), and at least _ROWS_APART_LEAST elements
    read."""
    for factor in product.src:
        if factor.op is not GraphOp.VIEW or len(factor.arg.views) != 1:
            continue
        strides = factor.arg.views[0].strides
        rows = prod(n for a, (n, step) in enumerate(zip(product.shape, strides))
                    if step == 0 and a != axis)
        if (strides[axis] > 1 and 1 in strides and rows <= _FEW_ROWS
                and prod(product.shape) >= rows * _ROWS_APART_LEAST):
            return True
    return False


def _moved(node: Lazy, method: str, arg) -> Lazy:
    """`node` reshaped or padded (with zeros); a product is moved factor by factor, so that the
    first stage is still a sum of one product, which codegen/pack.py blocks as a matmul (a
    conv's weight gradient, whose batch or output rows are cut)."""
    # a factor that is a constant (x * 2.0) stays outside: a scalar reaches a replay as a kernel
    # argument only through its own constant view, which a moved reshape would hide
    if node.op is Op.MUL and all(factor.shape == node.shape and factor.base.op is not
                                 GraphOp.CONST for factor in node.src):
        left, right = (factor.view(method, arg) for factor in node.src)
        return left.alu(Op.MUL, right)
    return node.view(method, arg)
