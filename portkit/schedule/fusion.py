"""Fusion: which nodes of a lazy graph get their own buffer, and so a kernel each.

- the nodes being realized, and every REDUCE and GATHER, except one whose only consumer is a
  chain of elementwise ops ending in a realized node: it fuses into that kernel (one kernel),
  unless it is a sum of one element: that is how a graph asks for a kernel of its own, one
  that loops over the sum's shape (a pool's gradient, in blocks of its windows);
- the source of a COPY (data must exist to be moved) and of a GATHER that gathers itself.
Everything else (elementwise ops, views, constants) is computed inside the kernel that needs it,
so elementwise chains fuse into their consumer and movement ops cost nothing. A kernel that
would read more buffers than the device allows is split by realizing its sources first; an
elementwise value that is costly and that a kernel reads many times per element (a matmul's
operand through its expand), or that several kernels compute and is deep or is a long
epilogue of a reduce (a SiLU of a conv), gets a buffer of its own (limits.py).

A reduce of many elements into few outputs is split in two (partial results per slice, then
a short reduce of those) so that many workgroups share the long part, and no reduce loops
longer than a stage (stages.py).
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from math import prod

from portkit import graph, runtime
from portkit.abi.errors import CapabilityError
from portkit.abi.ops import Op
from portkit.codegen.pads import pad_apart
from portkit.codegen.plan import serial
from portkit.graph import GraphOp, Lazy
from portkit.schedule import limits, stages


@dataclass
class ScheduleItem:
    """One kernel (or one device-to-device copy): realizes `root`, reading `inputs`."""

    root: Lazy
    inputs: list[Lazy]

    @property
    def is_copy(self) -> bool:
        """True for a copy between devices, which runs no kernel."""
        return self.root.op is GraphOp.COPY


def _elementwise(node: Lazy) -> bool:
    return isinstance(node.op, Op)


def _unrealized(outs: list[Lazy]) -> list[Lazy]:
    """Unrealized nodes reachable from `outs`, sources first."""
    return graph.toposort(outs, stop=lambda node: node.realized)


def split_reduce(node: Lazy, chunk: int) -> bool:
    """stages.split_reduce for `node`'s device: its partial sums interleave on hardware lanes."""
    return stages.split_reduce(node, chunk, not serial(runtime.get(node.device).capabilities))


def create_schedule(outs: list[Lazy], max_buffers: int | None = None,
                    max_loop_trips: int | None = None) -> list[ScheduleItem]:
    """The kernels that realize `outs`, in the order they must run, on devices that allow
    `max_buffers` per kernel and `max_loop_trips` loop iterations per thread (None: any)."""
    order = _unrealized(outs)
    chunk = stages.chunk(max_loop_trips)
    # every long reduce is split first (its parts may split again), then the graph is sorted
    while [n for n in order if n.op is GraphOp.REDUCE and split_reduce(n, chunk)]:
        order = _unrealized(outs)
    # on a device whose threads are loops, a convolution reads a padded copy (codegen/pads.py)
    copies = {id(p) for n in order if n.op is GraphOp.VIEW and serial(
        runtime.get(n.device).capabilities) and (p := pad_apart(n)) is not None}
    order = _unrealized(outs) if copies else order
    if not order:
        return []
    consumers: dict[int, set[int]] = defaultdict(set)
    by_id = {id(n): n for n in order}
    for node in order:
        for s in node.src:
            consumers[id(s)].add(id(node))
    wanted = {id(o) for o in outs if not o.realized}
    realize = wanted | copies
    for node in order:
        if node.op is GraphOp.REDUCE:
            realize.add(id(node))
        elif node.op is GraphOp.COPY:
            realize.add(id(node))
            if not node.src[0].realized:
                realize.add(id(node.src[0]))
        elif node.op is GraphOp.GATHER:     # a gathered gather is computed once, not per read
            realize.add(id(node))
            if graph.gathers(node.src[0].base, lambda n: n.realized or id(n) in realize):
                realize.add(id(node.src[0].base))
    limits.cut_reused(order, consumers, realize)
    # With a loop budget, the reduces fused into one kernel share it: x.sum() + y.sum() + ...
    # of 16,000 each, fused, ran 80,000 iterations, and lavapipe summed 63,546 of them.
    fused: dict[int, int] = defaultdict(int)      # id(kernel root) -> reduced elements in it
    # A kernel fuses one contraction at most: several (a weight's gradient summed over the 35
    # steps of an LSTM) ran as plain loops, not packed panels (codegen/pack.py), at under 1
    # GFLOP/s, half of that LSTM's training step; each is a matmul kernel of its own.
    contracted: set[int] = set()                  # ids of kernel roots holding a contraction
    for node in order:
        if node.op not in (GraphOp.REDUCE, GraphOp.GATHER) or id(node) in wanted:
            continue
        length = prod(node.src[0].shape[a] for a in node.arg[1]) if node.op is GraphOp.REDUCE else 0
        if node.op is GraphOp.REDUCE and length == 1:
            continue        # a sum of one element asks for a kernel of its own (tensor/pools.py)
        into = _fuses_down(node, consumers, by_id, realize)
        contraction = node.op is GraphOp.REDUCE and node.src[0].op is Op.MUL
        if contraction and into in contracted:
            continue
        if into is not None and (max_loop_trips is None or fused[into] + length <= chunk):
            fused[into] += length
            realize.discard(id(node))
            if contraction:
                contracted.add(into)
    position = {id(n): i for i, n in enumerate(order)}
    ends = (_epilogue(n, consumers, by_id, position, realize) for n in order
            if n.op is GraphOp.REDUCE and id(n) in realize)
    limits.cut_epilogues([e for e in ends if e is not None], order, consumers, realize)
    limits.cut_shared(order, consumers, realize)
    limits.cut_deep(order, realize)
    inputs = _fit_buffers(order, realize, max_buffers)
    return [ScheduleItem(n, inputs[id(n)]) for n in order if id(n) in realize]


def _fit_buffers(order: list[Lazy], realize: set[int], max_buffers: int | None
                 ) -> dict[int, list[Lazy]]:
    """The buffers each kernel reads, by id(root), once every kernel reads fewer than
    `max_buffers`: in rounds, each kernel that reads more gets its sources realized (added to
    `realize`). A round walks again only the kernels whose fused region it changed (the ones
    too big, those that computed a newly realized node, the new ones): a cat of 200 pieces
    splits one piece per round, and walking every kernel each round cost O(rounds x graph)."""
    position = {id(n): i for i, n in enumerate(order)}
    inputs: dict[int, list[Lazy]] = {}
    region: dict[int, list[int]] = {}               # id(root) -> ids its kernel computes
    holders: dict[int, set[int]] = defaultdict(set)  # id(node) -> roots whose kernel computes it
    stale = [n for n in order if id(n) in realize]
    while True:
        for root in stale:
            for node in region.get(id(root), ()):
                holders[node].discard(id(root))
            found = _fused(root, realize)
            inputs[id(root)], region[id(root)] = found.stopped, [id(n) for n in found.order]
            for node in region[id(root)]:
                holders[node].add(id(root))
        # a kernel not walked again reads what it read, and so still fits
        too_big = [n for n in stale if max_buffers and len(inputs[id(n)]) + 1 > max_buffers]
        if not too_big:
            return inputs
        cut = {id(s.base) for root in too_big for s in root.src
               if not s.base.realized and id(s.base) not in realize}
        if not cut:
            raise CapabilityError(
                f"{too_big[0]} reads {len(inputs[id(too_big[0])])} buffers at once but the "
                f"device allows {max_buffers} per kernel; use a device with more buffers")
        realize |= cut
        changed = cut | {id(n) for n in too_big}.union(*(holders[c] for c in cut))
        stale = [order[p] for p in sorted(position[i] for i in changed)]


def _fused(root: Lazy, realize: set[int]) -> graph.Walk:
    """A kernel for `root`: the nodes it computes (`order`) and the buffers it reads
    (`stopped`, in first-use order)."""
    return graph.walk(root.src, stop=lambda n: n.realized or id(n) in realize)


def _reads_once(node: Lazy) -> bool:
    """Elementwise ops and views that read each source element at most once (no expand)."""
    if _elementwise(node):
        return True
    return node.op is GraphOp.VIEW and all(st != 0 or size == 1 for view in node.arg.views
                                     for size, st in zip(view.shape, view.strides))


def _reorders(node: Lazy) -> bool:
    """A view that permutes its source: its strides (over axes longer than 1, not expanded)
    do not decrease from the outer axis in. A pad or a shrink keeps the order."""
    if node.op is not GraphOp.VIEW:
        return False
    steps = [[st for size, st in zip(v.shape, v.strides) if size > 1 and st != 0]
             for v in node.arg.views]
    return any(s != sorted(s, reverse=True) for s in steps)


def _fuses_down(node: Lazy, consumers, by_id, realize) -> int | None:
    """The id of the realized node whose kernel `node` fuses into, or None. A contraction (a
    sum of products: a matmul, a conv) does not fuse into a view that reorders its output:
    the consumer's kernel would walk the products in the view's order and lose the packed
    panels (codegen/pack.py); a transposed conv of stride = kernel is a matmul and a permute."""
    contraction = node.op is GraphOp.REDUCE and node.src[0].op is Op.MUL
    chain = node
    while len(consumers[id(chain)]) == 1:
        nxt = by_id[next(iter(consumers[id(chain)]))]
        if not _reads_once(nxt) or (contraction and _reorders(nxt)):
            return None
        chain = nxt
        if id(chain) in realize:
            return id(chain)
    return None


def _epilogue(reduce: Lazy, consumers, by_id, position: dict[int, int], realize: set[int]
              ) -> Lazy | None:
    """The last op that every path up from `reduce` passes through, where each op on those
    paths is elementwise or a view reading each element once, none a kernel root (in
    `realize`), and MAX_REUSED_COST or more of them are elementwise (SiLU's x * sigmoid(x)
    reads x twice, so this is no chain); None where there is none. `position` numbers the
    nodes sources first."""
    inside, open_, ops, end = {id(reduce)}, {id(reduce)}, 0, None
    heap = [(position[c], c) for c in consumers[id(reduce)]]
    heapq.heapify(heap)
    while heap:
        _, at = heapq.heappop(heap)
        if at in inside:
            continue
        node = by_id[at]
        if at in realize or not _reads_once(node):
            break
        inside.add(at)
        ops += _elementwise(node)
        open_ = {o for o in open_ | {at} if not consumers[o] <= inside}
        if open_ == {at} and ops >= limits.MAX_REUSED_COST:
            end = node
        for c in consumers[at]:
            heapq.heappush(heap, (position[c], c))
    return end


def device_limits(outs: list[Lazy]) -> tuple[int | None, int | None]:
    """The fewest buffers per kernel and loop iterations per thread of `outs`' devices."""
    caps = [runtime.get(d).capabilities for d in {o.device for o in outs}]
    trips = [c.max_loop_trips for c in caps if c.max_loop_trips is not None]
    return (min(c.max_buffers for c in caps) if caps else None), (min(trips) if trips else None)


def schedule(outs: list[Lazy]) -> list[ScheduleItem]:
    """The items that realize `outs` on their devices, as `realize` runs them."""
    return create_schedule(outs, *device_limits(outs))

