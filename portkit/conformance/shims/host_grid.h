/* Runs one workgroup's threads on the host so that they can wait for each other at a BARRIER.
 *
 * Used by the conformance shims' C++ runtime (shims/pk_shim_runtime.h includes it), which runs
 * CUDA C and MSL source as written, so a thread must stop at a barrier where it stands. The cpu
 * backend renders ABI kernels, so it splits them at their barriers instead
 * (portkit.codegen.loops), which is about 1000x faster. Valid C11 and C++20.
 *
 * Each thread runs as a coroutine (ucontext) with a stack of its own: the scheduler resumes
 * every unfinished thread in turn, and a thread runs until it reaches a barrier (it switches
 * back) or returns. After one round every live thread waits at the same barrier, so the next
 * round starts past it. Source with a barrier anywhere (inside a loop, a branch, a helper
 * function) works unchanged. Kernels without a barrier do not need this file.
 */
#ifndef PK_HOST_GRID_H
#define PK_HOST_GRID_H
#include <stdint.h>
#include <stdlib.h>
#include <ucontext.h>

#ifdef __cplusplus
#define PK_THREAD_LOCAL thread_local
#else
#define PK_THREAD_LOCAL _Thread_local
#endif

enum { PK_STACK = 256 * 1024 };  /* per thread; only touched pages cost memory */

typedef struct pk_group pk_group;
struct pk_group {
  ucontext_t scheduler, *threads;
  char *stacks;
  int32_t *finished, count, running;
  void (*thread)(pk_group *group, int32_t t);  /* runs thread t of the workgroup to its end */
  void *context;                                /* the caller's: arguments, workgroup ids */
};

/* The group whose threads run on this host thread now (OpenMP runs one group per core). */
static PK_THREAD_LOCAL pk_group *pk_self;

static inline void pk_barrier(void) {
  pk_group *g = pk_self;
  swapcontext(&g->threads[g->running], &g->scheduler);
}

static void pk_group_entry(void) {
  pk_group *g = pk_self;
  const int32_t t = g->running;
  g->thread(g, t);
  g->finished[t] = 1;
}

/* Allocates the coroutines of a workgroup of `count` threads; reused for every workgroup. */
static inline void pk_group_init(pk_group *g, int32_t count,
                                 void (*thread)(pk_group *, int32_t), void *context) {
  g->threads = (ucontext_t *)malloc(sizeof(ucontext_t) * count);
  g->finished = (int32_t *)malloc(sizeof(int32_t) * count);
  g->stacks = (char *)malloc((size_t)PK_STACK * count);
  g->count = count, g->running = 0, g->thread = thread, g->context = context;
}

static inline void pk_group_free(pk_group *g) {
  free(g->threads), free(g->finished), free(g->stacks);
}

/* Runs every thread of one workgroup to its end, switching between them at barriers. */
static inline void pk_group_run(pk_group *g) {
  for (int32_t t = 0; t < g->count; t++) {
    getcontext(&g->threads[t]);
    g->threads[t].uc_stack.ss_sp = g->stacks + (size_t)t * PK_STACK;
    g->threads[t].uc_stack.ss_size = PK_STACK;
    g->threads[t].uc_link = &g->scheduler;
    makecontext(&g->threads[t], pk_group_entry, 0);
    g->finished[t] = 0;
  }
  pk_group *outer = pk_self;
  pk_self = g;
  for (int32_t left = g->count; left > 0;) {
    for (int32_t t = 0; t < g->count; t++) {
      if (g->finished[t]) continue;
      g->running = t;
      swapcontext(&g->scheduler, &g->threads[t]);
      left -= g->finished[t];
    }
  }
  pk_self = outer;
}

#endif
