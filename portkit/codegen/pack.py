"""Packed panels: a matmul-shaped kernel on a device whose threads are loops (a CPU), with its
B operand copied into contiguous panels in workgroup memory (LOCAL) and its A operand read in
place, so the inner loop streams memory and the C compiler keeps the register block in vectors.

For C[..., m, n] = sum_k A[..., m, k] * B[..., k, n], each workgroup (one thread) owns a block
of `rows` x `width` outputs (width = `Limits.vector`, e.g. 32 float32: two 512-bit vectors) and
walks K in blocks of `depth`; the register block is sized to the device's vector registers
(plan.py `register_block`):
- it copies the B panel B[k0:k0+depth, n0:n0+width] into LOCAL as [depth][width] (zeros past
  N's edge), whatever B's layout: x @ W.T reads W along k, and the panel is then contiguous
  along n. The copy is its own short loop, paid once per workgroup and depth block;
- for each register block of `Limits.reuse` rows (8 x 32 with AVX-512: sixteen 16-lane
  accumulators; 3 x 32 with AVX2: twelve 8-lane ones), it
  sums the depth block's products into fresh registers, with MULACC where the device has it
  (the C renderer writes fma(), one rounding, which the compiler makes a vector FMA), and adds
  them into the block's running sums, kept in LOCAL: blocked summation, as the untiled reduce
  does, so no register adds more than `depth` terms;
- at the end it stores the sums, rounded once to the output dtype (float16 and bfloat16 are
  summed in float32, as torch does).
Workgroups run along n fastest, so neighbouring groups (on one core, see the launcher) share
A's rows in the cache. The pass shows at PORTKIT_DEBUG=3 as two LOCALs and no BARRIER. When K
fits one depth block the registers are the sums: stored straight to the output where they are
stored as they are along its rows, else through a small LOCAL, from which a loop stores them.
When A is more than a load (a relu mask of dy, relu(h + b), a softmax's gradient, fused in by
the scheduler), each group computes A's block once per depth block into a second LOCAL, laid
out in A's own order ([row][k] when A steps by 1 along k, else [k][row]) so the copy loop
vectorizes, and the multiply-add loop only reads it. When K also fits one depth block (a weight
gradient, K = the batch) the group spans several panels along n, so A is evaluated once per
group instead of once per panel.
An output at most half a block wide (a classifier's logits) takes half-width blocks, and a
small matmul gets fewer workgroups than a few cores' worth (each is worth waking a core for).
A 1x1 conv on NCHW (MobileNet's and EfficientNet's expansions and projections) is read the way
its output lies: n is its positions h * w, one axis of the input [cin][h * w], m its output
channels, so the lanes and the stores run along the positions (codegen/folds.py).
What an operand is (a load, x.T, a fused x * 2) is not matched by pattern: the lowerer computes
the reduce's factors at the panel's positions, as codegen/tiles.py does for GPU-class devices.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import product
from math import ceil, prod

from portkit.abi.backend import Capabilities
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen import folds
from portkit.codegen.blocking import (
    BLOCKS,
    Packing,
    blocks_per_group,
    evaluation_cost,
    on_unit,
    one_block,
    rows_per_block,
    spanned,
)
from portkit.codegen.counted import block_outputs, loop, nested, panel_of
from portkit.codegen.plan import (
    SERIAL,
    Limits,
    hot_bytes,
    load_steps,
    register_block,
    serial,
    under_epilogue,
)
from portkit.codegen.tiles import Contraction, match
from portkit.graph import GraphOp, Lazy
from portkit.symbolic import Bound, Lin, const, ravel, unravel

# K elements per panel, at most: 256 x 32 float32 is 32 KiB, which stays in L1 (48 KiB on the
# 2-core AVX-512 Xeon measured, where 256 ran matmul 1024 at 1.2x the speed of 128).
DEPTH = 256
_MIN_GROUPS = 16     # enough workgroups to keep a few cores busy and balanced
_PER_UNIT = 4        # a weight gradient's workgroups per compute unit the device states
_MIN_WORK = 1 << 15  # smaller matmuls (m * n * k) keep the untiled lowering
_GROUP_WORK = 1 << 17   # multiply-adds worth a workgroup of their own (tens of microseconds)
_L1_WAY = 4096          # bytes: addresses this far apart share an L1 set (x86's 32-48 KiB)
_L1_WAYS = 8            # lines an L1 set holds (32 KiB, 8-way: Zen 4, Skylake)
_LINE = 64              # bytes in a cache line


def find(root: Lazy, inputs: list[Lazy], caps: Capabilities,
         limits: Limits | None = None) -> tuple[Contraction, Packing] | None:
    """The contraction `root` computes and its packing on `caps`, if packing pays there: a
    device whose threads are loops, with workgroup memory for the panels; else None. `limits`:
    the register block's, by default sized to the device's registers."""
    if not serial(caps) or caps.local_memory_bytes <= 0:
        return None
    limits = limits or register_block(caps)
    reduce = under_epilogue(root, {id(x) for x in inputs})
    # integer sums only where a matrix unit may run them (`packed`)
    ints = any(unit.acc_dtype.is_int for unit in caps.matrix_units)
    # a conv's output rows fold into m where its row is short (7 wide at ResNet's last stage):
    # 49 rows give 7 x 32 register blocks, 7 of them sharing each B panel
    found = None if reduce is None else match(reduce, inputs, rows=limits.vector, depths=True,
                                              ints=ints)
    if reduce is None or found is None:
        return None
    if folds.taps(found, inputs, DEPTH) and reduce.src[0].shape[found.m] % limits.reuse == 0:
        # a conv walked by taps folds rows until a group can take BLOCKS register blocks, as
        # B's panel copy costs about 32 rows' multiply-adds (one thread, AVX-512: a 56-wide
        # row a group ran 64 -> 128 channels at 70 GFLOP/s, four rows at 87); where the
        # register rows do not divide the row (AVX2's 3 on 56) it keeps its remainder block
        found = match(reduce, inputs, rows=limits.reuse * BLOCKS, depths=True,
                      ints=ints) or found
    found, flat = folds.flatten(found, inputs, limits.vector)
    found = folds.batch_rows(found, inputs, limits.reuse * BLOCKS)
    few = folds.few_rows(found, inputs, limits.vector)
    # traded, the few rows are one vector of lanes, and W's rows take all the accumulators
    # (16 x 16 ran h @ W.T 16 x 256 by 1024 x 256 at 1.2x the speed of 8 x 16)
    reuse = limits.accumulators // (limits.vector // 2) if few is not found else limits.reuse
    found = few
    m, n, k = found.sizes
    if m * n * k < _MIN_WORK or n < limits.vector // 4:
        return None
    # a narrow output (a classifier's 10 logits) takes half a block: one vector of float32
    width = limits.vector if n > limits.vector // 2 else limits.vector // 2
    # a sum over several axes (a conv's weight gradient: batch and output positions) stages
    # its A, whose position along the flat k is then worked out once per staged element, not
    # once per multiply-add; its register rows divide all of m, as the staged A is read flat.
    # It is staged row by row ([row][k]), so that a row's position in a folded m (a channel
    # and a kernel tap) is worked out once per row: per element, it cost a stride-2 conv's
    # weight gradient 2.8x its forward's time. Where m is one axis along which A steps by 1
    # and k is not (a linear layer's weight gradient over batch and time, dy.T @ x with dy
    # [b, t, 1024]), it is staged k by k ([k][row]): row by row, each row read its k terms
    # 4 KiB apart, all in one L1 set, and the copy cost more than the multiply-adds
    folded_k = bool(found.k_fold)
    along_m = not found.fold and 1 in load_steps(found.left, inputs, f"o{found.m}")
    along_k = found.contiguous_k[0] or folded_k and not along_m
    # a folded m read in place (a conv's short rows) with k walked flat (a 1x1 conv's) keeps
    # SERIAL's rows however few the registers: while a 3x3 conv's A cost divisions per k,
    # paid once per block, a block that spilled still outran a small one (AVX2, 7 x 32
    # against the 2 x 32 and 1 x 32 blocks that fit: 1.6x on a 28 x 28 map, 1.2x on 14 x 14,
    # 2.6x on 7 x 7). A weight gradient's folded m reads a staged A, and its 3 x 32 blocks
    # ran at 1.3-1.4x its 8 x 32 on AVX2.
    # (an m that A reads as one axis, `flat`, has no short rows)
    short_rows = found.fold and not found.k_fold and not flat
    rows = rows_per_block(found, max(limits.reuse, SERIAL.reuse) if short_rows else reuse, m,
                          flat)
    taps = folds.taps(found, inputs, DEPTH)
    if short_rows and taps:
        # walked by taps, A's position costs no division: the blocks that fit the registers
        # win (AVX2, one thread: 2 x 32 ran a 3x3 conv on 28 x 28 at 1.4x 7 x 32's speed, one
        # of stride 2 onto 28 x 28 at 1.5x), with SERIAL's rows in narrower blocks where few
        # of the registers' rows divide the row (7 x 8 ran a 7 x 7 map at 1.6x 7 x 32's)
        fitting = rows_per_block(found, limits.reuse, m)
        if 2 * fitting > limits.reuse:
            rows = fitting
        while rows * width > limits.accumulators and width > limits.vector // 4:
            width //= 2
    tiles = ceil(m / rows)
    batch = prod(found.reduce.src[0].shape) // (m * n * k)
    # enough groups for a few cores, but no more than the work is worth splitting into
    wanted = max(1, min(_MIN_GROUPS, m * n * k // _GROUP_WORK))
    if folded_k and caps.compute_units:
        # a weight gradient's groups, fewer where the device states few units, take more
        # blocks and panels each, and stage their operands less (2 units: 8 groups, which ran
        # a 64 -> 128 3x3 conv's on 16 x 16 at 1.13x the speed of 16 groups, one thread)
        wanted = min(wanted, _PER_UNIT * caps.compute_units)
    # B's panel is copied by each group along m, in a loop of its own that costs more than
    # the multiply-adds where B is more than a load (a projection's input, hardswish(x + b)
    # times the squeeze-excite gate) or a 1x1 conv's positions ending part way into a panel
    # (a small map: with the last panel's copy ungated, once per panel still ran 240 -> 40
    # on 14 x 14, 576 -> 96 on 7 x 7 and 40 -> 240 on 14 x 14 at 1.5-1.9x the speed of a copy
    # per group, AVX-512, one thread). Such a B is copied once per panel: a group
    # takes all of m's blocks, and panels narrow to half the block's width (16 float32) where
    # that leaves fewer groups than wanted (16-wide ran as fast as 32-wide, 8-wide 1.2-1.3x
    # slower: AVX-512, one thread)
    need = evaluation_cost(found.right, {id(x) for x in inputs})
    costly = need > 1 or bool(found.n_fold) and n % width != 0
    whole = max(blocks_per_group(tiles, rows, m, True))  # all of m's blocks, up to 32
    while costly and width > limits.vector // 2 and \
            batch * ceil(n / width) * (tiles // whole) < wanted:
        width //= 2
    panels = ceil(n / width)
    itemsize = found.accumulate.itemsize
    if k <= DEPTH:
        # a matmul whose m A reads as one axis keeps one register block's sums in LOCAL here,
        # so more blocks cost no LOCAL: 35 blocks of 8 rows (two groups along m, each copying
        # W.T's panels) ran the LSTM's head, 560 x 256 by 2000 x 256, at 1.1x the speed of 14
        plain = flat and not (found.k_fold or found.n_fold or taps)
        packing = one_block(found, inputs, caps, wanted,
                            Packing(rows, width, 1, k, along_k=along_k, taps=taps),
                            tiles, panels, batch, (need, costly), folded_k,
                            2 * BLOCKS if plain else BLOCKS)
        packing = on_unit(found, caps, packing)
        return None if packing is None else (found, packing)
    # an A that is more than a load (layer 2's relu(h + b), a relu mask of dy) is staged per
    # depth block into LOCAL, out of the multiply-add loop, where the compiler vectorizes it;
    # then register blocks come first (the staged block repays more rows), depth second
    staged = folded_k or evaluation_cost(found.left, {id(x) for x in inputs}) > 1
    choices = [(most, blocks) for most in (DEPTH, DEPTH // 2, DEPTH // 4)
               for blocks in sorted(blocks_per_group(tiles, rows, m, staged), reverse=True)]
    if staged:
        choices.sort(key=lambda choice: -choice[1])
    # where no blocking leaves `wanted` groups, the fallback is the fewest blocks per group,
    # as many groups as there are: one block, unless B's copy is costly (above)
    counts = sorted({blocks for _, blocks in choices})
    fallback = counts[-1] if costly else 1
    packings = []
    for most, blocks in choices:
        # with taps, a depth block holds whole windows: `per` channels times every tap, a
        # divisor of the channels where one fills half the block (64 channels of 3x3 taps:
        # 16, four whole blocks), else as many per block as the blocks need
        unit, channels = prod(taps), k // prod(taps)
        fit = max(1, most // unit)
        per = max(d for d in range(1, fit + 1) if channels % d == 0) if taps else 0
        per = per if 2 * per >= fit else ceil(channels / ceil(channels / fit))
        packings.append(Packing(rows, width, blocks, per * unit, packed_a=staged,
                                along_k=along_k, taps=taps))
    # the deepest panel, then the most register blocks per group that divide m's, leave
    # enough groups, and fit the device's workgroup memory (at most `hot_bytes` of it)
    chosen = next((packing for packing in packings if (
        batch * panels * (tiles // packing.blocks) >= wanted or packing.blocks in (fallback, 1))
        and packing.local_bytes(itemsize) <= hot_bytes(caps)), None)
    if staged:
        # or groups of several panels where they evaluate the operands less: a weight
        # gradient's, or a staged A that is more than a load (attention's q, k and v input
        # gradients concatenated, staged once for 8 panels instead of once a panel: 1024 x
        # 768 by 768 x 256 at 2x the speed, one thread)
        chosen = spanned(packings, found, inputs, caps, wanted, (tiles, panels, batch), need,
                         chosen) or chosen
    chosen = on_unit(found, caps, chosen)
    return None if chosen is None else (found, chosen)


def emit(lowerer, root: Lazy, found: Contraction, packing: Packing, caps: Capabilities,
         out: int) -> Kernel:
    """The packed kernel storing `root` (the contraction, or an elementwise epilogue of it) into
    buffer `out`; `lowerer` (lower.py's) has its PARAMs and VARs set and lowers the factors at
    the panel's positions."""
    b, p = lowerer.b, packing
    red = found.reduce
    shape = red.src[0].shape
    m_size, n_size, k_size = found.sizes
    wide = found.accumulate
    batch = [a for a in range(len(shape))
             if a not in (*found.m_axes, *found.n_axes, *found.k_axes)]
    across = p.rows * p.blocks          # rows per workgroup
    grid_shape = (*(shape[a] for a in batch), ceil(m_size / across),
                  ceil(n_size / p.width) // p.spans)
    groups = prod(grid_shape)
    # the MOD is a no-op on this grid; it tells a C compiler every index's range
    group_node = b.alu(Op.MOD, b.special("group", 0), lowerer.const(groups))
    group = lowerer.new_var("g", 0, groups - 1, group_node)
    *batch_idx, tile_m, tile_n = unravel(group, grid_shape)
    # Where `rows` does not divide m (a remainder block, `rows_per_block`), the last block
    # starts at m - rows instead, so that A's rows stay in place and ungated, and stores only
    # the rows the block before it did not; with A staged per group, the last group is
    # shifted so.
    remainder = m_size % p.rows != 0

    def first_row(t: Lin) -> tuple[Lin, Lin]:
        """Block t's first row, and the row where its new rows begin."""
        nominal = (tile_m * p.blocks + t) * p.rows
        if not remainder:
            return nominal, nominal
        if p.packed_a:
            start, shift = tile_m * across, m_size - across
        else:
            start, shift = nominal, m_size - p.rows
        last, at_start = lowerer.const(shift), lowerer.index(start)
        first = lowerer.new_var("m", 0, shift, b.alu(
            Op.WHERE, b.alu(Op.CMPLT, at_start, last), at_start, last))
        return (first + t * p.rows, start) if p.packed_a else (first, start)

    def at(m: Lin, n: Lin, k: Lin) -> list[Lin]:
        idx = [const(0)] * len(shape)
        for axis, value in zip(batch, batch_idx):
            idx[axis] = value
        for axis, value in zip(found.m_axes, unravel(m, tuple(shape[a] for a in found.m_axes))):
            idx[axis] = value
        for axis, value in zip(found.k_axes, unravel(k, tuple(shape[a] for a in found.k_axes))):
            idx[axis] = value
        for axis, value in zip(found.n_axes, unravel(n, tuple(shape[a] for a in found.n_axes))):
            idx[axis] = value
        return idx

    edge = n_size % p.width != 0        # the last panel is partly past N: staged as zeros
    # B's rows along n crowd an L1 set: more of the panel's rows map to one set than it has
    # ways (rows 4 KiB apart all share one; 2 KiB apart, 16 of 32 rows share each of two).
    # Otherwise its k-outer copy, whose panel stores are contiguous, ran faster (one thread,
    # AVX2: x @ W.T for 16 x 256 x 1024 and 16 x 768 x 3072 at 1.3-1.6x the row-wise copy's;
    # AVX-512 EPYC: 20 x 768 x 256 at 1.07x), and row by row where they crowd (64 x 512 x
    # 512: 1.3x the k-outer copy's, whose 32 rows at each k were a gather)
    row_bytes = [step * found.right.dtype.itemsize
                 for step in load_steps(found.right, lowerer.inputs, f"o{found.n}") if step]
    # (lines, not elements: a B that steps by one element along n, as a 1x1 conv's input
    # does, fills two lines with its 32 columns, which crowd nothing)
    crowded = any(max(Counter(line % (_L1_WAY // _LINE) for line in
                              {j * size // _LINE for j in range(p.width)}).values()) > _L1_WAYS
                  for size in row_bytes)

    def write(t: Lin, r: Lin | int, column: Lin, value: int, first: tuple[Lin, Lin]) -> None:
        """Stores register block t's output (r, column), rounded to the output's dtype; `first`
        is first_row(t)."""
        row = first[0] + r
        conds: tuple[Bound, ...] = (Bound(column, 0, n_size),) if edge else ()
        if edge:    # stored only before N: its position needs no modulo by N (one per output)
            column = lowerer.new_var("sc", 0, n_size - 1, lowerer.index(column))
        idx = at(row, column, const(0))
        if remainder:               # rows the block before stored already are not stored
            conds += (Bound(row + first[1] * -1, 0, m_size),)
        gate = lowerer.condition(conds, None) if conds else None
        value = value if wide == red.dtype else b.cast(value, red.dtype)
        flat = ravel(idx, red.shape)
        if root is not red and not (root.op is GraphOp.VIEW and root.src[0] is red):
            # an epilogue (an optimizer's W - lr * grad): the root at this element, with the
            # reduce's value taken from the registers; its own loads gated like the store
            lowerer.fixed[id(red)] = value
            value, = lowerer.lower(root, [unravel(flat, root.shape)], [gate])
            del lowerer.fixed[id(red)]
        b.store(out, lowerer.index(flat), value, gate)

    # a block's stores run along the output's contiguous axis: its rows where they are
    # positions and its columns channels (a stem's 7x7 stride-2 conv, whose 32 channels per
    # row lie 49 KiB apart), else its columns
    strides = [prod(red.shape[a + 1:]) for a in range(len(red.shape))]
    rows_inner = strides[found.n_axes[-1]] != 1 and strides[found.m_axes[-1]] == 1
    # on a matrix unit, B's panel holds the unit's input dtype, [depth / k][width][k]: the
    # unit's k terms of a column side by side, as its B operand reads them
    unit = p.unit
    group = 1 if unit is None else unit.k
    panel = b.local(wide if unit is None else unit.b_dtype, p.depth * p.width)

    def slot(kk: Lin, j: Lin | int, h: int = 0) -> Lin:
        """Where the panel holds column j of k step kk (group kk, term h on a unit)."""
        return kk * p.width + j if unit is None else (kk * p.width + j) * group + h
    # K's last terms, where it ends part way into a group of the unit's: their group, in the
    # last depth block
    tail = k_size % group
    blocks_k = ceil(k_size / p.depth)
    last_group = const((k_size - tail - (blocks_k - 1) * p.depth) // group)

    def in_last_block(name: str) -> loop:
        """A loop of one trip in the last depth block and none in the others (an MMA node
        may not sit in an IF)."""
        last = b.alu(Op.CMPLT, lowerer.const(blocks_k - 2), lowerer.index(block))
        return loop(lowerer, name, 1, b.alu(Op.WHERE, last, lowerer.const(1), lowerer.const(0)))
    # a staged A holds the unit's input dtype on a unit, else the sums'
    staged = b.local(wide if unit is None else unit.a_dtype, p.depth * across) \
        if p.packed_a else None

    def at_a(row: Lin, kk: Lin) -> Lin:
        """Where the staged A holds (row, kk)."""
        return row * p.depth + kk if p.along_k else kk * across + row
    zero = lowerer.const(0.0, wide)
    # one depth block (k <= DEPTH, as in the MLP's weight gradient): the registers are the
    # sums. Stored as they are, ungated, along the output's rows, they go straight to it, a
    # vector store per run of lanes (through LOCAL, zeroed, added into and copied out, a 1x1
    # conv of 16 channels, EfficientNet's 16 -> 96 on 112 x 112, spent a fifth of its time
    # there); else they pass through LOCAL for a loop to store them: a 7 x 32 block's 224
    # stores, unrolled, each with its own copy of the epilogue, were most of a 1x1 conv's C
    # and 40% of its compile
    single = k_size <= p.depth
    direct = (single and not edge and not remainder and not rows_inner and wide == red.dtype
              and (root is red or root.op is GraphOp.VIEW and root.src[0] is red))
    # None where every block is stored from its registers
    sums = None if direct else b.local(wide, (p.rows if single else across * p.spans) * p.width)

    def running(span: Lin, t: Lin, r: Lin | int, column: Lin | int) -> Lin:
        """Where the running sums hold panel `span`'s register block t's (r, column)."""
        return ((span * p.blocks + t) * p.rows + r) * p.width + column
    if sums is not None and not single:
        with loop(lowerer, "z", across * p.spans * p.width) as z:
            b.store(sums, lowerer.index(z), zero)
    # a sum over several axes walks a depth block as (runs, run) loops, a run being the last
    # k axis (an output row), where runs fit the block whole: an operand's position is then
    # affine in the inner counter, a contiguous copy the C compiler makes vector loads, where
    # the flat counter cost a div and a mod of it per staged element (scalar code)
    run = shape[found.k_axes[-1]] if found.k_fold else 1
    run = run if 1 < run < p.depth and p.depth % run == 0 else 1
    # a conv's K (channels x kh x kw, read as k // 9, k // 3 % 3, k % 3) walks its channels and
    # taps as loops of their own, so that no operand's position divides a counter: the
    # divisions per k ran the multiply-add loop of a 3x3 conv at half the matmul's rate. The
    # loop with the most trips is innermost (the channels of a 3x3 conv, the stem's 7 columns)
    taps = prod(p.taps)
    unit_step = run if run > 1 else taps

    def walk(name: str) -> Iterator[tuple[Lin, Lin]]:
        """The depth block's position (in the panel and the staged A) and k there: one loop,
        runs of `run`, or a loop per channel and tap (above)."""
        if p.taps:
            trips = [p.depth // taps, *p.taps]
            order = sorted(range(len(trips)), key=lambda i: (i == trips.index(max(trips)), i))
            with nested(lowerer, name, [(trips[i], ends[1] if i == 0 else None)
                                        for i in order]) as counters:
                at_loop = dict(zip(order, counters))
                window = ravel([at_loop[i] for i in range(1, len(trips))], p.taps)
                # the channel as a variable of its own range: the last block's ragged end
                # leaves block * per + c's range past the channels, and a modulo by them
                channels = k_size // taps
                channel = lowerer.new_var(name + "c", 0, channels - 1, lowerer.index(
                    block * trips[0] + at_loop[0]))
                yield ravel(counters, tuple(trips[i] for i in order)), channel * taps + window
            return
        if run == 1:
            with loop(lowerer, name, p.depth, ends[0]) as kk:
                yield kk, k0 + kk
            return
        with loop(lowerer, name + "r", p.depth // run, ends[1]) as runs, \
                loop(lowerer, name, run) as kk:
            yield runs * run + kk, k0 + runs * run + kk

    def unit_groups(name: str) -> Iterator[tuple[Lin, list[Lin]]]:
        """The depth block's groups of the unit's k terms: each group's place and its terms'
        k. With taps, a group is `group` channels at one tap (the sum taken in another order),
        walked as a loop over groups of channels and one per tap (no division)."""
        if not p.taps:
            with loop(lowerer, name, p.depth // group, ends[-1]) as g:
                yield g, [k0 + g * group + h for h in range(group)]
            return
        trips = (p.depth // (taps * group), *p.taps)
        with nested(lowerer, name, [(trips[0], ends[-1])] + [(t, None) for t in p.taps]
                    ) as counters:
            window = ravel(counters[1:], p.taps)
            channel = lowerer.new_var(name + "c", 0, k_size // taps - group, lowerer.index(
                block * (p.depth // taps) + counters[0] * group))
            yield ravel(counters, trips), [(channel + h) * taps + window for h in range(group)]
    with loop(lowerer, "kb", blocks_k) as block:
        k0 = block * p.depth
        ends = []
        # the block's end, in terms, in runs or windows, and in a unit's groups of k terms
        # (of k channels at every tap, with taps: `unit_groups`)
        for step in (1, unit_step) + (() if unit is None else (group * taps,)):
            end = lowerer.const(p.depth // step)
            if k_size % p.depth:
                left = b.alu(Op.ADD, lowerer.const(k_size // step), b.alu(
                    Op.MUL, lowerer.index(block), lowerer.const(-p.depth // step)))
                end = b.alu(Op.WHERE, b.alu(Op.CMPLT, left, end), left, end)
            ends.append(end)
        if p.packed_a:
            group_row = first_row(const(0))[0]
            # A's block, computed once for every panel the group spans, in A's order
            def stage(kk: Lin, k: Lin, i: Lin) -> None:
                value, = lowerer.lower(found.left, [at(group_row + i, const(0), k)], [None])
                value = value if b.dtype(value) == b.dtype(staged) else b.cast(
                    value, b.dtype(staged))
                b.store(staged, lowerer.index(at_a(i, kk)), value)
            if unit is not None and p.taps:
                # a group's terms side by side ([row][k], on_unit), as the unit reads them
                with loop(lowerer, "am", across) as i:
                    for g, ks in unit_groups("ak"):
                        for h, k in enumerate(ks):
                            stage(g * group + h, k, i)
            elif p.along_k:
                with loop(lowerer, "am", across) as i:
                    for kk, k in walk("ak"):
                        stage(kk, k, i)
            else:
                for kk, k in walk("ak"):
                    with loop(lowerer, "am", across) as i:
                        stage(kk, k, i)
        with panel_of(lowerer, p.spans) as span:
            column0 = (tile_n * p.spans + span) * p.width
            # the last panel copies its columns before N, whose positions then need no modulo
            # by N and no gate (per element, they kept the copy scalar: a 64 -> 240 3x3 conv
            # ran at 0.6x the speed of 64 -> 256), and zeros the rest in a loop of its own
            valid, end = const(p.width), None
            if edge:
                left, width = lowerer.index(column0 * -1 + n_size), lowerer.const(p.width)
                valid = lowerer.new_var("pv", 1, p.width, b.alu(
                    Op.WHERE, b.alu(Op.CMPLT, left, width), left, width))
                end = lowerer.index(valid)

            def copy(where: Lin, k: Lin, j: Lin) -> None:
                column = lowerer.new_var("pc", 0, n_size - 1, lowerer.index(column0 + j)) \
                    if edge else column0 + j
                value, = lowerer.lower(found.right, [at(const(0), column, k)], [None])
                value = value if b.dtype(value) == b.dtype(panel) else b.cast(
                    value, b.dtype(panel))
                b.store(panel, lowerer.index(where), value)

            def copy_group(g: Lin, j: Lin, ks: list[Lin] | None = None) -> None:
                for h in range(group):
                    copy(slot(g, j, h), k0 + g * group + h if ks is None else ks[h], j)
            # B read along its rows (a conv's output gradient along the output positions,
            # x @ W.T's W): across n its `width` rows lie a plane or a row apart, 4 KiB on a
            # 32 x 32 map or for K = 1024, and walking them all at each k evicts each other
            # from their L1 sets
            along_rows = found.contiguous_k[1] and (found.k_fold or crowded)
            if unit is not None and p.taps:
                for g, ks in unit_groups("pk"):
                    with loop(lowerer, "pn", p.width, end) as j:
                        copy_group(g, j, ks)
            elif unit is not None:  # k groups outer, or columns where B is read along its rows
                loops = [(p.depth // group, ends[-1]), (p.width, end)]
                with nested(lowerer, "pk", loops[::-1] if along_rows else loops) as (outer, inner):
                    copy_group(*((inner, outer) if along_rows else (outer, inner)))
            elif along_rows:
                with loop(lowerer, "pn", p.width, end) as j:
                    for kk, k in walk("pk"):
                        copy(slot(kk, j), k, j)
            else:
                for kk, k in walk("pk"):
                    with loop(lowerer, "pn", p.width, end) as j:
                        copy(slot(kk, j), k, j)
            panel_zero = lowerer.const(0.0, b.dtype(panel))
            if tail:
                # the last group of k terms, where K ends part way into it: zeros past K
                with in_last_block("pl"), loop(lowerer, "pt", p.width, end) as j:
                    for h in range(group):
                        if h < tail:
                            copy(slot(last_group, j, h), const(k_size - tail + h), j)
                        else:
                            b.store(panel, lowerer.index(slot(last_group, j, h)), panel_zero)
            if edge:
                rest = lowerer.index((valid * -1 + p.width) * group)
                with loop(lowerer, "pz", p.depth // group) as kk, \
                        loop(lowerer, "pzn", p.width * group, rest) as j:
                    b.store(panel, lowerer.index(slot(kk, valid) + j), panel_zero)
            with loop(lowerer, "mb", p.blocks) as t:
                accs = [b.acc(zero) for _ in range(p.rows * p.width)]
                first = first_row(t)
                row0 = first[0]
                if found.fold and not p.packed_a:
                    # the rows' places along a folded m (an image, an output row) are worked
                    # out once per block, outside its multiply-add loop
                    for r in range(p.rows):
                        for axis, value in enumerate(at(row0 + r, const(0), const(0))):
                            if axis in found.m_axes:
                                lowerer.index(value)
                def multiply(g: Lin, ks: list[Lin]) -> None:
                    """One MMA node per register row and vector of the block, on k group g
                    of the panel (its terms past K are zeros; A's are `ks`)."""
                    assert unit is not None
                    n = unit.n
                    rights = [[b.load(panel, lowerer.index(slot(g, v * n) + e))
                               for e in range(n * group)] for v in range(p.width // n)]
                    if p.packed_a:
                        lefts = [b.load(staged, lowerer.index(at_a(t * p.rows + r, g * group + h)))
                                 for r in range(p.rows) for h in range(len(ks))]
                    else:
                        lefts = lowerer.lower(found.left, [at(row0 + r, const(0), k)
                                                           for r in range(p.rows) for k in ks],
                                              [None] * (p.rows * len(ks)))
                    # a factor widened from the unit's input dtype (`widened_from`) is cast
                    # back to it, which keeps every value
                    lefts = [x if b.dtype(x) == unit.a_dtype else b.cast(x, unit.a_dtype)
                             for x in lefts]
                    pad = [lowerer.const(0.0, unit.a_dtype)] * (group - len(ks))
                    for r, right in product(range(p.rows), range(len(rights))):
                        left = [*lefts[r * len(ks):(r + 1) * len(ks)], *pad]
                        own = accs[r * p.width + right * n:][:n]
                        b.add(Op.MMA, None, (*left, *rights[right], *own), unit)
                if unit is not None:
                    for g, ks in unit_groups("kk"):
                        multiply(g, ks)
                    if tail:
                        with in_last_block("kl"):
                            multiply(last_group, [const(k_size - tail + h) for h in range(tail)])
                else:
                    for kk, k in walk("kk"):
                        if p.packed_a:
                            lefts = [b.load(staged, lowerer.index(at_a(t * p.rows + r, kk)))
                                     for r in range(p.rows)]
                        else:
                            lefts = lowerer.lower(found.left, [at(row0 + r, const(0), k)
                                                               for r in range(p.rows)],
                                                  [None] * p.rows)
                        rights = [b.load(panel, lowerer.index(kk * p.width + j))
                                  for j in range(p.width)]
                        for acc, (x, y) in zip(accs, product(lefts, rights)):
                            x = x if b.dtype(x) == wide else b.cast(x, wide)
                            if Op.MULACC in caps.ops:
                                b.assign(acc, b.alu(Op.MULACC, x, y, acc))
                            else:
                                b.assign(acc, b.alu(Op.ADD, acc, b.alu(Op.MUL, x, y)))
                if sums is None:
                    # stored as they are: a run of lanes is one vector store (lanes.Flush)
                    for acc, (r, col) in zip(accs, product(range(p.rows), range(p.width))):
                        write(t, r, column0 + col, acc, first)
                else:
                    if single:
                        # zeroed, then added into: a run of lanes is one vector add (a Flush)
                        with loop(lowerer, "z", p.rows * p.width) as z:
                            b.store(sums, lowerer.index(z), zero)
                    for acc, (r, col) in zip(accs, product(range(p.rows), range(p.width))):
                        # this register block's sums, or the running sums of every block
                        where = lowerer.index(const(r * p.width + col) if single else
                                              running(span, t, r, col))
                        b.store(sums, where, b.alu(Op.ADD, b.load(sums, where), acc))
                if sums is not None and single:
                    with block_outputs(lowerer, p.rows, p.width, rows_inner) as (row, column):
                        value = b.load(sums, lowerer.index(row * p.width + column))
                        write(t, row, column0 + column, value, first)
    if sums is not None and not single:
        # the sums are in LOCAL, not registers: a loop over rows and columns stores them (one
        # store per element of the block, unrolled, was 40 kB of a 3x3 conv's C and half its
        # compile time)
        with panel_of(lowerer, p.spans) as span, loop(lowerer, "mo", p.blocks) as t:
            column0 = (tile_n * p.spans + span) * p.width
            first = first_row(t)
            with block_outputs(lowerer, p.rows, p.width, rows_inner) as (row, column):
                where = lowerer.index(running(span, t, row, column))
                write(t, row, column0 + column, b.load(sums, where), first)
    return b.build(grid=(groups, 1, 1), block=(1, 1, 1))
