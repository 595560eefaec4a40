"""Counted loops for lowerings that build kernels in Python `with` blocks: a RANGE, its END and
its counter as an index variable of the lowerer (codegen/lower.py's), one block at a time."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.symbolic import Lin, const


class loop:
    """`with loop(lowerer, name, trips[, end]) as i`: a RANGE from 0 to `end` (a node; the
    constant `trips` by default), i its counter as an index variable below `trips`."""

    def __init__(self, lowerer, name: str, trips: int, end: int | None = None):
        self.lowerer, self.name, self.trips, self.end = lowerer, name, trips, end

    def __enter__(self) -> Lin:
        low = self.lowerer
        end = low.const(self.trips) if self.end is None else self.end
        self.node = low.b.add(Op.RANGE, dtypes.int32, (low.const(0), end))
        low.scopes.append({})
        return low.new_var(self.name, 0, self.trips - 1, self.node)

    def __exit__(self, *exc) -> None:
        self.lowerer.b.add(Op.END, None, (self.node,))
        self.lowerer.scopes.pop()


@contextmanager
def nested(lowerer, name: str, bounds: list[tuple[int, int | None]]) -> Iterator[list[Lin]]:
    """`with nested(lowerer, name, [(trips, end), ...]) as counters`: a `loop` per bound,
    outer first."""
    if not bounds:
        yield []
        return
    (trips, end), *inner = bounds
    with loop(lowerer, name, trips, end) as counter, nested(lowerer, name, inner) as rest:
        yield [counter, *rest]


@contextmanager
def block_outputs(lowerer, rows: int, width: int, rows_inner: bool
                  ) -> Iterator[tuple[Lin, Lin]]:
    """`with block_outputs(lowerer, rows, width, rows_inner) as (row, column)`: loops over a
    register block's outputs, its rows innermost where `rows_inner`."""
    if rows_inner:
        with loop(lowerer, "mc", width) as column, loop(lowerer, "mr", rows) as row:
            yield row, column
    else:
        with loop(lowerer, "mr", rows) as row, loop(lowerer, "mc", width) as column:
            yield row, column


@contextmanager
def panel_of(lowerer, spans: int) -> Iterator[Lin]:
    """The panel a group is at: a loop over its `spans` panels, or panel 0 without a loop."""
    if spans == 1:
        yield const(0)
        return
    with loop(lowerer, "ns", spans) as span:
        yield span
