"""Element positions: the int32 ADD and MUL nodes of a kernel that only compute where a load or
store goes, which a C renderer may leave signed.

The ABI's integer ADD and MUL wrap, so a C renderer computes them in uint32 and casts back. A
position `base + 3` computed so may wrap in C's eyes, and then clang cannot prove that the loads
at base, base + 1, ... base + 7 are adjacent: it assembles the vector of a convolution's lanes
from eight scalar loads (vinsertps), and that was half of its inner loop's instructions. A
position is a buffer offset (or, behind a gate, a small step outside one), built from thread
and loop indices and constants, so it never overflows and signed arithmetic is exact for it.
Such a node: int32 ADD or MUL, computed from SPECIAL, RANGE and CONST only (no loaded value,
no argument but a view's offset, a VAR named OFFSET_VAR...: a buffer position itself), and read
only as a LOAD or STORE index or gate, as a loop bound or IF condition, or by other nodes that
are read only so. Anything that reaches data (a stored value, an accumulator, a float WHERE)
keeps the wrapping form.
"""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op

# the name of every VAR that holds a view's offset (codegen/lower.py) starts so
OFFSET_VAR = "offset"
# ops through which a position flows into another position, a gate or a loop bound
_INDEX_OPS = (Op.ADD, Op.MUL, Op.IDIV, Op.MOD, Op.CMPLT, Op.CMPNE, Op.AND, Op.OR, Op.WHERE)
# (op, operand position) where a value is used as a position, a gate or a bound
_USES = {(Op.LOAD, 1), (Op.LOAD, 2), (Op.STORE, 1), (Op.STORE, 3), (Op.RANGE, 0),
         (Op.RANGE, 1), (Op.IF, 0)}


def positions(kernel: Kernel) -> set[int]:
    """Positions in kernel.nodes of the int32 ADD and MUL nodes that compute only positions."""
    nodes = kernel.nodes
    pure: set[int] = set()        # computed from thread and loop indices and constants only
    for i, node in enumerate(nodes):
        if node.op in (Op.SPECIAL, Op.RANGE, Op.CONST) or (
                node.op is Op.VAR and node.arg.startswith(OFFSET_VAR)) or (
                node.op in _INDEX_OPS and node.dtype in (dtypes.int32, dtypes.bool_)
                and all(s in pure for s in node.src)):
            pure.add(i)
    users: dict[int, list[tuple[int, int]]] = {}
    for i, node in enumerate(nodes):
        for k, s in enumerate(node.src):
            users.setdefault(s, []).append((i, k))
    index_only: set[int] = set()  # every use is a position, gate or bound (users come later)
    for i in reversed(range(len(nodes))):
        if i in pure and nodes[i].op in _INDEX_OPS and all(
                (nodes[u].op, k) in _USES or u in index_only for u, k in users.get(i, ())):
            index_only.add(i)
    return {i for i in index_only if nodes[i].op in (Op.ADD, Op.MUL)
            and nodes[i].dtype == dtypes.int32}
