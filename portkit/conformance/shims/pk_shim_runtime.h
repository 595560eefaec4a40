// Runs a GPU kernel's grid on the host: the shared part of the MSL and CUDA C shims.
//
// Workgroups run one after another on the calling thread. A kernel without a barrier runs its
// threads as a plain loop. A kernel with one runs each thread as a coroutine (ucontext) with a
// stack of its own: a barrier switches back to the scheduler, which resumes every unfinished
// thread in turn, so after one round all of them wait at the same barrier. Workgroup memory is
// a function-static array (`static thread_local`), which every coroutine of the group shares.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>
#include <ucontext.h>

namespace pk_shim {

// Converts to any pointer type: the launch stubs pass buffers without knowing their types.
struct Ptr {
  void *p;
  template <class T> operator T *() const { return static_cast<T *>(p); }
};

struct Dim3 { unsigned x, y, z; };
struct Ids { Dim3 group, thread; };

struct Group {
  ucontext_t scheduler;
  std::vector<ucontext_t> threads;
  std::vector<Ids> ids;
  std::vector<char> done;
  int running = 0;
  const std::function<void(const Ids &)> *body = nullptr;
};

inline thread_local Group *current = nullptr;
inline thread_local Ids current_ids{};   // the ids of the thread now running

inline void barrier() {
  if (current) swapcontext(&current->threads[current->running], &current->scheduler);
}

inline void thread_entry() {
  Group *g = current;
  const int t = g->running;
  (*g->body)(g->ids[t]);
  g->done[t] = 1;
}

// dims = grid[3], block[3]; `body` runs one thread with its ids.
inline void launch(const int32_t *dims, bool barriers,
                   const std::function<void(const Ids &)> &body) {
  const int threads = dims[3] * dims[4] * dims[5];
  const size_t stack = 256 * 1024;
  std::vector<char> stacks(barriers ? stack * threads : 0);
  Group g;
  g.threads.resize(threads), g.ids.resize(threads), g.done.resize(threads);
  g.body = &body;
  for (unsigned z = 0; z < (unsigned)dims[2]; z++)
    for (unsigned y = 0; y < (unsigned)dims[1]; y++)
      for (unsigned x = 0; x < (unsigned)dims[0]; x++) {
        for (int t = 0; t < threads; t++)
          g.ids[t] = {{x, y, z}, {(unsigned)(t % dims[3]), (unsigned)(t / dims[3] % dims[4]),
                                  (unsigned)(t / (dims[3] * dims[4]))}};
        if (!barriers) {
          for (int t = 0; t < threads; t++) current_ids = g.ids[t], body(g.ids[t]);
          continue;
        }
        for (int t = 0; t < threads; t++) {
          getcontext(&g.threads[t]);
          g.threads[t].uc_stack.ss_sp = stacks.data() + stack * t;
          g.threads[t].uc_stack.ss_size = stack;
          g.threads[t].uc_link = &g.scheduler;
          makecontext(&g.threads[t], thread_entry, 0);
          g.done[t] = 0;
        }
        current = &g;
        for (int left = threads; left > 0;)
          for (int t = 0; t < threads; t++) {
            if (g.done[t]) continue;
            g.running = t, current_ids = g.ids[t];
            swapcontext(&g.scheduler, &g.threads[t]);
            left -= g.done[t];
          }
        current = nullptr;
      }
}

}  // namespace pk_shim
