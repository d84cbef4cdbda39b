// kernelkit/entry_cuda.h: where a CUDA thread runs, as a kk_thread_ctx.
// Metal dispatches `grid` threads (dispatchThreads): blocks at the edges are
// partial, and the threads past the grid return before the body (an exited
// thread no longer holds up __syncthreads).
#pragma once
#include "launch.h"

namespace kk {
__device__ __forceinline__ bool cuda_thread_ctx(const kk_dim3 grid, kk_thread_ctx& t) {
  t.tg_size = group_size(grid);
  if (!thread_position(t.tg_size, t.tid, t.tindex)) return false;  // past the grid
  t.gid = {blockIdx.x, blockIdx.y, blockIdx.z};
  t.tg_dispatch = {blockDim.x, blockDim.y, blockDim.z};
  t.num_groups = {gridDim.x, gridDim.y, gridDim.z};
  t.grid = grid;
  t.rt = nullptr;
  return true;
}
}  // namespace kk
