// Just enough of CUDA C to run rendered kernels as host C++ (clang++ -std=c++20, -include).
// A test tool: it accepts code NVRTC would reject and computes as the host does; see
// docs/backends/cuda.md for what it cannot catch.
#pragma once
#include "pk_shim_runtime.h"

// CUDA overloads the math functions for float, as <cmath> does in namespace std.
using std::sqrt, std::exp2, std::log2, std::sin, std::trunc, std::fma, std::fabs;

// blockIdx and threadIdx: the ids of the thread the scheduler runs now.
#define blockIdx (pk_shim::current_ids.group)
#define threadIdx (pk_shim::current_ids.thread)

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static thread_local
#define __syncthreads() pk_shim::barrier()
