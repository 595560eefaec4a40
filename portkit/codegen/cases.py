"""Joined pieces: a concatenation lowered on a device whose threads are loops over rows.

`cat` (portkit/tensor/movement.py) pads each piece to the full size and sums the pieces, so a
kernel lowered as it is evaluates every piece at every element: a padding gate and a gated
load per piece, and the gated loads keep a C compiler from vectorizing the row. A GPT-2 decode
step joins its key/value cache from 48 pieces (a stack of 12 layers of stacks of keys and
values, each the past cache and the new position) and ran that way at 0.1 GB/s.

Where every piece's gate depends only on a row's position (not on the column the row's loop
runs along), the pieces are disjoint and together cover the output, `cases` finds them, and
lower.py gives each row one test per piece and one plain loop for the piece that the row lies
in: a copy without gates, which vectorizes. A piece that is itself a join (the stack of
stacks) nests its own tests inside its piece's test.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.graph import GraphOp, Lazy
from portkit.symbolic import Bound, Div, Lin, Mod, Var, bounds, unravel

# a boolean cat joins its pieces with OR (booleans have no ADD)
_JOINS = (Op.ADD, Op.OR)


@dataclass(frozen=True)
class Case:
    """One piece of a join: where it lies (`conditions`, over the row's index), the piece's
    source at that place (`source` at multi-index `index`, or at flat position `flat` of a
    realized input), or the nested join (`inner`) that the piece is."""

    conditions: tuple[Bound, ...]
    source: Lazy
    index: list[Lin]
    flat: Lin
    inner: tuple[Case, ...] | None


def cases(node: Lazy, idx: list[Lin], params: set[int], column: str
          ) -> tuple[Case, ...] | None:
    """The pieces of `node` at `idx` when it is a join whose pieces are disjoint, cover it,
    and are told apart by conditions without variable `column`; else None."""
    if node.op not in _JOINS or id(node) in params:
        return None
    found: list[Case] = []
    for term in _terms(node, params):
        case = _piece(term, idx, params, column)
        if case is False:
            continue                    # padding everywhere here: adds nothing
        if case is None:
            return None
        found.append(case)
    if len(found) < 2 or not _cover(found):
        return None
    if any(not _apart(a, b) for k, a in enumerate(found) for b in found[k + 1:]):
        return None
    return tuple(found)


def _terms(node: Lazy, params: set[int]) -> list[Lazy]:
    """The operands of a tree of joins (a cat of three pieces is two ADDs)."""
    if node.op in _JOINS and id(node) not in params:
        return [t for src in node.src for t in _terms(src, params)]
    return [node]


def _piece(node: Lazy, idx: list[Lin], params: set[int], column: str
           ) -> Case | Literal[False] | None:
    """`node` as one padded piece: its Case; False where it is padding at every row; None
    where it is not a padded view or its padding depends on the column."""
    if node.op is not GraphOp.VIEW or id(node) in params:
        return None
    flat, conditions = node.arg.index(idx)
    kept = bounds(conditions)
    if kept is None:
        return False
    if not kept or any(column in _names(c.expr) for c in kept):
        return None
    source = node.src[0]
    views = node.arg.views
    split = views[0].split(idx, source.shape) if len(views) == 1 else None
    index = unravel(flat, source.shape) if split is None else split
    inner = None if id(source) in params else cases(source, index, params, column)
    return Case(kept, source, index, flat, inner)


def _base(cond: Bound) -> tuple[tuple, int, int]:
    """The condition as (its expression's terms, lo, hi) with the constant moved to the
    bounds, so that conditions on x + 1 and on x compare."""
    return cond.expr.terms, cond.lo - cond.expr.const, cond.hi - cond.expr.const


def _apart(a: Case, b: Case) -> bool:
    """Whether no row lies in both pieces: both bound one expression to disjoint ranges."""
    for x in map(_base, a.conditions):
        for y in map(_base, b.conditions):
            if x[0] == y[0] and (x[2] <= y[1] or y[2] <= x[1]):
                return True
    return False


def _cover(found: list[Case]) -> bool:
    """Whether every row lies in some piece: each piece bounds one and the same expression,
    and their ranges together span all the values it takes."""
    if any(len(case.conditions) != 1 for case in found):
        return False
    ranges = sorted(_base(case.conditions[0]) for case in found)
    terms = ranges[0][0]
    if any(r[0] != terms for r in ranges):
        return False
    expr = Lin(terms)
    reached = expr.min
    for _, lo, hi in ranges:
        if lo > reached:
            return False
        reached = max(reached, hi)
    return reached > expr.max


def _names(expr: Lin) -> set[str]:
    out: set[str] = set()
    for atom, _ in expr.terms:
        if isinstance(atom, Var):
            out.add(atom.name)
        elif isinstance(atom, Div | Mod):
            out |= _names(atom.expr)
    return out


def emit(lowerer, found: tuple[Case, ...], column: Lin, row: int, out: int, flat: Lin) -> None:
    """Per row: a test of each piece's conditions around one loop of `row` columns that stores
    that piece at `flat` in `out` (the ABI has no else: every piece is tested)."""
    b = lowerer.b
    (atom, _), = column.terms
    assert isinstance(atom, Var)
    name = atom.name
    for case in found:
        opener = b.add(Op.IF, None, (lowerer.condition(case.conditions, None),))
        lowerer.scopes.append({})
        if case.inner is not None:
            emit(lowerer, case.inner, column, row, out, flat)
        else:
            loop = b.add(Op.RANGE, dtypes.int32, (lowerer.const(0), lowerer.const(row)))
            lowerer.scopes.append({})
            lowerer.vars[name] = loop
            if id(case.source) in lowerer.params:
                value = lowerer.load(lowerer.params[id(case.source)], lowerer.index(case.flat),
                                     None)
            else:
                value = lowerer.lower(case.source, [case.index], [None])[0]
            b.store(out, lowerer.index(flat), value)
            b.add(Op.END, None, (loop,))
            lowerer.scopes.pop()
        b.add(Op.ENDIF, None, (opener,))
        lowerer.scopes.pop()
