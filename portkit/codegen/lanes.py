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
The untiled lowering's products (codegen/plan.py) update their accumulators with a MUL and an
ADD, each rounded: a run of those is written as a vector multiply, then a vector add
(`Spelling.mul_add`). Their operands may both be loads at consecutive addresses: an M = 1
product x @ W.T keeps partial sums along k, acc[j] += x[k + j] * W[n, k + j], where no operand
is shared and the run multiplies two loaded vectors. clang's own vectorizer gathered W's
elements across rows there (a vinsertps each) and ran h @ R.T (1, 256) x (1024, 256) at
1 GFLOP/s.
A run whose lanes, after the loop, are each added into consecutive elements of one buffer
(pack.py's running sums: LOAD buf[base + offset + lane], ADD the lane, STORE it back; or at
constant positions c + lane) is a `Flush`, which a renderer with `Spelling.add_into` writes as
one vector add; written lane by lane it was a third of a 3x3 conv's C. So is a run whose lanes
are stored as they are (STORE buf[base + offset + lane] = the lane: pack.py's sums of one
depth block, stored to the output), which `Spelling.store` writes as one vector store.
A run whose lanes are added after its loop by adjacent pairs, level after level (the untiled
lowering's partial sums end so), is a `Tree`; the trees of runs written together are added
side by side, two runs' vectors at a time, even lanes plus odd lanes (`Spelling.pairs`), the
same additions of the same operands. Written lane by lane, the 8 rows' trees of an x @ W.T
group were 120 scalar adds (with their extracts, a third of an LSTM step's h @ R.T); side by
side they are 8 vector adds.
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
    """Accumulators held in one vector: their ACC, update (MULACC, or the ADD of a MUL) and
    ASSIGN nodes in lane order, the operand every lane shares (None where the other operand
    is a vector too: `paired`), and where the lanes' own operands are loaded from: buffer
    node, index node and the constant added to it for lane 0 (lane k adds k more)."""

    accs: tuple[int, ...]
    updates: tuple[int, ...]
    assigns: tuple[int, ...]
    shared: int | None
    buffer: int
    base: int
    offset: int
    paired: tuple[int, int, int] | None = None   # the other vector's buffer, base and offset
    fused: bool = True          # MULACC, one rounding; else a MUL, then an ADD
    products: tuple[int, ...] = ()               # the MUL nodes of an unfused run

    @property
    def last(self) -> int:
        """The node after which every lane's operands exist: the vector update goes there."""
        return max(self.assigns)


@dataclass(frozen=True)
class Flush:
    """A run's lanes added into a buffer after its loop, lane k into buffer[base + offset + k]
    (or, with no LOADs and ADDs, stored there): per lane its LOAD, ADD and STORE nodes, and
    the index nodes only those read."""

    loads: tuple[int, ...]
    adds: tuple[int, ...]
    stores: tuple[int, ...]
    indices: tuple[int, ...]
    buffer: int
    base: int
    offset: int


def find(kernel: Kernel, widths: dict[DType, int],
         users: dict[int, list[int]] | None = None) -> list[Run]:
    """The runs of `kernel` to hold in vectors of widths[dtype] lanes (dtypes not in `widths`
    stay scalar). `users`: `readers` of the kernel's nodes, where the caller has it."""
    nodes = kernel.nodes
    users = readers(nodes) if users is None else users
    loop_of: list[int | None] = []       # per node, the innermost RANGE around it
    end_of: dict[int, int] = {}          # RANGE -> its END
    open_loops: list[int] = []
    for i, node in enumerate(nodes):
        if node.op is Op.END and nodes[node.src[0]].op is Op.RANGE:
            end_of[open_loops.pop()] = i
        loop_of.append(open_loops[-1] if open_loops else None)
        if node.op is Op.RANGE:
            open_loops.append(i)
    updates: dict[int, _Update | None] = {}
    for i, node in enumerate(nodes):
        if node.op is Op.ASSIGN:
            acc, value = node.src
            found = _update(nodes, users, acc, value)
            fits = found is not None and users[value] == [i] and acc not in updates
            updates[acc] = _Update(value, i, *found) if fits and found is not None else None
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


@dataclass(frozen=True)
class _Update:
    """How one accumulator is updated: its update and ASSIGN nodes, the product's two
    operands, and the MUL node (None for a MULACC)."""

    value: int
    assign: int
    left: int
    right: int
    product: int | None


def _update(nodes: tuple[Node, ...], users, acc: int, value: int
            ) -> tuple[int, int, int | None] | None:
    """(left, right, MUL node or None) where `value` is MULACC(left, right, acc) or
    ADD(acc, MUL(left, right)) with the MUL used only there; else None."""
    node = nodes[value]
    if node.op is Op.MULACC and node.src[2] == acc:
        return node.src[0], node.src[1], None
    if node.op is not Op.ADD or acc not in node.src or node.src[0] == node.src[1]:
        return None
    product = node.src[1] if node.src[0] == acc else node.src[0]
    if nodes[product].op is not Op.MUL or users[product] != [value]:
        return None
    return nodes[product].src[0], nodes[product].src[1], product


def _run(nodes: tuple[Node, ...], accs: list[int], updates, users, loop_of, end_of
         ) -> Run | None:
    if len({nodes[a].src[0] for a in accs}) != 1 or any(updates.get(a) is None for a in accs):
        return None
    mine = [updates[a] for a in accs]
    mulaccs = [u.value for u in mine]
    assigns = [u.assign for u in mine]
    products = [u.product for u in mine if u.product is not None]
    if len(products) not in (0, len(accs)):
        return None
    left, right = [u.left for u in mine], [u.right for u in mine]
    shared, paired, others = None, None, []
    if len(set(left)) == 1:
        shared, loads = left[0], right
    elif len(set(right)) == 1:
        shared, loads = right[0], left
    else:       # both operands vectors: only a MUL and an ADD, which every renderer spells
        loads, others = right, left
        paired = vector(nodes, others, nodes[accs[0]].value_dtype)
        if paired is None or not products:
            return None
    place = vector(nodes, loads, nodes[accs[0]].value_dtype)
    if place is None:
        return None
    buffer, base, offset = place
    loop = loop_of[assigns[0]]
    first, last = min(loads + others + mulaccs + products), max(assigns)
    if loop is None or any(loop_of[x] != loop for x in mulaccs + assigns):
        return None
    if any(nodes[i].op is Op.STORE for i in range(first, last)):
        return None
    for acc, mulacc, assign in zip(accs, mulaccs, assigns):
        if any(first <= u <= end_of[loop] for u in users[acc] if u not in (mulacc, assign)):
            return None
    return Run(tuple(accs), tuple(mulaccs), tuple(assigns), shared, buffer, base, offset,
               paired, not products, tuple(products))


def vector(nodes: tuple[Node, ...], loads: list[int], dtype: DType
           ) -> tuple[int, int, int] | None:
    """(buffer, base, offset) where `loads` are ungated LOADs of buffer[base + offset + lane]
    in lane order, from a buffer of `dtype`; else None."""
    if any(nodes[x].op is not Op.LOAD or len(nodes[x].src) != 2 for x in loads):
        return None
    buffers = {nodes[x].src[0] for x in loads}
    buffer = buffers.pop()
    if buffers or nodes[buffer].dtype != dtype:
        return None
    places = [_split(nodes, nodes[x].src[1]) for x in loads]
    base, offset = places[0]
    if places != [(base, offset + lane) for lane in range(len(loads))]:
        return None
    return buffer, base, offset


def flush(kernel: Kernel, run: Run, users: dict[int, list[int]] | None = None
          ) -> Flush | None:
    """The run's lanes added into a buffer after its loop, or stored there, if that is their
    only other use and nothing else reads or writes that buffer among those nodes; else
    None. `users`: `readers` of the kernel's nodes, where the caller has it."""
    return added_into(kernel, run.accs, {*run.updates, *run.assigns}, run.last, users)


def added_into(kernel: Kernel, accs: tuple[int, ...], updates: set[int], last: int,
               users: dict[int, list[int]] | None = None) -> Flush | None:
    """The `Flush` of accumulators `accs` (lane order) held in one vector, which the nodes
    `updates` update up to node `last` (an MMA node's C registers: that node), if adding them
    into a buffer, or storing them there, is their only other use; else None. `users`:
    `readers` of the kernel's nodes, where the caller has it."""
    nodes = kernel.nodes
    users = readers(nodes) if users is None else users
    loads, adds, stores = [], [], []
    for acc in accs:
        used = [u for u in users[acc] if u not in updates]
        if len(used) == 1 and nodes[used[0]].op is Op.STORE and len(nodes[used[0]].src) == 3 \
                and nodes[used[0]].src[2] == acc:
            stores.append(used[0])
            continue
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
    if loads and len(loads) != len(stores):
        return None                 # some lanes added, some stored
    buffer = nodes[stores[0]].src[0]
    places = [_split(nodes, nodes[x].src[1]) for x in stores]
    base, offset = places[0]
    if places != [(base, offset + lane) for lane in range(len(stores))]:
        # constant positions (pack.py's one register block of sums): lane 0's is the base
        values = [nodes[base].arg if nodes[base].op is Op.CONST else None
                  for base, _ in places]
        if values[0] is None or values != [values[0] + lane for lane in range(len(stores))]:
            return None
        base, offset = places[0][0], 0
    first = min(loads or stores)
    if nodes[buffer].dtype != nodes[accs[0]].dtype or first < last:
        return None
    ours = {*loads, *stores}
    if any(nodes[i].op in (Op.STORE, Op.BARRIER, Op.RANGE, Op.END, Op.IF, Op.ENDIF) or (
            nodes[i].op is Op.LOAD and nodes[i].src[0] == buffer)
           for i in range(first, max(stores)) if i not in ours):
        return None
    indices = tuple(nodes[x].src[1] for x in stores if nodes[x].src[1] != base
                    and set(users[nodes[x].src[1]]) <= ours)
    return Flush(tuple(loads), tuple(adds), tuple(stores), indices, buffer, base, offset)


@dataclass(frozen=True)
class Tree:
    """A run's lanes summed after its loop by adjacent pairs, level after level: per level
    its ADD nodes in lane order (the first level adds lanes 0 and 1, 2 and 3...; the last
    holds the total alone). The untiled lowering's partial sums end so (plan.py)."""

    levels: tuple[tuple[int, ...], ...]

    @property
    def root(self) -> int:
        """The ADD of the run's total."""
        return self.levels[-1][0]


def tree(kernel: Kernel, run: Run, users: dict[int, list[int]] | None = None) -> Tree | None:
    """The run's `Tree`, where its lanes and every sum on the way are read by that tree
    alone; else None. `users`: `readers` of the kernel's nodes, where the caller has it."""
    nodes = kernel.nodes
    users = readers(nodes) if users is None else users
    own = dict(zip(run.accs, zip(run.updates, run.assigns)))
    level, levels = list(run.accs), []
    while len(level) > 1:
        if len(level) % 2:
            return None
        above = []
        for a, b in zip(level[::2], level[1::2]):
            reads = [[u for u in users[x] if u not in own.get(x, ())] for x in (a, b)]
            if reads[0] != reads[1] or len(reads[0]) != 1:
                return None
            add = reads[0][0]
            if nodes[add].op is not Op.ADD or sorted(nodes[add].src) != sorted((a, b)):
                return None
            above.append(add)
        levels.append(tuple(above))
        level = above
    return Tree(tuple(levels)) if levels else None


def tree_lines(kernel: Kernel, runs: list[Run], spelling: Spelling,
               users: dict[int, list[int]] | None = None) -> dict:
    """Name-and-line functions that sum the trees of `runs` (each run's lanes a vector named
    acc<first ACC>, as `lines` names it) side by side: at each level, the vectors in pairs,
    even lanes plus odd lanes, so that a level of n trees is n / width vector adds, not n x
    width / 2 scalar ones; each run's total is then a lane of the last vectors. The same
    additions of the same operands as the scalar trees. {} where a run has no tree."""
    if spelling.pairs is None or not runs:
        return {}
    users = readers(kernel.nodes) if users is None else users
    found = [tree(kernel, run, users) for run in runs]
    if any(t is None for t in found):
        return {}
    trees = [t for t in found if t is not None]
    width = len(runs[0].accs)
    if any(len(run.accs) != width for run in runs):
        return {}
    first = min(node for t in trees for level in t.levels for node in level)
    held = [([k], f"acc{run.accs[0]}") for k, run in enumerate(runs)]  # (runs, vector name)
    code: list[str] = []
    for depth in range(len(trees[0].levels)):
        pairs = [(held[i], held[i + 1] if i + 1 < len(held) else held[i])
                 for i in range(0, len(held), 2)]
        held = []
        for j, ((runs_a, a), (runs_b, b)) in enumerate(pairs):
            name = f"sums{first}_{depth}_{j}"
            code.append(spelling.pairs(name, a, b, width))
            held.append((runs_a + runs_b, name))
    own: dict[int, Callable[[dict], tuple]] = {
        node: named("") for t in trees for level in t.levels for node in level}
    for k, t in enumerate(trees):
        at = next((name, row.index(k)) for row, name in held if k in row)
        own[t.root] = named(spelling.lane(*at))
    own[first] = lambda names: ("", "\n".join(code))
    return own


def readers(nodes: tuple[Node, ...]) -> dict[int, list[int]]:
    """Per node, the nodes that read it, in order."""
    users: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for s in node.src:
            users[s].append(i)
    return users


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
    with one rounding (`at` names the first value, e.g. buf[i + 3]), and optionally a Flush
    and an unfused run."""

    declare: Callable[[str, str, int], str]
    lane: Callable[[str, int], str]
    fma: Callable[[str, str, str], str]
    # `the n values from at += lead`, elementwise (a Flush); None: flushes stay scalar
    add_into: Callable[[str, str], str] | None = None
    # `the n values from at = lead` (a Flush that stores); None: such flushes stay scalar
    store: Callable[[str, str], str] | None = None
    # `lead = lead + a * (the n values from at)`, the product rounded, then the sum, where `a`
    # is a scalar or a `vector(...)`; and the n values from `at` as a vector. None: unfused
    # runs stay scalar
    mul_add: Callable[[str, str, str], str] | None = None
    vector: Callable[[str], str] | None = None
    # `declare lead = (the even lanes of a, then of b) + (the odd lanes of a, then of b)`,
    # n lanes each: one level of `Tree`s summed side by side. None: trees stay scalar
    pairs: Callable[[str, str, str, int], str] | None = None
    # A written-out row's lanes (codegen/straight.py): n values from `at` as a vector, its
    # other lanes 0, the values `step` (1 or 2) elements apart; the statement storing the
    # first n lanes of a vector at `at`; the declaration of a vector `name` = `value`. None:
    # such rows stay scalar
    load_lanes: Callable[[str, int, int], str] | None = None
    store_lanes: Callable[[str, str, int], str] | None = None
    constant: Callable[[str, str], str] | None = None

    def writes(self, run: Run) -> bool:
        """Whether this spelling can write `run`."""
        return run.fused and run.paired is None or (
            self.mul_add is not None and self.vector is not None)


def lines(kernel: Kernel, run: Run, init: int, spelling: Spelling,
          users: dict[int, list[int]] | None = None) -> dict:
    """Name-and-line functions (see CStyleRenderer.rendered_together) for one run whose
    accumulators start at node `init`: the first ACC declares the vector, the other lanes are
    its elements, and the last update adds every lane's product at once. `users`: `readers`
    of the kernel's nodes, where the caller has it."""
    lead = f"acc{run.accs[0]}"

    def declare(names: dict) -> tuple:
        return spelling.lane(lead, 0), spelling.declare(lead, names[init], len(run.accs))

    own: dict[int, Callable[[dict], tuple]] = {run.accs[0]: declare}
    for k, acc in enumerate(run.accs[1:], 1):
        own[acc] = named(spelling.lane(lead, k))
    for node in (*run.updates, *run.assigns, *run.products):
        own[node] = named("")

    def update(names: dict) -> tuple:
        at = f"{names[run.buffer]}[{names[run.base]} + {run.offset}]"
        if run.paired is not None:
            assert spelling.vector is not None    # `writes` asked for it
            buffer, base, offset = run.paired
            other = spelling.vector(f"{names[buffer]}[{names[base]} + {offset}]")
        else:
            other = names[run.shared]
        if run.fused:
            return "", spelling.fma(lead, other, at)
        assert spelling.mul_add is not None
        return "", spelling.mul_add(lead, other, at)

    own[run.last] = update
    own.update(flush_lines(lead, flush(kernel, run, users), spelling.add_into, spelling.store))
    return own


def flush_lines(lead: str, found: Flush | None, add_into: Callable[[str, str], str] | None,
                store: Callable[[str, str], str] | None = None) -> dict:
    """Name-and-line functions that write `found` (if any) as one vector add (`add_into`), or
    one vector store where its lanes are stored as they are (`store`), at its last STORE, and
    nothing for its other nodes; none where that spelling is None."""
    write = add_into if found is not None and found.loads else store
    if found is None or write is None:
        return {}
    own: dict[int, Callable[[dict], tuple]] = {
        node: named("") for node in (*found.loads, *found.adds, *found.stores, *found.indices)}

    def written(names: dict) -> tuple:
        return "", write(lead, f"{names[found.buffer]}[{names[found.base]} + {found.offset}]")

    own[max(found.stores)] = written
    return own


def named(name: str) -> Callable[[dict], tuple]:
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

    def spelled_as(run: Run) -> Spelling:
        dtype = kernel.nodes[run.accs[0]].value_dtype
        return spelling(types[dtype], widths[dtype])

    users = readers(kernel.nodes)     # one map for every run: a 3x3 conv has 16 of them
    runs = [run for run in find(kernel, widths, users) if spelled_as(run).writes(run)]
    for group in together(kernel, runs):
        updates = []
        for run in group:
            first = kernel.nodes[run.accs[0]]
            own.update(lines(kernel, run, first.src[0], spelled_as(run), users))
            updates.append(own.pop(run.last))
            own[run.last] = named("")
        own[max(run.last for run in group)] = _written(updates)
        own.update(tree_lines(kernel, group, spelled_as(group[0]), users))
    return own


def _written(updates: list[Callable[[dict], tuple]]) -> Callable[[dict], tuple]:
    """A name-and-line function that writes the lines of `updates` in order, one per line."""
    def line(names: dict) -> tuple:
        return "", "\n".join(update(names)[1] for update in updates)
    return line
