"""How a packed contraction (codegen/pack.py) walks its axes: a conv's depth K = channels x kh x
kw as a loop per channel and tap (`taps`), and the output axes that fold into one m or n
(`flatten`), so that no position along them costs a division in the multiply-add loop."""
from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import cast

from portkit.codegen.plan import divides, gates, load_steps
from portkit.codegen.tiles import Contraction
from portkit.graph import Lazy
from portkit.symbolic import ravel, var


def taps(found: Contraction, inputs: list[Lazy], depth: int) -> tuple[int, ...]:
    """The inner sizes one k axis unravels into at its factors' positions: (kh, kw) for a
    conv, whose K = channels x kh x kw is read as (k // 9, k // 3 % 3, k % 3). Sizes are split
    off from the inside, each the smallest divisor of what is left that frees the counters
    outside it of divisions. () for a k read flat (a matmul's, a 1x1 conv's), a sum over
    several axes, or windows larger than a depth block."""
    if found.k_fold:
        return ()
    shape = found.reduce.src[0].shape

    def divided(sizes: list[int], names: set[str]) -> bool:
        idx = [var(f"o{a}", 0, s - 1) for a, s in enumerate(shape)]
        idx[found.k] = ravel([var(f"t{i}", 0, s - 1) for i, s in enumerate(sizes)], tuple(sizes))
        return any(divides(factor, inputs, idx, names) for factor in (found.left, found.right))

    sizes = [shape[found.k]]
    while divided(sizes, {f"t{len(sizes) - 1}"}):
        last, name = sizes[-1], {f"t{len(sizes) - 1}"}
        split = next((d for d in range(2, last) if last % d == 0 and not divided(
            [*sizes[:-1], last // d, d], name)), None)
        if split is None:
            return ()
        sizes[-1:] = [last // split, split]
    if len(sizes) == 1 or prod(sizes[1:]) > depth:
        return ()
    return tuple(sizes[1:])


def flatten(found: Contraction, inputs: list[Lazy], width: int = 0
            ) -> tuple[Contraction, bool]:
    """`found` read the way the output lies, and whether A reads all of its m as one axis.
    Where m holds the output's contiguous axis and B reads it, and every output axis between
    n and it, as one axis (a 1x1 conv's positions h * 56 + w, B its input [cin][h * w]), the
    factors trade places: n is those positions, so the register block's lanes and its
    stores run along them (a 1x1 conv 24 -> 144 on 56 x 56 ran at 3x the speed of its
    transpose, whose stores were 32 channels 12 KiB apart). So does a conv walked by taps
    whose output row fills whole blocks of `width` lanes (32-wide maps), n its row alone.
    Else the output axes before m that A reads as its continuation fold into m, which then
    costs no division."""
    shape = found.reduce.src[0].shape
    outputs = [a for a, size in enumerate(shape) if size > 1 and a not in found.k_axes]
    if not found.k_fold and outputs and outputs[-1] in found.m_axes:
        swapped = replace(found, left=found.right, right=found.left, m=found.n, n=found.m,
                          contiguous_k=found.contiguous_k[::-1], fold=())
        columns = continued(swapped.right, swapped.left, swapped.n, inputs, outputs)
        # every output axis after n (a conv's positions, not only its row) is one run in B
        after = {a for a in outputs if a > found.n}
        # a 3x3 conv's row (a padded input's, 34 apart for 32 outputs) read as n: B's panel
        # is one contiguous copy per channel and tap, A the weights in place, and stores run
        # along the row. As m, one group per row and block width of channels copied the
        # weights scalar and stored 32 channels 4 KiB apart: 32 -> 64 channels on 32 x 32 ran
        # at half the rate of 64 -> 128 on 16 x 16 (AVX-512, one thread: 44 against 88 GFLOP/s)
        row = bool(width) and shape[swapped.n] % width == 0 and bool(
            taps(swapped, inputs, shape[found.k]))
        if columns is not None and after and (after <= {*columns, swapped.n} or row):
            return replace(swapped, n_fold=columns), True
    rows = continued(found.left, found.right, found.m, inputs, outputs)
    if rows is None or not set(found.fold) <= set(rows):
        return found, False
    return replace(found, fold=rows), True


def continued(reader: Lazy, other: Lazy, axis: int, inputs: list[Lazy], outputs: list[int]
              ) -> tuple[int, ...] | None:
    """The output axes just before `axis` (outer first) that `reader` reads, ungated, as the
    continuation of `axis` (h before w in a row-major [h][w]) and `other` ignores; None where
    `reader`'s position along `axis` is gated or not a constant step."""
    steps_along = load_steps(reader, inputs, f"o{axis}")
    index = [var(f"o{a}", 0, size - 1) for a, size in enumerate(reader.shape)]
    if None in steps_along or not any(steps_along) or gates(reader, inputs, index):
        return None
    along = cast("list[int]", steps_along)
    span, folded = reader.shape[axis], list[int]()
    for before in reversed([a for a in outputs if a < axis]):
        steps = load_steps(reader, inputs, f"o{before}")
        between = range(before + 1, folded[0] if folded else axis)
        if any(reader.shape[a] > 1 for a in between) or any(
                step != first * span for step, first in zip(steps, along)) or any(
                load_steps(other, inputs, f"o{before}")):
            break
        folded.insert(0, before)
        span *= reader.shape[before]
    return tuple(folded)


def batch_rows(found: Contraction, inputs: list[Lazy], rows: int) -> Contraction:
    """`found` with the batch axes B ignores folded into m, outermost, where m already folds
    short output rows and is shorter than `rows`: a conv over a batch of small maps."""
    shape = found.reduce.src[0].shape
    if found.sizes[0] >= rows or not found.fold or found.k_fold:
        return found
    taken = {*found.m_axes, *found.n_axes, *found.k_axes}
    batch = [a for a, size in enumerate(shape) if size > 1 and a not in taken]
    if not batch or any(any(load_steps(found.right, inputs, f"o{a}")) for a in batch):
        return found
    return replace(found, fold=(*batch, *found.fold))


def few_rows(found: Contraction, inputs: list[Lazy], width: int) -> Contraction:
    """`found` with its factors traded where m is a few rows (a quarter to half of `width`
    lanes: a recurrent step's batch of 16) and B reads n only across its rows (x @ W.T): m is then
    W's rows, read in place, and n the few rows, whose panel is a small copy of x. As it was,
    each group copied a panel of W.T, a gather of 32 rows at every k, for 16 rows of
    multiply-adds: h @ W.T for 16 x 256 by 1024 x 256 ran at 30 GFLOP/s on one thread."""
    m, n, _ = found.sizes
    if (found.fold or found.k_fold or found.n_fold or not width // 4 <= m <= width // 2
            or n < width or not all(found.contiguous_k)
            or 1 in load_steps(found.right, inputs, f"o{found.n}")):
        return found
    return replace(found, left=found.right, right=found.left, m=found.n, n=found.m,
                   contiguous_k=found.contiguous_k[::-1])
