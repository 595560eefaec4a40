"""Lanes: runs of accumulators that a C-like renderer may hold in one vector register.

A register block (codegen/pack.py's 8 x 32 float32) is, in the ABI, 256 scalar ACCs, each
updated once per loop iteration by MULACC(a, b[j], acc[j]): one operand shared by a row, the
other a load at consecutive addresses. A C compiler's straight-line (SLP) vectorizer turns
these into vector FMAs, but clang 14 also keeps each accumulator's previous value alive across
the loop's exit and spills a dozen registers per iteration. `find` names the runs a renderer
can write as vectors itself: `width` consecutive ACC nodes (one vector of the device), each
updated in one loop by one MULACC whose shared operand is the same for the run and whose other
operand loads `base + offset + lane` from one buffer, with no other use of the accumulators
inside the loop and no STORE among the updates. Everything else stays scalar; a run the
pattern does not fit is left to the compiler, so the pass only changes how a kernel is
spelled, never what it computes (the interpreter runs the same ABI kernel).
A run whose lanes, after the loop, are each added into consecutive elements of one buffer
(pack.py's running sums: LOAD buf[base + offset + lane], ADD the lane, STORE it back; or at
constant positions c + lane) is a `Flush`, which a renderer with `Spelling.add_into` writes as
one vector add; written lane by lane it was a third of a 3x3 conv's C.
Runs updated one after another in one loop body are written together, at the last one's place,
in the order that holds fewer operands at once (`together`): by the vector they load (each
row's shared value stays in a register, one loaded vector at a time) where a block has fewer
rows than vectors per row, else in the kernel's order (a row's whole width, then the next
row). In the kernel's order, clang held a 3 x 32 block's four vectors of 8 lanes beside its
twelve accumulators and spilled one per iteration: ViT's 197 x 384 @ 384 x 1536 on AVX2 (16
registers) ran at 29 GFLOP/s so, 47-52 by vectors (one thread). A 7 x 32 block (a conv on a
7 x 7 map, which spills either way) ran 1.16x slower by vectors.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel, Node
from portkit.abi.ops import Op


@dataclass(frozen=True)
class Run:
    """Accumulators held in one vector: their ACC, MULACC and ASSIGN nodes in lane order, the
    operand every lane shares, and where the lanes' own operands are loaded from: buffer
    node, index node and the constant added to it for lane 0 (lane k adds k more)."""

    accs: tuple[int, ...]
    updates: tuple[int, ...]
    assigns: tuple[int, ...]
    shared: int
    buffer: int
    base: int
    offset: int

    @property
    def last(self) -> int:
        """The node after which every lane's operands exist: the vector update goes there."""
        return max(self.assigns)


@dataclass(frozen=True)
class Flush:
    """A run's lanes added into a buffer after its loop, lane k into buffer[base + offset + k]:
    per lane its LOAD, ADD and STORE nodes, and the index nodes only those read."""

    loads: tuple[int, ...]
    adds: tuple[int, ...]
    stores: tuple[int, ...]
    indices: tuple[int, ...]
    buffer: int
    base: int
    offset: int


def find(kernel: Kernel, widths: dict[DType, int]) -> list[Run]:
    """The runs of `kernel` to hold in vectors of widths[dtype] lanes (dtypes not in `widths`
    stay scalar)."""
    nodes = kernel.nodes
    users: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for s in node.src:
            users[s].append(i)
    loop_of: list[int | None] = []       # per node, the innermost RANGE around it
    end_of: dict[int, int] = {}          # RANGE -> its END
    open_loops: list[int] = []
    for i, node in enumerate(nodes):
        if node.op is Op.END and nodes[node.src[0]].op is Op.RANGE:
            end_of[open_loops.pop()] = i
        loop_of.append(open_loops[-1] if open_loops else None)
        if node.op is Op.RANGE:
            open_loops.append(i)
    updates: dict[int, tuple[int, int] | None] = {}     # ACC -> (MULACC, ASSIGN)
    for i, node in enumerate(nodes):
        if node.op is Op.ASSIGN:
            acc, value = node.src
            fits = nodes[value].op is Op.MULACC and nodes[value].src[2] == acc
            fits = fits and users[value] == [i] and acc not in updates
            updates[acc] = (value, i) if fits else None
    accs = [i for i, node in enumerate(nodes) if node.op is Op.ACC and node.dtype in widths]
    runs, at = [], 0
    while at < len(accs):
        width = widths[nodes[accs[at]].value_dtype]
        block = accs[at:at + width]
        run = None
        if len(block) == width and block[-1] - block[0] == width - 1:
            run = _run(nodes, block, updates, users, loop_of, end_of)
        if run is None:
            at += 1
        else:
            runs.append(run)
            at += width
    return runs


def _run(nodes: tuple[Node, ...], accs: list[int], updates, users, loop_of, end_of
         ) -> Run | None:
    if len({nodes[a].src[0] for a in accs}) != 1 or any(updates.get(a) is None for a in accs):
        return None
    mulaccs = [updates[a][0] for a in accs]
    assigns = [updates[a][1] for a in accs]
    left = [nodes[m].src[0] for m in mulaccs]
    right = [nodes[m].src[1] for m in mulaccs]
    if len(set(left)) == 1:
        shared, loads = left[0], right
    elif len(set(right)) == 1:
        shared, loads = right[0], left
    else:
        return None
    if any(nodes[x].op is not Op.LOAD or len(nodes[x].src) != 2 for x in loads):
        return None
    buffers = {nodes[x].src[0] for x in loads}
    buffer = buffers.pop()
    if buffers or nodes[buffer].dtype != nodes[accs[0]].dtype:
        return None
    places = [_split(nodes, nodes[x].src[1]) for x in loads]
    base, offset = places[0]
    if places != [(base, offset + lane) for lane in range(len(accs))]:
        return None
    loop = loop_of[assigns[0]]
    first, last = min(loads + mulaccs), max(assigns)
    if loop is None or any(loop_of[x] != loop for x in mulaccs + assigns):
        return None
    if any(nodes[i].op is Op.STORE for i in range(first, last)):
        return None
    for acc, mulacc, assign in zip(accs, mulaccs, assigns):
        if any(first <= u <= end_of[loop] for u in users[acc] if u not in (mulacc, assign)):
            return None
    return Run(tuple(accs), tuple(mulaccs), tuple(assigns), shared, buffer, base, offset)


def flush(kernel: Kernel, run: Run) -> Flush | None:
    """The run's lanes added into a buffer after its loop, if that is their only other use
    and nothing else reads or writes that buffer among those nodes; else None."""
    nodes = kernel.nodes
    users: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for s in node.src:
            users[s].append(i)
    loads, adds, stores = [], [], []
    for acc, mulacc, assign in zip(run.accs, run.updates, run.assigns):
        used = [u for u in users[acc] if u not in (mulacc, assign)]
        if len(used) != 1 or nodes[used[0]].op is not Op.ADD:
            return None
        add = used[0]
        load = next((x for x in nodes[add].src if x != acc), acc)
        if nodes[load].op is not Op.LOAD or len(nodes[load].src) != 2 or users[load] != [add]:
            return None
        store = users[add]
        if len(store) != 1 or nodes[store[0]].src != (*nodes[load].src, add):
            return None
        loads.append(load)
        adds.append(add)
        stores.append(store[0])
    buffer = nodes[loads[0]].src[0]
    places = [_split(nodes, nodes[x].src[1]) for x in loads]
    base, offset = places[0]
    if places != [(base, offset + lane) for lane in range(len(loads))]:
        # constant positions (pack.py's one register block of sums): lane 0's is the base
        values = [nodes[base].arg if nodes[base].op is Op.CONST else None
                  for base, _ in places]
        if values[0] is None or values != [values[0] + lane for lane in range(len(loads))]:
            return None
        base, offset = places[0][0], 0
    if nodes[buffer].dtype != nodes[run.accs[0]].dtype or min(loads) < run.last:
        return None
    first, last = min(loads), max(stores)
    ours = {*loads, *stores}
    if any(nodes[i].op in (Op.STORE, Op.BARRIER, Op.RANGE, Op.END, Op.IF, Op.ENDIF) or (
            nodes[i].op is Op.LOAD and nodes[i].src[0] == buffer)
           for i in range(first, last) if i not in ours):
        return None
    indices = tuple(nodes[x].src[1] for x in loads if nodes[x].src[1] != base
                    and set(users[nodes[x].src[1]]) <= ours)
    return Flush(tuple(loads), tuple(adds), tuple(stores), indices, buffer, base, offset)


def _split(nodes: tuple[Node, ...], index: int) -> tuple[int, int]:
    """(node, constant) with index = node + constant; (index, 0) if it is not such a sum."""
    node = nodes[index]
    if node.op is Op.ADD:
        a, b = node.src
        if nodes[b].op is Op.CONST:
            return a, nodes[b].arg
        if nodes[a].op is Op.CONST:
            return b, nodes[a].arg
    return index, 0


@dataclass(frozen=True)
class Spelling:
    """How a renderer writes a run as a vector: the declaration of vector `lead` with every
    lane set to `init` (n lanes), lane k of it, `lead = a * (the n values from at) + lead`
    with one rounding (`at` names the first value, e.g. buf[i + 3]), and optionally a Flush."""

    declare: Callable[[str, str, int], str]
    lane: Callable[[str, int], str]
    fma: Callable[[str, str, str], str]
    # `the n values from at += lead`, elementwise (a Flush); None: flushes stay scalar
    add_into: Callable[[str, str], str] | None = None


def lines(kernel: Kernel, run: Run, init: int, spelling: Spelling) -> dict:
    """Name-and-line functions (see CStyleRenderer.rendered_together) for one run whose
    accumulators start at node `init`: the first ACC declares the vector, the other lanes are
    its elements, and the last update adds every lane's product at once."""
    lead = f"acc{run.accs[0]}"

    def declare(names: dict) -> tuple:
        return spelling.lane(lead, 0), spelling.declare(lead, names[init], len(run.accs))

    own: dict[int, Callable[[dict], tuple]] = {run.accs[0]: declare}
    for k, acc in enumerate(run.accs[1:], 1):
        own[acc] = _named(spelling.lane(lead, k))
    for node in (*run.updates, *run.assigns):
        own[node] = _named("")

    def update(names: dict) -> tuple:
        at = f"{names[run.buffer]}[{names[run.base]} + {run.offset}]"
        return "", spelling.fma(lead, names[run.shared], at)

    own[run.last] = update
    if spelling.add_into is not None:
        own.update(_flush_lines(lead, flush(kernel, run), spelling.add_into))
    return own


def _flush_lines(lead: str, found: Flush | None, add_into: Callable[[str, str], str]) -> dict:
    """Name-and-line functions that write `found` (if any) as one vector add at its last
    STORE, and nothing for its other nodes."""
    if found is None:
        return {}
    own: dict[int, Callable[[dict], tuple]] = {
        node: _named("") for node in (*found.loads, *found.adds, *found.stores, *found.indices)}

    def added(names: dict) -> tuple:
        return "", add_into(lead, f"{names[found.buffer]}[{names[found.base]} + {found.offset}]")

    own[max(found.stores)] = added
    return own


def _named(name: str) -> Callable[[dict], tuple]:
    """A name-and-line function that names its node `name` and writes no line."""
    return lambda names: (name, None)


# Nodes that end a group of runs written together: moving an update past one of them could
# change what its loads read or which loop iteration it belongs to.
_FENCES = frozenset({Op.STORE, Op.BARRIER, Op.RANGE, Op.END, Op.IF, Op.ENDIF})


def together(kernel: Kernel, runs: list[Run]) -> list[list[Run]]:
    """`runs` in groups to be written at the last one's `last`: runs in a row with no store,
    barrier, loop or branch between the first's updates and the last's; a group with fewer
    shared values (rows) than loaded vectors is ordered by the vector it loads (buffer, base,
    offset), any other keeps the kernel's order."""
    groups: list[list[Run]] = []
    for run in sorted(runs, key=lambda run: run.last):
        if groups and not any(kernel.nodes[i].op in _FENCES for i in range(
                min(min(r.updates) for r in groups[-1]), run.last)):
            groups[-1].append(run)
        else:
            groups.append([run])
    return [sorted(group, key=lambda run: (*_loaded(run), run.last))
            if len({run.shared for run in group}) < len({_loaded(run) for run in group})
            else group for group in groups]


def _loaded(run: Run) -> tuple[int, int, int]:
    """Where a run's vector is loaded from: buffer, base index and offset."""
    return run.buffer, run.base, run.offset


def spelled(kernel: Kernel, types: dict[DType, str], vector_bytes: int,
            spelling: Callable[[str, int], Spelling]) -> dict:
    """A renderer's `rendered_together`: every run of `kernel` in a vector of `vector_bytes`
    (types[dtype] names the vector type), written as spelling(that name, its lanes) says, the
    updates of each group (`together`) at once, at the group's last update."""
    own: dict = {}
    widths = {d: vector_bytes // d.itemsize for d in types}
    for group in together(kernel, find(kernel, widths)):
        updates = []
        for run in group:
            first = kernel.nodes[run.accs[0]]
            spelled_as = spelling(types[first.value_dtype], widths[first.value_dtype])
            own.update(lines(kernel, run, first.src[0], spelled_as))
            updates.append(own.pop(run.last))
            own[run.last] = _named("")
        own[max(run.last for run in group)] = _written(updates)
    return own


def _written(updates: list[Callable[[dict], tuple]]) -> Callable[[dict], tuple]:
    """A name-and-line function that writes the lines of `updates` in order, one per line."""
    def line(names: dict) -> tuple:
        return "", "\n".join(update(names)[1] for update in updates)
    return line
