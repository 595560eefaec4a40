"""What one kernel may hold, as the scheduler enforces it: how many ops it fuses along a path,
which values it computes again rather than reads, how many elements it indexes, how many bytes
its output takes."""
from __future__ import annotations

from collections.abc import Callable
from math import prod

from portkit import graph
from portkit.abi.ops import Op
from portkit.graph import GraphOp, Lazy
from portkit.view import ShapeTracker

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


# An elementwise value that several kernels read is computed again in each of them: cheap for a
# short expression, but a recurrence (an LSTM's cell state, c = f * c + i * g, read by the next
# step and by the output) would recompute every earlier step in every later kernel: O(steps^2)
# work in ever-larger kernels, each compiled anew. From this many fused ops deep (views and
# constants do not count; an exp is 17, a sigmoid 25, a tanh 29), such a value gets its own
# buffer: an LSTM step then runs as three kernels of one structure at any sequence length. At
# 20 a sigmoid or a tanh that several kernels read is stored, and each exponential of an
# LSTM's gate gradients runs once: its jitted training step took 90 ms of CPU, not 127 at 32,
# and compiled 64 distinct kernels, not 155. At 17 an exp is stored too: softmax's exp(x - max),
# read by the sum and by the division, ran twice (0.9 ms each over 560 x 2000 on one thread);
# stored, that softmax took 1.43 ms, not 2.43, and 1024 x 2000 2.99, not 4.36. The inference
# zoo's kernels and the training steps took the same time at 17 and 20; docs/performance.md
# has the figures.
MAX_SHARED_DEPTH = 17
# Buffers a shared value's fused expression reads, at most, before it gets its own buffer: a
# transformer's residual stream (x + attention + bias + MLP + bias, block after block) is a
# few ops per block, so by depth alone it went unstored for 8 blocks, and each block's layer
# norm statistics read every earlier block's outputs (an 8-block ViT's last ones 38 buffers, a
# kernel structure per block). Stored where it reads this many (once per block: x + attention
# + bias reads 3), each block's kernels are alike; so is a classifier's logits' gradient,
# which three kernels (two matmuls, a bias sum) computed from 5 buffers each. A padded read
# counts twice, its gate and its index being work of their own: a cat of three pieces is
# stored where several kernels read it (GPT's attention gradient, cat([dq, dk, dv]) of three
# permuted buffers, read by the qkv weight's and input's gradients and by the bias's column
# sum, which decoded every piece's index for each element at 0.5 GB/s: 1.5 ms for 3 MB).
MAX_SHARED_READS = 5
_MANY = -1


def cut_shared(order: list[Lazy], consumers: dict[int, set[int]], realize: set[int]) -> None:
    """Adds to `realize` the elementwise nodes of `order` (sources first) that two or more
    kernels would compute and whose fused expression is MAX_SHARED_DEPTH ops deep or more, or
    reads MAX_SHARED_READS buffers or more. Consumers are decided first (a cut one is its own
    kernel), so a value feeding only a cut node belongs to that node's kernel and stays fused;
    reads are counted sources first, so a stored value counts as one buffer downstream. Depth
    is counted again once the values stored for their reads are known: a residual stream
    stored once per block is no deeper than a block's adds, where counted through every block
    it reached the bound at the eighth."""
    realize |= _cut_shared(order, consumers, set(realize))
    _cut_shared(order, consumers, realize)


def _cut_shared(order: list[Lazy], consumers: dict[int, set[int]], realize: set[int]
                ) -> set[int]:
    """One pass of cut_shared over `realize`; returns the ids it stored for their reads."""
    depth: dict[int, int] = {}
    for node in order:
        deepest = max((depth.get(id(s), 0) for s in node.src if id(s) not in realize), default=0)
        depth[id(node)] = deepest + isinstance(node.op, Op)
    owner = _owners(order, consumers, realize, lambda node: isinstance(node.op, Op)
                    and depth[id(node)] >= MAX_SHARED_DEPTH)
    reads: dict[int, frozenset[int]] = {}   # id(node) -> the buffers its expression reads
    stored: set[int] = set()
    for node in order:
        read: frozenset[int] = frozenset().union(*(
            {id(s)} if s.realized or id(s) in realize else reads.get(id(s), frozenset())
            for s in node.src))
        if node.op is GraphOp.VIEW and any(view.mask is not None for view in node.arg.views):
            read |= {-1 - id(node)}         # a padded read counts twice
        if len(read) > MAX_SHARED_READS:    # past the bound, which buffers no longer matters
            read = frozenset(sorted(read)[:MAX_SHARED_READS])
        reads[id(node)] = read
        if (owner.get(id(node)) == _MANY and isinstance(node.op, Op)
                and len(read) >= MAX_SHARED_READS):
            realize.add(id(node))
            stored.add(id(node))
    return stored


def _owners(order: list[Lazy], consumers: dict[int, set[int]], realize: set[int],
            cut: Callable[[Lazy], bool]) -> dict[int, int]:
    """The one kernel root (an id) that computes each unrealized node of `order`, or _MANY
    where several do; consumers first, so a shared node for which `cut` holds is added to
    `realize` before its sources are placed (it is then their one kernel). A node that
    several kernels read only through slices that do not overlap (an LSTM's gates, chunked
    into i, f, g, o) is computed once per element all the same: its owner is its own mark,
    -2 - id(node), which its sources inherit, and it is not cut."""
    owner: dict[int, int] = {}
    by_id = {id(n): n for n in order}
    for node in reversed(order):
        if id(node) in realize:
            continue
        found = {c if c in realize else owner.get(c, _MANY) for c in consumers[id(node)]}
        if len(found) == 1:
            owner[id(node)] = found.pop()
        elif _MANY not in found and _apart(node, [by_id[c] for c in consumers[id(node)]]):
            owner[id(node)] = -2 - id(node)
        else:
            owner[id(node)] = _MANY
        if owner[id(node)] == _MANY and cut(node):
            realize.add(id(node))
    return owner


def _apart(node: Lazy, readers: list[Lazy]) -> bool:
    """Whether each of `readers` is a slice of `node` (a shrink of its row-major elements),
    none overlapping another."""
    found = [_box(r, node.shape) for r in readers if r.op is GraphOp.VIEW and r.src[0] is node]
    boxes = [box for box in found if box is not None]
    if len(boxes) != len(readers):
        return False
    return all(any(a_hi <= b_lo or b_hi <= a_lo for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b))
               for k, a in enumerate(boxes) for b in boxes[k + 1:])


def _box(view: Lazy, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """The region of `shape` that `view` reads where it is a shrink of it, else None."""
    start, rest = [], view.arg.views[-1].offset
    rows = [prod(shape[k + 1:]) for k in range(len(shape))]
    for row in rows:
        start.append(rest // row)
        rest %= row
    box = tuple((b, b + size) for b, size in zip(start, view.shape))
    if len(view.shape) != len(shape) or any(hi > size for (_, hi), size in zip(box, shape)):
        return None
    return box if ShapeTracker.contiguous(shape).shrink(box) == view.arg else None


# A matmul reads its A operand through an expand (each element once per output column), and
# a packed matmul computes A's fused expression again for every panel of output columns
# (codegen/pack.py): in ViT-S a GELU fused into the MLP's down-projection ran 12 times per
# element, and the residual stream and layer norm fused into each qkv and MLP matmul (up to 25
# buffers read by the last block) ran 36-48 times, so those matmuls ran at 1-2 GFLOP/s. An
# elementwise value that reaches such a view through views only, and whose fused expression
# has this many ops and buffer reads or more, gets its own buffer, written once. A short
# operand (relu(h + b) is 4, a layer norm of a buffer 14) stays fused.
MAX_REUSED_COST = 16
# Fewer reads of one element than this cost a packed matmul at most two evaluations (two
# panels of 32 columns); a small graph (an MLP's logits' gradient, 4 columns) keeps its fusion.
MIN_REUSE = 64


def _reuse(view: Lazy) -> int:
    """How many times a view reads each source element, at most (the sizes of its stride-0
    axes, multiplied)."""
    return max((prod(size for size, st in zip(v.shape, v.strides) if st == 0)
                for v in view.arg.views), default=1)


def cut_reused(order: list[Lazy], consumers: dict[int, set[int]], realize: set[int]) -> None:
    """Adds to `realize` the elementwise nodes of `order` (sources first) that reach a view
    reading each element MIN_REUSE times or more through views only, and whose fused
    expression costs MAX_REUSED_COST or more (ops plus buffer reads, each node once)."""
    by_id = {id(n): n for n in order}
    reused: set[int] = set()     # ids of nodes some kernel reads MIN_REUSE times an element
    for node in reversed(order):
        views = [by_id[c] for c in consumers[id(node)] if by_id[c].op is GraphOp.VIEW]
        if any(_reuse(v) >= MIN_REUSE or id(v) in reused for v in views):
            reused.add(id(node))
    for node in order:
        if (id(node) in reused and id(node) not in realize and isinstance(node.op, Op)
                and _cost(node, realize, MAX_REUSED_COST) >= MAX_REUSED_COST):
            realize.add(id(node))


def _cost(root: Lazy, realize: set[int], most: int) -> int:
    """The ops and buffer reads of `root`'s fused expression, counting up to `most`."""
    seen, stack, cost = {id(root)}, [root], 0
    while stack and cost < most:
        node = stack.pop()
        if node is not root and (node.realized or id(node) in realize):
            cost += 1
            continue
        cost += isinstance(node.op, Op)
        for s in node.src:
            if id(s) not in seen:
                seen.add(id(s))
                stack.append(s)
    return cost


# A depthwise conv's SiLU (with its BatchNorm folded, a bias) is read by two kernels in
# EfficientNet's squeeze-excite blocks: the pool's mean and the projection that multiplies it by
# the gate. Fused into each, its exponential ran twice per element, and the pool's sum ran at
# a few ns per element. Such an epilogue of a reduce (MAX_REUSED_COST ops or more between the
# reduce and the one op every path from it passes through) gets its own buffer where two or
# more kernels would compute it: one elementwise pass, whose rows vectorize. (Computed in the
# conv's kernel instead, it stayed scalar there: the conv's rows of 7 and 14 are written out
# whole, and a stride-2 row's loads are not contiguous.)
def cut_epilogues(ends: list[Lazy], order: list[Lazy], consumers: dict[int, set[int]],
                  realize: set[int]) -> None:
    """Adds to `realize` those of `ends` (each the last op of a reduce's epilogue) that two or
    more kernels would compute."""
    owner = _owners(order, consumers, realize, lambda node: False)
    realize.update(id(end) for end in ends if owner.get(id(end)) == _MANY)


def check_sizes(roots: list[Lazy], max_buffer_bytes: Callable[[str], int | None]) -> None:
    """Raises graph.TooLarge, before anything is allocated, for a kernel output (in `roots`)
    with more elements than int32 indexes, or more bytes than `max_buffer_bytes(device)`."""
    for root in roots:
        graph.check_elements(root.shape)
        check_bytes(root.shape, root.dtype, root.device, max_buffer_bytes(root.device))


def check_bytes(shape: tuple[int, ...], dtype, device: str, limit: int | None) -> None:
    """Raises graph.TooLarge if a buffer of `shape` and `dtype` takes more than `limit` bytes
    (the device's Capabilities.max_buffer_bytes; None: no limit)."""
    size = prod(shape) * dtype.itemsize
    if limit is not None and size > limit:
        raise graph.TooLarge(
            f"a {dtype.name} tensor of shape {tuple(shape)} takes {size:,} bytes; device "
            f"{device!r} allocates at most {limit:,} per buffer "
            "(Capabilities.max_buffer_bytes): split it, or use another device")
