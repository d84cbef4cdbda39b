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
  // A launch has ceil(grid / threadgroup) threadgroups a dimension, so each one starts inside
  // the grid: its first position, and the grid's threads left from there, fit 32 bits (even
  // with grid.x close to 2^32), and only the last one a dimension can be partial.
  const unsigned left_x = grid.x - blockIdx.x * blockDim.x;
  const unsigned left_y = grid.y - blockIdx.y * blockDim.y;
  const unsigned left_z = grid.z - blockIdx.z * blockDim.z;
  if (threadIdx.x >= left_x || threadIdx.y >= left_y || threadIdx.z >= left_z) return false;
  t.tg_size = {min(blockDim.x, left_x), min(blockDim.y, left_y), min(blockDim.z, left_z)};
  t.tindex = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  t.rt = nullptr;
  return true;
}
}  // namespace kk
