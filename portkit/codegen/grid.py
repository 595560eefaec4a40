"""Grids longer than a device allows along one axis, folded over the axes the kernel leaves at 1.

WebGPU and Vulkan launch at most 65,535 workgroups per axis. A kernel written for a grid of
(65536, 1, 1) runs there as (32768, 2, 1): every SPECIAL ("group", axis) of the folded axis
reads the linear id `group0 + size0 * (group1 + size1 * group2)` instead. Where the folded
grid holds more groups than the kernel's (5000 groups under a limit of 1024 fold to
1000 x 5 exactly, but 1025 to 513 x 2), the extra groups read the last group's id, so their
loads stay in bounds and their barriers are reached like any group's, and every STORE to a
buffer is gated off for them.
"""
from __future__ import annotations

from math import ceil, prod

from portkit.abi.errors import CapabilityError
from portkit.abi.kernel import Dim3, Kernel, KernelBuilder, validate
from portkit.abi.ops import Op


def fits(grid: Dim3, max_grid: Dim3) -> bool:
    """True if every axis of `grid` is within `max_grid`."""
    return all(g <= m for g, m in zip(grid, max_grid))


def folded_shape(name: str, grid: Dim3, max_grid: Dim3) -> tuple[int, tuple[int, ...], Dim3]:
    """(the axis folded, the axes its groups spread over, innermost first, the new grid) for a
    `grid` with one axis over `max_grid`; CapabilityError naming the limit where none fits."""
    over = [axis for axis in range(3) if grid[axis] > max_grid[axis]]
    free = [axis for axis in range(3) if grid[axis] == 1]
    new, used, remaining = list(grid), [], 0
    if len(over) == 1:
        remaining = grid[over[0]]
        for axis in [over[0], *free]:
            used.append(axis)
            rows = ceil(remaining / max_grid[axis])
            new[axis] = ceil(remaining / rows)
            remaining = rows
            if remaining == 1:
                break
    folded: Dim3 = (new[0], new[1], new[2])
    if remaining != 1 or not fits(folded, max_grid):
        raise CapabilityError(
            f"kernel {name!r}: grid {grid} exceeds the device's max_grid {max_grid} "
            "(Capabilities.max_grid) and does not fold over the axes it leaves at 1; "
            "launch fewer workgroups, each doing more work")
    return over[0], tuple(used), folded


def fold_grid(kernel: Kernel, max_grid: Dim3) -> Kernel:
    """`kernel` launched within `max_grid`: its one over-long grid axis folded over the axes it
    leaves at 1, the tail guarded (see the module's docstring). The kernel itself when it fits."""
    if fits(kernel.grid, max_grid):
        return kernel
    axis, axes, grid = folded_shape(kernel.name, kernel.grid, max_grid)
    groups = kernel.grid[axis]
    b = KernelBuilder(kernel.name)
    moved: dict[int, int] = {}
    group_id = inside = -1
    for i, node in enumerate(kernel.nodes):
        if group_id < 0 and node.op not in (Op.PARAM, Op.VAR):
            group_id, inside = _linear_group(b, axes, grid, groups)
        if node.op is Op.SPECIAL and node.arg[0] == "group" and node.arg[1] in axes:
            moved[i] = group_id if node.arg[1] == axis else b.const(0)
            continue
        src = tuple(moved[s] for s in node.src)
        if (node.op is Op.STORE and inside >= 0
                and kernel.nodes[node.src[0]].op is Op.PARAM):
            gate = inside if len(src) == 3 else b.alu(Op.AND, src[3], inside)
            src = src[:3] + (gate,)
        moved[i] = b.add(node.op, node.dtype, src, node.arg)
    return validate(Kernel(kernel.name, tuple(b.nodes), grid, kernel.block))


def _linear_group(b: KernelBuilder, axes: tuple[int, ...], grid: Dim3,
                  groups: int) -> tuple[int, int]:
    """Emits the folded axes' linear group id, clamped to `groups - 1`, and the bool that says
    it was in range (-1 where the fold is exact: every group is in range)."""
    linear = b.special("group", axes[-1])
    for axis in reversed(axes[:-1]):
        linear = b.alu(Op.ADD, b.alu(Op.MUL, linear, b.const(grid[axis])),
                       b.special("group", axis))
    if prod(grid[a] for a in axes) == groups:
        return linear, -1
    inside = b.alu(Op.CMPLT, linear, b.const(groups))
    return b.alu(Op.WHERE, inside, linear, b.const(groups - 1)), inside

