"""How a packed contraction (codegen/pack.py) is blocked: register rows and columns, register
blocks and panels per workgroup, K per depth block, chosen from its sizes, what its operands
cost to evaluate and the device's workgroup memory; and the matrix unit, if the device declares
one that runs its register block."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, prod

from portkit.abi.backend import Capabilities
from portkit.abi.dtypes import DType
from portkit.abi.matrix import MatrixUnit, fragment
from portkit.abi.ops import Op
from portkit.codegen.plan import hot_bytes
from portkit.codegen.tiles import Contraction
from portkit.graph import GraphOp, Lazy

# Register blocks per workgroup along m, at most: more reuse one B panel more often (copying
# the panels cost a quarter of matmul 1024's time at 8; 32 ran it at 1.5-2x the speed of 8),
# fewer give more workgroups to share among cores.
BLOCKS = 32


@dataclass(frozen=True)
class Packing:
    """The blocking of one packed matmul: register rows and columns, register blocks per
    workgroup along m, and K elements per panel."""

    rows: int
    width: int
    blocks: int
    depth: int
    spans: int = 1          # panels along n per workgroup (one depth block, or a staged A)
    packed_a: bool = False  # A's block computed once per group and depth block into LOCAL
    summed: bool = True     # several depth blocks: running sums in LOCAL
    along_k: bool = False   # the staged A is [row][k] (A steps by 1 along k), else [k][row]
    taps: tuple[int, ...] = ()  # k's inner sizes, each walked as a loop (a conv's kh, kw)
    unit: MatrixUnit | None = None  # the matrix unit the block's multiply-adds run on (pack.py)

    def local_bytes(self, itemsize: int) -> int:
        staged = self.depth * self.rows * self.blocks if self.packed_a else 0
        # running sums for every block and panel, or one register block's (one depth block)
        sums = self.rows * self.width * (self.blocks * self.spans if self.summed else 1)
        return (self.depth * self.width + staged + sums) * itemsize


_TRANSPOSING = 8    # what a copy that transposes B costs an element, in A's staging's ops


def spanned(packings: list[Packing], found: Contraction, inputs: list[Lazy],
            caps: Capabilities, wanted: int, counts: tuple[int, int, int], need: int,
            unspanned: Packing | None) -> Packing | None:
    """The packing of a contraction whose A is staged per group and depth block (a weight
    gradient's sum over the batch and the output positions, or an A that is more than a
    load) whose groups span several panels along n, if one leaves `wanted` groups, fits the
    device's workgroup memory and evaluates the operands less than `unspanned` (the packing
    of one panel a group, if any): each group stages its A block once for all its panels and
    copies each B panel once for all its register blocks, and keeps their running sums in
    LOCAL. Of those, the one that evaluates the operands least (A's staging weighted as 2
    ops, B's copy as `need`, or 8 times that where the copy transposes B), then the deepest.

    A copy that transposes (B read along k: x @ W.T's W) loads and stores an element at a
    time, where A's staging runs in vectors: layer 2 of the MLP, relu(h + b) @ W.T with
    64 x 512 by 512 x 512, took 0.95 ms spanning 4 panels of 16 rows (A staged 4x less, B
    copied 4x more), 0.57 spanning 2 of 32 rows, 0.47 with one panel of all 64 rows (one
    thread). A weight gradient's sum over several axes keeps `need`: its spans were measured
    with it."""
    tiles, panels, batch = counts
    m, n = found.sizes[:2]
    cost = max(evaluation_cost(found.left, {id(x) for x in inputs}), 2)
    need *= _TRANSPOSING if found.contiguous_k[1] and not found.k_fold else 1

    def evaluations(p: Packing) -> int:
        return operand_evaluations(cost, need, (m, n), (tiles, panels), p)
    best: tuple[tuple[int, int], Packing] | None = None
    for packing in packings:
        for spans in (d for d in range(2, panels + 1) if panels % d == 0):
            wider = replace(packing, spans=spans)
            groups = batch * (tiles // packing.blocks) * (panels // spans)
            if groups < wanted or wider.local_bytes(
                    found.accumulate.itemsize) > caps.local_memory_bytes:
                continue
            key = (evaluations(wider), -packing.depth)
            if best is None or key < best[0]:
                best = key, wider
    if best is None or unspanned is not None and evaluations(unspanned) <= best[0][0]:
        return None
    return best[1]


def rows_per_block(found: Contraction, reuse: int, m: int, flat: bool = False) -> int:
    """Register rows per block: the most, up to `reuse`, that divide m's last axis (A is read
    in place, ungated, and a block of a folded m stays within one output row), or all of m for
    a sum over several axes (its staged A is read flat) or an m that A reads as one axis
    (`flat`, folds.py `flatten`); or `reuse` with a remainder block
    where m is one axis that no more than reuse // 2 rows divide (ViT's 197 tokens: 8-row
    blocks, the last group shifted back to end at m, instead of 1-row blocks), or whose
    blocks fit one group and recompute at most a sixteenth of its rows (a 56-wide conv row in
    3-row blocks: 19 blocks, one row twice, instead of 28 2-row blocks, at 1.5x the speed on
    AVX2)."""
    shape = found.reduce.src[0].shape
    row = m if found.k_fold or flat else shape[found.m]
    # a block may span whole rows of one image (the axes folded next to m), as a 4 x 4 map's
    # 8 x 32 blocks do: their rows' places are worked out once per block
    image, axis = row, found.m - 1
    while axis in found.fold:
        image, axis = image * shape[axis], axis - 1
    rows = max(d for d in range(1, reuse + 1) if row % d == 0 or (
        found.fold and not flat and d % row == 0 and image % d == 0))
    if (found.fold and not flat) or found.k_fold or not rows < reuse <= row:
        return rows
    # a longer m is split among groups by the divisors of its block count, which a remainder
    # leaves few of (256 rows in 3s: 86 blocks, 2 per group at most, where 2 x 32 blocks ran
    # matmul 256 at 1.7x the speed)
    few = 16 * (reuse - row % reuse) <= row and ceil(row / reuse) <= BLOCKS
    return reuse if 2 * rows <= reuse or few else rows


def blocks_per_group(tiles: int, rows: int, m: int, staged: bool, most: int = BLOCKS
                     ) -> list[int]:
    """Register blocks per workgroup along m, up to `most`: those that divide the blocks m
    needs; with A staged per group (whose last group is shifted back whole), those that span
    no more than m."""
    return [d for d in range(1, most + 1) if tiles % d == 0 and (
        not staged or m % rows == 0 or d * rows <= m)]


def one_block(found: Contraction, inputs: list[Lazy], caps: Capabilities,
              wanted: int, base: Packing, tiles: int, panels: int, batch: int,
              copy: tuple[int, bool] = (1, False), staged: bool = False,
              most: int = BLOCKS) -> Packing | None:
    """The packing of a reduce that fits one depth block (a weight gradient: K is the batch).
    Its A block is worth computing once per group into LOCAL when A is more than a load (the
    MLP's relu gradient, a softmax's): a group then spans several panels along n. The blocking
    minimizes the operands' evaluations, each weighted by its ops, A's once per group along
    n, B's once per group along m, over those that fit and leave `wanted` groups or, where
    B's copy is costly, span one panel; `copy`: B's ops and whether its copy is costly;
    `staged`: A is staged whatever it costs; `most`: register blocks per group, at most."""
    m, n = found.sizes[:2]
    need, costly = copy
    cost = max(evaluation_cost(found.left, {id(x) for x in inputs}), 2 if staged else 1)
    itemsize = found.accumulate.itemsize
    best: Packing | None = None
    best_cost: tuple[int, int, int] | None = None
    for blocks in blocks_per_group(tiles, base.rows, m, cost > 1, most):
        # a plain load of A is read in place, as in the deeper matmuls: one panel per group
        for spans in (d for d in range(1, panels + 1) if panels % d == 0 and cost > 1 or d == 1):
            packed_a = cost > 1
            packing = Packing(base.rows, base.width, blocks, base.depth, spans, packed_a,
                              summed=False, along_k=base.along_k,
                              taps=base.taps)
            groups = batch * (tiles // blocks) * (panels // spans)
            if groups < wanted and (blocks, spans) != (1, 1) and (not costly or spans > 1):
                continue
            if packing.local_bytes(itemsize) > hot_bytes(caps):
                continue
            total = operand_evaluations(cost, need, (m, n), (tiles, panels), packing)
            # ties: more groups (cores), then more blocks per group (fewer loops)
            if best_cost is None or (total, -groups, -blocks) < best_cost:
                best, best_cost = packing, (total, -groups, -blocks)
    return best


def operand_evaluations(cost: int, need: int, sizes: tuple[int, int],
                        counts: tuple[int, int], packing: Packing) -> int:
    """How many ops a packing spends evaluating its operands: A's `cost` per element once
    per group along n, B's `need` once per group along m (`counts`: register blocks along m,
    panels along n)."""
    (m, n), (tiles, panels) = sizes, counts
    return cost * (panels // packing.spans) * m + need * (tiles // packing.blocks) * n


def evaluation_cost(node: Lazy, params: set[int]) -> int:
    """What computing one element of `node` costs, roughly: its loads and ops, but for integer
    casts that keep every value (uint8 -> int16: part of the load)."""
    seen: set[int] = set()
    stack, cost = [node], 0
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        widening = x.op is Op.CAST and _keeps(x.src[0].dtype, x.dtype)
        if id(x) in params or x.op is GraphOp.LOAD or isinstance(x.op, Op) and not widening:
            cost += 1
        if id(x) not in params:
            stack.extend(x.src)
    return max(cost, 1)


def on_unit(found: Contraction, caps: Capabilities, packing: Packing | None
            ) -> Packing | None:
    """`packing` with the first matrix unit the device declares that runs its register block
    (`runs_block`), if any; None where `packing` is None, or the contraction is an integer sum
    that no unit runs (the multiply-adds per element are float's)."""
    if packing is None:
        return None
    unit = next((u for u in caps.matrix_units if runs_block(u, found, packing)), None)
    if unit is None:
        return None if found.accumulate.is_int else packing
    # depth blocks of whole groups of the unit's k terms (a block of 129 terms takes 130);
    # with taps, of whole groups of channels, a group's terms k channels at one tap, which a
    # staged A holds side by side, [row][k] (pack.py `unit_groups`)
    taps = prod(packing.taps)
    return replace(packing, unit=unit, along_k=packing.along_k or bool(packing.taps),
                   depth=ceil(packing.depth // taps / unit.k) * unit.k * taps)


def runs_block(unit: MatrixUnit, found: Contraction, packing: Packing) -> bool:
    """Whether `unit` runs the register block of `packing`: the contraction's dtypes (its
    factors' values those of the unit's inputs, `widened_from`); one
    thread's 1 x n tile, n dividing the block's width; A's k terms, in order, one row's
    (broadcast); B's n columns of k terms each, interleaved by k (the panel's layout). With
    a conv's taps, the unit's k terms are k channels at one tap (pack.py `unit_groups`), so
    its channels are whole groups of k. Not with a k folded from several axes, whose walks
    step one k at a time."""
    k, n = unit.k, unit.n
    layout = (fragment(1, k, lambda t, e: (0, e)),
              fragment(1, k * n, lambda t, e: (e % k, e // k)),
              fragment(1, n, lambda t, e: (0, e)))
    return ((unit.m, unit.threads, unit.a, unit.b, unit.c) == (1, 1, *layout)
            and (unit.a_dtype, unit.b_dtype, unit.acc_dtype) == (
                widened_from(found.left), widened_from(found.right), found.accumulate)
            and packing.width % n == 0
            and not found.k_fold
            and not (packing.taps and found.sizes[2] // prod(packing.taps) % k))


def widened_from(node: Lazy) -> DType:
    """The dtype whose values `node` holds: through views and integer casts that keep every
    value (uint8 -> int16, as portkit promotes uint8 @ int8), the narrowest; else its own."""
    while node.op is GraphOp.VIEW or node.op is Op.CAST and _keeps(node.src[0].dtype, node.dtype):
        node = node.src[0]
    return node.dtype


def _keeps(narrow: DType, wide: DType) -> bool:
    """Whether every integer of dtype `narrow` is one of `wide`."""
    if not (narrow.is_int and wide.is_int):
        return False
    if narrow.kind == wide.kind:
        return wide.bits >= narrow.bits
    return narrow.kind == "uint" and wide.bits > narrow.bits
