"""Per-row decoding: on a device whose threads are loops, an elementwise kernel's thread loops
over rows of its output with an inner loop along the last axis.

A flat loop over elements decodes every element's position with a div and a mod per axis
(`t % 58`, `t / 58 % 64`), and clang keeps such a loop scalar: a padded or permuted copy then
runs at a fraction of the memory's speed. Looping over rows decodes a row's position once, and
the inner loop's indices are plain strides, which vectorize (tests/codegen/test_conv_tiles.py
checks that no div or mod is left inside the inner loop). `lower` emits the two loops.

Short trailing axes (a pool's window (..., W / k, k), the unit axis of a sum over one element,
an (re, im) pair) are unrolled into each step of the inner loop, which then runs along the axis
before them: as the inner loop they would be too short, and as part of a flat loop each element
would pay a div and a mod.
"""
from __future__ import annotations

from math import prod

from portkit.symbolic import Bound, Lin, Var

# Shorter rows keep the flat loop: an inner loop of a few iterations vectorizes badly.
MIN_ROW = 8
# The most elements of short trailing axes that one step of the inner loop computes.
MAX_TAIL = 8


def row_length(tile_shape: tuple[int, ...], elementwise_on_loops: bool) -> tuple[int, int]:
    """(the inner loop's length, how many short trailing axes each of its steps unrolls) when a
    thread decodes its tiles' positions once per row (given a kernel without a tiled reduce on
    a device whose threads are loops), else (1, 0)."""
    if not elementwise_on_loops:
        return 1, 0
    tail = 0
    while (tail < len(tile_shape) - 1 and tile_shape[-1 - tail] < MIN_ROW
           and prod(tile_shape[len(tile_shape) - 1 - tail:]) <= MAX_TAIL):
        tail += 1
    axis = len(tile_shape) - 1 - tail
    if axis >= 1 and prod(tile_shape[:axis]) > 1 and tile_shape[axis] >= MIN_ROW:
        return tile_shape[axis], tail
    return 1, 0


def pieces(conds: list[Bound], column: Lin, outer: set[str]
           ) -> tuple[list[tuple[int, int]], tuple[Bound, ...]]:
    """Where a padded row's inner loop splits: its column ranges [first, end), of which one
    (when there are two or more) no gate linear in `column` (a Var) can fail in, and the gates
    that depend on nothing but variables in `outer` (the row's position), which hold or fail
    for the whole row.

    A padded copy's row reads its source through a gate per element (`c - 1 < 112`), and clang
    leaves a loop of gated loads scalar: a loop over the columns inside the padding loads with
    no gate, which vectorizes, and the gate of the row's position, tested once outside it,
    drops the gate of the whole row."""
    (atom, _), = column.terms
    first, end = atom.min, atom.max + 1
    hoisted: list[Bound] = []
    for cond in conds:
        names = _names(cond.expr)
        if atom.name not in names:
            if names <= outer:
                hoisted.append(cond)
            continue
        coef = dict(cond.expr.terms).get(atom, 0)
        rest = cond.expr + column * -coef
        if not coef or atom.name in _names(rest):
            continue                    # inside a div or a mod: the gate stays
        if coef > 0:    # lo <= coef * c + rest < hi for every rest in [rest.min, rest.max]
            first = max(first, -((rest.min - cond.lo) // coef))
            end = min(end, (cond.hi - 1 - rest.max) // coef + 1)
        else:
            first = max(first, -((cond.hi - 1 - rest.max) // -coef))
            end = min(end, (cond.lo - rest.min) // coef + 1)
    low, high = atom.min, atom.max + 1
    if first >= end or (first, end) == (low, high):
        return [(low, high)], tuple(hoisted)
    spans = [(low, first), (first, end), (end, high)]
    return [(a, b) for a, b in spans if a < b], tuple(hoisted)


def _names(expr: Lin) -> set[str]:
    out: set[str] = set()
    for atom, _ in expr.terms:
        out |= {atom.name} if isinstance(atom, Var) else _names(atom.expr)
    return out
