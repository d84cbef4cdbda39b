// kernelkit/metal_attributes.h: Metal's thread attributes, derived from a kk_thread_ctx.
// The generated entry passes `kk_attr::<attribute>(t)` for each attribute the body names.
// A SIMD-group is 32 lanes cut from thread_index_in_threadgroup, as a CUDA warp is cut
// from the linear thread index, so lane numbers agree with the hardware on every target.
#pragma once
#include "launch.h"

namespace kk_attr {
using metal::uint;
using metal::uint3;

KK_FN uint3 u3(kk_dim3 d) { return uint3(d.x, d.y, d.z); }
KK_FN uint count(kk_dim3 d) { return d.x * d.y * d.z; }

KK_FN uint3 thread_position_in_grid(const kk_thread_ctx& t) {
  return uint3(t.gid.x * t.tg_dispatch.x + t.tid.x, t.gid.y * t.tg_dispatch.y + t.tid.y,
               t.gid.z * t.tg_dispatch.z + t.tid.z);
}
KK_FN uint3 thread_position_in_threadgroup(const kk_thread_ctx& t) { return u3(t.tid); }
KK_FN uint3 threadgroup_position_in_grid(const kk_thread_ctx& t) { return u3(t.gid); }
KK_FN uint3 threadgroups_per_grid(const kk_thread_ctx& t) { return u3(t.num_groups); }
KK_FN uint3 threads_per_grid(const kk_thread_ctx& t) { return u3(t.grid); }
KK_FN uint3 threads_per_threadgroup(const kk_thread_ctx& t) { return u3(t.tg_size); }
KK_FN uint3 dispatch_threads_per_threadgroup(const kk_thread_ctx& t) { return u3(t.tg_dispatch); }
KK_FN uint3 grid_origin(const kk_thread_ctx&) { return uint3(0u, 0u, 0u); }
KK_FN uint3 grid_size(const kk_thread_ctx& t) { return u3(t.grid); }

KK_FN uint thread_index_in_threadgroup(const kk_thread_ctx& t) { return t.tindex; }
KK_FN uint thread_index_in_simdgroup(const kk_thread_ctx& t) { return t.tindex % 32u; }
KK_FN uint thread_index_in_quadgroup(const kk_thread_ctx& t) { return t.tindex % 4u; }
KK_FN uint simdgroup_index_in_threadgroup(const kk_thread_ctx& t) { return t.tindex / 32u; }
KK_FN uint quadgroup_index_in_threadgroup(const kk_thread_ctx& t) { return t.tindex / 4u; }
KK_FN uint simdgroups_per_threadgroup(const kk_thread_ctx& t) { return (count(t.tg_size) + 31u) / 32u; }
KK_FN uint quadgroups_per_threadgroup(const kk_thread_ctx& t) { return (count(t.tg_size) + 3u) / 4u; }
KK_FN uint dispatch_simdgroups_per_threadgroup(const kk_thread_ctx& t) {
  return (count(t.tg_dispatch) + 31u) / 32u;
}
KK_FN uint dispatch_quadgroups_per_threadgroup(const kk_thread_ctx& t) {
  return (count(t.tg_dispatch) + 3u) / 4u;
}
KK_FN uint threads_per_simdgroup(const kk_thread_ctx&) { return 32u; }
KK_FN uint thread_execution_width(const kk_thread_ctx&) { return 32u; }
}  // namespace kk_attr
