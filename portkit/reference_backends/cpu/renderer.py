"""ABI kernels as C for the host CPU: the C-style base plus a prelude and a launcher.

The kernel body becomes a `static inline` function of its buffers, scalars, workgroup and
thread ids. Its entry point, `pk_launch_` and the function's name (`entry_point`), runs the grid:
workgroups are cut into chunks along axis 0, which a launch large enough hands to the runtime's
thread pool (`pk_pool`, runtime.py) and a small one runs on its caller's thread, and a
workgroup's threads run as a loop over thread axis 0 innermost, which the compiler may
vectorize. A kernel with a BARRIER goes through
portkit.codegen.loops first: its threads become loops between the barriers, inside the kernel.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.kernel import Kernel
from portkit.abi.matrix import MatrixUnit, fragment
from portkit.abi.ops import Op
from portkit.codegen import exp2f, lanes
from portkit.codegen.cstyle import CStyleRenderer, Spelling, function_name, local_bytes
from portkit.codegen.emulated import EMULATED_FLOATS, FLOAT16_HELPERS

_TEMPLATE = """\
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <tgmath.h>  /* sqrt, exp2, fma...: the float or the double function, by argument */
{% if matrix %}
#include <immintrin.h>
#ifndef PK_ONCE_I32X16
#define PK_ONCE_I32X16
typedef int32_t pk_i32x16 __attribute__((vector_size(64)));  /* an int32 matrix unit's C */
#endif
{% endif %}

{# Helpers are guarded: a batch (codegen.cstyle.compile_joined) is many kernels in one file #}
#ifndef PK_ONCE_POOL
#define PK_ONCE_POOL
/* The runtime's thread pool (runtime.py), which the runtime hands each library it loads:
   pk_pool(chunk, context, count) runs chunk(context, i) for every i in [0, count) on the pool's
   threads and its caller's, and returns when all have run. Without it, on one thread. */
typedef void (*pk_chunk_fn)(void *context, int64_t index);
typedef void (*pk_pool_fn)(pk_chunk_fn chunk, void *context, int64_t count);
static pk_pool_fn pk_pool;
static int64_t pk_pool_threads = 1;
void pk_use_pool(pk_pool_fn pool, int32_t threads) {
  pk_pool = pool;
  pk_pool_threads = threads;
}
/* A launch spread over the pool: the entry point's arguments and how its grid is split. */
struct pk_grid {
  void **buffers;
  const int32_t *scalars, *dims;
  int64_t size, chunks;
};
#endif
{% if small_floats %}
#ifndef PK_ONCE_FLOAT16_HELPERS
#define PK_ONCE_FLOAT16_HELPERS
{{ float16_helpers }}
#endif
{% endif %}
{% if exp2f %}
{{ exp2f_source }}{% endif %}
{% if vectors %}
/* Accumulators held in vectors (portkit.codegen.lanes): lanes += a * b[0..n), one rounding;
   at[0..n) += lanes; at[0..n) = lanes; the n values from at. */
{% for type, element, lanes, suffix, mask in vectors %}
#ifndef PK_ONCE_{{ type }}
#define PK_ONCE_{{ type }}
typedef {{ element }} {{ type }} __attribute__((vector_size({{ vector_bytes }})));
static inline {{ type }} {{ type }}_fma({{ element }} a, const {{ element }} *b, {{ type }} c) {
  #pragma STDC FP_CONTRACT ON
  {{ type }} v;
  memcpy(&v, b, sizeof v);
  return a * v + c;
}
static inline {{ type }} {{ type }}_load(const {{ element }} *at) {
  {{ type }} v;
  memcpy(&v, at, sizeof v);
  return v;
}
static inline void {{ type }}_add_into({{ element }} *at, {{ type }} v) {
  {{ type }} sum;
  memcpy(&sum, at, sizeof sum);
  sum += v;
  memcpy(at, &sum, sizeof sum);
}
static inline void {{ type }}_store({{ element }} *at, {{ type }} v) {
  memcpy(at, &v, sizeof v);
}
#endif
{% endfor %}
{% endif %}
{% if strips %}
#ifdef __AVX512F__
#include <immintrin.h>
#endif
/* A written-out row's lanes (portkit.codegen.straight): the first n values from at, the
   n values at[0], at[2]... at[2n - 2], and the first n lanes stored at at. */
{% for type, element, lanes, suffix, mask in vectors %}
#ifndef PK_ONCE_{{ type }}_LANES
#define PK_ONCE_{{ type }}_LANES
/* masked moves where AVX-512 has them: a copy of n elements went through the stack */
static inline {{ type }} {{ type }}_load_lanes(const {{ element }} *at, int n) {
#if defined(__AVX512F__) && {{ vector_bytes }} == 64
  return ({{ type }})_mm512_maskz_loadu_{{ suffix }}(({{ mask }})((1u << n) - 1), at);
#else
  {{ type }} v = {0};
  memcpy(&v, at, n * sizeof *at);
  return v;
#endif
}
static inline {{ type }} {{ type }}_load_even(const {{ element }} *at, int n) {
  const int count = 2 * n - 1, low_count = count < {{ lanes }} ? count : {{ lanes }};
  const {{ type }} low = {{ type }}_load_lanes(at, low_count);
  const {{ type }} high = {{ type }}_load_lanes(at + {{ lanes }}, count - low_count);
  return __builtin_shufflevector(low, high, {{ range(0, 2 * lanes, 2) | join(", ") }});
}
static inline void {{ type }}_store_lanes({{ element }} *at, {{ type }} v, int n) {
#if defined(__AVX512F__) && {{ vector_bytes }} == 64
  _mm512_mask_storeu_{{ suffix }}(at, ({{ mask }})((1u << n) - 1), v);
#else
  memcpy(at, &v, n * sizeof *at);
#endif
}
#endif
{% endfor %}
{% endif %}

static inline void {{ name }}({{ (args + id_args) | join(", ") }}) {
{% for line in body %}
{{ line }}
{% endfor %}
}

{% macro arguments(buffers, scalars, dims) %}
  const int32_t grid0 = {{ dims }}[0], grid1 = {{ dims }}[1], grid2 = {{ dims }}[2];
{% if looped %}
  /* One thread per group, whatever block the call names: threads_as_loops' kernels. */
  const int32_t block0 = 1, block1 = 1, block2 = 1;
{% else %}
  const int32_t block0 = {{ dims }}[3], block1 = {{ dims }}[4], block2 = {{ dims }}[5];
{% endif %}
  const int32_t threads = block0 * block1 * block2;
{% for p in kernel.params %}
  {{ types[loop.index0] }} *const data{{ p.arg }} = {{ buffers }}[{{ p.arg }}];
{% endfor %}
{% for v in kernel.vars %}
  const int32_t var_{{ v }} = {{ scalars }}[{{ loop.index0 }}];
{% endfor %}
{%- endmacro %}
{% macro chunk() %}
  const int32_t first = (int32_t)(chunk * size);
  const int32_t last = (int32_t)(chunk * size + size < grid0 ? chunk * size + size : grid0);
  _Alignas(64) char pk_local[{{ local_bytes or 16 }}];
  if (threads == 1) {
    for (int32_t gid0 = first; gid0 < last; gid0++)
      {{ name }}({{ (loop_args + single) | join(", ") }});
  } else {
    for (int32_t gid0 = first; gid0 < last; gid0++)
      for (int32_t lid2 = 0; lid2 < block2; lid2++)
        for (int32_t lid1 = 0; lid1 < block1; lid1++)
          for (int32_t lid0 = 0; lid0 < block0; lid0++)
            {{ name }}({{ (loop_args + ids) | join(", ") }});
  }
{%- endmacro %}
/* Chunk `index` of a launch spread over the pool, counting chunks along workgroup axis 0, then
   axes 1 and 2, as the entry point's loops do. */
static void {{ name }}_chunk(void *context, int64_t index) {
  const struct pk_grid *grid = context;
{{ arguments("grid->buffers", "grid->scalars", "grid->dims") | trim("\n") }}
  const int64_t size = grid->size, chunk = index % grid->chunks;
  const int32_t gid1 = (int32_t)(index / grid->chunks % grid1);
  const int32_t gid2 = (int32_t)(index / grid->chunks / grid1);
{{ chunk() }}
}

/* The kernel's entry point, named after it: buffers, int32 scalars, dims = grid[3], block[3]. */
void {{ entry }}(void **pk_buffers, const int32_t *pk_scalars, const int32_t *pk_dims) {
{{ arguments("pk_buffers", "pk_scalars", "pk_dims") | trim("\n") }}
  /* Waking the other cores costs microseconds: small launches stay on this one. */
  const bool pk_parallel = (int64_t)grid0 * grid1 * grid2 * threads >= {{ parallel_from }};
  /* Workgroups go to cores in chunks of up to 64 along axis 0, so that a chunk's index is
     decoded once, and a loop over one axis stays innermost for the vectorizer: thread axis 0,
     or workgroup axis 0 when a workgroup has one thread. A short grid gets shorter chunks, at
     least 4 per core, so that every core has work. */
  const int64_t cores = pk_parallel ? pk_pool_threads : 1;
  const int64_t fair = (int64_t)grid0 / (4 * cores);
  const int64_t size = fair < 1 ? 1 : (fair < 64 ? fair : 64);
  const int64_t chunks = ((int64_t)grid0 + size - 1) / size;
  if (cores > 1) {
    struct pk_grid grid = {pk_buffers, pk_scalars, pk_dims, size, chunks};
    pk_pool({{ name }}_chunk, &grid, chunks * grid1 * grid2);
    return;
  }
  for (int32_t gid2 = 0; gid2 < grid2; gid2++)
    for (int32_t gid1 = 0; gid1 < grid1; gid1++)
      for (int64_t chunk = 0; chunk < chunks; chunk++) {
{{ chunk() | indent(6, first=True) }}
      }
}
"""


_IDS = ["gid0", "gid1", "gid2", "lid0", "lid1", "lid2", "pk_local"]
# AVX-512's masked loads and stores of a vector type's first lanes: their suffix per dtype
_MASKED = {dtypes.float32: "ps", dtypes.float64: "pd"}


def _gnu_vectors(prefix: str, width: int) -> lanes.Spelling:
    """GNU C vectors of `width` lanes, named <prefix>x<width> (pk_f32x8): {a, a, ...} literals,
    v[k] lanes, and the template's <vector>_fma, <vector>_add_into, <vector>_store,
    <vector>_load, their first n lanes' <vector>_load_lanes and <vector>_store_lanes, and
    <vector>_load_even of every other element."""
    vector = f"{prefix}x{width}"
    return lanes.Spelling(
        declare=lambda lead, init, n: f"{vector} {lead} = {{{', '.join([init] * n)}}};",
        lane=lambda lead, k: f"{lead}[{k}]",
        fma=lambda lead, a, at: f"{lead} = {vector}_fma({a}, &{at}, {lead});",
        add_into=lambda lead, at: f"{vector}_add_into(&{at}, {lead});",
        store=lambda lead, at: f"{vector}_store(&{at}, {lead});",
        # a scalar times a vector is a vector (GNU C); -ffp-contract=off keeps two roundings
        mul_add=lambda lead, a, at: f"{lead} = {lead} + {a} * {vector}_load(&{at});",
        vector=lambda at: f"{vector}_load(&{at})",
        pairs=lambda lead, a, b, n: (
            f"const {vector} {lead} = ({vector}){{{_lanes(a, b, n, 0)}}} + "
            f"({vector}){{{_lanes(a, b, n, 1)}}};"),
        load_lanes=lambda at, n, step: (
            f"{vector}_load(&{at})" if n == width and step == 1 else
            f"{vector}_load_{'lanes' if step == 1 else 'even'}(&{at}, {n})"),
        store_lanes=lambda at, value, n: (f"{vector}_store(&{at}, {value});" if n == width else
                                          f"{vector}_store_lanes(&{at}, {value}, {n});"),
        constant=lambda name, value: f"const {vector} {name} = {value};")


def _lanes(a: str, b: str, n: int, odd: int) -> str:
    """The even (odd = 0) or odd lanes of vector a, then of b, n lanes each."""
    return ", ".join(f"{v}[{k}]" for v in (a, b) for k in range(odd, n, 2))


# vdpbf16ps on one thread: A's row holds k = 0, 1; B's element 2j + h is (k = h, column j);
# C's element j is column j. Lane j of the instruction adds A[1]·B[1][j], then A[0]·B[0][j],
# each product exact and each sum rounded to nearest, with denormal inputs and results flushed.
DPBF16 = MatrixUnit(1, 16, 2, 1, dtypes.bfloat16, dtypes.bfloat16, dtypes.float32,
                    fragment(1, 2, lambda t, e: (0, e)),
                    fragment(1, 32, lambda t, e: (e % 2, e // 2)),
                    fragment(1, 16, lambda t, e: (0, e)), denormals="flush")
# vpdpbusd (AVX-512 VNNI) the same way with k = 4: lane j adds the four products of A's
# unsigned bytes and column j's signed bytes to its int32, wrapping.
DPBUSD = MatrixUnit(1, 16, 4, 1, dtypes.uint8, dtypes.int8, dtypes.int32,
                    fragment(1, 4, lambda t, e: (0, e)),
                    fragment(1, 64, lambda t, e: (e % 4, e // 4)),
                    fragment(1, 16, lambda t, e: (0, e)))
MMA_UNITS = (DPBF16, DPBUSD)
# Per unit: C's 16 lanes as a GNU C vector type, and the instruction as a function of C (that
# type), A's k elements broadcast and B's elements, both __m512i. A and B's elements are
# words of their bits, k of them to each 32-bit lane, the lowest k first.
_INSTRUCTIONS = {
    DPBF16: ("__m512", "_mm512_dpbf16_ps({c}, (__m512bh){a}, (__m512bh){b})"),
    DPBUSD: ("pk_i32x16", "(pk_i32x16)_mm512_dpbusd_epi32((__m512i){c}, {a}, {b})"),
}


class CPURenderer(CStyleRenderer):
    """Plain C11 (GNU dialect) for gcc or clang, one shared object per kernel."""

    workitem: ClassVar[dict[str, str]] = {"group": "gid{}", "local": "lid{}"}
    # Runs of accumulators held in GNU C vectors (codegen/lanes.py), named by these prefixes
    # and their lanes (pk_f32x8 on AVX2, pk_f32x16 on AVX-512): see __init__
    vector_types: ClassVar[dict[dtypes.DType, str]] = {dtypes.float32: "pk_f32",
                                                       dtypes.float64: "pk_f64"}
    vector_spelling = staticmethod(_gnu_vectors)
    # MULACC on float and double rounds once (the ABI allows it): fma(), which the compiler
    # makes a vector FMA. Other dtypes multiply, then add (integers wrap).
    fma_dtypes = (dtypes.float32, dtypes.float64)
    # float16 and bfloat16 have no arithmetic type in portable C (clang 14 rejects _Float16 on
    # x86-64, and where it exists it computes in float anyway): values are held in a float.
    emulated = EMULATED_FLOATS
    # EXP2 on float (and the small floats, computed in float) is pk_exp2f (codegen/exp2f.py),
    # which the compiler vectorizes; double keeps libm's exp2.
    code_for_op: ClassVar[dict[Op, Spelling]] = {
        **CStyleRenderer.code_for_op,
        Op.EXP2: exp2f.spelling}
    template = _TEMPLATE
    # clang proves neighbouring loads adjacent (one vector load) only for signed positions
    signed_positions = True
    # The threads of a group run one after another, so no thread could wait at a barrier.
    threads_as_loops = True
    # clang leaves loops of under 16 trips scalar unless asked (codegen/vectorize.py): its
    # masked tail covers a row of 14 in one 16-lane step. gcc ignores the pragma.
    short_loop_pragma = "#pragma clang loop vectorize(enable) vectorize_predicate(enable)"
    # A row of stride-2 loads (a strided depthwise conv's) that clang's cost model may leave
    # scalar; masked, its loads became gathers at 3x the time.
    strided_loop_pragma = "#pragma clang loop vectorize(enable)"
    split_sums = True
    # LOCAL arrays are slices of one per-workgroup block that the entry point provides.
    local_declaration = "{type} *const {name} = ({type} *)(pk_local + {offset});"

    def __init__(self, vector_bytes: int = 64) -> None:
        """Runs of accumulators held in GNU C vectors (codegen/lanes.py) of `vector_bytes`: one
        register of the host (Capabilities.vector_registers), 64 (AVX-512's) by default. A
        vector of two AVX2 registers is loaded whole, so a packed matmul's 3 x 32 block held
        four B registers beside its twelve accumulators and spilled one every step."""
        self.vector_bytes = vector_bytes

    def render_mma(self, unit: MatrixUnit, src: list[str]) -> str:
        if unit not in _INSTRUCTIONS:
            return super().render_mma(unit, src)
        a, b, _ = unit.operand_counts
        words = self._words_of(unit, src[:a + b])
        c = src[a + b:]
        # C's registers copied into a vector and back out
        vector = _INSTRUCTIONS[unit][0]
        return ("{ " + f"{vector} pk_c = {{{', '.join(c)}}}; pk_c = "
                + _instruction(unit, "pk_c", words[:a], _words(unit, words[a:])) + "; "
                + " ".join(f"{x} = pk_c[{i}];" for i, x in enumerate(c)) + " }")

    def _words_of(self, unit: MatrixUnit, values: list[str]) -> list[str]:
        """A's, then B's elements of `unit` as unsigned words of their bits."""
        a = unit.operand_counts[0]
        return [self._word(unit.a_dtype if i < a else unit.b_dtype, x)
                for i, x in enumerate(values)]

    def _word(self, dtype: dtypes.DType, value: str) -> str:
        if dtype in self.emulated:
            return self.emulated[dtype].store.format(value)
        return f"(uint{dtype.bits}_t)({value})"

    def rendered_together(self, kernel: Kernel) -> dict[int, Callable[[dict], tuple]]:
        own = super().rendered_together(kernel)
        nodes = kernel.nodes
        held: dict[tuple[int, ...], list[int]] = {}      # C's ACCs in one vector -> MMA nodes
        for i, node in enumerate(nodes):
            if node.op is not Op.MMA or node.arg not in _INSTRUCTIONS:
                continue
            accs = node.src[sum(node.arg.operand_counts[:2]):]
            if all(nodes[a].op is Op.ACC and nodes[a].src == nodes[accs[0]].src and
                   a == accs[0] + lane for lane, a in enumerate(accs)):
                held.setdefault(accs, []).append(i)
        readers = lanes.readers(nodes) if held else {}
        for accs, users in held.items():
            own.update(self._held(kernel, accs, users, readers))
        return own

    def _held(self, kernel: Kernel, accs: tuple[int, ...], users: list[int],
              readers: dict[int, list[int]]) -> dict:
        """Name-and-line functions for MMA nodes `users` on one of MMA_UNITS whose C registers
        are the consecutive ACCs `accs`: one vector, each node one instruction on it, B loaded
        as one vector where its elements are loads in a row, and the sums added into a buffer
        afterwards, or stored (a lanes.Flush), as one vector add or store; `readers`:
        lanes.readers of the nodes."""
        nodes = kernel.nodes
        unit = nodes[users[0]].arg
        vector = _INSTRUCTIONS[unit][0]
        lead = f"acc{accs[0]}"
        init = nodes[accs[0]].src[0]

        def declare(names: dict) -> tuple:
            return f"{lead}[0]", f"{vector} {lead} = {{{', '.join([names[init]] * len(accs))}}};"
        own: dict[int, Callable[[dict], tuple]] = {accs[0]: declare}
        for lane, acc in enumerate(accs[1:], 1):
            own[acc] = lanes.named(f"{lead}[{lane}]")
        a, b, _ = unit.operand_counts
        for i in users:
            src = nodes[i].src
            place = lanes.vector(nodes, list(src[a:a + b]), unit.b_dtype)

            def update(names: dict, src=src, place=place) -> tuple:
                words = self._words_of(unit, [names[x] for x in src[:a + b]])
                if place is None:
                    right = _words(unit, words[a:])
                else:
                    buffer, base, offset = place
                    right = f"_mm512_loadu_si512(&{names[buffer]}[{names[base]} + {offset}])"
                return "", f"{lead} = {_instruction(unit, lead, words[:a], right)};"
            own[i] = update
        found = lanes.added_into(kernel, accs, set(users), max(users), readers)
        own.update(lanes.flush_lines(lead, found, lambda lead, at: (
            f"{{ {vector} pk_s; memcpy(&pk_s, &{at}, sizeof pk_s); pk_s += {lead}; "
            f"memcpy(&{at}, &pk_s, sizeof pk_s); }}"), lambda lead, at: (
            f"memcpy(&{at}, &{lead}, sizeof {lead});")))
        return own

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        used = {n.dtype for n in kernel.nodes}
        types, names = [self.storage_type(p.value_dtype) for p in kernel.params], kernel.vars
        return {**super().template_context(kernel, body),
                "looped": kernel.block == (1, 1, 1),
                "small_floats": bool(used & set(self.emulated)),
                "matrix": any(n.op is Op.MMA for n in kernel.nodes),
                "exp2f": exp2f.needed(kernel),
                "float16_helpers": FLOAT16_HELPERS, "exp2f_source": exp2f.EXP2F,
                "entry": entry_point(kernel.name), "types": types,
                "ids": _IDS, "single": ["gid0", "gid1", "gid2", "0", "0", "0", "pk_local"],
                # threads of a kernel with a loop may each do much work; others do little
                "parallel_from": 2 if any(n.op is Op.RANGE for n in kernel.nodes) else 16384,
                "id_args": [f"const int32_t {i}" for i in _IDS[:6]] + ["char *pk_local"],
                "loop_args": [f"data{i}" for i in range(len(types))] + [f"var_{v}" for v in names],
                "local_bytes": local_bytes(kernel), "vector_bytes": self.vector_bytes,
                # the vector types the body names, with AVX-512's masked moves' suffix and mask
                "vectors": [(f"{name}x{width}", self.type_map[d], width, _MASKED[d],
                             f"__mmask{width}")
                            for d, name in self.vector_types.items()
                            for width in [self.vector_bytes // d.itemsize]
                            if any(f"{name}x{width}" in line for line in body)],
                "strips": any("_store_lanes(&" in line for line in body)}


def _instruction(unit: MatrixUnit, c: str, a: list[str], b: str) -> str:
    """D = C + A·B on `unit`: `c` its C vector, `a` A's k elements as words (broadcast as one
    32-bit lane, the first in its lowest bits), `b` B's elements as an __m512i."""
    bits = unit.a_dtype.bits
    lane = " | ".join(f"(uint32_t){word} << {bits * e}" if e else f"(uint32_t){word}"
                      for e, word in enumerate(a))
    return _INSTRUCTIONS[unit][1].format(c=c, a=f"_mm512_set1_epi32((int)({lane}))", b=b)


def _words(unit: MatrixUnit, values: list[str]) -> str:
    """B's elements of `unit` (words of its bits) as an __m512i, the first in the lowest bits."""
    bits = unit.b_dtype.bits
    return (f"_mm512_loadu_si512((const uint{bits}_t[{len(values)}]){{"
            + ", ".join(values) + "})")


def entry_point(name: str) -> str:
    """The exported C symbol of kernel `name`: unique per name, so that many kernels can share
    one shared object (a batch) and each program finds its own."""
    return "pk_launch_" + function_name(name)
