// Runs a GPU kernel's grid on the host: the shared part of the MSL and CUDA C shims.
//
// Workgroups run one after another on the calling thread. A kernel without a barrier runs its
// threads as a plain loop. A kernel with one runs them through host_grid.h, a coroutine runner
// (host_grid.h, beside this file): the source is run as written, barriers and all.
// Workgroup memory is a function-static array (`static thread_local`), which every coroutine
// of the group shares.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "host_grid.h"

namespace pk_shim {

// Converts to any pointer type: the launch stubs pass buffers without knowing their types.
struct Ptr {
  void *p;
  template <class T> operator T *() const { return static_cast<T *>(p); }
};

struct Dim3 { unsigned x, y, z; };
struct Ids { Dim3 group, thread; };

// One workgroup: every thread's ids and the body that runs one thread.
struct Workgroup {
  std::vector<Ids> ids;
  const std::function<void(const Ids &)> *body;
};

inline thread_local Ids current_ids{};   // the ids of the thread now running

inline void barrier() {
  pk_barrier();
  // Back from the scheduler: CUDA's blockIdx/threadIdx read the ids of whichever thread runs.
  current_ids = static_cast<Workgroup *>(pk_self->context)->ids[pk_self->running];
}

inline void run_thread(pk_group *group, int32_t t) {
  const Workgroup &w = *static_cast<Workgroup *>(group->context);
  current_ids = w.ids[t];
  (*w.body)(w.ids[t]);
}

// dims = grid[3], block[3]; `body` runs one thread with its ids.
inline void launch(const int32_t *dims, bool barriers,
                   const std::function<void(const Ids &)> &body) {
  const int threads = dims[3] * dims[4] * dims[5];
  Workgroup w{std::vector<Ids>(threads), &body};
  pk_group g{};
  if (barriers) pk_group_init(&g, threads, run_thread, &w);
  for (unsigned z = 0; z < (unsigned)dims[2]; z++)
    for (unsigned y = 0; y < (unsigned)dims[1]; y++)
      for (unsigned x = 0; x < (unsigned)dims[0]; x++) {
        for (int t = 0; t < threads; t++)
          w.ids[t] = {{x, y, z}, {(unsigned)(t % dims[3]), (unsigned)(t / dims[3] % dims[4]),
                                  (unsigned)(t / (dims[3] * dims[4]))}};
        if (barriers) {
          pk_group_run(&g);
          continue;
        }
        for (int t = 0; t < threads; t++) current_ids = w.ids[t], body(w.ids[t]);
      }
  if (barriers) pk_group_free(&g);
}

}  // namespace pk_shim
