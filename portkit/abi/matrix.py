"""Matrix units (tensor cores, WMMA, simdgroup matrices, systolic arrays) described as data.

A `MatrixUnit` is one tile multiply-accumulate a device runs natively: D = C + A·B with A of
M×K, B of K×N and C, D of M×N. `threads` consecutive threads of a workgroup (linear thread ids
t·threads .. t·threads + threads - 1) run it together, each holding a fragment of every operand:
`a[thread][element]` is the (row, col) of A that the thread's element holds, and `b` and `c` the
same for B and C. The layout is a table, not a formula, so any unit is described the same way
and the table is checked: every element of A and B is held by at least one thread (a unit that
replicates operands across threads, as AMD's WMMA does, lists the copies; each copy must carry
the same value), and every element of C by exactly one.

Kernels use a unit through the MMA node (ops.py); its semantics and error budget are in spec.py.
A unit that reads denormal inputs as zeros and writes denormal results as zeros (x86's DAZ and
FTZ, as vdpbf16ps does whatever MXCSR says) declares `denormals="flush"`; the spec's oracle then
flushes its inputs first.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from portkit.abi import dtypes
from portkit.abi.dtypes import DType

# [thread][element] -> (row, col) within the operand's tile.
Fragment = tuple[tuple[tuple[int, int], ...], ...]


@dataclass(frozen=True)
class MatrixUnit:
    """One tile multiply-accumulate a device runs natively, with its thread layout."""

    m: int
    n: int
    k: int
    threads: int          # threads that run one tile together (a warp, a wave, a simdgroup)
    a_dtype: DType        # A's element type
    b_dtype: DType        # B's element type
    acc_dtype: DType      # C's and D's element type: the products are summed in it
    a: Fragment           # (row in M, col in K) of each thread's A elements
    b: Fragment           # (row in K, col in N) of each thread's B elements
    c: Fragment           # (row in M, col in N) of each thread's C and D elements
    # "flush": denormal inputs (A, B and C) are read as zeros, denormal results written as zeros
    denormals: Literal["preserve", "flush"] = "preserve"

    @property
    def name(self) -> str:
        """A short name for messages and kernel names: "m16n8k16_float16_float32"."""
        inputs = self.a_dtype.name if self.a_dtype == self.b_dtype else (
            f"{self.a_dtype.name}x{self.b_dtype.name}")
        return f"m{self.m}n{self.n}k{self.k}_{inputs}_{self.acc_dtype.name}"

    @property
    def operand_counts(self) -> tuple[int, int, int]:
        """Elements per thread of A, B and C: the MMA node's sources come in these groups."""
        return len(self.a[0]), len(self.b[0]), len(self.c[0])

    def problems(self) -> list[str]:
        """What is malformed in this description, one sentence each (empty: none)."""
        found = []
        sizes = (self.m, self.n, self.k, self.threads)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            return [f"m, n, k and threads must be positive ints, got {sizes}"]
        for name in ("a_dtype", "b_dtype", "acc_dtype"):
            if not isinstance(getattr(self, name), DType):
                found.append(f"{name} must be a portkit DType, got {getattr(self, name)!r}")
        if self.denormals not in ("preserve", "flush"):
            found.append(f"denormals must be 'preserve' or 'flush', got {self.denormals!r}")
        if found:
            return found
        if not (self.acc_dtype.is_float or self.acc_dtype.is_int) or (
                self.acc_dtype.is_float != self.a_dtype.is_float):
            found.append(f"acc_dtype {self.acc_dtype} must be a number of A's kind "
                         f"({self.a_dtype})")
        for name, rows, cols, once in (("a", self.m, self.k, False), ("b", self.k, self.n, False),
                                       ("c", self.m, self.n, True)):
            found += _fragment_problems(name, getattr(self, name), self.threads, rows, cols, once)
        return found

    def to_json(self) -> dict[str, Any]:
        """The unit as JSON data (an MMA node's arg in a kernel's JSON)."""
        return {"m": self.m, "n": self.n, "k": self.k, "threads": self.threads,
                "a_dtype": self.a_dtype.name, "b_dtype": self.b_dtype.name,
                "acc_dtype": self.acc_dtype.name, "denormals": self.denormals,
                **{name: [[list(rc) for rc in row] for row in getattr(self, name)]
                   for name in ("a", "b", "c")}}

    @staticmethod
    def from_json(data: dict[str, Any]) -> MatrixUnit:
        """The inverse of `to_json`."""
        def table(rows: list) -> Fragment:
            return tuple(tuple((int(r), int(c)) for r, c in row) for row in rows)

        return MatrixUnit(data["m"], data["n"], data["k"], data["threads"],
                          dtypes.by_name(data["a_dtype"]), dtypes.by_name(data["b_dtype"]),
                          dtypes.by_name(data["acc_dtype"]),
                          table(data["a"]), table(data["b"]), table(data["c"]),
                          data.get("denormals", "preserve"))


def fragment(threads: int, elements: int, where: Callable[[int, int], tuple[int, int]]
             ) -> Fragment:
    """A layout table from its formula: `where(thread, element)` -> (row, col)."""
    return tuple(tuple(where(t, e) for e in range(elements)) for t in range(threads))


def _fragment_problems(name: str, table: Any, threads: int, rows: int, cols: int,
                       once: bool) -> list[str]:
    if not isinstance(table, tuple) or len(table) != threads:
        return [(f"{name} must hold one tuple per thread ({threads}), got "
                f"{len(table) if isinstance(table, tuple) else type(table).__name__}")]
    counts = {len(row) if isinstance(row, tuple) else -1 for row in table}
    if len(counts) != 1 or min(counts) < 1:
        return [(f"every thread must hold the same positive number of {name} elements, "
                f"got counts {sorted(counts)}")]
    held: dict[tuple[int, int], int] = {}
    for row in table:
        for rc in row:
            if not (isinstance(rc, tuple) and len(rc) == 2 and 0 <= rc[0] < rows
                    and 0 <= rc[1] < cols):
                return [f"{name} names {rc!r}, not a (row, col) inside its {rows}x{cols} tile"]
            held[rc] = held.get(rc, 0) + 1
    if once and max(held.values()) > 1:
        twice = min(rc for rc, count in held.items() if count > 1)
        return [(f"{name} gives element {twice} to several threads; each C element has "
                "exactly one owner")]
    missing = rows * cols - len(held)
    if missing:
        return [f"{name} leaves {missing} of its {rows}x{cols} elements to no thread"]
    return []


def row_per_thread(size: int, a_dtype: DType, acc_dtype: DType) -> MatrixUnit:
    """A square size×size×size unit of `size` threads: thread t holds row t of A, C and D and
    column t of B. The simplest layout there is; the interpreter declares such units when asked
    to (tests), and conformance checks them like any other."""
    row = fragment(size, size, lambda t, e: (t, e))
    column = fragment(size, size, lambda t, e: (e, t))
    return MatrixUnit(size, size, size, size, a_dtype, a_dtype, acc_dtype, row, column, row)
