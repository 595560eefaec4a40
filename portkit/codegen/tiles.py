"""LOCAL tiling: a matmul-shaped kernel staged through workgroup memory (LOCAL) with BARRIERs.

On a device whose workgroup threads are real lanes (not loops) and that has workgroup memory,
a contraction C[..., m, n] = sum_k A[..., m, k] * B[..., k, n] is lowered so that:
- each workgroup computes a block of (threads_m * per_thread_m) x (threads_n * per_thread_n)
  outputs, and walks K in steps of `depth`;
- at each step the group's threads copy the A and B panels it needs into LOCAL (each thread a
  few elements, adjacent threads adjacent addresses along the operand's contiguous axis), wait
  at a BARRIER, and every thread adds per_thread_m x per_thread_n products from LOCAL into its
  registers, so one global load feeds threads_n (or threads_m) threads and one LOCAL load feeds
  per_thread_n (or per_thread_m) accumulators; a second BARRIER lets the panels be overwritten;
- a thread's outputs are either strided by the thread counts (neighbouring threads read
  neighbouring LOCAL words and store neighbouring outputs: the layout for hardware lanes) or a
  run of adjacent ones (which a driver that loops over work-items, PoCL or lavapipe, turns into
  vector lanes within each thread: the default, see CANDIDATES).
Each output is a running sum over K (the untiled lowering sums in blocks of about sqrt(K) terms
instead); the error stays within the gamma_K bound matmuls are tested against.
Sizes need not divide the tile: panel elements past an edge are staged as zeros (their loads
gated) and outputs past it are not stored. Float16/bfloat16 operands are widened to float32 as
they are staged, and the sum is rounded once at the end, as the untiled reduce does.

What an operand is (A, B, a fused prologue such as x * 2 or x.T) is not matched by pattern: the
lowerer computes the reduce's two factors at the staged positions, so any elementwise or
movement graph feeding the product is staged. The pass shows at PORTKIT_DEBUG=3 as LOCAL and
BARRIER nodes in the kernel; `Tiling` is what the tuner (portkit/schedule/search.py) varies.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import ceil, prod

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen.plan import load_steps
from portkit.graph import GraphOp, Lazy
from portkit.symbolic import Bound, Lin, const, ravel, unravel

_MIN_SIDE = 8      # smaller matmuls keep the untiled lowering: a tile would be mostly padding
# A convolution's output rows fold onto its columns until m has this many elements: ResNet's
# 3x3 convs on the 7 x 7 map (m = 7) were not tiled at all, 7 groups of 256 threads on an H200
# (0.87 ms, 16x cuDNN), and a 14-wide m wastes an eighth of a 16-row tile.
FOLD_ROWS = 64


@dataclass(frozen=True)
class Tiling:
    """One workgroup tile: threads per group and outputs per thread along m and n, and the
    K elements staged per BARRIER step."""

    threads_m: int = 16
    threads_n: int = 16
    per_thread_m: int = 4
    per_thread_n: int = 4
    depth: int = 16
    contiguous: bool = False      # a thread's outputs adjacent (else strided by the threads)
    unroll: int = 4               # depth steps written out per loop iteration (divides depth)

    @property
    def block_m(self) -> int:
        return self.threads_m * self.per_thread_m

    @property
    def block_n(self) -> int:
        return self.threads_n * self.per_thread_n

    @property
    def threads(self) -> int:
        return self.threads_m * self.threads_n

    def local_bytes(self, itemsize: int) -> int:
        return (self.block_m + self.block_n) * self.depth * itemsize

    def fits(self, caps: Capabilities, itemsize: int) -> bool:
        """True if `caps` can launch this tile: threads per group and LOCAL bytes."""
        return (self.threads > 0 and self.threads <= min(caps.max_block_threads, caps.max_block[0])
                and self.local_bytes(itemsize) <= caps.local_memory_bytes
                # every thread stages a whole number of panel elements
                and self.block_m * self.depth % self.threads == 0
                and self.block_n * self.depth % self.threads == 0
                and self.unroll > 0 and self.depth % self.unroll == 0)


# Candidates, the default first; the tuner times them all, and the untiled lowering (UNTILED).
# The default, 4 x 16 adjacent outputs per thread in 32-thread groups, is what PoCL and lavapipe
# (work-items run as loops a C-like compiler vectorizes) run fastest: at about the speed of the
# untiled kernel, where the GPU layout below it (outputs strided by the threads, the usual start
# on hardware lanes) runs 5x slower there. On a GPU, `PORTKIT_BEAM` picks among them all.
CANDIDATES = (
    Tiling(8, 4, 4, 16, 16, True), Tiling(8, 2, 4, 32, 16, True), Tiling(4, 4, 8, 16, 16, True),
    Tiling(8, 8, 2, 8, 16, True), Tiling(8, 8, 2, 2, 16, True),
    Tiling(16, 16, 4, 4, 16), Tiling(16, 16, 4, 4, 32), Tiling(16, 16, 8, 8, 16),
    Tiling(8, 8, 8, 8, 16), Tiling(8, 8, 4, 4, 16), Tiling(16, 16, 2, 2, 16),
)
UNTILED = Tiling(0, 0, 0, 0, 0)   # a tuner's verdict: LOCAL tiling does not pay here
# On a device that states its compute units, a default tiling of fewer groups than FILL per
# unit gives way to the next candidate that makes that many: BERT's 3072-to-768 projection
# (M = 128) made 48 groups of 32 threads in the default's 32 x 64 tiles, 0.4 ms on an H200's
# 132 multiprocessors (1.2 TFLOP/s), where 16 x 16 tiles make 384 groups of 64. On lavapipe
# (no units stated) the smaller tiles ran 2.5x slower.
FILL = 2


@dataclass(frozen=True)
class Contraction:
    """Where the matmul sits in a kernel: the reduce, its two factors, and its axes."""

    reduce: Lazy
    left: Lazy             # the factor that ignores axis n (A)
    right: Lazy            # the factor that ignores axis m (B)
    m: int
    n: int
    k: int
    accumulate: DType      # float32 for 16-bit floats
    contiguous_k: tuple[bool, bool]   # whether left, right step by 1 along k somewhere
    fold: tuple[int, ...] = ()        # output axes before m read as part of it (outer first)
    k_fold: tuple[int, ...] = ()      # reduced axes read as part of k, row-major (outer first)
    n_fold: tuple[int, ...] = ()      # output axes before n read as part of it (outer first)

    @property
    def m_axes(self) -> tuple[int, ...]:
        """The output axes that together are m, outer first (m itself last)."""
        return (*self.fold, self.m)

    @property
    def n_axes(self) -> tuple[int, ...]:
        """The output axes that together are n, outer first (n itself last)."""
        return (*self.n_fold, self.n)

    @property
    def k_axes(self) -> tuple[int, ...]:
        """The reduced axes that together are k, outer first (k itself last)."""
        return (*self.k_fold, self.k)

    @property
    def sizes(self) -> tuple[int, int, int]:
        shape = self.reduce.src[0].shape
        return (prod(shape[a] for a in self.m_axes), prod(shape[a] for a in self.n_axes),
                prod(shape[a] for a in self.k_axes))

    def key(self) -> str:
        """The structure the best tiling depends on: shapes, axes, dtype, operand layouts."""
        layout = "".join("k" if along else "-" for along in self.contiguous_k)
        folded = "".join(f"f{a}" for a in self.fold) + "".join(f"r{a}" for a in self.k_fold)
        folded += "".join(f"c{a}" for a in self.n_fold)
        return (f"{self.reduce.src[0].shape}|{folded}m{self.m}n{self.n}k{self.k}|{layout}|"
                f"{self.reduce.dtype.name}")


def find(root: Lazy, inputs: list[Lazy], caps: Capabilities) -> Contraction | None:
    """The contraction `root` computes from kernel `inputs` if it can be LOCAL-tiled on
    `caps`, else None."""
    if caps.threads_are_loops or caps.max_block_threads == 1 or caps.local_memory_bytes <= 0:
        return None
    return match(root, inputs, rows=FOLD_ROWS)


def match(root: Lazy, inputs: list[Lazy], rows: int = 0, depths: bool = False,
          ints: bool = False) -> Contraction | None:
    """The contraction `root` computes from kernel `inputs` (a float sum of one product over
    one axis, outputs along m and n at least _MIN_SIDE wide), on any device; None if it is not
    one. With `rows`, m-like output axes just before m are folded into it until m has at least
    `rows` elements (a convolution's output rows onto its 7-wide columns). With `depths`, a
    sum over several axes is one too, k their row-major flattening (a conv's weight gradient
    sums over the batch and the output positions). With `ints`, an integer sum is one too, of
    a product or of a product cast to the sum's dtype (uint8 @ int8: int16 products summed in
    int32)."""
    node = root
    if (node.op is GraphOp.VIEW and node.arg.is_contiguous
            and prod(node.shape) == prod(node.src[0].shape)):
        node = node.src[0]     # the reshape that drops the reduced axis (not a shrink)
    if node.op is not GraphOp.REDUCE or not (node.dtype.is_float or ints and node.dtype.is_int):
        return None
    op, axes = node.arg
    src = node.src[0]
    if node.dtype.is_int and src.op is Op.CAST and src.src[0].dtype.is_int:
        src = src.src[0]
    if op is not Op.ADD or not (len(axes) == 1 or depths) or src.op is not Op.MUL:
        return None
    if any(src is x for x in inputs):
        # a sum of a buffer, however it was computed: its factors lie outside the kernel, where
        # analysing their loads walks the whole unrealized graph before it (0.7 s for one
        # gradient's sum in an LSTM's first training step on webgpu)
        return None
    *k_fold, k = sorted(axes)
    left, right = src.src
    outputs = [a for a, s in enumerate(src.shape) if s > 1 and a not in axes]

    def ignores(factor: Lazy, axis: int) -> bool:
        return all(s == 0 for s in load_steps(factor, inputs, f"o{axis}"))

    ms = [a for a in outputs if ignores(right, a) and not ignores(left, a)]
    ns = [a for a in outputs if ignores(left, a) and not ignores(right, a)]
    if not ms or not ns:
        return None
    m, n = ms[-1], ns[-1]
    fold: tuple[int, ...] = ()
    while (m - len(fold) - 1) in ms and prod(src.shape[a] for a in (*fold, m)) < rows:
        fold = (m - len(fold) - 1, *fold)
    depth = prod(src.shape[a] for a in axes)
    if min(prod(src.shape[a] for a in (*fold, m)), src.shape[n], depth) < _MIN_SIDE:
        return None
    wide = dtypes.float32 if node.dtype.is_float and node.dtype.itemsize == 2 else node.dtype
    along_k = (1 in load_steps(left, inputs, f"o{k}"), 1 in load_steps(right, inputs, f"o{k}"))
    return Contraction(node, left, right, m, n, k, wide, along_k, fold, tuple(k_fold))


def choose(found: Contraction, caps: Capabilities, tuned: Tiling | None = None
           ) -> Tiling | None:
    """The tiling to use (None: none): `tuned` if it fits, else the first candidate that fits,
    wastes at most a third of its tile on padding (or, failing that, the least) and, where the
    device states its compute units, makes FILL groups per unit (or, failing that, the most)."""
    itemsize = found.accumulate.itemsize
    m, n, k = found.sizes
    batch = prod(found.reduce.src[0].shape) // (m * n * k)

    def groups(t: Tiling) -> int:
        return batch * ceil(m / t.block_m) * ceil(n / t.block_n)

    def fits(t: Tiling) -> bool:
        return t.fits(caps, itemsize) and groups(t) <= caps.max_grid[0]

    if tuned == UNTILED:
        return None
    if tuned is not None and fits(tuned):
        return tuned
    fitting = [t for t in CANDIDATES if fits(t)]
    if not fitting:
        return None

    def waste(t: Tiling) -> float:
        return ceil(m / t.block_m) * t.block_m * ceil(n / t.block_n) * t.block_n / (m * n)

    good = [t for t in fitting if waste(t) <= 1.34] or [min(fitting, key=waste)]
    if caps.compute_units is None:
        return good[0]
    return next((t for t in good if groups(t) >= FILL * caps.compute_units),
                max(good, key=groups))


def emit(lowerer, root: Lazy, found: Contraction, tiling: Tiling, out: int) -> Kernel:
    """The tiled kernel storing `root` into buffer `out`; `lowerer` (lower.py's) has its
    PARAMs and VARs set and lowers the factors at the staged positions."""
    b = lowerer.b
    red = found.reduce
    shape = red.src[0].shape
    m_size, n_size, k_size = found.sizes
    t = tiling
    batch = [a for a in range(len(shape)) if a not in (*found.m_axes, found.n, found.k)]
    grid_shape = tuple(shape[a] for a in batch) + (ceil(m_size / t.block_m),
                                                   ceil(n_size / t.block_n))
    groups = prod(grid_shape)
    group = lowerer.new_var("g", 0, groups - 1, b.special("group", 0))
    lane = lowerer.new_var("l", 0, t.threads - 1, b.special("local", 0))
    *batch_idx, tile_m, tile_n = unravel(group, grid_shape)
    thread_m, thread_n = unravel(lane, (t.threads_m, t.threads_n))
    # a thread's outputs within the tile: strided by the thread counts (neighbouring threads,
    # neighbouring words), or a contiguous run (lanes a C compiler vectorizes within a thread)
    if t.contiguous:
        rows = [thread_m * t.per_thread_m + r for r in range(t.per_thread_m)]
        columns = [thread_n * t.per_thread_n + r for r in range(t.per_thread_n)]
    else:
        rows = [thread_m + r * t.threads_m for r in range(t.per_thread_m)]
        columns = [thread_n + r * t.threads_n for r in range(t.per_thread_n)]
    wide = found.accumulate
    panels = {found.m: b.local(wide, t.block_m * t.depth),
              found.n: b.local(wide, t.block_n * t.depth)}
    zero = lowerer.const(0.0, wide)
    accs = [b.acc(zero) for _ in range(t.per_thread_m * t.per_thread_n)]
    steps = ceil(k_size / t.depth)
    step_node = b.add(Op.RANGE, dtypes.int32, (lowerer.const(0), lowerer.const(steps)))
    lowerer.scopes.append({})
    step = lowerer.new_var("k", 0, steps - 1, step_node)

    def base() -> list[Lin]:
        idx = [const(0)] * len(shape)
        for axis, value in zip(batch, batch_idx):
            idx[axis] = value
        return idx

    for side, (factor, axes, tile) in enumerate(((found.left, found.m_axes, tile_m),
                                                 ((found.right, (found.n,), tile_n)))):
        block = t.block_m if side == 0 else t.block_n
        at = base()
        at[found.k] = step * t.depth       # the panel's first element: (tile * block, at)
        _stage(lowerer, factor, panels[axes[-1]], at, (axes, found.k), tile * block,
               (m_size if side == 0 else n_size, k_size), lane, found.contiguous_k[side], t,
               block, wide)
    b.barrier()
    # the depth loop `unroll` steps at a time: a driver that loops over work-items (PoCL) then
    # vectorizes each thread's straight-line products; all of it unrolled costs compile time
    inner_node = b.add(Op.RANGE, dtypes.int32, (lowerer.const(0),
                                                lowerer.const(t.depth // t.unroll)))
    lowerer.scopes.append({})
    inner = lowerer.new_var("kk", 0, t.depth // t.unroll - 1, inner_node) * t.unroll
    for copy in range(t.unroll):
        lefts = [b.load(panels[found.m], lowerer.index(rows[r] + (inner + copy) * t.block_m))
                 for r in range(t.per_thread_m)]
        rights = [b.load(panels[found.n], lowerer.index(columns[r] + (inner + copy) * t.block_n))
                  for r in range(t.per_thread_n)]
        for acc, (x, y) in zip(accs, product(lefts, rights)):
            b.assign(acc, b.alu(Op.ADD, acc, b.alu(Op.MUL, x, y)))
    b.add(Op.END, None, (inner_node,))
    lowerer.scopes.pop()
    b.barrier()
    b.add(Op.END, None, (step_node,))
    lowerer.scopes.pop()
    for acc, (rm, rn) in zip(accs, product(range(t.per_thread_m), range(t.per_thread_n))):
        idx = base()
        row = tile_m * t.block_m + rows[rm]
        _place(idx, found.m_axes, shape, row)
        idx[found.n] = tile_n * t.block_n + columns[rn]
        gate = lowerer.condition((Bound(row, 0, m_size), Bound(idx[found.n], 0, n_size)), None)
        value = acc if wide == red.dtype else b.cast(acc, red.dtype)
        flat = ravel(idx, red.shape)
        b.store(out, lowerer.index(flat), value, gate)
    return b.build(grid=(groups, 1, 1), block=(t.threads, 1, 1))


def _place(idx: list[Lin], axes: tuple[int, ...], shape, position: Lin) -> None:
    """Sets `idx` along `axes` (outer first, read as one row-major axis) to `position`."""
    if len(axes) == 1:
        idx[axes[0]] = position
        return
    for axis, value in zip(axes, unravel(position, tuple(shape[a] for a in axes))):
        idx[axis] = value


def _stage(lowerer, factor: Lazy, panel: int, first: list[Lin],
           axes: tuple[tuple[int, ...], int], start: Lin, sizes: tuple[int, int], lane: Lin,
           along_k: bool, t: Tiling, block: int, wide: DType) -> None:
    """Every thread stores its share of the block x depth panel of `factor` from row `start`
    (along axes[0], several axes read as one) and index `first` along the reduced axes[1] into
    `panel` at [column * block + row]: zeros past the operand's edges (`sizes`), 16-bit floats
    widened. Threads walk the operand's contiguous axis (k when `along_k`) so that neighbouring
    threads load neighbouring elements."""
    b = lowerer.b
    along, k = axes
    shape = factor.shape
    for j in range(block * t.depth // t.threads):
        element = lane + j * t.threads
        if along_k:
            row, column = unravel(element, (block, t.depth))
        else:
            column, row = unravel(element, (t.depth, block))
        at, position = list(first), start + row
        _place(at, along, shape, position)
        at[k] = first[k] + column
        gate = lowerer.condition((Bound(position, 0, sizes[0]), Bound(at[k], 0, sizes[1])), None)
        value, = lowerer.lower(factor, [at], [gate])
        if b.dtype(value) != wide:
            value = b.cast(value, wide)
        if gate is not None:
            value = b.alu(Op.WHERE, gate, value, lowerer.const(0.0, wide))
        b.store(panel, lowerer.index(column * block + row), value)
