// kernelkit/entry_cuda.h: where a CUDA thread runs, as a kk_thread_ctx.
// Metal dispatches `grid` threads (dispatchThreads): blocks at the edges are
// partial, and the threads past the grid return before the body (an exited
// thread no longer holds up __syncthreads).
#pragma once
#include "launch.h"

namespace kk {
__device__ __forceinline__ bool cuda_thread_ctx(const kk_dim3 grid, kk_thread_ctx& t) {
  t.tid = {threadIdx.x, threadIdx.y, threadIdx.z};
  t.gid = {blockIdx.x, blockIdx.y, blockIdx.z};
  t.tg_dispatch = {blockDim.x, blockDim.y, blockDim.z};
  t.num_groups = {gridDim.x, gridDim.y, gridDim.z};
  t.grid = grid;
  // 64-bit: grid.x may be close to 2^32
  const unsigned long long x0 = (unsigned long long)blockIdx.x * blockDim.x;
  const unsigned long long y0 = (unsigned long long)blockIdx.y * blockDim.y;
  const unsigned long long z0 = (unsigned long long)blockIdx.z * blockDim.z;
  if (x0 + threadIdx.x >= grid.x || y0 + threadIdx.y >= grid.y || z0 + threadIdx.z >= grid.z)
    return false;
  t.tg_size = {(unsigned)min((unsigned long long)blockDim.x, grid.x - x0),
               (unsigned)min((unsigned long long)blockDim.y, grid.y - y0),
               (unsigned)min((unsigned long long)blockDim.z, grid.z - z0)};
  t.tindex = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  t.rt = nullptr;
  return true;
}
}  // namespace kk
