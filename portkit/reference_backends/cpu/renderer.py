"""ABI kernels as C for the host CPU: the C-style base plus a prelude and a launcher.

The kernel body becomes a `static inline` function of its buffers, scalars, workgroup and
thread ids. `pk_launch`, the same entry point in every kernel's shared object, runs the grid:
workgroups are spread across cores with OpenMP, and a workgroup's threads run as a loop over
thread axis 0 innermost, which the compiler may vectorize. Kernels with a BARRIER run their
threads as coroutines instead (see _BARRIER below).
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen.cstyle import EMULATED_FLOATS, FLOAT16_HELPERS, CStyleRenderer, local_bytes

# Threads of a workgroup must be able to wait for each other at a BARRIER. A kernel with one
# runs each thread as a coroutine with a stack of its own (ucontext): the scheduler resumes
# every unfinished thread in turn, and a thread runs until it reaches a barrier (it switches
# back) or returns. After one round every live thread waits at the same barrier, so the next
# round starts past it. Splitting the kernel at its barriers was the alternative; it does not
# survive barriers inside loops. Kernels without a BARRIER stay a plain loop.
_BARRIER = """\
enum { PK_STACK = 256 * 1024 };  /* per thread; only touched pages cost memory */
typedef struct {
  ucontext_t scheduler, *threads;
  char *stacks, *local;
  int32_t *finished, running, gid[3], block[3];
  void **buffers;
  const int32_t *scalars;
} pk_group;
static _Thread_local pk_group *pk_self;

static void pk_barrier(void) {
  pk_group *g = pk_self;
  swapcontext(&g->threads[g->running], &g->scheduler);
}
"""

_TEMPLATE = """\
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <tgmath.h>  /* sqrt, exp2, ...: the float or the double function, by argument */
{% if barrier %}
#include <stdlib.h>
#include <ucontext.h>
{% endif %}

{% if small_floats %}{{ float16_helpers }}
{% endif %}
{% if barrier %}{{ barrier_helpers }}
{% endif %}
static inline void {{ name }}({{ (args + id_args) | join(", ") }}) {
{% for line in body %}
{{ line }}
{% endfor %}
}

{% if barrier %}
static void pk_thread(void) {
  pk_group *g = pk_self;
  const int32_t t = g->running, b0 = g->block[0], b1 = g->block[1];
  {{ name }}({{ (thread_args + ["g->gid[0]", "g->gid[1]", "g->gid[2]", "t % b0", "t / b0 % b1",
      "t / (b0 * b1)", "g->local"]) | join(", ") }});
  g->finished[t] = 1;
}

static void pk_run_group(pk_group *g, int32_t threads) {
  for (int32_t t = 0; t < threads; t++) {
    getcontext(&g->threads[t]);
    g->threads[t].uc_stack.ss_sp = g->stacks + (size_t)t * PK_STACK;
    g->threads[t].uc_stack.ss_size = PK_STACK;
    g->threads[t].uc_link = &g->scheduler;
    makecontext(&g->threads[t], pk_thread, 0);
    g->finished[t] = 0;
  }
  pk_self = g;
  for (int32_t left = threads; left > 0;) {
    for (int32_t t = 0; t < threads; t++) {
      if (g->finished[t]) continue;
      g->running = t;
      swapcontext(&g->scheduler, &g->threads[t]);
      left -= g->finished[t];
    }
  }
}

{% endif %}
/* The entry point of every kernel: buffers, int32 scalars, dims = grid[3], block[3]. */
void pk_launch(void **pk_buffers, const int32_t *pk_scalars, const int32_t *pk_dims) {
  const int32_t grid0 = pk_dims[0], grid1 = pk_dims[1], grid2 = pk_dims[2];
  const int32_t block0 = pk_dims[3], block1 = pk_dims[4], block2 = pk_dims[5];
  const int32_t threads = block0 * block1 * block2;
  /* Waking the other cores costs microseconds: small launches stay on this one. */
  const bool pk_parallel = (int64_t)grid0 * grid1 * grid2 * threads >= {{ parallel_from }};
{% if barrier %}
  #pragma omp parallel if(pk_parallel)
  {
    pk_group g = {.buffers = pk_buffers, .scalars = pk_scalars,
                  .block = {block0, block1, block2}};
    g.threads = malloc(sizeof(ucontext_t) * threads);
    g.finished = malloc(sizeof(int32_t) * threads);
    g.stacks = malloc((size_t)PK_STACK * threads);
    #pragma omp for collapse(3) schedule(static)
    for (int32_t gid2 = 0; gid2 < grid2; gid2++)
      for (int32_t gid1 = 0; gid1 < grid1; gid1++)
        for (int32_t gid0 = 0; gid0 < grid0; gid0++) {
          _Alignas(64) char pk_local[{{ local_bytes or 16 }}];
          g.gid[0] = gid0, g.gid[1] = gid1, g.gid[2] = gid2, g.local = pk_local;
          pk_run_group(&g, threads);
        }
    free(g.threads), free(g.finished), free(g.stacks);
  }
{% else %}
{% for p in kernel.params %}
  {{ types[loop.index0] }} *const data{{ p.arg }} = pk_buffers[{{ p.arg }}];
{% endfor %}
{% for v in kernel.vars %}
  const int32_t var_{{ v }} = pk_scalars[{{ loop.index0 }}];
{% endfor %}
  /* Workgroups go to cores in chunks of 64 along axis 0, so that the parallel loop's index
     is decoded once per chunk, and a loop over one axis stays innermost for the vectorizer:
     thread axis 0, or workgroup axis 0 when a workgroup has one thread. */
  const int64_t chunks = ((int64_t)grid0 + 63) / 64;
  #pragma omp parallel for collapse(3) schedule(static) if(pk_parallel)
  for (int32_t gid2 = 0; gid2 < grid2; gid2++)
    for (int32_t gid1 = 0; gid1 < grid1; gid1++)
      for (int64_t chunk = 0; chunk < chunks; chunk++) {
        const int32_t first = (int32_t)(chunk * 64);
        const int32_t last = (int32_t)(chunk * 64 + 64 < grid0 ? chunk * 64 + 64 : grid0);
        _Alignas(64) char pk_local[{{ local_bytes or 16 }}];
        if (threads == 1) {
          for (int32_t gid0 = first; gid0 < last; gid0++)
            {{ name }}({{ (loop_args + single) | join(", ") }});
          continue;
        }
        for (int32_t gid0 = first; gid0 < last; gid0++)
          for (int32_t lid2 = 0; lid2 < block2; lid2++)
            for (int32_t lid1 = 0; lid1 < block1; lid1++)
              for (int32_t lid0 = 0; lid0 < block0; lid0++)
                {{ name }}({{ (loop_args + ids) | join(", ") }});
      }
{% endif %}
}
"""


_IDS = ["gid0", "gid1", "gid2", "lid0", "lid1", "lid2", "pk_local"]


class CRenderer(CStyleRenderer):
    """Plain C11 (GNU dialect) for gcc or clang, one shared object per kernel."""

    barrier = "pk_barrier();"
    workitem: ClassVar[dict[str, str]] = {"group": "gid{}", "local": "lid{}"}
    # float16 and bfloat16 have no arithmetic type in portable C (clang 14 rejects _Float16 on
    # x86-64, and where it exists it computes in float anyway): values are held in a float.
    emulated = EMULATED_FLOATS
    template = _TEMPLATE

    def render_local(self, name: str, dtype: dtypes.DType, size: int, offset: int) -> str:
        # LOCAL arrays are slices of one per-workgroup block that pk_launch provides.
        element = self.storage_type(dtype)
        return f"{element} *const {name} = ({element} *)(pk_local + {offset});"

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        used = {n.dtype for n in kernel.nodes}
        types, names = [self.storage_type(p.dtype) for p in kernel.params], kernel.vars
        return {**super().template_context(kernel, body),
                "barrier": any(n.op is Op.BARRIER for n in kernel.nodes),
                "small_floats": bool(used & set(self.emulated)),
                "float16_helpers": FLOAT16_HELPERS, "barrier_helpers": _BARRIER,
                "types": types,
                "ids": _IDS, "single": ["gid0", "gid1", "gid2", "0", "0", "0", "pk_local"],
                # threads of a kernel with a loop may each do much work; others do little
                "parallel_from": 2 if any(n.op is Op.RANGE for n in kernel.nodes) else 16384,
                "id_args": [f"const int32_t {i}" for i in _IDS[:6]] + ["char *pk_local"],
                "loop_args": [f"data{i}" for i in range(len(types))] + [f"var_{v}" for v in names],
                "thread_args": [f"({t} *)g->buffers[{i}]" for i, t in enumerate(types)]
                + [f"g->scalars[{i}]" for i in range(len(names))],
                "local_bytes": local_bytes(kernel)}
